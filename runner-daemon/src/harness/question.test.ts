import { describe, expect, it } from 'vitest';
import type { ModelClient, ModelRequest, ModelStreamEvent } from '@agentplane/protocol';
import type { CommandRunner, Sandbox } from '../sandbox/types.js';
import type { AgentConfig, HarnessEvent, SessionEventSink } from './events.js';
import { HarnessLoop, type GateDecision } from './loop.js';

const usage = { input_tokens: 1, cached_input_tokens: 0, cache_write_input_tokens: 0, output_tokens: 1, reasoning_output_tokens: 0, total_tokens: 2 };
const end = (stop: 'end_turn' | 'tool_use'): ModelStreamEvent => ({ type: 'end', stop_reason: stop, usage, provider: 'scripted', model: 'x' });

class Steps implements ModelClient {
  readonly requests: ModelRequest[] = [];
  constructor(private readonly steps: ModelStreamEvent[][]) {}
  async *stream(request: ModelRequest): AsyncIterable<ModelStreamEvent> {
    this.requests.push(structuredClone(request));
    yield* this.steps.shift() ?? [];
  }
}

const events: HarnessEvent[] = [];
const sink: SessionEventSink = { emit: async (e) => void events.push(e) };
// ask_user never reaches the sandbox: a driver that is never called stands in for it.
const unused = new Proxy({}, { get: () => { throw new Error('the sandbox must not be used'); } });
const loop = (model: ModelClient, gate?: (q: unknown) => Promise<GateDecision>) =>
  new HarnessLoop({ model, driver: unused as CommandRunner, sandbox: unused as Sandbox, sink, ...(gate ? { gate } : {}) });
const agent: AgentConfig = { routing_key: 'r', tools: [{ type: 'builtin', name: 'ask_user' }] };
const ask = (input: unknown): ModelStreamEvent => ({ type: 'tool_use', id: 'toolu_q', name: 'ask_user', input });
const Q = { questions: [{ question: 'Which?', options: ['a', 'b'] }] };

describe('ask_user in the harness loop', () => {
  it('offers the tool, waits for question_answer, then hands the answer to the model', async () => {
    events.length = 0;
    const first = new Steps([[ask(Q), end('tool_use')]]);
    const r1 = await loop(first).run({ agent, history: [{ role: 'user', content: [{ type: 'text', text: 'go' }] }] });
    expect(first.requests[0]?.tools.map((t) => t.name)).toEqual(['ask_user']);
    expect(r1.stop_reason).toEqual({ type: 'requires_action', tool_use_ids: ['toolu_q'] });
    expect(events.find((e) => e.type === 'agent.tool_use')?.payload).toMatchObject({ blocking: true, awaiting: 'question_answer' });

    // Not answered yet: still waiting, no model step.
    const idle = new Steps([]);
    expect((await loop(idle).run({ agent, history: r1.history })).stop_reason).toEqual({ type: 'requires_action', tool_use_ids: ['toolu_q'] });
    expect(idle.requests).toHaveLength(0);

    const second = new Steps([[{ type: 'text_delta', text: 'ok' }, end('end_turn')]]);
    const r2 = await loop(second).run({ agent, history: r1.history, responses: { question_answers: { toolu_q: { content: 'The user answered:\n1. b' } } } });
    expect(r2.stop_reason).toEqual({ type: 'end_turn' });
    expect(JSON.stringify(second.requests[0]?.messages)).toContain('1. b');
  });

  it('answers a malformed question at once instead of waiting', async () => {
    events.length = 0;
    const m = new Steps([[ask({ questions: [] }), end('tool_use')], [{ type: 'text_delta', text: 'sorry' }, end('end_turn')]]);
    const r = await loop(m).run({ agent, history: [{ role: 'user', content: [{ type: 'text', text: 'go' }] }] });
    expect(r.stop_reason).toEqual({ type: 'end_turn' });
    expect(events.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ is_error: true });
    expect(events.find((e) => e.type === 'agent.tool_use')?.payload).toMatchObject({ blocking: false });
  });

  it('a policy deny refuses the question; require_approval leaves it a question', async () => {
    const deny = new Steps([[ask(Q), end('tool_use')], [end('end_turn')]]);
    const r = await loop(deny, async () => ({ decision: 'deny', rule_id: 'apol_x', message: 'no' })).run({ agent, history: [{ role: 'user', content: [{ type: 'text', text: 'go' }] }] });
    expect(r.stop_reason).toEqual({ type: 'end_turn' });
    events.length = 0;
    const approve = new Steps([[ask(Q), end('tool_use')]]);
    const r2 = await loop(approve, async () => ({ decision: 'require_approval', rule_id: null, message: '' })).run({ agent, history: [{ role: 'user', content: [{ type: 'text', text: 'go' }] }] });
    expect(r2.stop_reason).toEqual({ type: 'requires_action', tool_use_ids: ['toolu_q'] });
    expect(events.find((e) => e.type === 'agent.tool_use')?.payload).toMatchObject({ awaiting: 'question_answer' });
  });
});
