import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { type Redis } from '@agentplane/store';
import { newAgent, type Agent } from '../agents/model.js';
import { VersionedStore } from '../versioned.js';
import type { RunDoc, SessionDoc } from './model.js';
import { SessionStore } from './store.js';
import { idleSession } from './fixtures.test-support.js';
import { continuable, ThreadRuntime, type TurnScheduler } from './turns.js';
import { CancelMarks } from '@agentplane/lease';
import { createLogger } from '@agentplane/core';

let redis: Redis;

const testRedis = useEmbeddedRedis('coordinator');
beforeAll(async () => {
  redis = testRedis();
});

/**
 * `resolved`: the threads whose turn a report of an answered wait would continue (the scheduler's
 * rule); `reports`: every report, continuing or not.
 */
function recording() {
  const queued: RunDoc[] = [];
  const resolved: string[] = [];
  const reports: string[] = [];
  const interrupted: string[] = [];
  const store = new SessionStore(redis);
  const scheduler: TurnScheduler = {
    runQueued: async (run) => void queued.push(run),
    interruptRequested: async (_s, threadId) => void interrupted.push(threadId),
    waitsResolved: async (sessionId, threadId, runId, generation) => {
      reports.push(threadId);
      if (continuable(await store.thread(sessionId, threadId), runId, generation)) resolved.push(threadId);
    },
  };
  return { scheduler, queued, resolved, reports, interrupted };
}

/**
 * Like `recording`, but `dieAtNextReport()` makes the next report throw before it reaches the
 * scheduler: a process that died between answering a wait and reporting it.
 */
function dying(store: SessionStore) {
  const rec = recording();
  let die = false;
  const scheduler: TurnScheduler = {
    ...rec.scheduler,
    waitsResolved: async (...args) => {
      if (die) {
        die = false;
        throw new Error('died before the report');
      }
      await rec.scheduler.waitsResolved(...args);
    },
  };
  return { ...rec, scheduler, runtime: new ThreadRuntime(store, () => scheduler), dieAtNextReport: () => void (die = true) };
}

/** Whether a Session is in the coordinators' delegation outbox (any of its buckets). */
async function inDelegationOutbox(sessionId: string): Promise<boolean> {
  const buckets = await redis.keys('*delegation_outbox*');
  const scores = await Promise.all(buckets.map((k) => redis.zscore(k, sessionId)));
  return scores.some((x) => x !== null);
}

/** A store, a recording scheduler and a runtime over them, and a coordinator Session with its first turn running. */
async function coordinatorRig(store = new SessionStore(redis)) {
  const rec = recording();
  const runtime = new ThreadRuntime(store, () => rec.scheduler);
  return { store, rec, runtime, ...(await coordinatorSession(store, runtime)) };
}

/** A coordinator Session over one member, its first turn running. */
async function coordinatorSession(store: SessionStore, runtime: ThreadRuntime): Promise<{ session: SessionDoc; primary: string; member: Agent; run: string }> {
  const { session: base, threadId } = await idleSession(store);
  const member = await new VersionedStore<Agent>(redis, 'agents', 'agent').create(base.workspace_id, newAgent(base.workspace_id, { name: 'worker', model: 'default' }));
  const session = await store.update(base.workspace_id, base.id, (s) => ({ ...s, agent: { ...s.agent, multiagent: { roster: [{ agent_id: member.id, version: 1 }] } } }));
  const { run } = await runtime.submitUserMessage(session, threadId, 'evt_first');
  return { session, primary: threadId, member, run: run?.id ?? '' };
}

async function modelUses(store: SessionStore, session: SessionDoc, thread: string, uses: { id: string; name: string; input: unknown }[]) {
  await store.log.append(session.id, uses.map((u) => ({
    type: 'agent.tool_use', payload: { ...u, blocking: true, awaiting: 'custom_tool_result' }, session_thread_id: thread,
  })));
  return uses.map((u) => ({ tool_use_id: u.id, kind: 'custom_tool' as const }));
}

describe('coordinator', () => {
  it('starts children from the roster, answers the starts at once and the wait once every child settled (retries exhausted included)', async () => {
    const { store, rec, runtime, session, primary, member } = await coordinatorRig();
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
    const { store, rec, runtime, session, primary } = await coordinatorRig();
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
    const { store, rec, runtime, session, primary } = await coordinatorRig();
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
    const { store, rec, runtime, session, primary } = await coordinatorRig();
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

  it('a child\'s turn end repeated after the process died between answering wait_threads and reporting it continues the coordinator', async () => {
    const store = new SessionStore(redis);
    const rec = dying(store);
    const { session, primary, run } = await coordinatorSession(store, rec.runtime);
    const waits = await modelUses(store, session, primary, [
      { id: 'toolu_s5', name: 'start_thread', input: { agent: 'worker', task: 'five' } },
      { id: 'toolu_w5', name: 'wait_threads', input: {} },
    ]);
    await rec.runtime.endTurn(session, primary, { type: 'requires_action', tool_use_ids: waits.map((w) => w.tool_use_id) }, waits, { runId: run });
    const childRun = rec.queued.find((r) => r.session_thread_id !== primary);
    const child = childRun?.session_thread_id ?? '';
    rec.dieAtNextReport();
    await expect(rec.runtime.endTurn(session, child, { type: 'end_turn' }, [], { runId: childRun?.id ?? '' })).rejects.toThrow('died before the report');
    expect((await store.thread(session.id, primary))._waits.toolu_w5?.answered_event_id).not.toBeNull();
    expect(rec.resolved).toEqual([]);

    // The runner's completion (or the scheduler's replay of it) ends the child's turn again.
    await rec.runtime.endTurn(session, child, { type: 'end_turn' }, [], { runId: childRun?.id ?? '' });
    expect(rec.resolved).toEqual([primary]);
    const answers = (await store.log.range(session.id, 0, 200)).filter((e) => e.type === 'agent.tool_result' && e.session_thread_id === primary);
    expect(answers.map((e) => (e.payload as { tool_use_id: string }).tool_use_id).sort()).toEqual(['toolu_s5', 'toolu_w5']);
  });

  it('the coordinator\'s turn end repeated after the process died between answering its last use and reporting it continues it', async () => {
    const store = new SessionStore(redis);
    const rec = dying(store);
    const { session, primary, run } = await coordinatorSession(store, rec.runtime);
    const waits = await modelUses(store, session, primary, [{ id: 'toolu_s6', name: 'start_thread', input: { agent: 'worker', task: 'six' } }]);
    const stop = { type: 'requires_action', tool_use_ids: ['toolu_s6'] };
    rec.dieAtNextReport();
    await expect(rec.runtime.endTurn(session, primary, stop, waits, { runId: run })).rejects.toThrow('died before the report');
    expect(rec.resolved).toEqual([]);

    await rec.runtime.endTurn(session, primary, stop, waits, { runId: run });
    expect(rec.resolved).toEqual([primary]);
    // Carried out once: one child, one answer.
    expect((await store.threadIds(session.id, 0, 10)).ids).toHaveLength(1);
    const answers = (await store.log.range(session.id, 0, 200)).filter((e) => e.type === 'agent.tool_result' && e.session_thread_id === primary);
    expect(answers).toHaveLength(1);
  });

  it('a coordinator\'s turn end cut short before it carried out its delegation uses, with no repeat to come: the scheduler\'s sweep carries them out, once', async () => {
    const log = createLogger({ name: 'coordinator-test', level: 'silent' });
    let dieOnce = false;
    // The process dies right after the waits were written, before the first start (its slot count).
    class Dying extends SessionStore {
      override async threadIds(...args: Parameters<SessionStore['threadIds']>): ReturnType<SessionStore['threadIds']> {
        if (dieOnce) {
          dieOnce = false;
          throw new Error('died before carrying out');
        }
        return super.threadIds(...args);
      }
    }
    const { store, rec, runtime, session, primary, run } = await coordinatorRig(new Dying(redis));
    const waits = await modelUses(store, session, primary, [{ id: 'toolu_s9', name: 'start_thread', input: { agent: 'worker', task: 'nine' } }]);
    dieOnce = true;
    await expect(runtime.endTurn(session, primary, { type: 'requires_action', tool_use_ids: ['toolu_s9'] }, waits, { runId: run })).rejects.toThrow('died before carrying out');
    expect((await store.thread(session.id, primary))._waits.toolu_s9).toMatchObject({ kind: 'delegation', answered_event_id: null });
    expect((await store.threadIds(session.id, 0, 10)).ids).toEqual([]);

    expect(await inDelegationOutbox(session.id)).toBe(true);
    // Not before its time (a turn end still under way elsewhere is left to finish)...
    expect(await runtime.coordinator.repair(60_000, log)).not.toContain(session.id);
    expect((await store.threadIds(session.id, 0, 10)).ids).toEqual([]);
    // ...then carried out: one child, the start answered, the coordinator continued.
    expect(await runtime.coordinator.repair(0, log)).toContain(session.id);
    expect((await store.threadIds(session.id, 0, 10)).ids).toHaveLength(1);
    expect((await store.thread(session.id, primary))._waits.toolu_s9?.answered_event_id).not.toBeNull();
    // (The sweep sees to every coordinator left in the outbox, earlier tests' included.)
    expect(rec.resolved.filter((t) => t === primary)).toEqual([primary]);
    // Struck out: the outbox no longer holds it.
    expect(await inDelegationOutbox(session.id)).toBe(false);

    // A turn end that carried its uses out leaves nothing for the sweep.
    const other = await coordinatorSession(store, runtime);
    const otherWaits = await modelUses(store, other.session, other.primary, [{ id: 'toolu_s10', name: 'start_thread', input: { agent: 'worker', task: 'ten' } }]);
    await runtime.endTurn(other.session, other.primary, { type: 'requires_action', tool_use_ids: ['toolu_s10'] }, otherWaits, { runId: other.run });
    expect(await inDelegationOutbox(other.session.id)).toBe(false);
  });

  it('a start_thread whose process died mid-start, carried out again, makes one child and starts it once', async () => {
    // A death is a step that never returns: nothing after it runs in that process.
    const hang = new Promise<never>(() => undefined);
    for (const diesAt of ['the task\'s append', 'the child\'s start'] as const) {
      const store = new SessionStore(redis);
      const rec = recording();
      const dying = new ThreadRuntime(store, () => rec.scheduler);
      const { session, primary, run } = await coordinatorSession(store, dying);
      let reached: () => void = () => undefined;
      const died = new Promise<void>((resolve) => (reached = resolve));
      if (diesAt === 'the task\'s append') {
        const append = store.log.append.bind(store.log);
        store.log.append = (sessionId, events, o) => {
          if (!events.some((e) => e.producer_key?.endsWith(':task'))) return append(sessionId, events, o);
          reached();
          return hang;
        };
      } else {
        const submit = dying.submitUserMessage.bind(dying);
        dying.submitUserMessage = (s, threadId, eventId, o) => {
          if (threadId === primary) return submit(s, threadId, eventId, o);
          reached();
          return hang;
        };
      }
      const waits = await modelUses(store, session, primary, [{ id: 'toolu_s11', name: 'start_thread', input: { agent: 'worker', task: 'eleven' } }]);
      const stop = { type: 'requires_action', tool_use_ids: ['toolu_s11'] };
      void dying.endTurn(session, primary, stop, waits, { runId: run });
      await died;

      // The restarted process: the runner's completion ends the turn again.
      const again = new ThreadRuntime(new SessionStore(redis), () => rec.scheduler);
      await again.endTurn(session, primary, stop, waits, { runId: run });
      const { ids } = await store.threadIds(session.id, 0, 10);
      expect(ids, diesAt).toHaveLength(1);
      const log = await store.log.range(session.id, 0, 200);
      expect(log.filter((e) => e.type === 'user.message' && e.session_thread_id === ids[0]), diesAt).toHaveLength(1);
      expect(rec.queued.filter((r) => r.session_thread_id === ids[0]), diesAt).toHaveLength(1);
      const answers = log.filter((e) => e.type === 'agent.tool_result' && e.session_thread_id === primary);
      expect(answers.map((e) => JSON.parse(String((e.payload as { content: string }).content)) as unknown), diesAt)
        .toEqual([expect.objectContaining({ session_thread_id: ids[0], status: 'running' })]);
    }
  });

  it('two attempts of one start_thread interleaved: the child takes its task once', async () => {
    const { store, rec, runtime, session, primary, run } = await coordinatorRig();
    // Attempt A (another process) starts the child right after this attempt decided to start it.
    const other = new ThreadRuntime(new SessionStore(redis), () => rec.scheduler);
    const submit = runtime.submitUserMessage.bind(runtime);
    let raced = false;
    runtime.submitUserMessage = async (s, threadId, eventId, o) => {
      if (threadId !== primary && !raced && eventId !== null) {
        raced = true;
        await other.submitUserMessage(s, threadId, eventId);
      }
      return submit(s, threadId, eventId, o);
    };
    const waits = await modelUses(store, session, primary, [{ id: 'toolu_s12', name: 'start_thread', input: { agent: 'worker', task: 'twelve' } }]);
    await runtime.endTurn(session, primary, { type: 'requires_action', tool_use_ids: ['toolu_s12'] }, waits, { runId: run });
    expect(raced).toBe(true);
    const [child] = (await store.threadIds(session.id, 0, 10)).ids;
    expect(rec.queued.filter((r) => r.session_thread_id === child)).toHaveLength(1);
    // Nothing left queued for a second turn.
    expect(await store.queuedInputs(session.id, child ?? '')).toEqual([]);
  });

  it('a turn end with the coordinator\'s wait still open, or already continued, reports nothing more', async () => {
    const { store, rec, runtime, session, primary, run } = await coordinatorRig();
    const waits = await modelUses(store, session, primary, [
      { id: 'toolu_s7', name: 'start_thread', input: { agent: 'worker', task: 'seven' } },
      { id: 'toolu_s8', name: 'start_thread', input: { agent: 'worker', task: 'eight' } },
      { id: 'toolu_w7', name: 'wait_threads', input: {} },
    ]);
    await runtime.endTurn(session, primary, { type: 'requires_action', tool_use_ids: waits.map((w) => w.tool_use_id) }, waits, { runId: run });
    // The starts' answer was reported (the wait still open: nothing continued).
    expect([rec.reports, rec.resolved]).toEqual([[primary], []]);
    const [one, two] = rec.queued.filter((r) => r.session_thread_id !== primary);
    await runtime.endTurn(session, one!.session_thread_id, { type: 'end_turn' }, [], { runId: one!.id });
    await runtime.endTurn(session, one!.session_thread_id, { type: 'end_turn' }, [], { runId: one!.id });
    expect([rec.reports, rec.resolved]).toEqual([[primary], []]);
    await runtime.endTurn(session, two!.session_thread_id, { type: 'end_turn' }, [], { runId: two!.id });
    expect([rec.reports, rec.resolved]).toEqual([[primary, primary], [primary]]);
    // The coordinator continued: a repeat of either end finds no Run waiting, and reports nothing.
    await store.updateThread(session.id, primary, (t) => ({ ...t, status: 'running', _active_run_id: 'run_next', _running_since_ms: Date.now() }));
    await runtime.endTurn(session, two!.session_thread_id, { type: 'end_turn' }, [], { runId: two!.id });
    await runtime.endTurn(session, one!.session_thread_id, { type: 'end_turn' }, [], { runId: one!.id });
    expect(rec.reports).toEqual([primary, primary]);
  });
});

/**
 * A user.interrupt that meets a turn's end: it marks the Run, then looks for waits to end; the
 * turn's end writes its waits, then looks for a mark. Whichever looks second sees the other's
 * write, so the interrupt is never lost and no child the coordinator asked for runs on.
 */
describe('an interrupt that meets a turn ending on waits', () => {
  const toolResults = async (store: SessionStore, session: SessionDoc) =>
    (await store.log.range(session.id, 0, 200)).filter((e) => e.type === 'agent.tool_result').map((e) => e.payload as { tool_use_id: string; interrupted?: boolean });

  it('a Run marked before its end was written ends interrupted: its custom tool wait is answered as interrupted', async () => {
    const store = new SessionStore(redis);
    const rec = recording();
    const runtime = new ThreadRuntime(store, () => rec.scheduler);
    const { session, threadId } = await idleSession(store);
    const { run } = await runtime.submitUserMessage(session, threadId, 'evt_first');
    const waits = await modelUses(store, session, threadId, [{ id: 'toolu_lookup', name: 'lookup', input: {} }]);
    await new CancelMarks(redis).mark(session.id, run?.id ?? '');
    await runtime.endTurn(session, threadId, { type: 'requires_action', tool_use_ids: ['toolu_lookup'] }, waits, { runId: run?.id ?? '' });
    const t = await store.thread(session.id, threadId);
    expect(t).toMatchObject({ status: 'idle', _active_run_id: null, _stop_reason: { type: 'interrupted' } });
    expect(await toolResults(store, session)).toEqual([expect.objectContaining({ tool_use_id: 'toolu_lookup', interrupted: true })]);
  });

  it('a coordinator\'s Run marked before its end was written starts no child', async () => {
    const { store, rec, runtime, session, primary, run } = await coordinatorRig();
    const waits = await modelUses(store, session, primary, [
      { id: 'toolu_s1', name: 'start_thread', input: { agent: 'worker', task: 'one' } },
      { id: 'toolu_w', name: 'wait_threads', input: {} },
    ]);
    await new CancelMarks(redis).mark(session.id, run);
    await runtime.endTurn(session, primary, { type: 'requires_action', tool_use_ids: waits.map((w) => w.tool_use_id) }, waits);
    expect((await store.threadIds(session.id, 0, 10)).ids).toEqual([]);
    expect(rec.queued.filter((r) => r.session_thread_id !== primary)).toEqual([]);
    expect(await store.thread(session.id, primary)).toMatchObject({ status: 'idle', _active_run_id: null, _stop_reason: { type: 'interrupted' } });
    expect((await toolResults(store, session)).map((r) => [r.tool_use_id, r.interrupted])).toEqual(expect.arrayContaining([['toolu_s1', true], ['toolu_w', true]]));
  });

  it('a child made while an interrupt ended the coordinator\'s wait (after it looked at the children) is interrupted too', async () => {
    const rec = recording();
    let runtime: ThreadRuntime | undefined;
    let interruptOnce: (() => Promise<void>) | undefined;
    // The interrupt runs in full just before the child is made: it ends the coordinator's wait
    // and finds no child to stop.
    class Racing extends SessionStore {
      override async reserveSpawn(sessionId: string, limit: number): Promise<number | null> {
        const race = interruptOnce;
        interruptOnce = undefined;
        await race?.();
        return super.reserveSpawn(sessionId, limit);
      }
    }
    const store = new Racing(redis);
    runtime = new ThreadRuntime(store, () => rec.scheduler);
    const { session, primary } = await coordinatorSession(store, runtime);
    const waits = await modelUses(store, session, primary, [{ id: 'toolu_s1', name: 'start_thread', input: { agent: 'worker', task: 'one' } }]);
    interruptOnce = () => (runtime as ThreadRuntime).interrupt(session, primary);
    await runtime.endTurn(session, primary, { type: 'requires_action', tool_use_ids: ['toolu_s1'] }, waits);
    expect(interruptOnce).toBeUndefined();
    const { ids } = await store.threadIds(session.id, 0, 10);
    expect(ids).toHaveLength(1);
    expect(rec.interrupted).toEqual([ids[0]]);
    expect(await store.thread(session.id, primary)).toMatchObject({ _stop_reason: { type: 'interrupted' } });
  });
});
