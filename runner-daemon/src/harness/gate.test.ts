import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { ModelClient, ModelRequest, ModelStreamEvent } from '@agentplane/protocol';
import { LocalCommands } from './colocated/local-commands.js';
import type { AgentConfig, HarnessEvent, SessionEventSink } from './events.js';
import { HarnessLoop, type GateDecision, type GateQuery } from './loop.js';

const usage = { input_tokens: 1, cached_input_tokens: 0, cache_write_input_tokens: 0, output_tokens: 1, reasoning_output_tokens: 0, total_tokens: 2 };
const end = (stop_reason: 'end_turn' | 'tool_use'): ModelStreamEvent => ({ type: 'end', stop_reason, usage, provider: 'scripted', model: 's' });

/** One tool call, then a reply. */
class OneToolModel implements ModelClient {
  private n = 0;
  constructor(private readonly command: string) {}
  async *stream(_r: ModelRequest): AsyncIterable<ModelStreamEvent> {
    if (this.n++ === 0) {
      yield { type: 'tool_use', id: 'toolu_1', name: 'bash', input: { command: this.command } };
      yield end('tool_use');
    } else {
      yield { type: 'text_delta', text: 'done' };
      yield end('end_turn');
    }
  }
}
class Sink implements SessionEventSink {
  readonly events: HarnessEvent[] = [];
  async emit(e: HarnessEvent): Promise<void> {
    this.events.push(e);
  }
}

const dir = mkdtempSync(join(tmpdir(), 'gate-'));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const agent: AgentConfig = { routing_key: 'default', tools: [{ type: 'builtin', name: 'bash' }] };

async function run(command: string, gate: (q: GateQuery) => Promise<GateDecision>) {
  const sink = new Sink();
  const asked: GateQuery[] = [];
  const loop = new HarnessLoop({
    model: new OneToolModel(command), driver: new LocalCommands(), sink,
    sandbox: { sessionId: 's', driver: 'process', ref: dir, workspace: dir, createdAt: Date.now(), reused: true },
    gate: async (q) => {
      asked.push(q);
      return gate(q);
    },
  });
  const out = await loop.run({ agent, history: [{ role: 'user', content: [{ type: 'text', text: 'go' }] }] });
  return { out, sink, asked };
}

describe('the tool gate', () => {
  it('asks before running; a deny is answered with a refusal and the command never runs', async () => {
    const marker = join(dir, 'denied');
    const { out, sink, asked } = await run(`touch ${marker}`, async () => ({ decision: 'deny', rule_id: 'apol_1', message: 'no' }));
    expect(asked).toEqual([{ tool_use_id: 'toolu_1', tool: { kind: 'builtin', name: 'bash' }, input: { command: `touch ${marker}` } }]);
    expect(existsSync(marker)).toBe(false);
    const result = sink.events.find((e) => e.type === 'agent.tool_result');
    expect(result?.payload).toMatchObject({ is_error: true, denied: true, policy_rule_id: 'apol_1' });
    expect(out.stop_reason).toEqual({ type: 'end_turn' });
  });

  it('an allow runs the command', async () => {
    const marker = join(dir, 'allowed');
    await run(`touch ${marker}`, async () => ({ decision: 'allow', rule_id: null, message: 'ok' }));
    expect(existsSync(marker)).toBe(true);
  });

  it('require_approval makes the use blocking (requires_action) without running it', async () => {
    const marker = join(dir, 'held');
    const { out, sink } = await run(`touch ${marker}`, async () => ({ decision: 'require_approval', rule_id: 'apol_2', message: 'ask' }));
    expect(out.stop_reason).toEqual({ type: 'requires_action', tool_use_ids: ['toolu_1'] });
    expect(sink.events.find((e) => e.type === 'agent.tool_use')?.payload).toMatchObject({ blocking: true, awaiting: 'tool_confirmation' });
    expect(existsSync(marker)).toBe(false);
  });

  it('a gate that fails denies (fail closed)', async () => {
    const marker = join(dir, 'failed');
    const { sink } = await run(`touch ${marker}`, async () => {
      throw new Error('control plane unreachable');
    });
    expect(existsSync(marker)).toBe(false);
    expect(String(sink.events.find((e) => e.type === 'agent.tool_result')?.payload.content)).toContain('fail closed');
  });
});
