import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { type Redis } from '@agentplane/store';
import { newAgent, type Agent } from '../agents/model.js';
import { VersionedStore } from '../versioned.js';
import type { RunDoc, SessionDoc } from './model.js';
import { SessionStore } from './store.js';
import { idleSession } from './fixtures.test-support.js';
import { continuable, ThreadRuntime, type TurnScheduler } from './turns.js';

let redis: Redis;

const testRedis = useEmbeddedRedis('coordinator');
beforeAll(async () => {
  redis = testRedis();
});

/** `resolved`: the threads whose turn a report of an answered wait would continue (the scheduler's rule). */
function recording() {
  const queued: RunDoc[] = [];
  const resolved: string[] = [];
  const interrupted: string[] = [];
  const store = new SessionStore(redis);
  const scheduler: TurnScheduler = {
    runQueued: async (run) => void queued.push(run),
    interruptRequested: async (_s, threadId) => void interrupted.push(threadId),
    waitsResolved: async (sessionId, threadId, runId, generation) => {
      if (continuable(await store.thread(sessionId, threadId), runId, generation)) resolved.push(threadId);
    },
  };
  return { scheduler, queued, resolved, interrupted };
}

/** A coordinator Session over one member, its first turn running. */
async function coordinatorSession(store: SessionStore, runtime: ThreadRuntime): Promise<{ session: SessionDoc; primary: string; member: Agent }> {
  const { session: base, threadId } = await idleSession(store);
  const member = await new VersionedStore<Agent>(redis, 'agents', 'agent').create(base.workspace_id, newAgent(base.workspace_id, { name: 'worker', model: 'default' }));
  const session = await store.update(base.workspace_id, base.id, (s) => ({ ...s, agent: { ...s.agent, multiagent: { roster: [{ agent_id: member.id, version: 1 }] } } }));
  await runtime.submitUserMessage(session, threadId, 'evt_first');
  return { session, primary: threadId, member };
}

async function modelUses(store: SessionStore, session: SessionDoc, thread: string, uses: { id: string; name: string; input: unknown }[]) {
  await store.log.append(session.id, uses.map((u) => ({
    type: 'agent.tool_use', payload: { ...u, blocking: true, awaiting: 'custom_tool_result' }, session_thread_id: thread,
  })));
  return uses.map((u) => ({ tool_use_id: u.id, kind: 'custom_tool' as const }));
}

describe('coordinator', () => {
  it('starts children from the roster, answers the starts at once and the wait once every child settled (retries exhausted included)', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const runtime = new ThreadRuntime(store, () => rec.scheduler);
    const { session, primary, member } = await coordinatorSession(store, runtime);
    const waits = await modelUses(store, session, primary, [
      { id: 'toolu_s1', name: 'start_thread', input: { agent: 'worker', task: 'one' } },
      { id: 'toolu_s2', name: 'start_thread', input: { agent: 'worker', task: 'two' } },
      { id: 'toolu_w', name: 'wait_threads', input: {} },
      { id: 'toolu_bad', name: 'start_thread', input: { agent: 'nobody', task: 'x' } },
    ]);
    await runtime.endTurn(session, primary, { type: 'requires_action', tool_use_ids: waits.map((w) => w.tool_use_id) }, waits);

    const { ids } = await store.threadIds(session.id, 0, 10);
    expect(ids).toHaveLength(2);
    const children = await store.threads(session.id, ids);
    for (const c of children) {
      expect(c).toMatchObject({ parent_thread_id: primary, status: 'running', agent: { id: member.id, version: 1, name: 'worker' } });
      expect(c.agent).not.toHaveProperty('multiagent');
    }
    // Each child's Run carries the member's snapshot, not the coordinator's.
    const childRuns = rec.queued.filter((r) => r.session_thread_id !== primary);
    expect(childRuns.map((r) => r.agent.id)).toEqual([member.id, member.id]);

    let t = await store.thread(session.id, primary);
    expect(t._waits.toolu_w).toMatchObject({ kind: 'delegation', answered_event_id: null });
    expect(t._waits.toolu_s1?.answered_event_id).not.toBeNull();
    expect(t._waits.toolu_bad?.answered_event_id).not.toBeNull();
    const log = await store.log.range(session.id, 0, 100);
    const bad = log.find((e) => e.type === 'agent.tool_result' && (e.payload as { tool_use_id: string }).tool_use_id === 'toolu_bad');
    expect(bad?.payload).toMatchObject({ is_error: true });
    expect(rec.resolved).toEqual([]);

    const [one, two] = children;
    await store.log.append(session.id, [{ type: 'agent.message', payload: { content: [{ type: 'text', text: 'result one' }] }, session_thread_id: one!.id }]);
    await runtime.endTurn(session, one!.id, { type: 'end_turn' });
    expect(rec.resolved).toEqual([]);
    await runtime.retriesExhausted(session, two!.id);
    expect(rec.resolved).toEqual([primary]);
    t = await store.thread(session.id, primary);
    expect(t._waits.toolu_w?.answered_event_id).not.toBeNull();
    const answer = (await store.log.range(session.id, 0, 200)).find((e) => e.type === 'agent.tool_result' && (e.payload as { tool_use_id: string }).tool_use_id === 'toolu_w');
    const results = JSON.parse(String((answer?.payload as { content: string }).content)) as { results: { session_thread_id: string; result: string | null; stop_reason: unknown }[] };
    expect(results.results).toEqual(expect.arrayContaining([
      expect.objectContaining({ session_thread_id: one!.id, result: 'result one', stop_reason: { type: 'end_turn' } }),
      expect.objectContaining({ session_thread_id: two!.id, result: null, stop_reason: { type: 'retries_exhausted' } }),
    ]));
  });

  it('user.interrupt while the coordinator waits: the waits are answered as interrupted, its turn ends and busy children are interrupted', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const runtime = new ThreadRuntime(store, () => rec.scheduler);
    const { session, primary } = await coordinatorSession(store, runtime);
    const waits = await modelUses(store, session, primary, [
      { id: 'toolu_a', name: 'start_thread', input: { agent: 'worker', task: 'a' } },
      { id: 'toolu_w2', name: 'wait_threads', input: {} },
    ]);
    await runtime.endTurn(session, primary, { type: 'requires_action', tool_use_ids: waits.map((w) => w.tool_use_id) }, waits);
    const [child] = (await store.threadIds(session.id, 0, 10)).ids;
    await runtime.interrupt(session, primary);
    const t = await store.thread(session.id, primary);
    expect(t).toMatchObject({ status: 'idle', _active_run_id: null, _stop_reason: { type: 'interrupted' } });
    expect(rec.interrupted).toContain(child);
    expect(rec.resolved).toEqual([]);
    const idles = (await store.log.range(session.id, 0, 200)).filter((e) => e.type === 'session.status_idle' && e.session_thread_id === primary);
    expect(idles.map((e) => (e.payload as { stop_reason: { type: string } }).stop_reason.type)).toEqual(['requires_action', 'interrupted']);
  });
  it('user.interrupt of a coordinator whose waits mix delegation and client uses ends them all', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const runtime = new ThreadRuntime(store, () => rec.scheduler);
    const { session, primary } = await coordinatorSession(store, runtime);
    const waits = await modelUses(store, session, primary, [
      { id: 'toolu_a', name: 'start_thread', input: { agent: 'worker', task: 'a' } },
      { id: 'toolu_w3', name: 'wait_threads', input: {} },
      { id: 'toolu_client', name: 'lookup', input: {} },
    ]);
    await runtime.endTurn(session, primary, { type: 'requires_action', tool_use_ids: waits.map((w) => w.tool_use_id) }, waits);
    const [child] = (await store.threadIds(session.id, 0, 10)).ids;
    await runtime.interrupt(session, primary);
    const t = await store.thread(session.id, primary);
    expect(t).toMatchObject({ status: 'idle', _active_run_id: null, _stop_reason: { type: 'interrupted' } });
    expect(Object.values(t._waits).filter((w) => w.generation === t._wait_generation)).toEqual([]);
    expect(rec.interrupted).toContain(child);
    expect(rec.resolved).toEqual([]);
    const log = (await store.log.range(session.id, 0, 200)).filter((e) => e.session_thread_id === primary);
    const results = log.filter((e) => e.type === 'agent.tool_result').map((e) => e.payload as { tool_use_id: string; interrupted?: boolean });
    expect(results.filter((r) => r.interrupted).map((r) => r.tool_use_id).sort()).toEqual(['toolu_client', 'toolu_w3']);
    expect(log.filter((e) => e.type === 'session.status_idle').map((e) => (e.payload as { stop_reason: { type: string } }).stop_reason.type)).toEqual(['requires_action', 'interrupted']);
  });

  it('user.interrupt of a child that waits on its client settles it: the coordinator\'s wait_threads is answered', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const runtime = new ThreadRuntime(store, () => rec.scheduler);
    const { session, primary } = await coordinatorSession(store, runtime);
    const waits = await modelUses(store, session, primary, [
      { id: 'toolu_b', name: 'start_thread', input: { agent: 'worker', task: 'b' } },
      { id: 'toolu_w4', name: 'wait_threads', input: {} },
    ]);
    await runtime.endTurn(session, primary, { type: 'requires_action', tool_use_ids: waits.map((w) => w.tool_use_id) }, waits);
    const [child] = (await store.threadIds(session.id, 0, 10)).ids;
    await runtime.endTurn(session, child!, { type: 'requires_action', tool_use_ids: ['toolu_ask'] }, [{ tool_use_id: 'toolu_ask', kind: 'custom_tool' }]);
    expect((await store.thread(session.id, primary))._waits.toolu_w4?.answered_event_id).toBeNull();

    await runtime.interrupt(session, child!);
    expect(await store.thread(session.id, child!)).toMatchObject({ status: 'idle', _active_run_id: null, _stop_reason: { type: 'interrupted' } });
    expect(rec.resolved).toEqual([primary]);
    const answer = (await store.log.range(session.id, 0, 200)).find((e) => e.type === 'agent.tool_result' && (e.payload as { tool_use_id: string }).tool_use_id === 'toolu_w4');
    const { results } = JSON.parse(String((answer?.payload as { content: string }).content)) as { results: { session_thread_id: string; stop_reason: unknown }[] };
    expect(results).toEqual([expect.objectContaining({ session_thread_id: child, stop_reason: { type: 'interrupted' } })]);
  });
});
