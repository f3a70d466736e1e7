import { createHash } from 'node:crypto';
import { crashPoint, ID_PREFIXES, type Logger } from '@agentplane/core';
import { BoundedCache, keys, tags, type LogEvent } from '@agentplane/store';
import { snapshotOf, type Agent, type AgentSnapshot } from '../agents/model.js';
import {
  delegationToolSpecs, isDelegationTool, MULTIAGENT_LIMITS, rosterMembers, type DelegationTool, type MultiagentT, type RosterMember,
} from '../agents/multiagent.js';
import { Outbox } from '../outbox.js';
import { VersionedStore } from '../versioned.js';
import type { PendingWait, SessionDoc, ThreadDoc, WaitKind } from './model.js';
import { sessionTag, type SessionStore } from './store.js';
import { continuable, waitsOnAction, type TurnScheduler } from './turns.js';

/** How far back the log is read for a Run's delegation tool uses and children's results. */
const SCAN_LIMIT = 50_000;
const PAGE = 500;

type Input = Record<string, unknown>;

interface Answer {
  content: string;
  is_error: boolean;
}

/** One child thread as a delegation tool reports it to the coordinator's model. */
interface ChildResult {
  session_thread_id: string;
  agent: string;
  status: string;
  stop_reason: unknown;
  result: string | null;
}

/** What the runtime side asks of the coordinator (implemented by `ThreadRuntime`). */
export interface CoordinatorHost {
  /** `queued`: the message is in the thread's input queue already, `thread` as the queueing left it. */
  submitUserMessage(session: SessionDoc, threadId: string, eventId: string | null, options?: { queued?: boolean; thread?: ThreadDoc | null }): Promise<unknown>;
  /** `user.interrupt` on one thread: a running Run asked to stop, a wait on an action ended. */
  interrupt(session: SessionDoc, threadId: string): Promise<void>;
}

const textOf = (content: unknown): string =>
  Array.isArray(content)
    ? content.map((b) => (b && typeof b === 'object' && typeof (b as Input).text === 'string' ? ((b as Input).text as string) : '')).join('')
    : typeof content === 'string' ? content : '';

const pendingNow = (t: ThreadDoc): [string, PendingWait][] =>
  Object.entries(t._waits).filter(([, w]) => w.generation === t._wait_generation && w.answered_event_id === null);

/** A child has settled when its turn is over: idle with no Run (not waiting on an action), or terminated. */
const settled = (t: ThreadDoc): boolean => t.status === 'terminated' || (t.status === 'idle' && t._active_run_id === null);

/**
 * Coordinator Sessions (docs/COORDINATION.md). The primary thread of a Session whose Agent has a
 * `multiagent` roster sees four delegation tools; its model's uses of them end its Run like any
 * blocking custom tool (through the same ActionPolicy gate), and the control plane answers them
 * here instead of a client: `start_thread` spawns a child thread with its own frozen member
 * snapshot and starts its first turn (its own Runs, leased independently), `read_thread` and
 * `stop_thread` answer at once, `wait_threads` when the children it names have settled. Each
 * answer is an `agent.tool_result` on the primary thread (producer key per use and wait
 * generation, so a repeat never duplicates it); once every wait of the generation is answered the
 * coordinator continues in a new Run. All state is in the thread documents and the log, so any
 * process (API or scheduler) that ends a child's turn moves its coordinator on.
 */
export class Coordinator {
  private readonly agents: VersionedStore<Agent>;
  /** `<ws>/<agent>/<version>` → the member's Agent version (immutable). */
  private readonly members = new BoundedCache<string, Agent>(1024);
  /**
   * Coordinators whose turn end is writing delegation uses: written down before the waits are, struck
   * out once they were carried out, so the scheduler's sweep (`repair`) carries out what a process
   * that died in between left, where no repeat of the turn end comes.
   * `ap:{g:delegation_outbox:<n>}:delegation_outbox:<n>`: zset, member: the Session id, score: ms.
   */
  private readonly outbox: Outbox;

  constructor(
    private readonly store: SessionStore,
    private readonly host: CoordinatorHost,
    private readonly scheduler: () => TurnScheduler,
  ) {
    this.agents = new VersionedStore<Agent>(store.redis, 'agents', 'agent');
    this.outbox = new Outbox(store.redis, 'delegation_outbox');
  }

  /** Before a coordinator's turn end writes waits that hold delegation uses. */
  carrying(sessionId: string): Promise<void> {
    return this.outbox.add(sessionId, sessionId);
  }

  /**
   * Coordinators written down by `carrying` more than `olderThanMs` ago: their turn end is done
   * again from the thread as it is (`turnEnded`: open delegation uses carried out, a generation
   * answered in full reported), then struck out. Every step is one a repeat may take (a started
   * child is found by its use, an answer by its producer key, a continuation is a compare-and-swap);
   * one that fails stays for the next sweep. Returns the Sessions whose open uses it carried out
   * (an entry whose turn end had nothing left open, one cut short by an interrupt say, just goes).
   */
  async repair(olderThanMs: number, log: Logger): Promise<string[]> {
    const done: string[] = [];
    for (const { member } of await this.outbox.due(olderThanMs)) {
      try {
        const session = await this.store.docs.get<SessionDoc>(sessionTag(member), member);
        // A Session or thread deleted since has nothing left to carry out.
        const primary = session?.type === 'session' && session.agent.multiagent ? await this.store.thread(session.id, session._primary_thread_id).catch(() => null) : null;
        const open = primary !== null && pendingNow(primary).some(([, w]) => w.kind === 'delegation');
        if (session && primary) await this.turnEnded(session, primary);
        await this.outbox.remove(member, member);
        if (open) done.push(member);
      } catch (err) {
        log.warn({ err, session: member }, 'could not carry out a coordinator\'s delegation uses: the next sweep tries again');
      }
    }
    return done;
  }

  private async member(ws: string, agentId: string, version: number): Promise<Agent> {
    const key = `${ws}/${agentId}/${version}`;
    const hit = this.members.get(key);
    if (hit) return hit;
    const a = await this.agents.getVersion(ws, agentId, version);
    this.members.set(key, a);
    return a;
  }

  async roster(ws: string, config: MultiagentT): Promise<RosterMember[]> {
    const entries = await Promise.all(config.roster.map(async (e) => ({ ...e, name: (await this.member(ws, e.agent_id, e.version)).name })));
    return rosterMembers(entries);
  }

  /** The delegation tools of a coordinator's primary thread, as custom tool specs. */
  async toolSpecs(ws: string, config: MultiagentT): Promise<ReturnType<typeof delegationToolSpecs>> {
    return delegationToolSpecs(await this.roster(ws, config));
  }

  /**
   * Before a coordinator's waits are registered: which of them are delegation tool uses (found in
   * the log as the Run's `agent.tool_use` events). Waits answered by a client or an approval keep
   * their kind.
   */
  async classify(session: SessionDoc, threadId: string, waits: { tool_use_id: string; kind: WaitKind }[]): Promise<Map<string, { tool: DelegationTool; input: Input }>> {
    const out = new Map<string, { tool: DelegationTool; input: Input }>();
    if (!session.agent.multiagent || threadId !== session._primary_thread_id) return out;
    const wanted = new Set(waits.filter((w) => w.kind === 'custom_tool').map((w) => w.tool_use_id));
    if (wanted.size === 0) return out;
    await this.scanBack(session.id, (e) => {
      if (e.session_thread_id !== threadId || e.type !== 'agent.tool_use') return wanted.size === 0;
      const p = e.payload as Input;
      const id = String(p.id);
      if (!wanted.delete(id)) return wanted.size === 0;
      if (typeof p.name === 'string' && isDelegationTool(p.name)) {
        out.set(id, { tool: p.name, input: p.input && typeof p.input === 'object' ? (p.input as Input) : {} });
      }
      return wanted.size === 0;
    });
    return out;
  }

  /** Reads the log backwards until `visit` says it has seen enough (or the scan limit). */
  private async scanBack(sessionId: string, visit: (e: LogEvent) => boolean): Promise<void> {
    let before: number | null = null;
    for (let scanned = 0; scanned < SCAN_LIMIT;) {
      const page = await this.store.log.rangeBackward(sessionId, before, PAGE);
      for (const e of page) if (visit(e)) return;
      if (page.length < PAGE) return;
      scanned += page.length;
      before = (page[page.length - 1] as LogEvent).seq;
    }
  }

  /**
   * A thread's turn ended. The coordinator's: its delegation waits are carried out. A child's
   * (other than `requires_action`): the coordinator's `wait_threads` uses it settles are answered.
   * Either, repeated after a crash, also reports a coordinator's waits found all answered while
   * its turn has not continued (`reportAnswered`).
   */
  async turnEnded(session: SessionDoc, thread: ThreadDoc): Promise<void> {
    if (thread.parent_thread_id === null) {
      if (pendingNow(thread).some(([, w]) => w.kind === 'delegation')) {
        await this.carryOut(session, thread);
        await this.outbox.remove(session.id, session.id);
      } else await this.reportAnswered(session, thread);
      return;
    }
    if (!settled(thread)) return;
    const primary = await this.store.thread(session.id, session._primary_thread_id);
    for (const [id, w] of pendingNow(primary)) {
      if (w.kind !== 'delegation' || w.delegation?.tool !== 'wait_threads') continue;
      const answer = await this.waitAnswer(session, w.delegation.input);
      if (answer) await this.answer(session, primary.id, id, w.generation, answer);
    }
    // As read before the answers above: a wait answered here was reported by its answer.
    await this.reportAnswered(session, primary);
  }

  /**
   * The coordinator's wait generation, reported to the scheduler when it holds delegation uses,
   * every wait of it is answered and the turn has not continued (`continuable`): the process that
   * answered the last one died before its report (`answerMany`), and nothing else reports it. A
   * repeated turn end (the coordinator's, or a child's) gets here; the scheduler's start of the
   * continuation is a compare-and-swap from the waiting Run, so a report made twice starts one
   * Run. On the normal path the thread document at hand says no (a wait still open, or no Run
   * waiting): nothing is read or written.
   */
  private async reportAnswered(session: SessionDoc, coordinator: ThreadDoc): Promise<void> {
    const generation = coordinator._wait_generation;
    const runId = coordinator._active_run_id;
    if (!Object.values(coordinator._waits).some((w) => w.generation === generation && w.kind === 'delegation')) return;
    if (!continuable(coordinator, runId, generation)) return;
    await this.scheduler().waitsResolved(session.id, coordinator.id, runId, generation);
  }

  /**
   * Carries out the coordinator's delegation uses of its current wait generation: the starts
   * first (concurrently, within the free child slots), so a wait in the same step sees them.
   */
  private async carryOut(session: SessionDoc, coordinator: ThreadDoc): Promise<void> {
    const uses = pendingNow(coordinator).filter(([, w]) => w.kind === 'delegation' && w.delegation);
    const starts = uses.filter(([, w]) => w.delegation?.tool === 'start_thread');
    if (starts.length > 0) {
      const author = await this.authorOf(session, coordinator.id);
      const slots = await this.freeSlots(session);
      let taken = 0;
      const answers = await Promise.all(starts.map(async ([id, w]) => {
        const input = (w.delegation as { input: Input }).input;
        const answer = await this.start(session, coordinator, { toolUseId: id, generation: w.generation }, input, author, () => taken++ < slots.free, slots.limit)
          .catch((e: unknown) => err(`start_thread failed: ${e instanceof Error ? e.message : String(e)}`));
        return { toolUseId: id, generation: w.generation, answer };
      }));
      // One append and one compare-and-swap for every start of the step.
      await this.answerMany(session, coordinator.id, answers);
    }
    const rest = uses.filter(([, w]) => w.delegation?.tool !== 'start_thread');
    rest.sort((a, b) => Number(a[1].delegation?.tool === 'wait_threads') - Number(b[1].delegation?.tool === 'wait_threads'));
    for (const [id, w] of rest) {
      const d = w.delegation as { tool: DelegationTool; input: Input };
      let answer: Answer | null;
      try {
        switch (d.tool) {
          case 'wait_threads':
            answer = await this.waitAnswer(session, d.input);
            break;
          case 'read_thread': {
            const child = await this.child(session, d.input.session_thread_id);
            answer = typeof child === 'string' ? err(child) : ok((await this.results(session, [child]))[0]);
            break;
          }
          case 'stop_thread': {
            const child = await this.child(session, d.input.session_thread_id);
            if (typeof child === 'string') answer = err(child);
            else {
              // A running child's Run is asked to stop; one waiting on a client's answer (or an
              // approval) ends its wait, as a user.interrupt naming it would.
              const busy = (child._active_run_id !== null && (child.status === 'running' || child.status === 'rescheduling')) || waitsOnAction(child);
              if (busy) await this.host.interrupt(session, child.id);
              answer = ok({ session_thread_id: child.id, interrupted: busy });
            }
            break;
          }
          default:
            answer = null;
        }
      } catch (e) {
        answer = err(`${d.tool} failed: ${e instanceof Error ? e.message : String(e)}`);
      }
      if (answer) await this.answer(session, coordinator.id, id, w.generation, answer);
    }
  }

  /** How many more children may be busy at once. */
  private async freeSlots(session: SessionDoc): Promise<{ free: number; limit: number }> {
    const limit = session.agent.multiagent?.max_concurrent_threads ?? MULTIAGENT_LIMITS.defaultConcurrentThreads;
    const { ids } = await this.store.threadIds(session.id, 0, MULTIAGENT_LIMITS.threadsPerSession + 1);
    const children = ids.length > 0 ? await this.store.threads(session.id, ids) : [];
    const busy = children.filter((t) => t && !settled(t)).length;
    return { free: Math.max(0, limit - busy), limit };
  }

  /** The Principal whose message the coordinator answers: a child's task acts for the same one. */
  private async authorOf(session: SessionDoc, threadId: string): Promise<string | undefined> {
    let author: string | undefined;
    await this.scanBack(session.id, (e) => {
      if (e.type !== 'user.message' || (e.session_thread_id !== threadId && e.session_thread_id !== null)) return false;
      const a = (e.payload as Input).authored_by;
      if (typeof a === 'string') author = a;
      return true;
    });
    return author;
  }

  private async start(
    session: SessionDoc, coordinator: ThreadDoc, use: { toolUseId: string; generation: number }, input: Input, author: string | undefined,
    takeSlot: () => boolean, limit: number,
  ): Promise<Answer> {
    const { toolUseId } = use;
    // Tool use ids are the model's: keyed with the wait generation, a later turn never meets an earlier one's child.
    const useKey = `${use.generation}/${toolUseId}`;
    const config = session.agent.multiagent;
    if (!config) return err('this Session has no roster');
    if (session.archived_at !== null) return err('the Session is archived: it takes no new work');
    const task = typeof input.task === 'string' ? input.task : '';
    if (task.trim() === '') return err('start_thread needs a non-empty task');
    if (task.length > MULTIAGENT_LIMITS.taskChars) return err(`the task exceeds ${MULTIAGENT_LIMITS.taskChars} characters`);
    const roster = await this.roster(session.workspace_id, config);
    const member = roster.find((m) => m.name === input.agent || m.agent_id === input.agent);
    if (!member) return err(`'${String(input.agent)}' is not a roster member; members: ${roster.map((m) => m.name).join(', ')}`);

    // A repeat of the same use (a retried turn end, the sweep) finds the child an earlier attempt
    // made, under the id the use gives it, and takes what that attempt did not get to: the task's
    // append (once, by its producer key) and the child's start (once: only a child that never ran).
    const childId = delegatedThreadId(session.id, useKey);
    let child = await this.startedBy(session, useKey, childId);
    if (!child) {
      if (!takeSlot()) return err(`the busy child threads reached max_concurrent_threads (${limit}); wait for one to finish first`);
      const spawn = await this.store.reserveSpawn(session.id, MULTIAGENT_LIMITS.threadsPerSession);
      if (spawn === null) return err(`this Session has spawned ${MULTIAGENT_LIMITS.threadsPerSession} child threads, its limit`);
      const agent = await this.member(session.workspace_id, member.agent_id, member.version);
      const { multiagent: _none, ...snapshot }: AgentSnapshot = snapshotOf(agent);
      child = await this.store.createChild(session, snapshot, spawn, childId);
    }
    const r = await this.store.log.append(session.id, [{
      type: 'user.message',
      payload: {
        content: [{ type: 'text', text: task }],
        ...(author ? { authored_by: author } : {}),
        caused_by: { kind: 'coordinator', session_thread_id: coordinator.id, tool_use_id: toolUseId },
      },
      session_thread_id: child.id,
      producer_key: `delegation:${toolUseId}:${use.generation}:task`,
    }]);
    if (!r.ok) return err('the Session log refused the task');
    const ev = r.events[0] as LogEvent;
    // Queued only while no turn has started on the child (one script), then started: two attempts
    // of the same start never give the child its task twice.
    const fresh = await this.store.enqueueFirstInput(session.id, child.id, ev.id);
    if (fresh) await this.host.submitUserMessage(session, child.id, ev.id, { queued: true, thread: fresh });
    else {
      const now = await this.store.thread(session.id, child.id);
      return ok({ session_thread_id: child.id, agent: member.name, status: now.status });
    }
    // A user.interrupt that ended the coordinator's wait while this child was being made looked
    // at the children before it existed: the child is stopped here instead (the interrupt ends
    // the wait, then looks at the children; this starts the child, then looks at the wait).
    if ((await this.store.thread(session.id, coordinator.id))._wait_generation !== use.generation) {
      await this.host.interrupt(session, child.id);
    }
    return ok({ session_thread_id: child.id, agent: member.name, status: 'running' });
  }

  /**
   * The child a use started: under the use's id, or as recorded against the use for a child made
   * before ids were derived from uses (a Session of an earlier version; nothing records it now).
   */
  private async startedBy(session: SessionDoc, useKey: string, childId: string): Promise<ThreadDoc | null> {
    const id = (await this.store.redis.hget(delegationsKey(session.id), useKey)) ?? childId;
    return this.store.thread(session.id, id).catch(() => null);
  }

  /** A child thread of this Session named by the model, or why not. */
  private async child(session: SessionDoc, id: unknown): Promise<ThreadDoc | string> {
    if (typeof id !== 'string' || id === '') return 'session_thread_id is required';
    const t = await this.store.thread(session.id, id).catch(() => null);
    if (!t || t.parent_thread_id === null) return `${id} is not a child thread of this Session`;
    return t;
  }

  /** `wait_threads`: the answer once the named children have settled (all, or any), else null. */
  private async waitAnswer(session: SessionDoc, input: Input): Promise<Answer | null> {
    // The tool's schema, held to: a value of another shape is an error the model reads, not the default.
    if (input.mode !== undefined && input.mode !== 'all' && input.mode !== 'any') return err(`mode must be 'all' or 'any', not ${JSON.stringify(input.mode)}`);
    const named = input.session_thread_ids;
    if (named !== undefined && (!Array.isArray(named) || named.some((x) => typeof x !== 'string'))) return err('session_thread_ids must be a list of child thread ids');
    let ids: string[];
    if (Array.isArray(named)) {
      ids = named as string[];
    } else {
      ids = (await this.store.threadIds(session.id, 0, MULTIAGENT_LIMITS.threadsPerSession + 1)).ids;
    }
    if (ids.length === 0) return err('there are no child threads to wait for');
    if (ids.length > MULTIAGENT_LIMITS.threadsPerSession) return err(`at most ${MULTIAGENT_LIMITS.threadsPerSession} child threads per wait`);
    const byId = new Map((await this.store.threads(session.id, [...new Set(ids)])).map((t) => [t.id, t]));
    const threads: ThreadDoc[] = [];
    for (const id of new Set(ids)) {
      const t = byId.get(id);
      if (!t || t.type !== 'session_thread' || t.session_id !== session.id || t.parent_thread_id === null) return err(`${id} is not a child thread of this Session`);
      threads.push(t);
    }
    const done = threads.filter(settled);
    const mode = input.mode ?? 'all';
    if (mode === 'all' ? done.length < threads.length : done.length === 0) return null;
    return ok({ results: await this.results(session, done) });
  }

  /** Each child's status, stop reason and latest `agent.message` (bounded). */
  private async results(session: SessionDoc, threads: ThreadDoc[]): Promise<ChildResult[]> {
    const wanted = new Set(threads.map((t) => t.id));
    const last = new Map<string, string>();
    await this.scanBack(session.id, (e) => {
      if (e.type === 'agent.message' && e.session_thread_id && wanted.delete(e.session_thread_id)) last.set(e.session_thread_id, textOf((e.payload as Input).content));
      return wanted.size === 0;
    });
    return threads.map((t) => {
      const text = last.get(t.id) ?? null;
      return {
        session_thread_id: t.id, agent: t.agent.name, status: t.status, stop_reason: t._stop_reason,
        result: text !== null && text.length > MULTIAGENT_LIMITS.resultChars ? `${text.slice(0, MULTIAGENT_LIMITS.resultChars)}…` : text,
      };
    });
  }

  /**
   * Answers one delegation use: its `agent.tool_result` on the coordinator's thread, then the wait
   * is marked answered and reported to the scheduler, which continues the turn once no wait of
   * the generation is open (`TurnScheduler.waitsResolved`).
   */
  private answer(session: SessionDoc, threadId: string, toolUseId: string, generation: number, a: Answer): Promise<void> {
    return this.answerMany(session, threadId, [{ toolUseId, generation, answer: a }]);
  }

  private async answerMany(session: SessionDoc, threadId: string, items: { toolUseId: string; generation: number; answer: Answer }[]): Promise<void> {
    if (items.length === 0) return;
    const r = await this.store.log.append(session.id, items.map((x) => ({
      type: 'agent.tool_result',
      payload: { tool_use_id: x.toolUseId, content: x.answer.content, is_error: x.answer.is_error, delegation: true },
      session_thread_id: threadId,
      producer_key: `delegation:${x.toolUseId}:${x.generation}`,
    })));
    if (!r.ok) return;
    const events = new Map(items.map((x, i) => [x.toolUseId, { ev: r.events[i] as LogEvent, generation: x.generation }]));
    const answered = new Set<number>();
    const next = await this.store.updateThread(session.id, threadId, (t) => {
      answered.clear();
      const waits = { ...t._waits };
      for (const [id, { ev, generation }] of events) {
        const w = waits[id];
        if (!w || w.answered_event_id !== null || w.generation !== generation) continue;
        waits[id] = { ...w, answered_event_id: ev.id, answered_seq: ev.seq, answer_fingerprint: null };
        answered.add(generation);
      }
      return answered.size === 0 ? null : { ...t, _waits: waits };
    });
    // Answered and not reported yet: a repeated turn end reports it (`turnEnded`).
    if (answered.size > 0) crashPoint('delegation-answered');
    // Whether the turn continues (this was the generation's last open wait) is the scheduler's to decide.
    for (const generation of answered) await this.scheduler().waitsResolved(session.id, threadId, next._active_run_id, generation);
  }
}

/** Member Agent versions are immutable: names are cached per process for the spec builders. */
const memberNames = new BoundedCache<string, string>(4096);

/** The delegation tools a coordinator's primary thread sees (the turn spec adds them as custom tools). */
export async function coordinatorToolSpecs(store: SessionStore, ws: string, config: MultiagentT): Promise<ReturnType<typeof delegationToolSpecs>> {
  const agents = new VersionedStore<Agent>(store.redis, 'agents', 'agent');
  const entries = await Promise.all(config.roster.map(async (e) => {
    const key = `${ws}/${e.agent_id}/${e.version}`;
    let name = memberNames.get(key);
    if (name === undefined) {
      name = (await agents.getVersion(ws, e.agent_id, e.version)).name;
      memberNames.set(key, name);
    }
    return { ...e, name };
  }));
  return delegationToolSpecs(rosterMembers(entries));
}

const ok = (value: unknown): Answer => ({ content: JSON.stringify(value), is_error: false });
const err = (message: string): Answer => ({ content: message, is_error: true });

/**
 * The id of the child thread a `start_thread` use makes, from the Session and the use
 * (`<wait generation>/<tool_use_id>`): every attempt of the same start names the same thread.
 */
export function delegatedThreadId(sessionId: string, useKey: string): string {
  return `${ID_PREFIXES.thread}_${createHash('sha256').update(`agentplane.delegation.v1\n${sessionId}\n${useKey}`).digest('hex').slice(0, 32)}`;
}

/** `<wait generation>/<tool_use_id>` → the child thread it started (`ap:{s:<sess>}:delegations`). */
export const delegationsKey = (sessionId: string): string => keys.scoped(tags.session(sessionId), 'delegations');
