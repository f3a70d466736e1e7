import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { createLogger, newId } from '@agentplane/core';
import { connectRedis, keys, tags, type Redis } from '@agentplane/store';
import { SessionStore } from '../sessions/store.js';
import { recordOnlyTurnScheduler, ThreadRuntime } from '../sessions/turns.js';
import { idleSession } from '../sessions/fixtures.test-support.js';
import { CancelMarks, LeaseFence } from '@agentplane/lease';
import { RunLifecycle } from './lifecycle.js';
import type { RunAttempt, RunDoc } from '../sessions/model.js';

let redis: Redis;
let store: SessionStore;
let lifecycle: RunLifecycle;

const testRedis = useEmbeddedRedis('lifecycle');
beforeAll(async () => {
  redis = testRedis();
  store = new SessionStore(redis);
  lifecycle = new RunLifecycle(store, new ThreadRuntime(store, () => recordOnlyTurnScheduler), createLogger({ name: 'test', level: 'silent' }));
});

/** A Session whose primary thread runs a turn with attempt 1 leased. */
async function leasedTurn(): Promise<{ sessionId: string; threadId: string; runId: string }> {
  const { session, threadId } = await idleSession(store);
  const { run } = await new ThreadRuntime(store, () => recordOnlyTurnScheduler).submitUserMessage(session, threadId, newId('event'));
  if (!run) throw new Error('no turn started');
  await lifecycle.leased(session.id, run.id, { lease_id: 'lease-1', runner_id: 'runner_a', attempt: 1 });
  await lifecycle.started(session.id, run.id);
  return { sessionId: session.id, threadId, runId: run.id };
}

/** A Session whose primary thread has a queued Run, as the process that started it knows them. */
async function queuedTurn(): Promise<{ sessionId: string; threadId: string; runId: string }> {
  const { session, threadId } = await idleSession(store);
  const { run } = await new ThreadRuntime(store, () => recordOnlyTurnScheduler).submitUserMessage(session, threadId, newId('event'));
  if (!run) throw new Error('no turn started');
  return { sessionId: session.id, threadId, runId: run.id };
}

const rescheduledEvents = async (sessionId: string) =>
  (await store.log.range(sessionId, 0, 100)).filter((e) => e.type === 'session.thread_status_rescheduled');

const scriptCalls = async (): Promise<number> => {
  const stats = await redis.info('commandstats');
  return ['evalsha', 'eval'].reduce((n, c) => n + Number(new RegExp(`cmdstat_${c}:calls=(\\d+)`).exec(stats)?.[1] ?? 0), 0);
};

describe('acceptance', () => {
  const lease = { lease_id: 'lease-a', runner_id: 'runner_a', attempt: 1 };

  it('the thread\'s startup mark rides on the Run\'s move when the thread is known here; a stale guess is marked after it', async () => {
    // A first acceptance loads the scripts (a script's first run may take two calls).
    const warm = await queuedTurn();
    await lifecycle.accepted(warm.sessionId, warm.runId, lease);
    const t = await queuedTurn();
    const before = await scriptCalls();
    await lifecycle.accepted(t.sessionId, t.runId, lease);
    // The Run's move and the thread's mark: one script.
    expect((await scriptCalls()) - before).toBe(1);
    expect(await store.run(t.sessionId, t.runId)).toMatchObject({ status: 'running', attempts: [{ lease_id: 'lease-a', outcome: 'running' }] });
    const marked = await store.thread(t.sessionId, t.threadId);
    expect(marked._startup_ms).toEqual(expect.any(Number));
    expect(marked.status).toBe('running');

    // Another process changed the thread since this one wrote it: the mark's guess is stale, the
    // Run still moves, and the mark is written after it, once.
    const u = await queuedTurn();
    await new SessionStore(redis).updateThread(u.sessionId, u.threadId, (th) => ({ ...th }));
    // (Read past this process's thread guesses, which a read through the store would refresh.)
    const version = (JSON.parse((await redis.get(keys.doc(tags.session(u.sessionId), u.threadId))) ?? '{}') as { version: number }).version;
    await lifecycle.accepted(u.sessionId, u.runId, lease);
    expect((await store.run(u.sessionId, u.runId))?.status).toBe('running');
    const later = await store.thread(u.sessionId, u.threadId);
    expect(later._startup_ms).toEqual(expect.any(Number));
    expect(later.version).toBe(version + 1);
  });
});

describe('acceptance with the lease\'s fence claim', () => {
  const fence = () => new LeaseFence(redis);
  const claimOf = (t: { sessionId: string; runId: string }, token: string, runner = 'runner_a') => ({
    fence: fence(), ttlMs: 30_000, claim: { sessionId: t.sessionId, token, runnerId: runner, attempt: 1, runId: t.runId },
  });
  const lease = (token: string, runner = 'runner_a') => ({ lease_id: token, runner_id: runner, attempt: 1 });

  it('claims the fence and moves the Run (with the thread\'s startup mark) in one script', async () => {
    const warm = await queuedTurn();
    expect(await lifecycle.accepted(warm.sessionId, warm.runId, lease('tok-warm'), claimOf(warm, 'tok-warm'))).toBe('ok');
    const t = await queuedTurn();
    const before = await scriptCalls();
    expect(await lifecycle.accepted(t.sessionId, t.runId, lease('tok-1'), claimOf(t, 'tok-1'))).toBe('ok');
    expect((await scriptCalls()) - before).toBe(1);
    expect(await fence().holds(t.sessionId, 'tok-1')).toBe(true);
    expect(await store.run(t.sessionId, t.runId)).toMatchObject({ status: 'running', attempts: [{ lease_id: 'tok-1', outcome: 'running' }] });
    expect((await store.thread(t.sessionId, t.threadId))._startup_ms).toEqual(expect.any(Number));
  });

  it('a refused claim (a cancel mark, another runner\'s lease) writes nothing', async () => {
    const t = await queuedTurn();
    await new CancelMarks(redis).mark(t.sessionId, t.runId);
    expect(await lifecycle.accepted(t.sessionId, t.runId, lease('tok-c'), claimOf(t, 'tok-c'))).toBe('canceled');
    expect(await fence().holds(t.sessionId, 'tok-c')).toBe(false);
    expect((await store.run(t.sessionId, t.runId))?.status).toBe('queued');

    const u = await queuedTurn();
    expect(await fence().claim({ sessionId: u.sessionId, token: 'tok-b', runnerId: 'runner_b', attempt: 1, runId: u.runId }, 30_000)).toBe('ok');
    expect(await lifecycle.accepted(u.sessionId, u.runId, lease('tok-b'), claimOf(u, 'tok-b', 'runner_a'))).toBe('taken');
    expect((await store.run(u.sessionId, u.runId))?.status).toBe('queued');
  });

  it('a stale guess of the Run still claims once and moves it; a Run past the move gets the claim alone', async () => {
    const t = await queuedTurn();
    // Another process moved the Run since this one last wrote it: the first write is stale.
    await new RunLifecycle(store, new ThreadRuntime(store, () => recordOnlyTurnScheduler), createLogger({ name: 'test', level: 'silent' }))
      .waiting(t.sessionId, t.runId, 'every matching runner is busy or offline', 'rpool_x');
    expect(await lifecycle.accepted(t.sessionId, t.runId, lease('tok-s'), claimOf(t, 'tok-s'))).toBe('ok');
    expect(await fence().holds(t.sessionId, 'tok-s')).toBe(true);
    expect((await store.run(t.sessionId, t.runId))?.status).toBe('running');

    // Accepted again with the same lease (a repeated frame): no move, the claim is still made.
    await fence().release(t.sessionId, 'tok-s');
    expect(await lifecycle.accepted(t.sessionId, t.runId, lease('tok-s'), claimOf(t, 'tok-s'))).toBe('ok');
    expect(await fence().holds(t.sessionId, 'tok-s')).toBe(true);
  });

  it('an ended Run is never leased (a job an interrupt left behind): the claim is refused, or given back when a stale write made it', async () => {
    const other = new RunLifecycle(store, new ThreadRuntime(store, () => recordOnlyTurnScheduler), createLogger({ name: 'test', level: 'silent' }));
    const t = await queuedTurn();
    expect(await other.canceled(t.sessionId, t.runId, 'interrupted while queued', undefined, { onlyQueued: true })).toBe(true);
    expect(await lifecycle.accepted(t.sessionId, t.runId, lease('tok-e'), claimOf(t, 'tok-e'))).toBe('canceled');
    expect(await fence().holds(t.sessionId, 'tok-e')).toBe(false);
    expect((await store.run(t.sessionId, t.runId))?.status).toBe('canceled');

    // This process wrote the Run last, then another one ended it: the claim rides on a stale
    // write (the claim is made, the Run's swap refused), and is given back.
    const u = await queuedTurn();
    lifecycle.written((await store.run(u.sessionId, u.runId)) as RunDoc);
    expect(await other.canceled(u.sessionId, u.runId, 'interrupted while queued', undefined, { onlyQueued: true })).toBe(true);
    expect(await lifecycle.accepted(u.sessionId, u.runId, lease('tok-f'), claimOf(u, 'tok-f'))).toBe('canceled');
    expect(await fence().holds(u.sessionId, 'tok-f')).toBe(false);

    // Only a Run still waiting for a runner is cancelled that way: a leased one is left running.
    const v = await queuedTurn();
    expect(await lifecycle.accepted(v.sessionId, v.runId, lease('tok-g'), claimOf(v, 'tok-g'))).toBe('ok');
    expect(await other.canceled(v.sessionId, v.runId, 'interrupted while queued', undefined, { onlyQueued: true })).toBe(false);
    expect((await store.run(v.sessionId, v.runId))?.status).toBe('running');
  });
});

describe('a move that cannot be written', () => {
  const result = { stop_reason: { type: 'end_turn' as const } };

  it('fails the call (Redis unreachable), so the caller does not go on as if the end were recorded; a Run that is gone is skipped', async () => {
    const t = await leasedTurn();
    const down = connectRedis(testRedis.server().url, { name: 'test-down' });
    const downStore = new SessionStore(down);
    const cut = new RunLifecycle(downStore, new ThreadRuntime(downStore, () => recordOnlyTurnScheduler), createLogger({ name: 'test', level: 'silent' }));
    down.disconnect();
    await expect(cut.succeeded(t.sessionId, t.runId, 'lease-1', result)).rejects.toThrow();
    await expect(cut.failed(t.sessionId, t.runId, 'lease-1', { class: 'infrastructure', code: 'retries_exhausted', message: 'x' })).rejects.toThrow();
    await expect(cut.canceled(t.sessionId, t.runId, 'interrupted')).rejects.toThrow();
    expect((await store.run(t.sessionId, t.runId))?.status).toBe('running');
    // A late report of a Run that is gone (its Session deleted) is no failure.
    await expect(lifecycle.succeeded(t.sessionId, 'run_gone', null, result)).resolves.toBeUndefined();
    await expect(lifecycle.canceled(t.sessionId, 'run_gone', 'interrupted')).resolves.toBe(false);
  });
});

describe('lost leases', () => {
  it('every path that notices the loss records it, together: one event, one ended attempt', async () => {
    const t = await leasedTurn();
    const n = await Promise.all([
      lifecycle.leaseLost(t.sessionId, t.runId, 2, 'lost'),
      lifecycle.leaseLost(t.sessionId, t.runId, 2, 'lost'),
      lifecycle.rescheduled(t.sessionId, t.runId, null, 'lost').then(() => 0),
    ]);
    expect(n[0] + n[1]).toBeLessThanOrEqual(1);
    expect(await rescheduledEvents(t.sessionId)).toHaveLength(1);
    const run = await store.run(t.sessionId, t.runId);
    expect(run?.status).toBe('queued');
    expect(run?.attempts).toMatchObject([{ attempt: 1, outcome: 'lost', cause: 'lost' }]);
    expect((await store.thread(t.sessionId, t.threadId)).status).toBe('rescheduling');
    expect(await lifecycle.leaseLost(t.sessionId, t.runId, 2, 'lost')).toBe(0);
    expect(await rescheduledEvents(t.sessionId)).toHaveLength(1);
  });

  it('a repair after a crash between the event and the Run update completes it without a second event', async () => {
    const t = await leasedTurn();
    // The process died right after the append: the thread moved and the event is in the log,
    // but the attempt is still open.
    await store.updateThread(t.sessionId, t.threadId, (th) => ({ ...th, status: 'rescheduling' }));
    await store.log.append(t.sessionId, [{ type: 'session.thread_status_rescheduled', payload: {}, session_thread_id: t.threadId, producer_key: `run:${t.runId}:rescheduled:1` }]);
    expect(await lifecycle.leaseLost(t.sessionId, t.runId, 2, 'lost')).toBe(1);
    expect(await rescheduledEvents(t.sessionId)).toHaveLength(1);
    expect((await store.run(t.sessionId, t.runId))?.attempts?.[0]?.outcome).toBe('lost');
  });

  it('only attempts the lease engine is done with are ended; a later loss gets its own event', async () => {
    const t = await leasedTurn();
    expect(await lifecycle.leaseLost(t.sessionId, t.runId, 1, 'lost')).toBe(0);
    expect(await rescheduledEvents(t.sessionId)).toHaveLength(0);
    expect(await lifecycle.leaseLost(t.sessionId, t.runId, 3, 'lost')).toBe(1);
    await lifecycle.leased(t.sessionId, t.runId, { lease_id: 'lease-3', runner_id: 'runner_b', attempt: 3 });
    // A late report about attempt 1 leaves the live attempt 3 alone.
    expect(await lifecycle.leaseLost(t.sessionId, t.runId, 3, 'lost')).toBe(0);
    let run = await store.run(t.sessionId, t.runId);
    expect(run?.status).toBe('leased');
    expect(run?.attempts?.map((a) => a.outcome)).toEqual(['lost', 'running']);
    expect(await lifecycle.leaseLost(t.sessionId, t.runId, 4, 'lost')).toBe(1);
    run = await store.run(t.sessionId, t.runId);
    expect(run?.attempts?.map((a) => a.outcome)).toEqual(['lost', 'lost']);
    expect(await rescheduledEvents(t.sessionId)).toHaveLength(2);
  });

  it('an infrastructure failure reported by the gateway ends its own attempt once', async () => {
    const t = await leasedTurn();
    await lifecycle.rescheduled(t.sessionId, t.runId, 'lease-1', 'sandbox failed to start');
    await lifecycle.rescheduled(t.sessionId, t.runId, 'lease-1', 'sandbox failed to start');
    expect(await lifecycle.leaseLost(t.sessionId, t.runId, 2, 'lost')).toBe(0);
    expect(await rescheduledEvents(t.sessionId)).toHaveLength(1);
    expect((await store.run(t.sessionId, t.runId))?.attempts?.[0]).toMatchObject({ outcome: 'infrastructure_failure', cause: 'sandbox failed to start' });
  });

  it('the rescheduled event names the Run, the lost attempt and why', async () => {
    const t = await leasedTurn();
    expect(await lifecycle.leaseLost(t.sessionId, t.runId, 2, 'lease lost: the runner stopped renewing it')).toBe(1);
    expect((await rescheduledEvents(t.sessionId)).map((e) => [e.session_thread_id, e.payload])).toEqual([
      [t.threadId, { run_id: t.runId, attempt: 1, cause: 'lease lost: the runner stopped renewing it' }],
    ]);
  });

  it('an attempt its restarted runner no longer holds is recorded lost, not as a reported failure', async () => {
    const t = await leasedTurn();
    await lifecycle.abandoned(t.sessionId, t.runId, 'lease-1', 'the runner restarted without this lease');
    await lifecycle.abandoned(t.sessionId, t.runId, 'lease-1', 'the runner restarted without this lease');
    const run = await store.run(t.sessionId, t.runId);
    expect(run?.status).toBe('queued');
    expect(run?.attempts).toMatchObject([{ attempt: 1, outcome: 'lost', cause: 'the runner restarted without this lease' }]);
    expect((await store.thread(t.sessionId, t.threadId)).status).toBe('rescheduling');
    expect(await rescheduledEvents(t.sessionId)).toHaveLength(1);
  });
});

describe('a retried attempt', () => {
  const runningEvents = async (sessionId: string) =>
    (await store.log.range(sessionId, 0, 100)).filter((e) => e.type === 'session.status_running').map((e) => e.payload);

  it('runs its thread again when it starts, with session.status_running naming the attempt, once however often the start is reported', async () => {
    const t = await leasedTurn();
    expect(await lifecycle.leaseLost(t.sessionId, t.runId, 2, 'lost')).toBe(1);
    expect((await store.thread(t.sessionId, t.threadId)).status).toBe('rescheduling');
    const retry = { lease_id: 'lease-2', runner_id: 'runner_b', attempt: 2 };
    expect(await lifecycle.accepted(t.sessionId, t.runId, retry)).toBe('ok');
    const thread = await store.thread(t.sessionId, t.threadId);
    expect([thread.status, thread._active_run_id]).toEqual(['running', t.runId]);
    expect(await runningEvents(t.sessionId)).toEqual([{ run_id: t.runId, input_event_ids: expect.any(Array) }, { run_id: t.runId, attempt: 2 }]);
    // The start reported again (a repeated frame, another process): nothing more.
    await lifecycle.accepted(t.sessionId, t.runId, retry);
    await new RunLifecycle(store, new ThreadRuntime(store, () => recordOnlyTurnScheduler), createLogger({ name: 'test', level: 'silent' })).accepted(t.sessionId, t.runId, retry);
    expect(await runningEvents(t.sessionId)).toHaveLength(2);
    expect((await store.thread(t.sessionId, t.threadId)).version).toBe(thread.version);
    // Its loss reschedules the thread again, and the next attempt runs it again.
    expect(await lifecycle.leaseLost(t.sessionId, t.runId, 3, 'lost')).toBe(1);
    await lifecycle.leased(t.sessionId, t.runId, { lease_id: 'lease-3', runner_id: 'runner_a', attempt: 3 });
    await lifecycle.started(t.sessionId, t.runId);
    expect((await store.thread(t.sessionId, t.threadId)).status).toBe('running');
    expect((await runningEvents(t.sessionId)).slice(2)).toEqual([{ run_id: t.runId, attempt: 3 }]);
    expect(await rescheduledEvents(t.sessionId)).toHaveLength(2);
  });

  it('a start whose thread move a crash cut off is completed when the start is reported again', async () => {
    const t = await leasedTurn();
    expect(await lifecycle.leaseLost(t.sessionId, t.runId, 2, 'lost')).toBe(1);
    // The Run moved to running with attempt 2; the process died before the thread's move.
    const attempt: RunAttempt = { attempt: 2, lease_id: 'lease-2', runner_id: 'runner_b', leased_at: new Date().toISOString(), ended_at: null, outcome: 'running', cause: null };
    await store.docs.update<RunDoc>(tags.session(t.sessionId), t.runId, (r) => ({ ...r, status: 'running', attempts: [...(r.attempts ?? []), attempt] }));
    expect((await store.thread(t.sessionId, t.threadId)).status).toBe('rescheduling');
    expect(await lifecycle.accepted(t.sessionId, t.runId, { lease_id: 'lease-2', runner_id: 'runner_b', attempt: 2 })).toBe('ok');
    expect((await store.thread(t.sessionId, t.threadId)).status).toBe('running');
    expect((await runningEvents(t.sessionId)).slice(1)).toEqual([{ run_id: t.runId, attempt: 2 }]);
  });

  it('a first attempt\'s start appends nothing: the turn\'s start said it runs', async () => {
    const t = await queuedTurn();
    await lifecycle.accepted(t.sessionId, t.runId, { lease_id: 'lease-1', runner_id: 'runner_a', attempt: 1 });
    expect(await runningEvents(t.sessionId)).toHaveLength(1);
  });
});

describe('a Run placed before its enqueue is recorded', () => {
  it('a scheduler that says the Run waits before the api records the enqueue: both land, and the pool is known either way', async () => {
    const { session, threadId } = await idleSession(store);
    const { run } = await new ThreadRuntime(store, () => recordOnlyTurnScheduler).submitUserMessage(session, threadId, newId('event'));
    if (!run) throw new Error('no turn started');
    const pool = `rpool_${'1'.repeat(32)}`;
    // The scheduler took the job and found no runner before the api's write of the enqueue.
    await lifecycle.waiting(session.id, run.id, 'every matching runner is busy or offline', pool);
    let doc = await store.run(session.id, run.id);
    expect(doc).toMatchObject({ status: 'waiting', runner_pool_id: pool });
    // The api's write, with the Run as it created it (a stale guess): recorded all the same.
    await lifecycle.enqueued(session.id, run.id, pool, run);
    doc = await store.run(session.id, run.id);
    expect(doc?.status).toBe('waiting');
    expect(doc?.runner_pool_id).toBe(pool);
    expect(doc?.timestamps?.enqueued_at).toEqual(expect.any(String));
    // Recorded once: a repeated report changes nothing.
    const version = doc?.version;
    await lifecycle.enqueued(session.id, run.id, pool);
    expect((await store.run(session.id, run.id))?.version).toBe(version);
  });

  it('the enqueue is recorded on a Run already leased, and not on one that ended', async () => {
    const t = await leasedTurn();
    const pool = `rpool_${'2'.repeat(32)}`;
    await lifecycle.enqueued(t.sessionId, t.runId, pool);
    expect(await store.run(t.sessionId, t.runId)).toMatchObject({ status: 'running', runner_pool_id: pool });
    const ended = await leasedTurn();
    await lifecycle.canceled(ended.sessionId, ended.runId, 'interrupted');
    await lifecycle.enqueued(ended.sessionId, ended.runId, pool);
    const doc = await store.run(ended.sessionId, ended.runId);
    expect(doc?.status).toBe('canceled');
    expect(doc?.timestamps?.enqueued_at ?? null).toBeNull();
  });
});

describe('a lease\'s first events', () => {
  const message = (key: string) => [{ type: 'agent.message', payload: { content: [] }, producer_key: key }];

  it('record the Run\'s first event in the append that carries them, only when the lease holds; later ones are appended alone', async () => {
    const t = await leasedTurn();
    // No fence claimed for this token: neither the events nor the Run's first event are written.
    expect(await lifecycle.appendFirstEvents(t.sessionId, t.runId, message('k0'), { fence: 'lease-1' })).toMatchObject({ ok: false, reason: 'fenced' });
    expect((await store.run(t.sessionId, t.runId))?.timestamps?.first_event_at).toBeNull();
    const seq = (await store.log.state(t.sessionId)).seq;

    await store.log.setLease(t.sessionId, 'lease-1', Date.now() + 60_000);
    const first = await lifecycle.appendFirstEvents(t.sessionId, t.runId, message('k1'), { fence: 'lease-1' });
    expect(first.ok && first.events.map((e) => e.seq)).toEqual([seq + 1]);
    const run = await store.run(t.sessionId, t.runId);
    expect(run?.timestamps?.first_event_at).toEqual(expect.any(String));
    expect(run?.status).toBe('running');

    // Again (another batch that thought it was first): appended alone, the Run unchanged.
    const again = await lifecycle.appendFirstEvents(t.sessionId, t.runId, message('k2'), { fence: 'lease-1' });
    expect(again.ok && again.events.map((e) => e.seq)).toEqual([seq + 2]);
    expect(await store.run(t.sessionId, t.runId)).toEqual(run);

    // A Run that is gone: the events are appended alone.
    const gone = await lifecycle.appendFirstEvents(t.sessionId, 'run_gone', message('k3'), { fence: 'lease-1' });
    expect(gone.ok && gone.events.map((e) => e.seq)).toEqual([seq + 3]);
  });
});

describe('a turn\'s end', () => {
  const idles = async (sessionId: string) => (await store.log.range(sessionId, 0, 100)).filter((e) => e.type === 'session.status_idle');
  const result = { stop_reason: { type: 'end_turn' as const } };

  it('writes the Run succeeded in the turn end\'s own script when this process wrote the Run last', async () => {
    const warm = await leasedTurn();
    await lifecycle.succeeded(warm.sessionId, warm.runId, 'lease-1', result);
    const t = await leasedTurn();
    const before = await scriptCalls();
    await lifecycle.succeeded(t.sessionId, t.runId, 'lease-1', result);
    // The Run, the thread and session.status_idle: one script.
    expect((await scriptCalls()) - before).toBe(1);
    expect(await store.run(t.sessionId, t.runId)).toMatchObject({ status: 'succeeded', stop_reason: { type: 'end_turn' }, attempts: [{ lease_id: 'lease-1', outcome: 'succeeded' }] });
    expect((await store.thread(t.sessionId, t.threadId)).status).toBe('idle');
    expect(await idles(t.sessionId)).toHaveLength(1);
    // Reported again (the scheduler's reconciliation): nothing moves, nothing is appended twice.
    await lifecycle.succeeded(t.sessionId, t.runId, null, result);
    await new RunLifecycle(store, new ThreadRuntime(store, () => recordOnlyTurnScheduler), createLogger({ name: 'test', level: 'silent' })).succeeded(t.sessionId, t.runId, null, result);
    expect(await idles(t.sessionId)).toHaveLength(1);
    expect((await store.run(t.sessionId, t.runId))?.status).toBe('succeeded');
  });

  it('a Run that moved since this process wrote it writes nothing with the thread: it is ended on its own, or not at all', async () => {
    // Another process canceled the Run: its end is not written, and this end does not end the turn.
    const t = await leasedTurn();
    const other = new RunLifecycle(store, new ThreadRuntime(store, () => recordOnlyTurnScheduler), createLogger({ name: 'test', level: 'silent' }));
    await other.canceled(t.sessionId, t.runId, 'interrupted');
    const canceledThread = await store.thread(t.sessionId, t.threadId);
    await lifecycle.succeeded(t.sessionId, t.runId, 'lease-1', result);
    expect((await store.run(t.sessionId, t.runId))?.status).toBe('canceled');
    expect((await store.thread(t.sessionId, t.threadId)).version).toBe(canceledThread.version);

    // Another process wrote the Run since (its version moved; it still runs): the end is written
    // after a read, once, and the turn ends once.
    const u = await leasedTurn();
    await store.docs.update(tags.session(u.sessionId), u.runId, (r) => ({ ...r }));
    await lifecycle.succeeded(u.sessionId, u.runId, 'lease-1', result);
    expect((await store.run(u.sessionId, u.runId))?.status).toBe('succeeded');
    expect((await store.thread(u.sessionId, u.threadId)).status).toBe('idle');
    expect(await idles(u.sessionId)).toHaveLength(1);
  });

  it('a thread no longer in the Run\'s turn is not ended by it; the Run still records its end', async () => {
    const t = await leasedTurn();
    // The thread is in another Run's turn by the time this end is reported.
    await store.updateThread(t.sessionId, t.threadId, (th) => ({ ...th, _active_run_id: 'run_other' }));
    const thread = await store.thread(t.sessionId, t.threadId);
    await lifecycle.succeeded(t.sessionId, t.runId, 'lease-1', result);
    expect((await store.run(t.sessionId, t.runId))?.status).toBe('succeeded');
    expect((await store.thread(t.sessionId, t.threadId)).version).toBe(thread.version);
    expect(await idles(t.sessionId)).toHaveLength(0);
  });
});
