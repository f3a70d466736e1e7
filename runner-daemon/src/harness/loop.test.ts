import { randomBytes } from 'node:crypto';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ModelClient, ModelMessage, ModelRequest, ModelStreamEvent, TokenUsage } from '@agentplane/protocol';
import { DockerDriver } from '../sandbox/docker-driver.js';
import { ensureSandboxImage } from '../sandbox/image.js';
import { HarnessError, type AgentConfig, type HarnessEvent, type SessionEventSink, type StepRecord } from './events.js';
import { HarnessLoop } from './loop.js';

const usage = (input: number, output: number): TokenUsage => ({
  input_tokens: input,
  cached_input_tokens: 0,
  cache_write_input_tokens: 0,
  output_tokens: output,
  reasoning_output_tokens: 0,
  total_tokens: input + output,
});
const end = (stop_reason: 'end_turn' | 'tool_use', u = usage(10, 5)): ModelStreamEvent => ({ type: 'end', stop_reason, usage: u, provider: 'scripted', model: 'script-1' });
const toolUse = (id: string, name: string, input: unknown): ModelStreamEvent => ({ type: 'tool_use', id, name, input });

type Step = ModelStreamEvent[] | ((request: ModelRequest, signal: AbortSignal) => AsyncIterable<ModelStreamEvent>);

/** Replays scripted steps in order and records every request it was sent. */
class ScriptedModel implements ModelClient {
  readonly requests: ModelRequest[] = [];
  constructor(private readonly steps: Step[]) {}
  async *stream(request: ModelRequest, signal: AbortSignal): AsyncIterable<ModelStreamEvent> {
    this.requests.push(structuredClone(request));
    const step = this.steps.shift();
    if (!step) throw new Error('script exhausted');
    if (typeof step === 'function') {
      yield* step(request, signal);
      return;
    }
    for (const event of step) yield event;
  }
}

class CollectingSink implements SessionEventSink {
  readonly events: Array<HarnessEvent & { session_thread_id?: string }> = [];
  readonly steps: StepRecord[] = [];
  async emit(event: HarnessEvent & { session_thread_id?: string }): Promise<void> {
    this.events.push(event);
  }
  step(record: StepRecord): void {
    this.steps.push(record);
  }
  types(): string[] {
    return this.events.map((e) => e.type);
  }
  last(): HarnessEvent | undefined {
    return this.events[this.events.length - 1];
  }
}

const runnerId = `htest-${randomBytes(4).toString('hex')}`;
const docker = new Docker();
const driver = new DockerDriver({ runnerId, docker });
const agent: AgentConfig = {
  routing_key: 'default',
  system: 'You are a test agent.',
  tools: [
    { type: 'builtin', name: 'bash' },
    { type: 'builtin', name: 'write' },
    { type: 'builtin', name: 'read' },
    { type: 'builtin', name: 'edit', permission: 'always_ask' },
    { type: 'custom', spec: { name: 'lookup_order', description: 'Look up an order', input_schema: { type: 'object', properties: { id: { type: 'string' } } } } },
  ],
};
const user = (text: string): ModelMessage => ({ role: 'user', content: [{ type: 'text', text }] });
const newSession = (): { id: string } => ({ id: `sess_${randomBytes(8).toString('hex')}` });

beforeAll(async () => {
  await ensureSandboxImage({ docker });
}, 120_000);

afterAll(async () => {
  await driver.reapOrphans(runnerId, []);
});

describe('harness loop', () => {
  it('writes a file in turn 1 and reads it back in turn 2 (new Run, same sandbox)', async () => {
    const session = newSession();
    const model = new ScriptedModel([
      [{ type: 'thinking_delta', text: 'I will ' }, { type: 'thinking_delta', text: 'write it.' }, toolUse('tu_1', 'write', { path: 'notes/todo.txt', content: 'buy milk\n' }), end('tool_use', usage(100, 20))],
      [{ type: 'text_delta', text: 'Saved ' }, { type: 'text_delta', text: 'it.' }, end('end_turn', usage(130, 5))],
      [toolUse('tu_2', 'read', { path: 'notes/todo.txt' }), end('tool_use')],
      [{ type: 'text_delta', text: 'It says buy milk.' }, end('end_turn')],
    ]);
    const sink = new CollectingSink();
    const sb1 = await driver.ensure(session, {});
    const turn1 = await new HarnessLoop({ model, driver, sandbox: sb1, sink }).run({ agent, history: [user('remember: buy milk')] });
    expect(turn1.stop_reason).toEqual({ type: 'end_turn' });
    expect(sink.types()).toEqual(['agent.thinking', 'agent.tool_use', 'agent.tool_result', 'agent.message', 'session.status_idle']);
    expect(sink.events[0]).toEqual({ type: 'agent.thinking', payload: { content: [{ type: 'thinking', text: 'I will write it.' }] } });
    expect(turn1.usage).toMatchObject({ input_tokens: 230, output_tokens: 25, total_tokens: 255 });
    expect(sink.steps.map((s) => s.usage.total_tokens)).toEqual([120, 135]);
    expect(model.requests[0]!.tools.map((t) => t.name)).toEqual(['bash', 'write', 'read', 'edit', 'lookup_order']);
    expect(model.requests[1]!.messages.at(-1)).toEqual({ role: 'user', content: [{ type: 'tool_result', tool_use_id: 'tu_1', content: 'wrote 9 bytes to notes/todo.txt' }] });

    const sb2 = await driver.ensure(session, {});
    expect(sb2.reused).toBe(true);
    const sink2 = new CollectingSink();
    const turn2 = await new HarnessLoop({ model, driver, sandbox: sb2, sink: sink2 }).run({ agent, history: [...turn1.history, user('what did I ask?')] });
    expect(turn2.stop_reason).toEqual({ type: 'end_turn' });
    const result = sink2.events.find((e) => e.type === 'agent.tool_result');
    expect(result?.payload).toMatchObject({ tool_use_id: 'tu_2', content: '     1\tbuy milk\n', is_error: false });
    expect(sink2.last()).toMatchObject({ type: 'session.status_idle', payload: { stop_reason: { type: 'end_turn' } } });
    await driver.destroy(session.id);
  });

  it('a custom tool ends the Run with requires_action; its result continues the turn in a new Run', async () => {
    const session = newSession();
    const sandbox = await driver.ensure(session, {});
    const model = new ScriptedModel([
      [{ type: 'text_delta', text: 'Checking.' }, toolUse('tu_c', 'lookup_order', { id: 'o-1' }), toolUse('tu_b', 'bash', { command: 'echo side-effect > done.txt' }), end('tool_use')],
      [{ type: 'text_delta', text: 'Order shipped.' }, end('end_turn')],
    ]);
    const sink = new CollectingSink();
    const first = await new HarnessLoop({ model, driver, sandbox, sink }).run({ agent, history: [user('where is my order?')], session_thread_id: 'sthr_child' });
    expect(first.stop_reason).toEqual({ type: 'requires_action', tool_use_ids: ['tu_c'] });
    const uses = sink.events.filter((e) => e.type === 'agent.tool_use');
    expect(uses.map((e) => e.payload)).toEqual([
      { id: 'tu_c', name: 'lookup_order', input: { id: 'o-1' }, blocking: true, awaiting: 'custom_tool_result' },
      { id: 'tu_b', name: 'bash', input: { command: 'echo side-effect > done.txt' }, blocking: false },
    ]);
    expect(sink.events.every((e) => e.session_thread_id === 'sthr_child')).toBe(true);

    // Without an answer the Run stops again at once, executing nothing twice.
    const again = await new HarnessLoop({ model, driver, sandbox, sink: new CollectingSink() }).run({ agent, history: first.history });
    expect(again.stop_reason).toEqual({ type: 'requires_action', tool_use_ids: ['tu_c'] });
    expect(model.requests).toHaveLength(1);

    // A new user message instead of an answer: the waiting use is closed as abandoned (not replayed here).
    const abandonedModel = new ScriptedModel([[{ type: 'text_delta', text: 'Ok.' }, end('end_turn')]]);
    await new HarnessLoop({ model: abandonedModel, driver, sandbox, sink: new CollectingSink() }).run({ agent, history: [...first.history, user('never mind')] });
    expect(abandonedModel.requests[0]!.messages.at(-1)!.content).toEqual([
      { type: 'tool_result', tool_use_id: 'tu_b', content: '[exit code 0]' },
      { type: 'tool_result', tool_use_id: 'tu_c', content: expect.stringContaining('Not run') as unknown, is_error: true },
      { type: 'text', text: 'never mind' },
    ]);

    const sink2 = new CollectingSink();
    const second = await new HarnessLoop({ model, driver, sandbox, sink: sink2 }).run({
      agent,
      history: first.history,
      responses: { custom_tool_results: { tu_c: { content: '{"status":"shipped"}' } } },
    });
    expect(second.stop_reason).toEqual({ type: 'end_turn' });
    const sent = model.requests[1]!.messages.at(-1)!;
    expect(sent.content).toEqual([
      { type: 'tool_result', tool_use_id: 'tu_b', content: '[exit code 0]' },
      { type: 'tool_result', tool_use_id: 'tu_c', content: '{"status":"shipped"}' },
    ]);
    await driver.destroy(session.id);
  });

  it('always_ask tools wait for confirmation; deny is reported to the model and not executed; allow executes', async () => {
    const session = newSession();
    const sandbox = await driver.ensure(session, {});
    await driver.writeFiles(sandbox, [{ path: 'cfg.txt', data: Buffer.from('mode=safe\n') }]);
    const model = new ScriptedModel([
      [toolUse('tu_e1', 'edit', { path: 'cfg.txt', old_string: 'safe', new_string: 'unsafe' }), end('tool_use')],
      [{ type: 'text_delta', text: 'Understood, not changed.' }, end('end_turn')],
      [toolUse('tu_e2', 'edit', { path: 'cfg.txt', old_string: 'safe', new_string: 'fast' }), end('tool_use')],
      [{ type: 'text_delta', text: 'Changed.' }, end('end_turn')],
    ]);
    const loop = (sink: SessionEventSink): HarnessLoop => new HarnessLoop({ model, driver, sandbox, sink });
    const s1 = new CollectingSink();
    const r1 = await loop(s1).run({ agent, history: [user('make it unsafe')] });
    expect(r1.stop_reason).toEqual({ type: 'requires_action', tool_use_ids: ['tu_e1'] });
    expect(s1.events.find((e) => e.type === 'agent.tool_use')?.payload).toMatchObject({ blocking: true, awaiting: 'tool_confirmation' });

    const s2 = new CollectingSink();
    const r2 = await loop(s2).run({ agent, history: r1.history, responses: { confirmations: { tu_e1: 'deny' } } });
    expect(r2.stop_reason).toEqual({ type: 'end_turn' });
    expect(s2.events[0]).toMatchObject({ type: 'agent.tool_result', payload: { tool_use_id: 'tu_e1', is_error: true, denied: true } });
    expect(model.requests[1]!.messages.at(-1)!.content[0]).toMatchObject({ type: 'tool_result', tool_use_id: 'tu_e1', is_error: true });
    expect((await driver.exec(sandbox, ['cat', 'cfg.txt'])).stdout).toBe('mode=safe\n');

    const r3 = await loop(new CollectingSink()).run({ agent, history: [...r2.history, user('make it fast')] });
    expect(r3.stop_reason.type).toBe('requires_action');
    const r4 = await loop(new CollectingSink()).run({ agent, history: r3.history, responses: { confirmations: { tu_e2: 'allow' } } });
    expect(r4.stop_reason).toEqual({ type: 'end_turn' });
    expect((await driver.exec(sandbox, ['cat', 'cfg.txt'])).stdout).toBe('mode=fast\n');
    await driver.destroy(session.id);
  });

  it('interrupt kills a running sleep 600 inside the sandbox within bounded time', async () => {
    const session = newSession();
    const sandbox = await driver.ensure(session, {});
    const model = new ScriptedModel([[toolUse('tu_s', 'bash', { command: 'sleep 600' }), end('tool_use')]]);
    const sink = new CollectingSink();
    const controller = new AbortController();
    const running = new HarnessLoop({ model, driver, sandbox, sink }).run({ agent, history: [user('wait')], signal: controller.signal });
    // Wait until the sleep runs in the sandbox, then interrupt.
    for (let i = 0; i < 50; i++) {
      const ps = await driver.exec(sandbox, ['ps', '-eo', 'args']);
      if (ps.stdout.includes('sleep 600')) break;
      await new Promise((r) => setTimeout(r, 50));
    }
    const interruptedAt = Date.now();
    controller.abort();
    const outcome = await running;
    expect(Date.now() - interruptedAt).toBeLessThan(5_000);
    expect(outcome.stop_reason).toEqual({ type: 'interrupted' });
    expect(sink.events.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ tool_use_id: 'tu_s', interrupted: true, is_error: true });
    expect(sink.last()).toMatchObject({ type: 'session.status_idle', payload: { stop_reason: { type: 'interrupted' } } });
    expect((await driver.exec(sandbox, ['ps', '-eo', 'args'])).stdout).not.toContain('sleep 600');
    await driver.destroy(session.id);
  });

  it('interrupt stops a model step that is still streaming', async () => {
    const session = newSession();
    const sandbox = await driver.ensure(session, {});
    const model = new ScriptedModel([
      async function* (_req, signal) {
        yield { type: 'text_delta', text: 'thinking very slowly' } as ModelStreamEvent;
        await new Promise<void>((resolve) => signal.addEventListener('abort', () => resolve(), { once: true }));
        throw new DOMException('aborted', 'AbortError');
      },
    ]);
    const sink = new CollectingSink();
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 100);
    const outcome = await new HarnessLoop({ model, driver, sandbox, sink }).run({ agent, history: [user('hi')], signal: controller.signal });
    expect(outcome.stop_reason).toEqual({ type: 'interrupted' });
    expect(sink.types()).toEqual(['session.status_idle']);
    await driver.destroy(session.id);
  });

  it('reports a tool killed by the memory limit to the model and in the event', async () => {
    const session = newSession();
    const sandbox = await driver.ensure(session, { memory_mib: 64 });
    const model = new ScriptedModel([
      [toolUse('tu_m', 'bash', { command: 'x=$(head -c 300000000 /dev/zero | tr "\\0" a); echo survived' }), end('tool_use')],
      [{ type: 'text_delta', text: 'Too big.' }, end('end_turn')],
    ]);
    const sink = new CollectingSink();
    const outcome = await new HarnessLoop({ model, driver, sandbox, sink }).run({ agent, history: [user('allocate')] });
    expect(outcome.stop_reason).toEqual({ type: 'end_turn' });
    const result = sink.events.find((e) => e.type === 'agent.tool_result');
    expect(result?.payload).toMatchObject({ oom_killed: true, is_error: true });
    expect(JSON.stringify(model.requests[1]!.messages.at(-1))).toContain('exceeded the sandbox memory limit');
    await driver.destroy(session.id);
  });

  it('enforces max_duration_seconds over the Run', async () => {
    const session = newSession();
    const sandbox = await driver.ensure(session, {});
    const model = new ScriptedModel([[toolUse('tu_d', 'bash', { command: 'sleep 30' }), end('tool_use')]]);
    const sink = new CollectingSink();
    const started = Date.now();
    const outcome = await new HarnessLoop({ model, driver, sandbox, sink }).run({ agent, history: [user('slow')], max_duration_seconds: 1 });
    expect(outcome.stop_reason).toEqual({ type: 'max_duration' });
    expect(Date.now() - started).toBeLessThan(6_000);
    await driver.destroy(session.id);
  });

  it('surfaces model errors as a typed HarnessError', async () => {
    const session = newSession();
    const sandbox = await driver.ensure(session, {});
    const model = new ScriptedModel([[{ type: 'error', error: { type: 'model.platform_capacity_reached', message: 'busy', retryable: true } }]]);
    const err = await new HarnessLoop({ model, driver, sandbox, sink: new CollectingSink() }).run({ agent, history: [user('hi')] }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(HarnessError);
    expect(err).toMatchObject({ reason: 'model_error', retryable: true });
    await driver.destroy(session.id);
  });
});
