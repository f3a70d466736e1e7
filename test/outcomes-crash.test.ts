import { describe, expect, it } from 'vitest';
import { existsSync } from 'node:fs';
import { Job, Queue } from 'bullmq';
import { Redis } from 'ioredis';
import type { HttpClient } from '@agentplane/client';
import { queuePrefix, RUN_QUEUE } from '@agentplane/lease';
import { waitFor } from './harness/platform.js';
import { useCrashPlatforms } from './harness/crash-platform.js';
import { developerWorkspace, FAST_LEASES, SCRIPT, untilEvents, type Json, type TurnEvent } from './harness/turns.js';

/**
 * The API dies inside a `user.define_outcome` (crash point `outcome-define-committed`): after the
 * define's commit, before the outcome's first Run reaches its queue. The commit started the turn
 * (the thread running, the Run queued with the define as its input, announced to the enqueue
 * outbox first), so the scheduler's enqueue repair puts the Run in its queue: the outcome goes on
 * with no client retry. (Before, the first turn was started by a second step, and the outcome
 * stayed `working` on an idle thread until a retry under the same Idempotency-Key, at least a
 * minute later, repaired it.) First with no runner (the Run waits in its queue: the repair's own
 * work, seen exactly), then with one (the outcome runs to its end). Last, a define in a new
 * Session's `initial_events`: the create commits the initial events with the outcome and its turn
 * the same way (before, it appended them and wrote the outcome after, so a crash between the two
 * left a define with no outcome).
 */
const crash = useCrashPlatforms('outcomes-crash');

async function log(api: HttpClient, sessionId: string): Promise<TurnEvent[]> {
  const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id ?? '';
  return (await api.get<{ data: TurnEvent[] }>(`/v1/sessions/${sessionId}/threads/${thread}/events`, { limit: 1000 })).data;
}

describe('a crash inside a user.define_outcome', () => {
  it('after its commit, before its Run is queued: the outcome\'s first turn reaches its queue by itself', async () => {
    const c = await crash.start(['outcome-define-committed'], { runner: false, scheduler: true, env: { ...FAST_LEASES, LOG_LEVEL: 'warn', ENQUEUE_REPAIR_AFTER_MS: '500' } });
    const { p } = c;
    const marker = c.marker('outcome-define-committed');
    const { api, principal, envId } = await developerWorkspace(p, 'outcome-crash');
    const s = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default', system: SCRIPT([{ then: [{ reply: 'Done.' }] }]) }, environment_id: envId });
    const apiBefore = p.pids().api;

    // The API dies while it answers the define: the request gets no answer.
    const define = {
      type: 'user.define_outcome',
      payload: { description: 'Write the report.', rubric: '- The report exists', authored_by: principal, caused_by: { kind: 'api' } },
    };
    await expect(api.post(`/v1/sessions/${s.id}/events`, define)).rejects.toThrow();
    expect(existsSync(marker)).toBe(true);
    await c.apiRestarted(apiBefore);

    // The repair enqueues the outcome's first Run: it gets its pool.
    const runs = () => api.get<{ data: (Json & { id: string; status: string; runner_pool_id?: string; input_event_ids?: string[] })[] }>(`/v1/sessions/${s.id}/runs`);
    const queued = await waitFor('the first Run in its queue', async () => {
      const r = (await runs().catch(() => ({ data: [] }))).data[0];
      return r?.runner_pool_id ? r : undefined;
    }, 60_000);
    // Queued, or waiting for a runner (there is none).
    expect(['queued', 'waiting']).toContain(queued.status);
    expect((await runs()).data).toHaveLength(1);

    // Written whole by the define's commit: the define, the outcome's start and the turn's start
    // (then the Run's wait for a runner).
    const events = await log(api, s.id);
    const defineEvent = events.find((e) => e.type === 'user.define_outcome');
    expect(events.slice(0, 3).map((e) => e.type)).toEqual(['user.define_outcome', 'session.outcome_started', 'session.status_running']);
    expect(events.filter((e) => e.type === 'user.define_outcome' || e.type === 'session.outcome_started' || e.type === 'session.status_running')).toHaveLength(3);
    expect(events[2]?.payload).toMatchObject({ run_id: queued.id, input_event_ids: [defineEvent?.id] });
    expect(queued.input_event_ids).toEqual([defineEvent?.id]);
    const thread = (await api.get<{ data: { status: string }[] }>(`/v1/sessions/${s.id}/threads`)).data[0];
    expect(thread?.status).toBe('running');

    // The job waits in the pool's queue for a runner.
    const conn = new Redis(p.redisUrl(), { maxRetriesPerRequest: null });
    const queue = new Queue(RUN_QUEUE, { connection: conn, prefix: queuePrefix(String(queued.runner_pool_id)) });
    try {
      const job = await Job.fromId(queue, queued.id);
      expect(job ? await job.getState() : 'absent').toMatch(/^(waiting|prioritized|delayed)$/);
    } finally {
      await queue.close();
      conn.disconnect();
    }

    // The outcome holds the thread: a second define is refused, and writes nothing.
    const again = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: { ...define, payload: { ...define.payload, description: 'Another.' } } });
    expect(again.status).toBe(409);
    expect((await log(api, s.id)).filter((e) => e.type === 'user.define_outcome')).toHaveLength(1);
  }, 180_000);

  it('with a runner: the outcome runs its turn, is graded and ends satisfied', async () => {
    const t = await crash.startTurn(['outcome-define-committed'], { name: 'outcome-crash-runner', env: { LOG_LEVEL: 'warn', ENQUEUE_REPAIR_AFTER_MS: '500' } });
    const marker = t.marker('outcome-define-committed');
    const s = await t.api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default', system: SCRIPT([{ then: [{ reply: 'Done.' }] }]) }, environment_id: t.envId });
    const apiBefore = t.p.pids().api;
    const rubric = `- The report exists\n\n\`\`\`scripted\n${JSON.stringify({ rules: [{ then: [{ verdict: 'satisfied' }] }] })}\n\`\`\`\n`;
    await expect(t.api.post(`/v1/sessions/${s.id}/events`, {
      type: 'user.define_outcome', payload: { description: 'Write the report.', rubric, authored_by: t.principal, caused_by: { kind: 'api' } },
    })).rejects.toThrow();
    expect(existsSync(marker)).toBe(true);
    await t.apiRestarted(apiBefore);
    const events = await waitFor('the outcome\'s end', () => untilEvents(t.api, s.id, (e) => e.some((x) => x.type === 'session.outcome_ended'), 5_000).catch(() => undefined), 120_000);
    expect(events.find((e) => e.type === 'session.outcome_ended')?.payload).toMatchObject({ result: 'satisfied', evaluation_count: 1, revision_count: 0 });
    // One agent turn (the define's) and one grader Run.
    const runs = (await t.api.get<{ data: (Json & { grader?: unknown })[] }>(`/v1/sessions/${s.id}/runs`)).data;
    expect(runs.map((r) => (r.grader ? 'grader' : 'turn')).sort()).toEqual(['grader', 'turn']);
    expect(events.filter((e) => e.type === 'user.define_outcome')).toHaveLength(1);
  }, 240_000);

  it('in a new Session\'s initial_events: the create\'s one commit holds the events, the outcome and its turn, which goes on by itself', async () => {
    const t = await crash.startTurn(['outcome-define-committed'], { name: 'outcome-crash-create', env: { LOG_LEVEL: 'warn', ENQUEUE_REPAIR_AFTER_MS: '500' } });
    const marker = t.marker('outcome-define-committed');
    const apiBefore = t.p.pids().api;
    const rubric = `- The report exists\n\n\`\`\`scripted\n${JSON.stringify({ rules: [{ then: [{ verdict: 'satisfied' }] }] })}\n\`\`\`\n`;
    const by = { authored_by: t.principal, caused_by: { kind: 'api' } };
    // The API dies while it answers the create: the request gets no answer.
    await expect(t.api.post('/v1/sessions', {
      agent: { name: 'a', model: 'default', system: SCRIPT([{ then: [{ reply: 'Done.' }] }]) }, environment_id: t.envId,
      initial_events: [{ type: 'user.message', payload: { content: 'Some context first.', ...by } }, { type: 'user.define_outcome', payload: { description: 'Write the report.', rubric, ...by } }],
    }, { idempotencyKey: 'outcome-crash-create' })).rejects.toThrow();
    expect(existsSync(marker)).toBe(true);
    await t.apiRestarted(apiBefore);
    // The Session was listed before its commit: found without the lost answer.
    const listed = await waitFor('the Session listed', async () => (await t.api.get<{ data: { id: string }[] }>('/v1/sessions').catch(() => ({ data: [] }))).data[0], 30_000);
    const events = await waitFor('the outcome\'s end', () => untilEvents(t.api, listed.id, (e) => e.some((x) => x.type === 'session.outcome_ended'), 5_000).catch(() => undefined), 120_000);
    expect(events.find((e) => e.type === 'session.outcome_ended')?.payload).toMatchObject({ result: 'satisfied', evaluation_count: 1, revision_count: 0 });
    // Written whole by the create's commit: the initial events, the outcome's start and its first
    // turn, whose input is both initial events.
    expect(events.slice(0, 4).map((e) => e.type)).toEqual(['user.message', 'user.define_outcome', 'session.outcome_started', 'session.status_running']);
    expect(events[3]?.payload).toMatchObject({ input_event_ids: [events[0]?.id, events[1]?.id] });
    expect(events.filter((e) => e.type === 'user.define_outcome' || e.type === 'session.outcome_started')).toHaveLength(2);
    // One agent turn (the define's) and one grader Run; one Session.
    const runs = (await t.api.get<{ data: (Json & { grader?: unknown })[] }>(`/v1/sessions/${listed.id}/runs`)).data;
    expect(runs.map((x) => (x.grader ? 'grader' : 'turn')).sort()).toEqual(['grader', 'turn']);
    expect((await t.api.get<{ data: unknown[] }>('/v1/sessions')).data).toHaveLength(1);
  }, 240_000);
});

describe('a crash inside an archive', () => {
  it('after the archive\'s write, before its outcome ended: the close sweep ends the outcome, then closes the Session', async () => {
    const t = await crash.startTurn(['session-archived'], { name: 'outcome-crash-archive', env: { LOG_LEVEL: 'warn', ENQUEUE_REPAIR_AFTER_MS: '500' } });
    const question = { questions: [{ question: 'Which colour?', options: ['red', 'blue'] }] };
    const s = await t.api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'asker', model: 'default', tools: [{ type: 'builtin', name: 'ask_user' }], system: SCRIPT([{ then: [{ tool: 'ask_user', input: question }] }]) },
      environment_id: t.envId,
    });
    const rubric = `- The report exists\n\n\`\`\`scripted\n${JSON.stringify({ rules: [{ then: [{ verdict: 'satisfied' }] }] })}\n\`\`\`\n`;
    await t.api.post(`/v1/sessions/${s.id}/events`, {
      type: 'user.define_outcome', payload: { description: 'Pick a colour.', rubric, authored_by: t.principal, caused_by: { kind: 'api' } },
    });
    // The outcome's turn waits on the question.
    await untilEvents(t.api, s.id, (e) => e.some((x) => x.type === 'session.status_idle'), 60_000);
    // The API dies after the archive's write, before the outcome's end: the request gets no answer.
    const apiBefore = t.p.pids().api;
    await expect(t.api.post(`/v1/sessions/${s.id}/archive`, {})).rejects.toThrow();
    expect(existsSync(t.marker('session-archived'))).toBe(true);
    await t.apiRestarted(apiBefore);
    // No archive is sent again: the scheduler's sweep ends the outcome, then writes the terminal event.
    const events = await waitFor('the terminal event', () => untilEvents(t.api, s.id, (e) => e.some((x) => x.type === 'session.status_canceled'), 5_000).catch(() => undefined), 60_000);
    const types = events.map((e) => e.type);
    expect(events.filter((e) => e.type === 'session.outcome_ended').map((e) => e.payload)).toEqual([expect.objectContaining({ result: 'interrupted', reason: 'the session was archived' })]);
    expect(types.indexOf('session.outcome_ended')).toBeLessThan(types.indexOf('session.status_canceled'));
  }, 240_000);
});
