import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { newId } from '@agentplane/core';
import { keys, tags, type Redis } from '@agentplane/store';
import type { RunDoc } from './model.js';
import { SessionStore } from './store.js';
import { idleSession } from './fixtures.test-support.js';
import { continuable, ThreadRuntime, type TurnScheduler } from './turns.js';
import { SessionCloser } from './closing.js';

let redis: Redis;
let other: Redis;

const testRedis = useEmbeddedRedis('turns');
beforeAll(async () => {
  redis = testRedis();
  other = testRedis.connect('test:other');
});

function recording(): { scheduler: TurnScheduler; queued: RunDoc[] } {
  const queued: RunDoc[] = [];
  return {
    queued,
    scheduler: { runQueued: async (run) => void queued.push(run), interruptRequested: async () => undefined, waitsResolved: async () => undefined },
  };
}


describe('turn start', () => {
  it('records the thread, the Run and session.status_running together, and hands over the Run as written', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const { session, threadId } = await idleSession(store);
    await store.thread(session.id, threadId); // the drive path reads the thread first
    const msg = newId('event');
    const { run } = await new ThreadRuntime(store, () => rec.scheduler).submitUserMessage(session, threadId, msg);
    expect(run).toMatchObject({ status: 'queued', version: 1, input_event_ids: [msg], session_thread_id: threadId });
    expect(rec.queued).toEqual([run]);
    expect(await store.run(session.id, run?.id ?? '')).toEqual(run);
    expect(await redis.zscore(keys.index(tags.session(session.id), 'runs'), run?.id ?? '')).not.toBeNull();
    expect(await store.thread(session.id, threadId)).toMatchObject({ status: 'running', _active_run_id: run?.id, version: 2 });
    expect(await store.queuedInputs(session.id, threadId)).toEqual([]);
    const events = await store.log.range(session.id, 0, 10);
    // The start names the messages it takes (a conversation rebuilt from the log places them there).
    expect(events.map((e) => [e.type, e.payload])).toEqual([['session.status_running', { run_id: run?.id, input_event_ids: [msg] }]]);
  });

  it('a thread changed elsewhere since this process saw it: the change is made on the stored thread', async () => {
    const store = new SessionStore(redis);
    const elsewhere = new SessionStore(other);
    const rec = recording();
    const { session, threadId } = await idleSession(store);
    await store.thread(session.id, threadId); // remembered at version 1
    const first = newId('event');
    const started = await new ThreadRuntime(elsewhere, () => rec.scheduler).submitUserMessage(session, threadId, first);
    expect(started.run).not.toBeNull();
    // This process still holds version 1 (idle): its guess is stale, so no second turn starts; the
    // message waits in the input queue and the busy thread is not written.
    const second = newId('event');
    const queued = await new ThreadRuntime(store, () => rec.scheduler).submitUserMessage(session, threadId, second);
    expect(queued.run).toBeNull();
    expect(await store.thread(session.id, threadId)).toMatchObject({ status: 'running', _active_run_id: started.run?.id, version: 2 });
    expect(await store.queuedInputs(session.id, threadId)).toEqual([second]);
    expect(rec.queued.map((r) => r.id)).toEqual([started.run?.id]);
    expect((await store.log.range(session.id, 0, 10)).map((e) => e.type)).toEqual(['session.status_running']);
  });

  it('messages racing on an idle thread from two processes start exactly one turn', async () => {
    const a = new SessionStore(redis);
    const b = new SessionStore(other);
    const rec = recording();
    const { session, threadId } = await idleSession(a);
    await Promise.all([a.thread(session.id, threadId), b.thread(session.id, threadId)]);
    const ids = Array.from({ length: 6 }, () => newId('event'));
    const results = await Promise.all(ids.map((id, i) => new ThreadRuntime(i % 2 ? a : b, () => rec.scheduler).submitUserMessage(session, threadId, id)));
    const runs = results.flatMap((r) => (r.run ? [r.run] : []));
    expect(runs).toHaveLength(1);
    const t = await a.thread(session.id, threadId);
    expect(t._active_run_id).toBe(runs[0]?.id);
    expect([...(runs[0]?.input_event_ids ?? []), ...(await a.queuedInputs(session.id, threadId))].sort()).toEqual([...ids].sort());
    expect((await a.log.range(session.id, 0, 10)).map((e) => e.type)).toEqual(['session.status_running']);
    expect(await redis.zcard(keys.index(tags.session(session.id), 'runs'))).toBe(1);
  });

  it('a message submitted twice is queued once; the turn end starts everything queued, in order', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const { session, threadId } = await idleSession(store);
    const rt = new ThreadRuntime(store, () => rec.scheduler);
    const first = await rt.submitUserMessage(session, threadId, newId('event'));
    const [a, b] = [newId('event'), newId('event')];
    for (const id of [a, b, a]) expect((await rt.submitUserMessage(session, threadId, id)).run).toBeNull();
    expect(await store.queuedInputs(session.id, threadId)).toEqual([a, b]);
    const t = await rt.endTurn(session, threadId, { type: 'end_turn' });
    expect(t._active_run_id).not.toBe(first.run?.id);
    expect(rec.queued.map((r) => r.input_event_ids)).toEqual([first.run?.input_event_ids, [a, b]]);
    expect(await store.queuedInputs(session.id, threadId)).toEqual([]);
  });

  it('a thread written by an earlier version (inputs queued in the document) starts them first', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const { session, threadId } = await idleSession(store);
    const old = newId('event');
    await store.updateThread(session.id, threadId, (t) => ({ ...t, _queued_inputs: [old] }));
    const next = newId('event');
    const { run } = await new ThreadRuntime(store, () => rec.scheduler).submitUserMessage(session, threadId, next);
    expect(run?.input_event_ids).toEqual([old, next]);
    const t = await store.thread(session.id, threadId);
    expect(t._queued_inputs).toBeUndefined();
    expect(await store.queuedInputs(session.id, threadId)).toEqual([]);
  });

  it('an erased Session starts nothing', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const { session, threadId } = await idleSession(store);
    await store.log.erase(session.id);
    await expect(new ThreadRuntime(store, () => rec.scheduler).submitUserMessage(session, threadId, newId('event'))).rejects.toMatchObject({ type: 'validation.not_found' });
    expect(await store.thread(session.id, threadId)).toMatchObject({ status: 'idle', version: 1 });
    expect(await redis.zcard(keys.index(tags.session(session.id), 'runs'))).toBe(0);
    expect(rec.queued).toEqual([]);
  });

  it('the drive path: an intent recorded beside the append names the Run; a stale one (the thread turned busy) starts nothing', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const intents: string[] = [];
    const dropped: string[] = [];
    const runtime = new ThreadRuntime(store, () => ({
      ...rec.scheduler,
      // The Session comes with the intent (the scheduler takes the Run's fair-share rank beside it).
      runStarting: async (_sessionId, runId, withSession) => void intents.push(`${runId}@${withSession?.id}`),
      runNotStarting: (runId) => void dropped.push(runId),
    }));
    const { session, threadId } = await idleSession(store);
    const idle = await store.thread(session.id, threadId);
    const intent = runtime.intendStart(session, idle);
    if (!intent) throw new Error('an idle thread gets an intent');
    // As the drive path's append script: the message queued, the thread and the queue read back.
    const msg = newId('event');
    const seen = await store.enqueueInput(session.id, threadId, msg);
    const { run } = await runtime.submitUserMessage(session, threadId, msg, { queued: true, thread: seen, queue: [msg], intent });
    expect(run).toMatchObject({ id: intent.runId, input_event_ids: [msg] });
    expect(intents).toEqual([`${intent.runId}@${session.id}`]); // recorded once, before the commit
    expect(rec.queued).toEqual([run]);
    expect(dropped).toEqual([]);

    // Running now: no intent for it. One made from the stale idle copy starts nothing; the
    // message waits in the queue for the turn end, and the intent is left for the enqueue repair.
    expect(runtime.intendStart(session, await store.thread(session.id, threadId))).toBeUndefined();
    const stale = runtime.intendStart(session, idle);
    const next = newId('event');
    const busy = await store.enqueueInput(session.id, threadId, next);
    expect(await runtime.submitUserMessage(session, threadId, next, { queued: true, thread: busy, queue: [next], ...(stale ? { intent: stale } : {}) })).toEqual({ run: null });
    expect(rec.queued).toEqual([run]);
    expect(dropped).toEqual([stale?.runId]); // what was taken for it is given back at once
    expect(await store.queuedInputs(session.id, threadId)).toEqual([next]);
    expect(await redis.zcard(keys.index(tags.session(session.id), 'runs'))).toBe(1);
  });
});

describe('a job sent behind the start (TurnScheduler.sendBehind)', () => {
  /**
   * A scheduler that sends, behind each start, a read of the Run's document on the start's own
   * connection (as the lease engine sends the Run's job there): what Redis runs after the start.
   */
  function behindScheduler() {
    const rec = recording();
    const behind: { runId: string; sawRun: Promise<number>; settled?: RunDoc | null }[] = [];
    const dropped: string[] = [];
    const scheduler: TurnScheduler = {
      ...rec.scheduler,
      intentAhead: true,
      runStarting: async () => undefined,
      runNotStarting: (runId) => void dropped.push(runId),
      // The start writes the Run as the scheduler hands it back (with its enqueue recorded).
      sendBehind: (run) => ({
        run: { ...run, runner_pool_id: 'rpool_behind' },
        send: () => {
          const entry: (typeof behind)[number] = { runId: run.id, sawRun: redis.exists(keys.doc(tags.session(run.session_id), run.id)) };
          behind.push(entry);
          return async (committed) => void (entry.settled = committed);
        },
      }),
    };
    return { rec, behind, dropped, scheduler };
  }

  /** An idle Session, its thread as this process read it, and a runtime on `behindScheduler`. */
  async function idleBehind() {
    const store = new SessionStore(redis);
    // A start with something behind it is refused while Redis does not hold the commit script
    // (`unloaded`): a turn started the usual way first loads it, whatever ran before.
    const loader = await idleSession(store);
    await new ThreadRuntime(store, () => recording().scheduler).submitUserMessage(loader.session, loader.threadId, newId('event'));
    const b = behindScheduler();
    const runtime = new ThreadRuntime(store, () => b.scheduler);
    const { session, threadId } = await idleSession(store);
    return { store, b, runtime, session, threadId, idle: await store.thread(session.id, threadId) };
  }

  it('goes out before the start is answered, runs after it (the Run, as the scheduler handed it back, is there), and is settled with the Run', async () => {
    const { store, b, runtime, session, idle } = await idleBehind();
    const intent = runtime.intendStart(session, idle);
    if (!intent) throw new Error('an idle thread gets an intent');
    const started = await runtime.startWithMessage(session, idle, { type: 'user.message', payload: { content: 'hi' } }, intent);
    expect(started?.run.id).toBe(intent.runId);
    expect(b.behind.map((x) => x.runId)).toEqual([intent.runId]);
    expect(await b.behind[0]?.sawRun).toBe(1);
    // The rest (rank, enqueue record) follows the answer; runQueued is not called as well.
    await new Promise((r) => setImmediate(r));
    expect(b.behind[0]?.settled).toEqual(started?.run);
    expect(started?.run.runner_pool_id).toBe('rpool_behind');
    expect((await store.run(session.id, intent.runId))?.runner_pool_id).toBe('rpool_behind');
    expect(b.rec.queued).toEqual([]);
    expect(intent.spent).toBeUndefined();
  });

  it('behind a start that did not commit: it finds no Run, is settled with null, and the message starts under another Run id', async () => {
    const { store, b, runtime, session, threadId, idle } = await idleBehind();
    // Another process starts a turn first: this process's copy of the thread is stale.
    const first = newId('event');
    expect((await new ThreadRuntime(new SessionStore(other), () => recording().scheduler).submitUserMessage(session, threadId, first)).run).not.toBeNull();
    const intent = runtime.intendStart(session, idle);
    if (!intent) throw new Error('the stale copy is idle');
    expect(await runtime.startWithMessage(session, idle, { type: 'user.message', payload: { content: 'hi' } }, intent)).toBeNull();
    expect(await b.behind[0]?.sawRun).toBe(0);
    await new Promise((r) => setImmediate(r));
    expect(b.behind[0]?.settled).toBeNull();
    expect(b.dropped).toEqual([]); // the settle gives the rank back, not the runtime as well
    expect(intent.spent).toBe(true);
    // The caller appends and queues the message as usual: a busy thread starts nothing, and the
    // spent intent is not used again (its Run id named a job that found no Run).
    const msg = newId('event');
    const busy = await store.enqueueInput(session.id, threadId, msg);
    expect(await runtime.submitUserMessage(session, threadId, msg, { queued: true, thread: busy, queue: [msg], intent })).toEqual({ run: null });
    expect(await store.run(session.id, intent.runId)).toBeNull();
    expect(await store.queuedInputs(session.id, threadId)).toEqual([msg]);
  });
});

describe('turn end', () => {
  it('writes the thread and its session.status_idle in one script; a repeated end appends nothing more; an erased Session\'s thread is written alone', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const runtime = new ThreadRuntime(store, () => rec.scheduler);
    const { session, threadId } = await idleSession(store);
    const { run } = await runtime.submitUserMessage(session, threadId, newId('event'));
    if (!run) throw new Error('no turn started');
    const idles = async () => (await store.log.range(session.id, 0, 100)).filter((e) => e.type === 'session.status_idle');

    // The thread changed elsewhere since this process saw it: the end is made on the stored one.
    await new SessionStore(other).updateThread(session.id, threadId, (t) => ({ ...t, _startup_ms: 5 }));
    const idle = { type: 'session.status_idle', payload: { stop_reason: { type: 'end_turn' } }, session_thread_id: threadId, producer_key: `run:${run.id}:idle` };
    const end = (t: Parameters<Parameters<SessionStore['endTurnWith']>[2]>[0]) => (t.status === 'running' ? { ...t, status: 'idle' as const, _active_run_id: null } : null);
    // A message queued during the turn comes back with the end (read by its script).
    await store.enqueueInput(session.id, threadId, 'evt_queued');
    const first = await store.endTurnWith(session.id, threadId, end, idle);
    expect(first.appended).toBe(true);
    expect(first.queued).toEqual(['evt_queued']);
    expect(first.thread).toMatchObject({ status: 'idle', _startup_ms: 5 });
    expect(await idles()).toHaveLength(1);
    expect(await store.thread(session.id, threadId)).toEqual(first.thread);

    const again = await store.endTurnWith(session.id, threadId, end, idle);
    expect(again).toEqual({ thread: first.thread, appended: false });
    expect(await idles()).toHaveLength(1);

    await store.updateThread(session.id, threadId, (t) => ({ ...t, status: 'running' }));
    const seq = (await store.log.state(session.id)).seq;
    await store.log.erase(session.id);
    const erased = await store.endTurnWith(session.id, threadId, end, idle);
    expect(erased).toMatchObject({ appended: false, thread: { status: 'idle' } });
    expect((await store.log.state(session.id))).toMatchObject({ seq, erased: true });
  });
});

describe('startup time', () => {
  it('is written at the thread\'s first start only; a start of a thread known to carry it reads and writes nothing', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const runtime = new ThreadRuntime(store, () => rec.scheduler);
    const { session, threadId } = await idleSession(store);
    await runtime.submitUserMessage(session, threadId, newId('event'));
    await runtime.markStarted(session.id, threadId);
    const marked = await store.thread(session.id, threadId);
    expect(marked._startup_ms).toEqual(expect.any(Number));

    const calls = async () => {
      const stats = await redis.info('commandstats');
      return ['get', 'evalsha', 'eval'].reduce((n, c) => n + Number(new RegExp(`cmdstat_${c}:calls=(\\d+)`).exec(stats)?.[1] ?? 0), 0);
    };
    const before = await calls();
    await runtime.markStarted(session.id, threadId);
    expect(await calls()).toBe(before);

    // A process that does not know the thread reads it and leaves it as it is.
    await new ThreadRuntime(new SessionStore(other), () => rec.scheduler).markStarted(session.id, threadId);
    expect(await calls()).toBeGreaterThan(before);
    expect(await store.thread(session.id, threadId)).toEqual(marked);
  });
});

describe('an archive during a turn', () => {
  it('is seen by the turn end handed the Session as it was before: no queued message starts, and the terminal event follows', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const runtime = new ThreadRuntime(store, () => rec.scheduler);
    const { session, threadId } = await idleSession(store);
    await store.thread(session.id, threadId);
    const { run } = await runtime.submitUserMessage(session, threadId, newId('event'));
    expect(run).not.toBeNull();
    // A message queued behind the running turn, then the archive, whose close finds the turn under way.
    await store.enqueueInput(session.id, threadId, newId('event'));
    await store.archive(session.workspace_id, session.id);
    expect(await new SessionCloser(store, redis).settle(session.id)).toBe('busy');
    // The turn's end was handed the Session as read before the archive (archived_at null).
    expect(session.archived_at).toBeNull();
    await runtime.endTurn(session, threadId, { type: 'end_turn' }, [], { runId: run?.id as string, fresh: true });
    const types = (await store.log.range(session.id, 0, 20)).map((e) => e.type);
    expect(types).toEqual(['session.status_running', 'session.status_idle', 'session.status_completed']);
    expect(rec.queued).toHaveLength(1);
    expect(await store.thread(session.id, threadId)).toMatchObject({ status: 'idle', _closed: true });
  });
});

describe('the continuation rule (continuable)', () => {
  it('continues a thread idle on the Run that waited, at the answered generation, with no wait of it open, and nothing else', async () => {
    const store = new SessionStore(redis);
    const { session, threadId } = await idleSession(store);
    const base = await store.thread(session.id, threadId);
    const answered = { kind: 'custom_tool' as const, answered_event_id: 'evt_a', answer_fingerprint: null };
    const open = { kind: 'confirmation' as const, answered_event_id: null, answer_fingerprint: null };
    // Idle on run_1 at generation 2; a wait of generation 1 left open does not count.
    const waiting = { ...base, status: 'idle' as const, _active_run_id: 'run_1', _wait_generation: 2, _waits: { a: { ...answered, generation: 2 }, old: { ...open, generation: 1 } } };
    expect(continuable(waiting, 'run_1', 2)).toBe(true);
    expect(continuable({ ...waiting, _waits: { ...waiting._waits, b: { ...open, generation: 2 } } }, 'run_1', 2)).toBe(false);
    // Another Run, no Run, a generation that is no longer current (an interrupt moved it on).
    expect(continuable(waiting, 'run_2', 2)).toBe(false);
    expect(continuable(waiting, null, 2)).toBe(false);
    expect(continuable({ ...waiting, _active_run_id: null }, null, 2)).toBe(false);
    expect(continuable(waiting, 'run_1', 1)).toBe(false);
    // Continued already, terminated, or the Session closed or archived under a turn.
    expect(continuable({ ...waiting, status: 'running' }, 'run_1', 2)).toBe(false);
    expect(continuable({ ...waiting, status: 'terminated' }, 'run_1', 2)).toBe(false);
    expect(continuable({ ...waiting, _closed: true }, 'run_1', 2)).toBe(false);
    expect(continuable({ ...waiting, _archived: true }, 'run_1', 2)).toBe(false);
  });
});
