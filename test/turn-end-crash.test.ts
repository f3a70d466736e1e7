import { describe, expect, it } from 'vitest';
import { existsSync } from 'node:fs';
import type { HttpClient } from '@agentplane/client';
import { waitFor } from './harness/platform.js';
import { useCrashPlatforms } from './harness/crash-platform.js';
import { SCRIPT, untilEvents, type TurnEvent } from './harness/turns.js';

/**
 * A process dies inside a turn's end, at the points recovery must repair (named crash points,
 * `AGENTPLANE_CRASH_AT`): the API after the runner's completion is on the BullMQ job but before
 * the Run or the thread records it, and then whichever process repeats the end (the API the
 * runner sends its unanswered completion to again, or the scheduler, whose reconciliation
 * replays the completed job) after it wrote the Run `succeeded` but before the thread; the API
 * after the turn's end (the Run `succeeded`, the thread idle and its `session.status_idle`, all
 * written by one script) but before the queued message starts; or the API after it checked the
 * completion's fence, before the job moved to completed (the job still active under the lease).
 * The supervisor restarts what died; the runner sends its completion again and the scheduler's
 * reconciliation replays a finished job, and the turn end completes: one `session.status_idle`
 * per turn, the queued message runs, no event twice, and the finished turn never runs again.
 */
const crash = useCrashPlatforms('turn-end-crash');

const AGENT = {
  name: 'a', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
  system: SCRIPT([
    { when: { user_contains: 'first' }, then: [{ tool: 'bash', input: { command: 'sleep 1; echo one' } }] },
    { when: { user_contains: 'second' }, then: [{ reply: 'reply two' }] },
    { when: { on: 'tool_result' }, then: [{ reply: 'reply one: {{tool_result}}' }] },
  ]),
};

/** The whole log, read over plain requests (a stream would end with the API it is served by). */
async function log(api: HttpClient, sessionId: string): Promise<TurnEvent[]> {
  const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id ?? '';
  return (await api.get<{ data: TurnEvent[] }>(`/v1/sessions/${sessionId}/threads/${thread}/events`, { limit: 1000 })).data;
}

function noDuplicates(events: TurnEvent[]): void {
  expect(new Set(events.map((e) => e.id)).size).toBe(events.length);
  expect(new Set(events.map((e) => e.seq)).size).toBe(events.length);
}

/** Where a crash point is met: in one process, or in whichever repeats the end first. */
type CrashedIn = 'api' | 'scheduler' | 'api or scheduler';

async function crashInsideTurnEnd(points: { point: string; process: CrashedIn }[], env: Record<string, string> = {}): Promise<void> {
  const name = points.map((p) => p.point).join('+');
  const t = await crash.startTurn(points.map((p) => p.point), { name: `crash-${name}`, env });
  const pidsBefore = t.p.pids();
  const s = await t.api.post<{ id: string }>('/v1/sessions', { agent: AGENT, environment_id: t.envId });
  await t.api.post(`/v1/sessions/${s.id}/events`, t.msg('first'));
  await untilEvents(t.api, s.id, (e) => e.some((x) => x.type === 'agent.tool_use'));
  // Queued behind the running turn: the turn end that the crash cuts short must start it.
  await t.api.post(`/v1/sessions/${s.id}/events`, t.msg('second'));

  const events = await waitFor('both turns ended', async () => {
    const e = await log(t.api, s.id).catch(() => []);
    return e.filter((x) => x.type === 'session.status_idle').length >= 2 ? e : undefined;
  }, 90_000);
  for (const p of points) {
    expect(existsSync(t.marker(p.point))).toBe(true);
    const processes = p.process === 'api or scheduler' ? ['api', 'scheduler'] : [p.process];
    expect(processes.some((name) => t.p.pids()[name] !== pidsBefore[name])).toBe(true);
  }
  // The first turn ran once: its tool once, no attempt lost and run again.
  expect(events.filter((e) => e.type === 'agent.tool_use')).toHaveLength(1);
  expect(events.some((e) => e.type === 'session.thread_status_rescheduled')).toBe(false);
  const idles = events.filter((e) => e.type === 'session.status_idle');
  expect(idles.map((e) => (e.payload.stop_reason as { type: string }).type)).toEqual(['end_turn', 'end_turn']);
  const replies = events.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload));
  expect(replies).toHaveLength(2);
  expect(replies[0]).toContain('reply one');
  expect(replies[1]).toContain('reply two');
  // The second turn starts after the first one's end, never before it.
  const firstIdle = events.indexOf(idles[0] as TurnEvent);
  expect(events.findIndex((e) => e.type === 'session.status_running' && events.indexOf(e) > 0)).toBeGreaterThan(-1);
  expect(events.slice(firstIdle).some((e) => e.type === 'session.status_running')).toBe(true);
  noDuplicates(events);

  const thread = (await t.api.get<{ data: { id: string; status: string }[] }>(`/v1/sessions/${s.id}/threads`)).data[0];
  expect(thread?.status).toBe('idle');
  // The first turn was ended by the reconciliation's replay, which then removed its job; the
  // second ended normally: a later read finds nothing added.
  const again = await log(t.api, s.id);
  expect(again.filter((e) => e.type === 'session.status_idle')).toHaveLength(2);
  noDuplicates(again);
}

describe('a crash inside a turn end', () => {
  it('after the job completed, before the Run and the thread; then the repeat of the end, after the Run is written succeeded: the turn ends and the queued message starts', async () => {
    await crashInsideTurnEnd([{ point: 'run-completed', process: 'api' }, { point: 'run-succeeded-written', process: 'api or scheduler' }]);
  }, 180_000);

  it('after the completion\'s fence was checked, before the job moved to completed: the runner sends the completion again, and the turn ends once without running again', async () => {
    // The lease outlives the API's restart and the runner's reconnect (its backoff can reach
    // seconds, and a loaded machine restarts the API slowly), as a production lease does: the
    // lease is kept, not lost and run again.
    await crashInsideTurnEnd([{ point: 'lease-complete-checked', process: 'api' }], { LEASE_MS: '60000' });
  }, 180_000);

  it('after the Run is succeeded and the thread idle with session.status_idle appended, before the queued message: it starts once', async () => {
    await crashInsideTurnEnd([{ point: 'turn-end-written', process: 'api' }]);
  }, 180_000);
});
