import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import type { HttpClient } from '@agentplane/client';
import { SessionStore, ThreadRuntime, recordOnlyTurnScheduler } from '@agentplane/domain';
import type { Platform } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnEvent } from './harness/turns.js';

/**
 * `ask_user` and `user.question_answer` with the scripted model and a real runner: the thread idles
 * `requires_action` on the question; the answer resumes it exactly once under the wait-generation
 * rules of tool results and confirmations.
 */
let p: Platform;
let api: HttpClient;
let principal: string;
let envId: string;
let msg: (content: string) => { type: 'user.message'; payload: Json };
let redis: Redis;
let store: SessionStore;

beforeAll(async () => {
  ({ p, api, principal, envId, msg } = await startTurnPlatform({ name: 'questions' }));
  redis = new Redis(p.redisUrl());
  store = new SessionStore(redis);
}, 120_000);
afterAll(async () => {
  redis?.disconnect();
  await p?.stop();
});

const errType = (r: { body: unknown }) => (r.body as { error?: { type?: string } }).error?.type;
const errMsg = (r: { body: unknown }) => (r.body as { error?: { message?: string } }).error?.message ?? '';

const QUESTION = { questions: [{ question: 'Which colour?', options: ['red', 'blue'], allow_other: true }, { question: 'Why?' }] };
const AGENT = SCRIPT([
  { when: { user_contains: 'colour' }, then: [{ tool: 'ask_user', input: QUESTION }] },
  { when: { after_tool: 'ask_user' }, then: [{ reply: 'Noted. {{tool_result}}' }] },
]);

async function session(environmentId = envId): Promise<string> {
  return (await api.post<{ id: string }>('/v1/sessions', {
    agent: { name: 'asker', model: 'default', system: AGENT, tools: [{ type: 'builtin', name: 'ask_user' }] }, environment_id: environmentId,
  })).id;
}

const answer = (toolUseId: string, payload: Json) => ({
  type: 'user.question_answer', payload: { tool_use_id: toolUseId, authored_by: principal, caused_by: { kind: 'api' }, ...payload },
});
const send = (id: string, body: unknown) => api.request<Json>('POST', `/v1/sessions/${id}/events`, { body });
const idleOf = (e: TurnEvent[], n: number) => e.filter((x) => x.type === 'session.status_idle')[n]?.payload.stop_reason as Json | undefined;

describe('questions', () => {
  it('a question with options idles requires_action; the answer resumes the turn once; a replay returns the original', async () => {
    const id = await session();
    await api.post(`/v1/sessions/${id}/events`, msg('pick a colour'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    const use = first.find((e) => e.type === 'agent.tool_use');
    expect(use?.payload).toMatchObject({ name: 'ask_user', blocking: true, awaiting: 'question_answer', input: QUESTION });
    const toolUseId = String(use?.payload.id);
    expect(idleOf(first, 0)).toEqual({ type: 'requires_action', tool_use_ids: [toolUseId] });

    // The wrong kind of answer is refused.
    const wrongKind = await send(id, { type: 'user.custom_tool_result', payload: { tool_use_id: toolUseId, result: 'x', authored_by: principal, caused_by: { kind: 'api' } } });
    expect(wrongKind.status).toBe(409);
    expect(errType(wrongKind)).toBe('runtime.invalid_transition');
    expect(errMsg(wrongKind)).toContain('user.question_answer');
    // Exactly one of answers and declined.
    const both = await send(id, answer(toolUseId, { answers: [{ text: 'x' }], declined: true }));
    expect(both.status).toBe(400);
    expect(errType(both)).toBe('validation.malformed');
    // A reason is a decline's: beside answers it is refused, not dropped unread.
    const reasonWithAnswers = await send(id, answer(toolUseId, { answers: [{ selected: ['blue'] }, { text: 'calm' }], reason: 'because' }));
    expect([reasonWithAnswers.status, errType(reasonWithAnswers)]).toEqual([400, 'validation.malformed']);
    expect(errMsg(reasonWithAnswers)).toContain('reason');

    const body = answer(toolUseId, { answers: [{ selected: ['blue'] }, { text: 'calm' }] });
    const ok = await send(id, body);
    expect(ok.status).toBe(201);
    const replay = await send(id, body);
    expect(replay.status).toBe(200);
    expect(replay.body).toEqual(ok.body);
    // The same answer naming the thread it answered (left implicit the first time) is the same answer.
    const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${id}/threads`)).data[0]?.id;
    const named = await send(id, { ...body, payload: { ...body.payload, session_thread_id: thread } });
    expect([named.status, named.body]).toEqual([200, ok.body]);
    const other = await send(id, answer(toolUseId, { answers: [{ selected: ['red'] }, { text: 'calm' }] }));
    expect(other.status).toBe(409);
    expect(errType(other)).toBe('validation.conflict');

    const all = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(idleOf(all, 1)).toEqual({ type: 'end_turn' });
    const reply = all.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload)).join(' ');
    expect(reply).toContain('1. blue');
    expect(reply).toContain('2. calm');
    // Resumed exactly once: one continuation Run.
    const runs = await api.get<{ data: Json[] }>(`/v1/sessions/${id}/runs`);
    expect(runs.data).toHaveLength(2);
    expect(runs.data.filter((r) => r.continues_run_id)).toHaveLength(1);
    expect(all.filter((e) => e.type === 'user.question_answer')).toHaveLength(1);
  });

  it('the colocated topology asks and resumes the same way', async () => {
    const env = await api.post<{ id: string }>('/v1/environments', {
      name: 'colocated', image: 'agentplane/sandbox:latest', harness_topology: 'colocated',
      resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    });
    const id = await session(env.id);
    await api.post(`/v1/sessions/${id}/events`, msg('pick a colour'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    const use = first.find((e) => e.type === 'agent.tool_use');
    expect(use?.payload).toMatchObject({ name: 'ask_user', blocking: true, awaiting: 'question_answer' });
    expect(idleOf(first, 0)).toMatchObject({ type: 'requires_action' });
    expect((await send(id, answer(String(use?.payload.id), { answers: [{ selected: ['red'] }, { text: 'warm' }] }))).status).toBe(201);
    const all = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(idleOf(all, 1)).toEqual({ type: 'end_turn' });
    expect(JSON.stringify(all.filter((e) => e.type === 'agent.message'))).toContain('1. red');
  });

  it('a stale answer (an older wait generation) is refused', async () => {
    const s = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'idle', model: 'default', tools: [{ type: 'builtin', name: 'ask_user' }] }, environment_id: envId });
    const doc = await store.get(p.bootstrap.workspace_id, s.id);
    const runtime = new ThreadRuntime(store, () => recordOnlyTurnScheduler);
    const wait = (t: string) => runtime.endTurn(doc, doc._primary_thread_id, { type: 'requires_action', tool_use_ids: [t] }, [{ tool_use_id: t, kind: 'question' }]);
    await wait('toolu_q1');
    await wait('toolu_q2');
    const stale = await send(s.id, answer('toolu_q1', { answers: [{ text: 'late' }] }));
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('runtime.invalid_transition');
    const current = await send(s.id, answer('toolu_q2', { declined: true }));
    expect(current.status).toBe(201);
  });

  it('after the Session is archived, an exact replay of an answer returns the original; a new answer is refused', async () => {
    const s = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'idle', model: 'default', tools: [{ type: 'builtin', name: 'ask_user' }] }, environment_id: envId });
    const doc = await store.get(p.bootstrap.workspace_id, s.id);
    const runtime = new ThreadRuntime(store, () => recordOnlyTurnScheduler);
    await runtime.endTurn(doc, doc._primary_thread_id, { type: 'requires_action', tool_use_ids: ['toolu_a1', 'toolu_a2'] },
      [{ tool_use_id: 'toolu_a1', kind: 'question' }, { tool_use_id: 'toolu_a2', kind: 'question' }]);
    const body = answer('toolu_a1', { answers: [{ selected: ['blue'] }] });
    const ok = await send(s.id, body);
    expect(ok.status).toBe(201);
    expect((await api.request('POST', `/v1/sessions/${s.id}/archive`, { body: {} })).status).toBe(200);
    const replay = await send(s.id, body);
    expect([replay.status, replay.body]).toEqual([200, ok.body]);
    // Not a replay: another answer to the answered wait, an answer to the open one, a message.
    for (const other of [answer('toolu_a1', { answers: [{ selected: ['red'] }] }), answer('toolu_a2', { declined: true }), msg('more')]) {
      const r = await send(s.id, other);
      expect([r.status, errType(r), errMsg(r)]).toEqual([409, 'runtime.invalid_transition', expect.stringContaining('the session is archived')]);
    }
    expect((await store.log.range(s.id, 0, 100)).filter((e) => e.type === 'user.question_answer')).toHaveLength(1);
  });

  it('user.interrupt ends the wait on a question: the turn ends interrupted, a late answer is no longer current, the next message runs a new turn', async () => {
    const id = (await api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'asker', model: 'default', tools: [{ type: 'builtin', name: 'ask_user' }],
        system: SCRIPT([
          { when: { user_contains: 'colour' }, then: [{ tool: 'ask_user', input: QUESTION }] },
          { when: { user_contains: 'instead' }, then: [{ reply: 'fresh turn; before: {{tool_results}}' }] },
        ]),
      },
      environment_id: envId,
    })).id;
    await api.post(`/v1/sessions/${id}/events`, msg('pick a colour'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    const toolUseId = String(first.find((e) => e.type === 'agent.tool_use')?.payload.id);
    expect(idleOf(first, 0)).toEqual({ type: 'requires_action', tool_use_ids: [toolUseId] });

    // The Run that asked has ended, so nothing runs to be stopped: the interrupt ends the wait.
    expect((await send(id, { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } })).status).toBe(201);
    const ended = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(idleOf(ended, 1)).toEqual({ type: 'interrupted' });
    expect(ended.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ tool_use_id: toolUseId, is_error: true, interrupted: true });
    const late = await send(id, answer(toolUseId, { answers: [{ selected: ['red'] }, { text: 'late' }] }));
    expect([late.status, errType(late)]).toEqual([409, 'runtime.invalid_transition']);
    expect(errMsg(late)).toContain('no longer current');

    // The next message starts a new turn (not a continuation), and the model reads the use closed.
    await api.post(`/v1/sessions/${id}/events`, msg('something else instead'));
    const all = await untilEvents(api, id, (e) => idleCount(e) >= 3);
    expect(idleOf(all, 2)).toEqual({ type: 'end_turn' });
    expect(JSON.stringify(all.filter((e) => e.type === 'agent.message'))).toContain('fresh turn; before: Interrupted by user.interrupt');
    const runs = (await api.get<{ data: Json[] }>(`/v1/sessions/${id}/runs`)).data;
    expect(runs.map((r) => [r.status, r.continues_run_id ?? null])).toEqual([['succeeded', null], ['succeeded', null]]);
  });

  it('a declined question is reported to the agent', async () => {
    const id = await session();
    await api.post(`/v1/sessions/${id}/events`, msg('pick a colour'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    const toolUseId = String(first.find((e) => e.type === 'agent.tool_use')?.payload.id);
    expect((await send(id, answer(toolUseId, { declined: true, reason: 'no time' }))).status).toBe(201);
    const all = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    const result = all.find((e) => e.type === 'agent.tool_result');
    expect(result?.payload).toMatchObject({ tool_use_id: toolUseId, content: 'The user declined to answer: no time', is_error: false });
    expect(JSON.stringify(all.filter((e) => e.type === 'agent.message'))).toContain('declined to answer: no time');
  });

  it('a question in a child thread is answered by session_thread_id', async () => {
    const id = await session();
    const doc = await store.get(p.bootstrap.workspace_id, id);
    const child = await store.spawnChild(doc);
    // The same conversation in both threads asks with the same tool_use_id.
    await api.post(`/v1/sessions/${id}/events`, { ...msg('pick a colour'), payload: { ...msg('pick a colour').payload, session_thread_id: child.id } });
    await untilEvents(api, id, (e) => idleCount(e) >= 1);
    await api.post(`/v1/sessions/${id}/events`, msg('pick a colour'));
    const both = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    // The Session stream is the condensed view: a child's tool use is read from the child's thread.
    const childUses = (await api.get<{ data: typeof both }>(`/v1/sessions/${id}/threads/${child.id}/events`)).data.filter((e) => e.type === 'agent.tool_use');
    expect(both.filter((e) => e.type === 'agent.tool_use' && e.session_thread_id === child.id)).toEqual([]);
    const uses = [...childUses, ...both.filter((e) => e.type === 'agent.tool_use')];
    expect(uses.map((u) => u.session_thread_id)).toEqual([child.id, doc._primary_thread_id]);
    const toolUseId = String(uses[0]?.payload.id);
    expect(uses[1]?.payload.id).toBe(toolUseId);

    const ambiguous = await send(id, answer(toolUseId, { answers: [{ selected: ['red'] }, { text: 'child' }] }));
    expect(ambiguous.status).toBe(400);
    expect(errMsg(ambiguous)).toContain('session_thread_id');
    const ok = await send(id, answer(toolUseId, { answers: [{ selected: ['red'] }, { text: 'child' }], session_thread_id: child.id }));
    expect(ok.status).toBe(201);
    expect(ok.body.session_thread_id).toBe(child.id);
    const all = await untilEvents(api, id, (e) => idleCount(e) >= 3);
    const third = all.filter((e) => e.type === 'session.status_idle')[2];
    expect(third?.session_thread_id).toBe(child.id);
    expect(third?.payload.stop_reason).toEqual({ type: 'end_turn' });
    // The primary still waits on its own question.
    const primary = await api.get<{ status: string }>(`/v1/sessions/${id}/threads/${doc._primary_thread_id}`);
    expect(primary.status).toBe('idle');
    const again = await send(id, answer(toolUseId, { answers: [{ selected: ['blue'] }, { text: 'primary' }] }));
    expect(again.status).toBe(201);
    expect(again.body.session_thread_id).toBe(doc._primary_thread_id);
  });

  it('an ActionPolicy can forbid questions: the use is refused and nothing waits', async () => {
    const policy = await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'deny', tool: { kind: 'builtin', name: 'ask_user' }, description: 'no one to answer' });
    try {
      const id = await session();
      await api.post(`/v1/sessions/${id}/events`, msg('pick a colour'));
      const evs = await untilEvents(api, id, (e) => idleCount(e) >= 1);
      expect(evs.find((e) => e.type === 'agent.tool_use')?.payload).toMatchObject({ name: 'ask_user', blocking: false });
      expect(evs.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ denied: true, is_error: true, policy_rule_id: policy.id });
      expect(idleOf(evs, 0)).toEqual({ type: 'end_turn' });
    } finally {
      await p.root.delete(`/v1/action-policies/${policy.id}`);
    }
  });
});
