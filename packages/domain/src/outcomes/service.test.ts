import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { ApiError, newId, nowIso } from '@agentplane/core';
import { keys, tags, type LogEvent, type Redis } from '@agentplane/store';
import type { RunDoc, SessionDoc } from '../sessions/model.js';
import { activeOutcomesKey, SessionStore } from '../sessions/store.js';
import { idleSession } from '../sessions/fixtures.test-support.js';
import type { ThreadRuntime, TurnScheduler } from '../sessions/turns.js';
import { OutcomeService, type OutcomeDoc } from './service.js';

let redis: Redis;
const testRedis = useEmbeddedRedis('outcomes');
beforeAll(() => {
  redis = testRedis();
});

/**
 * An OutcomeService whose runtime only counts the turns it is asked to start, and whose scheduler
 * records what it is told: `scheduler` lists `starting:<run>`, `queued:<run>` and `not:<run>` in order.
 */
function service(store: SessionStore): { svc: OutcomeService; turns: string[]; scheduler: string[]; queued: RunDoc[] } {
  const turns: string[] = [];
  const told: string[] = [];
  const queued: RunDoc[] = [];
  const runtime = {
    submitUserMessage: (_s: SessionDoc, _t: string, eventId: string) => {
      turns.push(eventId);
      return Promise.resolve({ run: { id: newId('run') } });
    },
  } as unknown as ThreadRuntime;
  const scheduler: TurnScheduler = {
    runStarting: (_s, runId) => Promise.resolve(void told.push(`starting:${runId}`)),
    runNotStarting: (runId) => void told.push(`not:${runId}`),
    runQueued: (run) => {
      told.push(`queued:${run.id}`);
      queued.push(run);
      return Promise.resolve();
    },
    interruptRequested: () => Promise.resolve(),
    waitsResolved: () => Promise.resolve(),
  };
  const log = { warn: () => undefined, info: () => undefined, error: () => undefined, debug: () => undefined } as never;
  return { svc: new OutcomeService({ store, runtime, scheduler: () => scheduler, log }), turns, scheduler: told, queued };
}

/** The thread's turn ends (as a runner's report would end it): idle again, no Run. */
async function endTurn(store: SessionStore, sessionId: string, threadId: string): Promise<void> {
  await store.updateThread(sessionId, threadId, (t) => ({ ...t, status: 'idle', _active_run_id: null, _running_since_ms: null }));
}

const payload = (description = 'Write the report.') => ({ description, rubric: '- The report exists', authored_by: 'prin_x', caused_by: { kind: 'api' } });

async function events(store: SessionStore, sessionId: string): Promise<LogEvent[]> {
  return store.log.range(sessionId, 0, 100);
}

describe('OutcomeService.appendDefine', () => {
  it('of two defines sent together on one idle thread, one is written with its outcome; the other is 409 and writes nothing', async () => {
    const store = new SessionStore(redis);
    const { svc } = service(store);
    const { session, threadId } = await idleSession(store);
    const thread = await store.thread(session.id, threadId);
    const rs = await Promise.allSettled([svc.appendDefine(session, thread, payload('one'), undefined), svc.appendDefine(session, thread, payload('two'), undefined)]);
    const won = rs.filter((r): r is PromiseFulfilledResult<LogEvent> => r.status === 'fulfilled');
    const lost = rs.filter((r): r is PromiseRejectedResult => r.status === 'rejected');
    expect([won.length, lost.length]).toEqual([1, 1]);
    expect(lost[0]?.reason).toBeInstanceOf(ApiError);
    expect((lost[0]?.reason as ApiError).type).toBe('runtime.invalid_transition');
    const event = won[0]?.value as LogEvent;
    const log = await events(store, session.id);
    expect(log.map((e) => e.type)).toEqual(['user.define_outcome', 'session.outcome_started', 'session.status_running']);
    expect(log[0]?.id).toBe(event.id);
    const tag = tags.session(session.id);
    const ids = await redis.zrange(keys.index(tag, 'outcomes'), 0, -1);
    expect(ids).toHaveLength(1);
    expect(await redis.hget(activeOutcomesKey(session.id), threadId)).toBe(ids[0]);
    expect(await svc.get(session.id, ids[0] ?? '')).toMatchObject({ status: 'working', define_event_id: event.id, thread_id: threadId });
    // While it works, a later define is refused too.
    await expect(svc.appendDefine(session, thread, payload('three'), undefined)).rejects.toMatchObject({ type: 'runtime.invalid_transition' });
  });

  it('a retry under the same producer key answers the original event; an outcome that is over no longer holds the thread', async () => {
    const store = new SessionStore(redis);
    const { svc, turns, queued } = service(store);
    const { session, threadId } = await idleSession(store);
    const thread = await store.thread(session.id, threadId);
    const first = await svc.appendDefine(session, thread, payload(), 'drive:k1');
    const again = await svc.appendDefine(session, thread, payload(), 'drive:k1');
    expect(again).toEqual(first);
    // The define's own commit started its turn: `defined` has nothing left to start.
    const outcome = await svc.defined(session, threadId, first);
    expect(turns).toEqual([]);
    expect(queued.map((r) => r.input_event_ids)).toEqual([[first.id]]);
    expect(outcome.first_run_id).toBe(queued[0]?.id);
    // The turn ended and the outcome with it, but its claim was left behind (as by a crash before it was cleared).
    await endTurn(store, session.id, threadId);
    await store.docs.update<OutcomeDoc>(tags.session(session.id), outcome.id, (c) => ({ ...c, status: 'ended', result: 'failed' }));
    expect(await redis.hget(activeOutcomesKey(session.id), threadId)).toBe(outcome.id);
    // Handed the thread as it was before the first define: it is read again.
    const next = await svc.appendDefine(session, thread, payload('next'), undefined);
    expect(next.id).not.toBe(first.id);
    expect(await redis.hget(activeOutcomesKey(session.id), threadId)).not.toBe(outcome.id);
    // A repeated define of the ended outcome starts nothing.
    await svc.defined(session, threadId, first);
    expect(turns).toEqual([]);
    expect(queued).toHaveLength(2);
  });

  it('starts the first turn in its own commit: the Run is announced before, queued after, and takes the queued messages first', async () => {
    const store = new SessionStore(redis);
    const { svc, scheduler, queued } = service(store);
    const { session, threadId } = await idleSession(store);
    // A message left waiting in the idle thread's queue (its start never came).
    const waiting = await store.log.append(session.id, [{ type: 'user.message', payload: { content: 'first' }, session_thread_id: threadId }]);
    const waitingId = waiting.ok ? (waiting.events[0]?.id ?? '') : '';
    await store.enqueueInput(session.id, threadId, waitingId);
    const event = await svc.appendDefine(session, await store.thread(session.id, threadId), payload(), undefined);
    const run = queued[0] as RunDoc;
    expect(run).toMatchObject({ status: 'queued', session_thread_id: threadId, input_event_ids: [waitingId, event.id] });
    // Announced once before the commit (the outbox entry the enqueue repair reads), under the Run committed.
    expect(scheduler.filter((x) => x.startsWith('starting:') || x.startsWith('queued:')).slice(-2)).toEqual([`starting:${run.id}`, `queued:${run.id}`]);
    expect(await store.queuedInputs(session.id, threadId)).toEqual([]);
    const t = await store.thread(session.id, threadId);
    expect(t).toMatchObject({ status: 'running', _active_run_id: run.id });
    expect(await store.run(session.id, run.id)).toMatchObject({ id: run.id, status: 'queued' });
    const log = await events(store, session.id);
    const running = log.find((e) => e.type === 'session.status_running');
    expect(running?.payload).toMatchObject({ run_id: run.id, input_event_ids: [waitingId, event.id] });
    // The outcome names the Run that its commit started.
    const o = await svc.active(session.id, threadId);
    expect(o).toMatchObject({ status: 'working', define_event_id: event.id, first_run_id: run.id });
  });

  it('checks the thread as the commit finds it: a thread that started a turn meanwhile is 409 and nothing is written', async () => {
    const store = new SessionStore(redis);
    const { svc, scheduler } = service(store);
    const { session, threadId } = await idleSession(store);
    const stale = await store.thread(session.id, threadId);
    // Another turn starts after the define read the thread, before its commit.
    await store.updateThread(session.id, threadId, (t) => ({ ...t, status: 'running', _active_run_id: newId('run') }));
    await expect(svc.appendDefine(session, stale, payload(), undefined)).rejects.toMatchObject({ type: 'runtime.invalid_transition' });
    expect(await events(store, session.id)).toEqual([]);
    expect(await redis.zcard(keys.index(tags.session(session.id), 'outcomes'))).toBe(0);
    expect(await redis.hget(activeOutcomesKey(session.id), threadId)).toBeNull();
    // The start announced for the refused commit was withdrawn.
    const announced = scheduler.filter((x) => x.startsWith('starting:')).map((x) => x.slice('starting:'.length));
    expect(announced).toHaveLength(1);
    expect(scheduler).toContain(`not:${announced[0] ?? ''}`);
  });
  it('the same define sent twice at once under one producer key: both answer the one event written, as a retry after it would', async () => {
    const store = new SessionStore(redis);
    const { svc, queued } = service(store);
    // Repeated: the two meet at every step of the define in one round or another (the producer
    // key's first look, the thread's check, the claim, the commit).
    for (let round = 0; round < 8; round++) {
      const { session, threadId } = await idleSession(store);
      const thread = await store.thread(session.id, threadId);
      const key = `drive:twice-${round}`;
      const [a, b] = await Promise.all([svc.appendDefine(session, thread, payload(), key), svc.appendDefine(session, thread, payload(), key)]);
      expect(b).toEqual(a);
      const log = await events(store, session.id);
      expect(log.map((e) => e.type)).toEqual(['user.define_outcome', 'session.outcome_started', 'session.status_running']);
      expect(log[0]?.id).toBe(a.id);
      expect(await redis.zcard(keys.index(tags.session(session.id), 'outcomes'))).toBe(1);
      expect(queued.filter((r) => r.session_id === session.id).map((r) => r.input_event_ids)).toEqual([[a.id]]);
    }
  });

  it('another define under another producer key, sent together, is still 409', async () => {
    const store = new SessionStore(redis);
    const { svc } = service(store);
    const { session, threadId } = await idleSession(store);
    const thread = await store.thread(session.id, threadId);
    const rs = await Promise.allSettled([svc.appendDefine(session, thread, payload('one'), 'drive:one'), svc.appendDefine(session, thread, payload('two'), 'drive:two')]);
    expect(rs.map((r) => r.status).sort()).toEqual(['fulfilled', 'rejected']);
    const lost = rs.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    expect((lost?.reason as ApiError).type).toBe('runtime.invalid_transition');
  });
});

describe('OutcomeService.defineInNewSession', () => {
  it('commits the initial events with the outcome and its first turn, which takes them all as its input', async () => {
    const store = new SessionStore(redis);
    const { svc, scheduler, queued, turns } = service(store);
    const { session, threadId } = await idleSession(store);
    const thread = await store.thread(session.id, threadId);
    const message = (content: string) => ({ type: 'user.message', payload: { content, authored_by: 'prin_x', caused_by: { kind: 'api' } } });
    const initial = [message('before'), { type: 'user.define_outcome', payload: payload() }, message('after')];
    const written = await svc.defineInNewSession(session, thread, initial, 'create:k');
    expect(written.map((e) => e.type)).toEqual(['user.message', 'user.define_outcome', 'user.message']);
    const log = await events(store, session.id);
    expect(log.map((e) => e.type)).toEqual(['user.message', 'user.define_outcome', 'user.message', 'session.outcome_started', 'session.status_running']);
    const ids = written.map((e) => e.id);
    const run = queued[0] as RunDoc;
    expect(run).toMatchObject({ status: 'queued', input_event_ids: ids });
    expect(log[4]?.payload).toMatchObject({ run_id: run.id, input_event_ids: ids });
    expect(scheduler.filter((x) => x.startsWith('starting:') || x.startsWith('queued:'))).toEqual([`starting:${run.id}`, `queued:${run.id}`]);
    expect(await store.thread(session.id, threadId)).toMatchObject({ status: 'running', _active_run_id: run.id });
    const o = await svc.active(session.id, threadId);
    expect(o).toMatchObject({ status: 'working', define_event_id: ids[1], first_run_id: run.id });
    expect(await redis.hget(activeOutcomesKey(session.id), threadId)).toBe(o?.id);
    // Nothing is left for `defined` to start.
    await svc.defined(session, threadId, written[1] as LogEvent);
    expect(turns).toEqual([]);
    // The same create's events again (its batch key): the events written, nothing more.
    const again = await svc.defineInNewSession(session, thread, initial, 'create:k');
    expect(again.map((e) => e.id)).toEqual(ids);
    expect(await events(store, session.id)).toHaveLength(5);
    expect(queued).toHaveLength(1);
  });
});

describe('OutcomeService.graded', () => {
  it('a repeated report of one grader Run (a stale grading document) starts one revision turn only', async () => {
    const store = new SessionStore(redis);
    const { svc, turns } = service(store);
    const { session, threadId } = await idleSession(store);
    const tag = tags.session(session.id);
    const now = nowIso();
    const runId = newId('run');
    const outcomeId = `outc_${'a'.repeat(32)}`;
    const grading: OutcomeDoc = {
      id: outcomeId, type: 'outcome', session_id: session.id, workspace_id: session.workspace_id, thread_id: threadId, define_event_id: newId('event'),
      description: 'Write the report.', rubric: '- The report exists', max_iterations: 3, grader_model: 'default', status: 'grading', result: null,
      evaluation_count: 0, revision_count: 0, grader_run_id: runId, current_evaluation: { id: `oeval_${'b'.repeat(32)}`, iteration: 1, started_at: now }, ended_at: null,
      version: 1, created_at: now, updated_at: now,
    };
    await store.docs.create(tag, grading, ['outcomes']);
    await redis.hset(activeOutcomesKey(session.id), threadId, outcomeId);
    const run = {
      id: runId, type: 'run', session_id: session.id, workspace_id: session.workspace_id, session_thread_id: threadId, status: 'succeeded',
      agent: session.agent, environment_id: session.environment_id, environment_version: 1, input_event_ids: [],
      grader_result: { input: { system: '', messages: [] }, output: '{"result":"needs_revision","explanation":"Bring it to version 2."}', usage: null },
      version: 1, created_at: now, updated_at: now,
    } as RunDoc;
    await store.docs.create(tag, run, ['runs']);
    // Both calls hold the document as it was before either moved it.
    const graded = (svc as unknown as { graded(s: SessionDoc, o: OutcomeDoc, r: string, stop: { type: 'end_turn' }): Promise<boolean> }).graded.bind(svc);
    expect(await graded(session, grading, runId, { type: 'end_turn' })).toBe(true);
    expect(await graded(session, grading, runId, { type: 'end_turn' })).toBe(false);
    expect(turns).toHaveLength(1);
    expect(await svc.get(session.id, outcomeId)).toMatchObject({ status: 'working', evaluation_count: 1, revision_count: 1 });
    const evs = await events(store, session.id);
    expect(evs.filter((e) => e.type === 'session.outcome_evaluation_ended').map((e) => e.id)).toEqual([turns[0]]);
    expect((await store.get(session.workspace_id, session.id)).outcome_evaluations).toHaveLength(1);
  });
});

describe('OutcomeService.turnEnded: another turn takes the thread before the grader Run', () => {
  /** An outcome at work on an idle Session's thread, which now runs another Run (`other`). */
  async function taken(store: SessionStore): Promise<{ session: SessionDoc; threadId: string; outcomeId: string; other: string }> {
    const { session, threadId } = await idleSession(store);
    const now = nowIso();
    const outcomeId = `outc_${newId('run').slice(4)}`;
    const working: OutcomeDoc = {
      id: outcomeId, type: 'outcome', session_id: session.id, workspace_id: session.workspace_id, thread_id: threadId, define_event_id: newId('event'),
      description: 'Write the report.', rubric: '- The report exists', max_iterations: 3, grader_model: 'default', status: 'working', result: null,
      evaluation_count: 0, revision_count: 0, grader_run_id: null, current_evaluation: null, ended_at: null, version: 1, created_at: now, updated_at: now,
    };
    await store.docs.create(tags.session(session.id), working, ['outcomes']);
    await redis.hset(activeOutcomesKey(session.id), threadId, outcomeId);
    // A message sent as the agent's turn ended found the thread idle and started a turn.
    const other = newId('run');
    await store.updateThread(session.id, threadId, (t) => ({ ...t, status: 'running', _active_run_id: other, _running_since_ms: Date.now(), _stop_reason: null }));
    return { session, threadId, outcomeId, other };
  }
  const ended = (store: SessionStore, sessionId: string, threadId: string, runId: string) =>
    store.updateThread(sessionId, threadId, (t) => ({ ...t, status: 'idle', _active_run_id: null, _running_since_ms: null, _ended_run_id: runId, _stop_reason: { type: 'end_turn' } }));

  it('the outcome keeps working, and the end of the turn that took the thread grades it', async () => {
    const store = new SessionStore(redis);
    const { svc, scheduler, queued } = service(store);
    const { session, threadId, outcomeId, other } = await taken(store);
    expect(await svc.turnEnded(session, threadId, newId('run'), { type: 'end_turn' })).toBe(false);
    const kept = await svc.get(session.id, outcomeId);
    expect(kept).toMatchObject({ status: 'working', result: null, grader_run_id: null, current_evaluation: null });
    // The grader Run announced to the scheduler was called off; nothing was queued.
    expect(scheduler.map((x) => x.split(':')[0])).toEqual(['starting', 'not']);
    expect(queued).toEqual([]);
    // The other turn ends: its end grades the outcome.
    await ended(store, session.id, threadId, other);
    expect(await svc.turnEnded(session, threadId, other, { type: 'end_turn' })).toBe(true);
    expect(await svc.get(session.id, outcomeId)).toMatchObject({ status: 'grading', grader_run_id: queued[0]?.id });
    expect((await events(store, session.id)).filter((e) => e.type === 'session.outcome_evaluation_started')).toHaveLength(1);
  });

  it('a turn that ended while the grading held the outcome (its end left the outcome alone) is taken up', async () => {
    const store = new SessionStore(redis);
    const { svc, queued } = service(store);
    const { session, threadId, outcomeId, other } = await taken(store);
    // The other turn ends right after the grader Run was refused the thread, before the outcome
    // went back to working: its own end found the outcome grading and did nothing.
    const startTurn = store.startTurn.bind(store);
    store.startTurn = async (...a: Parameters<SessionStore['startTurn']>) => {
      store.startTurn = startTurn;
      const r = await startTurn(...a);
      await ended(store, session.id, threadId, other);
      return r;
    };
    expect(await svc.turnEnded(session, threadId, newId('run'), { type: 'end_turn' })).toBe(true);
    expect(queued).toHaveLength(1);
    expect(await svc.get(session.id, outcomeId)).toMatchObject({ status: 'grading', grader_run_id: queued[0]?.id });
  });
});
