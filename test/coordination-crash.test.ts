import { beforeAll, describe, expect, it } from 'vitest';
import { existsSync, rmSync } from 'node:fs';
import { waitFor } from './harness/platform.js';
import { useCrashPlatforms, type CrashTurnPlatform } from './harness/crash-platform.js';
import { SCRIPT, type TurnEvent } from './harness/turns.js';

/**
 * The process answering a coordinator's delegation use dies after it marked the wait answered and
 * before it reported it to the scheduler (crash point `delegation-answered`, `AGENTPLANE_CRASH_AT`):
 * the answer is in the log and on the thread, but nothing continued the coordinator's turn. The
 * supervisor restarts the process, the turn end it was handling is repeated (the runner sends its
 * unanswered completion again, the scheduler replays the completed job), and the repeat reports
 * the answered wait generation: the coordinator continues, in exactly one Run. Once where the
 * coordinator's own turn end answers its `start_thread` use, once where a child's turn end answers
 * the coordinator's `wait_threads` use.
 */
const crash = useCrashPlatforms('coordination-crash');
let t: CrashTurnPlatform;
let marker: string;
let worker: { id: string; version: number };

beforeAll(async () => {
  t = await crash.startTurn(['delegation-answered'], { name: 'coordination-crash', env: { RUNNER_MAX_SLOTS: '4' } });
  marker = t.marker('delegation-answered');
  worker = await t.api.post<{ id: string; version: number }>('/v1/agents', {
    name: 'worker', model: 'default',
    system: SCRIPT([
      { when: { user_contains: 'slow' }, then: [{ sleep_ms: 10_000 }, { reply: 'finished {{user}}' }] },
      { when: { on: 'user' }, then: [{ reply: 'finished {{user}}' }] },
    ]),
  });
}, 180_000);

interface Thread { id: string; parent_thread_id: string | null; status: string }
interface Run { id: string; session_thread_id: string; status: string }

/** A coordinator Session over the worker; its script is the test's. */
async function coordinator(rules: unknown[]): Promise<{ session: string; primary: string }> {
  const agent = await t.api.post<{ id: string }>('/v1/agents', {
    name: 'lead', model: 'default', system: SCRIPT(rules), multiagent: { roster: [{ agent_id: worker.id, version: worker.version }] },
  });
  const s = await t.api.post<{ id: string }>('/v1/sessions', { agent: agent.id, environment_id: t.envId });
  return { session: s.id, primary: (await threads(s.id))[0]?.id ?? '' };
}

const threads = async (session: string) => (await t.api.get<{ data: Thread[] }>(`/v1/sessions/${session}/threads`)).data;
/** A thread's log, over plain requests (a stream would end with the API serving it). */
const events = async (session: string, thread: string) =>
  (await t.api.get<{ data: TurnEvent[] }>(`/v1/sessions/${session}/threads/${thread}/events`, { limit: 1000 })).data.filter((e) => e.session_thread_id === thread);
const runsOf = async (session: string, thread: string) =>
  (await t.api.get<{ data: Run[] }>(`/v1/sessions/${session}/runs`, { limit: 100 })).data.filter((r) => r.session_thread_id === thread);
const stops = (evs: TurnEvent[]) => evs.filter((e) => e.type === 'session.status_idle').map((e) => (e.payload.stop_reason as { type: string }).type);

/** The thread's events once it has ended `turns` turns (read again while the API restarts). */
const ended = (session: string, thread: string, turns: number) => waitFor(`${turns} turns of ${thread} ended`, async () => {
  const evs = await events(session, thread).catch(() => []);
  return stops(evs).length >= turns ? evs : undefined;
}, 120_000);

/** The coordinator continued once per wait generation, and nothing was written twice. */
async function continuedOnce(session: string, primary: string, evs: TurnEvent[], turns: number): Promise<void> {
  expect(evs.filter((e) => e.type === 'session.status_running')).toHaveLength(turns);
  expect(new Set(evs.map((e) => e.seq)).size).toBe(evs.length);
  const results = evs.filter((e) => e.type === 'agent.tool_result').map((e) => String(e.payload.tool_use_id));
  expect(new Set(results).size).toBe(results.length);
  expect(results).toHaveLength(evs.filter((e) => e.type === 'agent.tool_use').length);
  const runs = await runsOf(session, primary);
  expect(runs.map((r) => r.status)).toEqual(Array<string>(turns).fill('succeeded'));
}

describe('a crash after a delegation use was answered, before the answer was reported', () => {
  it('in the coordinator\'s own turn end (start_thread): its repeat continues the coordinator, once', async () => {
    const apiBefore = t.p.pids().api;
    const c = await coordinator([
      { when: { on: 'user' }, then: [{ tool: 'start_thread', input: { agent: 'worker', task: 'alpha' } }] },
      { when: { after_tool: 'start_thread' }, then: [{ reply: 'started: {{tool_result}}' }] },
      { then: [{ reply: 'unexpected: {{tool_results}}' }] },
    ]);
    await t.api.post(`/v1/sessions/${c.session}/events`, t.msg('delegate'));

    const evs = await ended(c.session, c.primary, 2);
    expect(existsSync(marker)).toBe(true);
    expect(t.p.pids().api).not.toBe(apiBefore);
    expect(stops(evs)).toEqual(['requires_action', 'end_turn']);
    const reply = evs.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload)).join(' ');
    expect(reply).toContain('started:');
    expect(reply).not.toContain('unexpected');
    // One child, started once; it runs its own turn.
    const children = (await threads(c.session)).filter((x) => x.parent_thread_id === c.primary);
    expect(children).toHaveLength(1);
    expect(stops(await ended(c.session, children[0]!.id, 1))).toEqual(['end_turn']);
    await continuedOnce(c.session, c.primary, await events(c.session, c.primary), 2);
  }, 240_000);

  it('in a child\'s turn end (wait_threads): its repeat continues the coordinator, once', async () => {
    const c = await coordinator([
      { when: { on: 'user' }, then: [{ tool: 'start_thread', input: { agent: 'worker', task: 'slow beta' } }] },
      { when: { after_tool: 'start_thread' }, then: [{ tool: 'wait_threads', input: { session_thread_ids: '{{each_tool_result.session_thread_id}}' } }] },
      { when: { after_tool: 'wait_threads' }, then: [{ reply: 'combined: {{tool_result}}' }] },
      { then: [{ reply: 'unexpected: {{tool_results}}' }] },
    ]);
    await t.api.post(`/v1/sessions/${c.session}/events`, t.msg('delegate'));
    // The start was answered (and passed the crash point, whose marker the first test left) once
    // the coordinator's second Run runs: the next delegation answer to reach it dies there.
    await waitFor('the coordinator continued after its start', async () =>
      (await events(c.session, c.primary)).filter((e) => e.type === 'session.status_running').length >= 2 || undefined, 60_000);
    rmSync(marker);
    const pidsBefore = t.p.pids();

    const evs = await ended(c.session, c.primary, 3);
    expect(existsSync(marker)).toBe(true);
    // Whichever process ended the child's turn first died there (the API on the runner's completion, or the scheduler replaying it).
    expect(['api', 'scheduler'].some((name) => t.p.pids()[name] !== pidsBefore[name])).toBe(true);
    expect(stops(evs)).toEqual(['requires_action', 'requires_action', 'end_turn']);
    const [child] = (await threads(c.session)).filter((x) => x.parent_thread_id === c.primary);
    const childEvents = await events(c.session, child!.id);
    expect(stops(childEvents)).toEqual(['end_turn']);
    // The child's end answered the wait: the coordinator waited on it before the child finished.
    const idles = evs.filter((e) => e.type === 'session.status_idle');
    const childIdle = childEvents.find((e) => e.type === 'session.status_idle')!;
    expect(idles[1]!.seq).toBeLessThan(childIdle.seq);
    const waited = evs.find((e) => e.type === 'agent.tool_result' && e.payload.tool_use_id === evs.filter((x) => x.type === 'agent.tool_use')[1]?.payload.id);
    expect(waited!.seq).toBeGreaterThan(childIdle.seq);
    const reply = evs.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload)).join(' ');
    expect(reply).toContain('combined:');
    expect(reply).toContain('finished slow beta');
    await continuedOnce(c.session, c.primary, evs, 3);
  }, 240_000);
});
