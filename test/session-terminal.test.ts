import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WebSocket } from 'ws';
import { HttpClient } from '@agentplane/client';
import { frame, MODEL_GATEWAY_PROTOCOL } from '@agentplane/protocol';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { useCrashPlatforms } from './harness/crash-platform.js';
import { connectRawRunner, dockerHello, pairedRunnerSecret, type RawRunner, type RunnerFrame } from './harness/raw-runner.js';
import { developerWorkspace, SCRIPT, untilEvents, type TurnEvent } from './harness/turns.js';

/**
 * An archived Session's terminal status event (`session.status_completed`, `_canceled` or
 * `_failed`, by how its primary thread's last turn ended): written once, when no turn is under
 * way any more (at the archive, or at the end of its last turn), and always the Session's last
 * status event. The runner is a protocol client written here, so each turn ends when the test
 * says. A crash between the archive and its close leaves the close to the scheduler's sweep, and
 * a wait answered in between continues no turn.
 */
let p: Platform;
let api: HttpClient;
let runner: RawRunner<Frame>;
let principal = '';
let envId = '';
const sockets: WebSocket[] = [];
const crash = useCrashPlatforms('session-terminal');

type Frame = RunnerFrame<Record<string, unknown>>;
const TERMINAL = ['session.status_completed', 'session.status_canceled', 'session.status_failed'];
const STATUS = /^session\.(status_|thread_status_)/;

const drive = (type: 'user.message' | 'user.interrupt', content?: string) => ({
  type, payload: { ...(content !== undefined ? { content } : {}), authored_by: principal, caused_by: { kind: 'api' } },
});

const nextFrame = (r: RawRunner<Frame>, type: string, after = 0): Promise<Frame> =>
  waitFor(type, () => r.frames.slice(after).find((f) => f.type === type), 15_000);

/** A Session whose turn is leased to the test's runner and running: its lease and Run. */
async function runningTurn(): Promise<{ sessionId: string; runId: string; ref: { lease_id: string; attempt: number } }> {
  const before = runner.frames.length;
  const s = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: envId });
  await api.post(`/v1/sessions/${s.id}/events`, drive('user.message', 'hi'));
  const offer = await nextFrame(runner, 'lease.offer', before);
  expect(offer.payload.session_id).toBe(s.id);
  const runId = String(offer.payload.run_id);
  const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
  runner.sock.send(frame('lease.accept', `a-${runId}`, ref));
  await waitFor('the Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status === 'running' ? true : undefined), 10_000);
  return { sessionId: s.id, runId, ref };
}

async function endTurn(t: { runId: string; ref: { lease_id: string; attempt: number } }, stop: string): Promise<void> {
  runner.sock.send(frame('lease.complete', `c-${t.runId}`, { ...t.ref, result: { stop_reason: { type: stop } } }));
  await waitFor('the Run ended', async () => ((await api.get<{ status: string }>(`/v1/runs/${t.runId}`)).status === 'succeeded' ? true : undefined), 10_000);
}

/**
 * The log up to a `user.interrupt` sent after everything else (an archived Session records one
 * even with nothing to stop): what came before it is the whole log as it will stay.
 */
async function settledLog(on: HttpClient, sessionId: string): Promise<TurnEvent[]> {
  const last = await on.post<{ id: string }>(`/v1/sessions/${sessionId}/events`, drive('user.interrupt'));
  const events = await untilEvents(on, sessionId, (e) => e.some((x) => x.id === last.id), 20_000);
  expect(events.at(-1)?.id).toBe(last.id);
  return events;
}

/** The terminal event is there once, after every other status event. */
function terminalOf(events: TurnEvent[]): TurnEvent {
  const terminal = events.filter((e) => TERMINAL.includes(e.type));
  expect(terminal).toHaveLength(1);
  const t = terminal[0] as TurnEvent;
  const lastStatus = events.filter((e) => STATUS.test(e.type)).at(-1);
  expect(lastStatus?.id).toBe(t.id);
  expect(t.session_thread_id ?? null).toBeNull();
  return t;
}

beforeAll(async () => {
  p = await startPlatform({ scheduler: true, runner: false, env: { LOG_LEVEL: 'warn' } });
  ({ api, principal, envId } = await developerWorkspace(p, 'terminal'));
  runner = await connectRawRunner<Frame>(p, await pairedRunnerSecret(p, principal, 'terminal-box'), dockerHello([MODEL_GATEWAY_PROTOCOL], { slots: 4 }));
  sockets.push(runner.sock);
}, 120_000);

afterAll(async () => {
  for (const s of sockets) s.terminate();
  await p?.stop();
});

describe('an archived Session\'s terminal status event', () => {
  it('archived when idle: session.status_completed at once, once, as its last status event', async () => {
    const t = await runningTurn();
    await endTurn(t, 'end_turn');
    expect((await api.request('POST', `/v1/sessions/${t.sessionId}/archive`)).status).toBe(200);
    const [done] = (await untilEvents(api, t.sessionId, (e) => e.some((x) => TERMINAL.includes(x.type)), 15_000)).filter((e) => TERMINAL.includes(e.type));
    expect(done?.type).toBe('session.status_completed');
    expect(done?.payload.stop_reason).toEqual({ type: 'end_turn' });
    // The archive again (retry-safe) writes nothing more; a message is refused.
    expect((await api.request('POST', `/v1/sessions/${t.sessionId}/archive`)).status).toBe(200);
    expect((await api.request('POST', `/v1/sessions/${t.sessionId}/events`, { body: drive('user.message', 'more') })).status).toBe(409);
    terminalOf(await settledLog(api, t.sessionId));
  }, 60_000);

  it('archived mid-turn: nothing until the turn ends; interrupted, the Session ends session.status_canceled after the turn\'s idle', async () => {
    const t = await runningTurn();
    expect((await api.request('POST', `/v1/sessions/${t.sessionId}/archive`)).status).toBe(200);
    const before = runner.frames.length;
    await api.post(`/v1/sessions/${t.sessionId}/events`, drive('user.interrupt'));
    const cancel = await nextFrame(runner, 'lease.cancel', before);
    expect(cancel.payload).toMatchObject(t.ref);
    await endTurn(t, 'interrupted');
    const events = await untilEvents(api, t.sessionId, (e) => e.some((x) => TERMINAL.includes(x.type)), 15_000);
    const idle = events.findIndex((e) => e.type === 'session.status_idle');
    const terminal = events.findIndex((e) => TERMINAL.includes(e.type));
    expect(idle).toBeGreaterThan(-1);
    expect(terminal).toBeGreaterThan(idle);
    expect(events[terminal]?.type).toBe('session.status_canceled');
    expect(events[terminal]?.payload.stop_reason).toEqual({ type: 'interrupted' });
    terminalOf(await settledLog(api, t.sessionId));
  }, 60_000);

  it('a Session that never ran a turn ends session.status_completed with no stop reason', async () => {
    const s = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: envId });
    await api.post(`/v1/sessions/${s.id}/archive`, {});
    const done = terminalOf(await settledLog(api, s.id));
    expect(done.type).toBe('session.status_completed');
    expect(done.payload.stop_reason).toBeNull();
  }, 30_000);

  it('the API killed between the archive and its close: the scheduler\'s sweep writes the terminal event', async () => {
    const q = await crash.start(['session-archived'], { scheduler: true, runner: false, env: { LOG_LEVEL: 'warn', ENQUEUE_REPAIR_AFTER_MS: '500' } });
    const on = await developerWorkspace(q.p, 'terminal-crash');
    const s = await on.api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: on.envId });
    const apiBefore = q.p.pids().api;
    // The API dies after the archive's write, before the close: the request gets no answer.
    await expect(on.api.post(`/v1/sessions/${s.id}/archive`, {})).rejects.toThrow();
    await q.apiRestarted(apiBefore);
    const events = await waitFor('the terminal event', () => untilEvents(on.api, s.id, (e) => e.some((x) => TERMINAL.includes(x.type)), 5_000).catch(() => undefined), 60_000);
    expect(events.filter((e) => TERMINAL.includes(e.type)).map((e) => e.type)).toEqual(['session.status_completed']);
    expect((await on.api.get<{ archived_at: string | null }>(`/v1/sessions/${s.id}`)).archived_at).not.toBeNull();
  }, 120_000);

  it('the API killed between the archive and its close, a coordinator\'s wait answered before the sweep: no turn continues, the Session ends session.status_canceled', async () => {
    // The sweep waits long enough for the wait to be answered first (the close would end it).
    const q = await crash.startTurn(['session-archived'], { name: 'terminal-coordinator', env: { LOG_LEVEL: 'warn', ENQUEUE_REPAIR_AFTER_MS: '120000' } });
    const asker = await q.api.post<{ id: string; version: number }>('/v1/agents', {
      name: 'asker', model: 'default',
      tools: [{ type: 'custom', name: 'lookup', description: 'Ask the client', input_schema: { type: 'object', properties: { q: { type: 'string' } } } }],
      system: SCRIPT([{ when: { on: 'user' }, then: [{ tool: 'lookup', input: { q: 'x' } }] }, { when: { after_tool: 'lookup' }, then: [{ reply: 'got {{tool_result}}' }] }]),
    });
    const lead = await q.api.post<{ id: string }>('/v1/agents', {
      name: 'lead', model: 'default', multiagent: { roster: [{ agent_id: asker.id, version: asker.version }] },
      system: SCRIPT([
        { when: { on: 'user' }, then: [{ tool: 'start_thread', input: { agent: 'asker', task: 'ask' } }, { tool: 'wait_threads', input: {} }] },
        { when: { after_tool: 'wait_threads' }, then: [{ reply: 'combined: {{tool_result}}' }] },
      ]),
    });
    const s = await q.api.post<{ id: string }>('/v1/sessions', { agent: lead.id, environment_id: q.envId });
    await q.api.post(`/v1/sessions/${s.id}/events`, q.msg('go'));
    const threadEvents = async (thread: string) => (await q.api.get<{ data: TurnEvent[] }>(`/v1/sessions/${s.id}/threads/${thread}/events`, { limit: 1000 })).data;
    const waiting = (events: TurnEvent[], thread: string) => events.some((e) => e.type === 'session.status_idle' && e.session_thread_id === thread && (e.payload.stop_reason as { type: string }).type === 'requires_action');
    // The coordinator waits on wait_threads, its child on its client's answer.
    const { primary, child } = await waitFor('both threads waiting', async () => {
      const threads = (await q.api.get<{ data: { id: string; parent_thread_id: string | null }[] }>(`/v1/sessions/${s.id}/threads`)).data;
      const [p0, c0] = [threads.find((x) => x.parent_thread_id === null)?.id, threads.find((x) => x.parent_thread_id !== null)?.id];
      if (!p0 || !c0) return undefined;
      return waiting(await threadEvents(p0), p0) && waiting(await threadEvents(c0), c0) ? { primary: p0, child: c0 } : undefined;
    }, 90_000);

    // The API dies after the archive's write, before the close.
    const apiBefore = q.p.pids().api;
    await expect(q.api.post(`/v1/sessions/${s.id}/archive`, {})).rejects.toThrow();
    await q.apiRestarted(apiBefore, { client: q.api, path: `/v1/sessions/${s.id}` }, 60_000);
    // Interrupting the child settles it: the coordinator's wait_threads is answered, and its turn
    // would continue, but the Session is archived: it takes no new work.
    await q.api.post(`/v1/sessions/${s.id}/events`, { type: 'user.interrupt', payload: { session_thread_id: child, authored_by: q.principal, caused_by: { kind: 'api' } } });
    const events = await untilEvents(q.api, s.id, (e) => e.some((x) => TERMINAL.includes(x.type)), 30_000);
    expect(events.filter((e) => TERMINAL.includes(e.type)).map((e) => e.type)).toEqual(['session.status_canceled']);
    const coordinator = await threadEvents(primary);
    expect(coordinator.some((e) => e.type === 'agent.tool_result' && e.payload.delegation === true && String(e.payload.content).includes(child))).toBe(true);
    expect(coordinator.filter((e) => e.type === 'session.status_running' && e.session_thread_id === primary)).toHaveLength(1);
    const runs = (await q.api.get<{ data: { session_thread_id: string }[] }>(`/v1/sessions/${s.id}/runs`, { limit: 100 })).data;
    expect(runs.filter((r) => r.session_thread_id === primary)).toHaveLength(1);
  }, 240_000);
});
