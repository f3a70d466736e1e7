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

/** An OutcomeService whose runtime only counts the turns it is asked to start. */
function service(store: SessionStore): { svc: OutcomeService; turns: string[] } {
  const turns: string[] = [];
  const runtime = {
    submitUserMessage: (_s: SessionDoc, _t: string, eventId: string) => {
      turns.push(eventId);
      return Promise.resolve({ run: { id: newId('run') } });
    },
  } as unknown as ThreadRuntime;
  const scheduler = { runQueued: () => Promise.resolve(), interruptRequested: () => Promise.resolve(), waitsResolved: () => Promise.resolve() } as TurnScheduler;
  const log = { warn: () => undefined, info: () => undefined, error: () => undefined, debug: () => undefined } as never;
  return { svc: new OutcomeService({ store, runtime, scheduler: () => scheduler, log }), turns };
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
    expect((await events(store, session.id)).map((e) => e.id)).toEqual([event.id]);
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
    const { svc, turns } = service(store);
    const { session, threadId } = await idleSession(store);
    const thread = await store.thread(session.id, threadId);
    const first = await svc.appendDefine(session, thread, payload(), 'drive:k1');
    const again = await svc.appendDefine(session, thread, payload(), 'drive:k1');
    expect(again).toEqual(first);
    const outcome = await svc.defined(session, threadId, first);
    expect(turns).toEqual([first.id]);
    // The outcome ended, but its claim was left behind (as by a crash before it was cleared).
    await store.docs.update<OutcomeDoc>(tags.session(session.id), outcome.id, (c) => ({ ...c, status: 'ended', result: 'failed' }));
    expect(await redis.hget(activeOutcomesKey(session.id), threadId)).toBe(outcome.id);
    const next = await svc.appendDefine(session, thread, payload('next'), undefined);
    expect(next.id).not.toBe(first.id);
    expect(await redis.hget(activeOutcomesKey(session.id), threadId)).not.toBe(outcome.id);
    // A repeated define of the ended outcome starts nothing.
    await svc.defined(session, threadId, first);
    expect(turns).toEqual([first.id]);
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
