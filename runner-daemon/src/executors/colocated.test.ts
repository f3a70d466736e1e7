import { randomBytes } from 'node:crypto';
import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import type { ModelClient, ModelMessage, ModelRequest, ModelStreamEvent, TokenUsage } from '@agentplane/protocol';
import type { AgentConfig, HarnessEvent, SessionEventSink } from '../harness/events.js';
import type { GateQuery } from '../harness/loop.js';
import { ProcessDriver } from '../sandbox/process-driver.js';
import { ColocatedHarnessError, runColocated, type ColocatedRunOptions } from './colocated.js';

/**
 * The runner side of the colocated topology against the real harness bundle (built by
 * `npm run build`), with the process driver so that it runs without Docker. The black-box test
 * with Docker is test/colocated.test.ts.
 */
const usage = (input: number, output: number): TokenUsage => ({
  input_tokens: input, cached_input_tokens: 0, cache_write_input_tokens: 0, output_tokens: output, reasoning_output_tokens: 0, total_tokens: input + output,
});
const end = (stop_reason: 'end_turn' | 'tool_use', u = usage(10, 5)): ModelStreamEvent => ({ type: 'end', stop_reason, usage: u, provider: 'scripted', model: 'script-1' });
const toolUse = (id: string, name: string, input: unknown): ModelStreamEvent => ({ type: 'tool_use', id, name, input });
const user = (text: string): ModelMessage => ({ role: 'user', content: [{ type: 'text', text }] });

class ScriptedModel implements ModelClient {
  readonly requests: ModelRequest[] = [];
  constructor(private readonly steps: ModelStreamEvent[][]) {}
  async *stream(request: ModelRequest): AsyncIterable<ModelStreamEvent> {
    this.requests.push(structuredClone(request));
    const step = this.steps.shift();
    if (!step) throw new Error('script exhausted');
    for (const event of step) yield event;
  }
}

class CollectingSink implements SessionEventSink {
  readonly events: HarnessEvent[] = [];
  onEvent?: (e: HarnessEvent) => void;
  async emit(event: HarnessEvent): Promise<void> {
    this.events.push(event);
    this.onEvent?.(event);
  }
  types(): string[] {
    return this.events.map((e) => e.type);
  }
}

const dataDir = mkdtempSync(join(tmpdir(), 'colocated-'));
const runnerId = `ctest-${randomBytes(4).toString('hex')}`;
const driver = new ProcessDriver({ runnerId, dataDir, logger: createLogger({ name: 'colocated-test', level: 'silent' }) });
const log = createLogger({ name: 'colocated-test', level: 'silent' });
const agent: AgentConfig = {
  routing_key: 'default',
  tools: [
    { type: 'builtin', name: 'bash' },
    { type: 'custom', spec: { name: 'get_weather', description: 'Weather', input_schema: { type: 'object' } } },
  ],
};

afterAll(async () => {
  await driver.reapOrphans(runnerId, []);
  rmSync(dataDir, { recursive: true, force: true });
});

async function run(over: Partial<ColocatedRunOptions> & { model: ModelClient; sink?: SessionEventSink }): Promise<ReturnType<typeof runColocated>> {
  const sandbox = await driver.ensure({ id: `sess_${randomBytes(6).toString('hex')}` });
  return runColocated({
    driver, sandbox, log, signal: new AbortController().signal, sink: new CollectingSink(),
    run: { agent, history: [user('go')], max_duration_seconds: 60 },
    ...over,
  });
}

/** A stand-in harness program (what a compromised or broken harness could do). */
function fakeHarness(source: string): URL {
  const path = join(dataDir, `fake-${randomBytes(4).toString('hex')}.mjs`);
  writeFileSync(path, source);
  return pathToFileURL(path);
}

describe('colocated harness (process driver)', () => {
  it('runs the loop next to the tools: the tool runs under the harness process, events in order, usage from the gateway', async () => {
    const model = new ScriptedModel([
      [{ type: 'text_delta', text: 'Looking.' }, toolUse('call_1', 'bash', { command: 'tr "\\0" " " < /proc/$PPID/cmdline' }), end('tool_use', usage(100, 20))],
      [{ type: 'text_delta', text: 'Done.' }, end('end_turn', usage(130, 5))],
    ]);
    const sink = new CollectingSink();
    const out = await run({ model, sink });
    expect(out.stop_reason).toEqual({ type: 'end_turn' });
    expect(out.usage).toMatchObject({ input_tokens: 230, output_tokens: 25, total_tokens: 255 });
    expect(sink.types()).toEqual(['agent.message', 'agent.tool_use', 'agent.tool_result', 'agent.message']);
    const result = sink.events[2] as Extract<HarnessEvent, { type: 'agent.tool_result' }>;
    expect(result.payload).toMatchObject({ tool_use_id: 'call_1', is_error: false, exit_code: 0 });
    expect(result.payload.content).toContain('colocated/harness.mjs');
    expect(model.requests[1]?.messages.at(-1)?.content[0]).toMatchObject({ type: 'tool_result', tool_use_id: 'call_1' });
  });

  it('the harness bundle globs with the linear-time matcher: shell classes, and a backtracking-hostile pattern answers at once', async () => {
    const make = `mkdir -p g && for i in $(seq 10 59); do : > "g/${'a'.repeat(44)}$i"; done && : > g/b.txt && : > g/c.txt`;
    const model = new ScriptedModel([
      [toolUse('call_m', 'bash', { command: make }), end('tool_use')],
      [toolUse('call_c', 'glob', { pattern: 'g/{[ab],x}.txt' }), end('tool_use')],
      [toolUse('call_h', 'glob', { pattern: `g/${'*a'.repeat(11)}z` }), end('tool_use')],
      [{ type: 'text_delta', text: 'Done.' }, end('end_turn')],
    ]);
    const sink = new CollectingSink();
    const out = await run({ model, sink, run: { agent: { ...agent, tools: [...agent.tools, { type: 'builtin', name: 'glob' }] }, history: [user('go')], max_duration_seconds: 60 } });
    expect(out.stop_reason).toEqual({ type: 'end_turn' });
    const results = sink.events.filter((e): e is Extract<HarnessEvent, { type: 'agent.tool_result' }> => e.type === 'agent.tool_result');
    expect(results.map((r) => [r.payload.tool_use_id, r.payload.is_error])).toEqual([['call_m', false], ['call_c', false], ['call_h', false]]);
    expect(results[1]?.payload.content).toBe('g/b.txt');
    expect(results[2]?.payload.content).toBe('no files matched');
  });

  it('a custom tool ends with requires_action, classified by the runner', async () => {
    const model = new ScriptedModel([[toolUse('call_w', 'get_weather', { city: 'Paris' }), end('tool_use')]]);
    const sink = new CollectingSink();
    const out = await run({ model, sink });
    expect(out.stop_reason).toEqual({ type: 'requires_action', tool_use_ids: ['call_w'] });
    expect(out.awaiting.get('call_w')).toBe('custom_tool_result');
    expect(sink.events[0]).toMatchObject({ type: 'agent.tool_use', payload: { blocking: true, awaiting: 'custom_tool_result' } });
  });

  it('MCP tools are called by the runner for the harness', async () => {
    const calls: Array<{ input: unknown; id: string }> = [];
    const withMcp: AgentConfig = {
      ...agent,
      tools: [...agent.tools, { type: 'external', spec: { name: 'ext__echo', description: 'Echo', input_schema: { type: 'object' } }, call: async (input, _s, id) => {
        calls.push({ input, id });
        return { content: 'echo: hi', is_error: false };
      } }],
    };
    const model = new ScriptedModel([[toolUse('call_e', 'ext__echo', { text: 'hi' }), end('tool_use')], [{ type: 'text_delta', text: 'ok' }, end('end_turn')]]);
    const sink = new CollectingSink();
    const out = await run({ model, sink, run: { agent: withMcp, history: [user('echo')] } });
    expect(out.stop_reason).toEqual({ type: 'end_turn' });
    expect(calls).toEqual([{ input: { text: 'hi' }, id: 'call_e' }]);
    expect(sink.events.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ content: 'echo: hi', is_error: false });
  });

  it('an interrupt during `sleep 600` ends the Run interrupted within the cancel bound', async () => {
    const model = new ScriptedModel([[toolUse('call_s', 'bash', { command: 'sleep 600' }), end('tool_use')]]);
    const ac = new AbortController();
    const sink = new CollectingSink();
    let started = 0;
    sink.onEvent = (e) => {
      if (e.type === 'agent.tool_use') setTimeout(() => {
        started = Date.now();
        ac.abort();
      }, 300);
    };
    const out = await run({ model, sink, signal: ac.signal });
    expect(out.stop_reason).toEqual({ type: 'interrupted' });
    expect(Date.now() - started).toBeLessThan(3_000);
    expect(sink.events.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ interrupted: true, is_error: true });
  });

  it('ActionPolicies: the loop asks through the runner before each tool use; a denied command never runs, a failed check denies', async () => {
    const marker = join(dataDir, 'gated-marker');
    const asked: GateQuery[] = [];
    const model = new ScriptedModel([
      [toolUse('call_d', 'bash', { command: `touch ${marker}` }), end('tool_use')],
      [toolUse('call_f', 'bash', { command: `touch ${marker}` }), end('tool_use')],
      [{ type: 'text_delta', text: 'Done.' }, end('end_turn')],
    ]);
    const sink = new CollectingSink();
    const gate = async (q: GateQuery) => {
      asked.push(q);
      if (q.tool_use_id === 'call_f') throw new Error('control plane unreachable');
      return { decision: 'deny' as const, rule_id: 'apol_t', message: 'no touching' };
    };
    const out = await run({ model, sink, gate });
    expect(out.stop_reason).toEqual({ type: 'end_turn' });
    expect(asked).toEqual([
      { tool_use_id: 'call_d', tool: { kind: 'builtin', name: 'bash' }, input: { command: `touch ${marker}` } },
      { tool_use_id: 'call_f', tool: { kind: 'builtin', name: 'bash' }, input: { command: `touch ${marker}` } },
    ]);
    const results = sink.events.filter((e): e is Extract<HarnessEvent, { type: 'agent.tool_result' }> => e.type === 'agent.tool_result');
    expect(results[0]?.payload).toMatchObject({ tool_use_id: 'call_d', is_error: true, denied: true, policy_rule_id: 'apol_t' });
    expect(results[1]?.payload).toMatchObject({ tool_use_id: 'call_f', is_error: true, denied: true, content: expect.stringContaining('fail closed') as unknown });
    expect(existsSync(marker)).toBe(false);
  });

  it('ActionPolicies: require_approval makes the use blocking; a confirmation does not run it, the next allow does', async () => {
    const gate = async () => ({ decision: 'require_approval' as const, rule_id: 'apol_r', message: 'ask first' });
    const use = toolUse('call_r', 'bash', { command: 'echo approved-ran' });
    const first = await run({ model: new ScriptedModel([[use, end('tool_use')]]), gate });
    expect(first.stop_reason).toEqual({ type: 'requires_action', tool_use_ids: ['call_r'] });
    expect(first.awaiting.get('call_r')).toBe('tool_confirmation');
    const history = [user('go'), { role: 'assistant' as const, content: [{ type: 'tool_use' as const, id: 'call_r', name: 'bash', input: { command: 'echo approved-ran' } }] }];
    // While the approval is pending, a user.tool_confirmation does not stand in for it.
    const pending = new CollectingSink();
    const still = await run({
      model: new ScriptedModel([]), sink: pending, gate,
      run: { agent, history, responses: { confirmations: { call_r: 'allow' } }, max_duration_seconds: 60 },
    });
    expect(still.stop_reason).toEqual({ type: 'requires_action', tool_use_ids: ['call_r'] });
    expect(pending.events.filter((e) => e.type === 'agent.tool_result')).toHaveLength(0);
    // Approved: the control plane's next check allows it, and it runs.
    const sink = new CollectingSink();
    const second = await run({
      model: new ScriptedModel([[{ type: 'text_delta', text: 'Done.' }, end('end_turn')]]), sink,
      gate: async () => ({ decision: 'allow' as const, rule_id: 'apol_r', message: 'approved in ActionApproval approval_1' }),
      run: { agent, history, max_duration_seconds: 60 },
    });
    expect(second.stop_reason).toEqual({ type: 'end_turn' });
    expect(sink.events.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ tool_use_id: 'call_r', is_error: false, content: expect.stringContaining('approved-ran') as unknown });
  });

  it('ActionPolicies: an interrupt while a check is pending refuses the use on both ends; the Run ends interrupted, not failed', async () => {
    const ac = new AbortController();
    const gate = () => {
      setImmediate(() => ac.abort());
      return new Promise<never>(() => undefined);
    };
    const sink = new CollectingSink();
    const out = await run({ model: new ScriptedModel([[toolUse('call_i', 'bash', { command: 'true' }), end('tool_use')]]), sink, gate, signal: ac.signal });
    expect(out.stop_reason).toEqual({ type: 'interrupted' });
    expect(sink.events.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ tool_use_id: 'call_i', denied: true, is_error: true });
  });

  it('ActionPolicies: a harness that reports a tool use without asking, or a refused one as run, is cut off', async () => {
    const model = (): ScriptedModel => new ScriptedModel([[toolUse('call_1', 'bash', { command: 'true' }), end('tool_use')]]);
    const deny = async () => ({ decision: 'deny' as const, rule_id: 'apol_t', message: 'no' });
    const step = `process.stdout.write(JSON.stringify({ type: 'model.request', id: 'm1', request: { routing_key: 'default', messages: [{ role: 'user', content: [{ type: 'text', text: 'go' }] }], tools: [] } }) + '\\n');`;
    const use = `JSON.stringify({ type: 'event', event: { type: 'agent.tool_use', payload: { id: 'call_1', name: 'bash', input: {}, blocking: false } } }) + '\\n'`;
    const ran = `JSON.stringify({ type: 'event', event: { type: 'agent.tool_result', payload: { tool_use_id: 'call_1', content: 'ran anyway', is_error: false, exit_code: 0 } } }) + '\\n'`;
    const unasked = fakeHarness(`
      process.stdin.once('data', () => {
        ${step}
        process.stdin.on('data', (d) => { if (String(d).includes('"model.end"')) process.stdout.write(${use}); });
      }); setInterval(() => {}, 1000);`);
    await expect(run({ model: model(), bundle: unasked, gate: deny })).rejects.toMatchObject({ reason: 'relay', message: expect.stringContaining('before its policy check') as unknown });
    const ignoring = fakeHarness(`
      process.stdin.once('data', () => {
        ${step}
        process.stdin.on('data', (d) => {
          if (String(d).includes('"model.end"')) process.stdout.write(JSON.stringify({ type: 'tool.check', id: 'c1', tool_use_id: 'call_1' }) + '\\n');
          if (String(d).includes('"tool.decision"')) process.stdout.write(${use} + ${ran});
        });
      }); setInterval(() => {}, 1000);`);
    await expect(run({ model: model(), bundle: ignoring, gate: deny })).rejects.toMatchObject({ reason: 'relay', message: expect.stringContaining('not reported as that refusal') as unknown });
  });

  it('the model route is the Run\'s, whatever the harness asks for', async () => {
    const model = new ScriptedModel([[{ type: 'text_delta', text: 'x' }, end('end_turn')]]);
    const bundle = fakeHarness(`
      process.stdin.once('data', () => {
        process.stdout.write(JSON.stringify({ type: 'model.request', id: 'm1', request: { routing_key: 'premium', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }], tools: [] } }) + '\\n');
        process.stdin.on('data', (d) => { if (String(d).includes('"model.end"')) { process.stdout.write('{"type":"done","outcome":{"stop_reason":{"type":"end_turn"}}}\\n'); process.exit(0); } });
      });`);
    const out = await run({ model, bundle });
    expect(model.requests[0]?.routing_key).toBe('default');
    expect(out.usage.total_tokens).toBe(15);
  });

  it('a model request too large for one runner frame is answered with a model error, not forwarded', async () => {
    const model = new ScriptedModel([[{ type: 'text_delta', text: 'never' }, end('end_turn')]]);
    const err = await run({ model, run: { agent, history: [user('x'.repeat(1_200_000))] } }).catch((e: unknown) => e);
    expect(err).toMatchObject({ name: 'HarnessError', modelError: { type: 'validation.malformed' } });
    expect(model.requests).toHaveLength(0);
  });

  it('garbage on stdout fails the Run with the reason, and the harness is stopped', async () => {
    const bundle = fakeHarness(`process.stdout.write('rm -rf / done\\n'); setInterval(() => {}, 1000);`);
    const started = Date.now();
    await expect(run({ model: new ScriptedModel([]), bundle })).rejects.toMatchObject({ name: 'ColocatedHarnessError', reason: 'relay', message: expect.stringContaining('not JSON') as unknown });
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('a forged event type, a forged tool use and an oversize line are refused', async () => {
    const forged = fakeHarness(`process.stdout.write(JSON.stringify({ type: 'event', event: { type: 'session.status_idle', payload: { stop_reason: { type: 'end_turn' } } } }) + '\\n'); setInterval(() => {}, 1000);`);
    await expect(run({ model: new ScriptedModel([]), bundle: forged })).rejects.toMatchObject({ reason: 'relay', message: expect.stringContaining('invalid_event') as unknown });
    const use = fakeHarness(`process.stdout.write(JSON.stringify({ type: 'event', event: { type: 'agent.tool_use', payload: { id: 'toolu_x', name: 'get_weather', input: {}, blocking: true, awaiting: 'custom_tool_result' } } }) + '\\n'); setInterval(() => {}, 1000);`);
    await expect(run({ model: new ScriptedModel([]), bundle: use })).rejects.toMatchObject({ reason: 'relay', message: expect.stringContaining('not a tool use the model made') as unknown });
    const huge = fakeHarness(`process.stdout.write('x'.repeat(5 * 1024 * 1024)); setInterval(() => {}, 1000);`);
    await expect(run({ model: new ScriptedModel([]), bundle: huge })).rejects.toMatchObject({ reason: 'relay', message: expect.stringContaining('line_too_long') as unknown });
  });

  it('a harness that dies fails the Run with its exit code and stderr', async () => {
    const bundle = fakeHarness(`process.stderr.write('harness blew up'); process.exit(3);`);
    const err = await run({ model: new ScriptedModel([]), bundle }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(ColocatedHarnessError);
    expect((err as ColocatedHarnessError).reason).toBe('harness_exited');
    expect((err as Error).message).toMatch(/code 3.*harness blew up/);
  });

  it('a harness that ignores abort is killed at the cancel bound; the Run ends interrupted', async () => {
    const bundle = fakeHarness(`process.stdin.resume(); setInterval(() => {}, 1000);`);
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 200);
    const started = Date.now();
    const out = await run({ model: new ScriptedModel([]), bundle, signal: ac.signal, cancelTimeoutMs: 500 });
    expect(out.stop_reason).toEqual({ type: 'interrupted' });
    expect(Date.now() - started).toBeLessThan(3_000);
  });
});
