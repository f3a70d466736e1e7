import { ApiError, crashPoint, newId, type Context } from '@agentplane/core';
import type { RunDoc, SessionDoc, ThreadDoc, WaitKind } from './model.js';
import { InputQueueMoved, RideRefused, sessionTag, type RunRide, type SessionStore } from './store.js';
import { SessionCloser } from './closing.js';
import { newEventId, type AppendEvent, type LogEvent } from '@agentplane/store';
import { CancelMarks } from '@agentplane/lease';
import { Coordinator } from './coordinator.js';

/**
 * Where turns leave the API. The default implementation only records: a Run stays `queued`
 * until a scheduler is plugged in (the BullMQ lease engine implements this interface).
 * Implementations must be idempotent: a hook may be called again for the same Run after a
 * crash-and-retry of the request that triggered it.
 */
export interface TurnScheduler {
  /**
   * A turn is about to start with this Run id (before the Run is committed): lets the scheduler
   * record its intent, so a crash between the commit and `runQueued` is repaired.
   */
  runStarting?(sessionId: string, runId: string, session?: SessionDoc): Promise<void>;
  /**
   * True when `runStarting`'s record goes out on the connection the Session's writes use (one
   * Redis, not a Cluster): Redis runs it before any write sent after it, so a start may commit
   * without waiting for its answer.
   */
  readonly intentAhead?: boolean;
  /** The start announced under `runId` did not happen (no Run was committed under it). */
  runNotStarting?(runId: string): void;
  /**
   * The Run's job, sent right behind its start on the connection the start went out on, before
   * the start is answered (`RunQueues.sendBehind`): one round trip fewer before a scheduler can
   * take it. Asked with the Run about to be written; undefined when the job cannot go so (a
   * Cluster, the pool or requirements not known here without a read, no rank taken): the Run is
   * then queued with `runQueued` once committed. Else the start writes `JobBehind.run` (the Run
   * with its enqueue record: the job is added in the same write) and calls `send` synchronously
   * once the start is issued.
   */
  sendBehind?(run: RunDoc, trace?: Context): JobBehind | undefined;
  /**
   * A turn started: `run` (as just written, version 1) was recorded as `queued` in the Session
   * slot. `trace`: the context the turn started in (the parent of its job's span).
   */
  runQueued(run: RunDoc, trace?: Context): Promise<void>;
  /** `user.interrupt` on a thread whose turn is active. */
  /** `trace`: the interrupt's context (the parent of the Run's end records when it ends here). */
  interruptRequested(sessionId: string, threadId: string, runId: string, trace?: Context): Promise<void>;
  /**
   * A wait of wait generation `generation` on the thread, opened when `runId`'s turn ended
   * `requires_action`, was answered (or was found answered already: a retry after a crash).
   * Whoever answers a wait reports it here and decides nothing more: the scheduler continues the
   * turn in a new Run only when the thread can continue (`continuable`: no wait of that
   * generation is open any more) and its Session is not archived, checked in the compare-and-swap
   * that starts the Run. A report made again, or for a wait that was not the last, starts nothing.
   */
  waitsResolved(sessionId: string, threadId: string, runId: string | null, generation: number): Promise<void>;
}

/** A turn start's intent recorded ahead of the start (`ThreadRuntime.intendStart`). */
export interface TurnIntent {
  runId: string;
  recorded: Promise<void>;
  /** The record is sure to be written before any later write of the Session (`TurnScheduler.intentAhead`). */
  ahead: boolean;
  /**
   * A job went behind a start under `runId` that did not commit (`TurnScheduler.sendBehind`):
   * the id is not used again (a scheduler may hold that job and drop it for want of its Run).
   */
  spent?: boolean;
}

/** A Run's job sent right behind its start (`TurnScheduler.sendBehind`). */
export interface JobBehind {
  /** The Run as its start writes it: its pool and `enqueued_at` recorded (the job is added right behind the write). */
  run: RunDoc;
  /**
   * Sends the job. The returned function is called once the start is answered: with the Run when
   * it committed (the job gets its rank), with null when it did not or its answer was lost (the
   * job and the rank go; a Run committed all the same is enqueued again by the repair).
   */
  send(): (committed: RunDoc | null) => Promise<void>;
}

/** A thread that may start a turn now: idle, no Run, no unanswered wait of its generation. */
export function startable(t: Readonly<ThreadDoc>): boolean {
  if (t.status !== 'idle' || t._active_run_id !== null || t._closed === true || t._archived === true) return false;
  return !Object.values(t._waits).some((w) => w.generation === t._wait_generation && w.answered_event_id === null);
}

/**
 * A thread whose turn continues now in a new Run (`TurnScheduler.waitsResolved`): still idle on
 * `runId`, the Run whose turn ended `requires_action`, still at wait generation `generation`
 * (an interrupt ended the wait, or a later turn opened others, when it is not), every wait of that
 * generation answered, and the Session neither closed nor archived as far as the thread knows.
 */
export function continuable(t: Readonly<ThreadDoc>, runId: string | null, generation: number): boolean {
  if (runId === null || t.status !== 'idle' || t._active_run_id !== runId || t._wait_generation !== generation) return false;
  if (t._closed === true || t._archived === true) return false;
  return !Object.values(t._waits).some((w) => w.generation === generation && w.answered_event_id === null);
}

/**
 * A thread that waits on an action: its turn ended `requires_action` and keeps its Run (the
 * continuation starts from it) until the waits are answered and the next Run starts.
 */
export function waitsOnAction(t: Readonly<ThreadDoc>): boolean {
  return t.status === 'idle' && t._active_run_id !== null;
}

/** The thread as a turn under `runId` starts it (its legacy in-document queue, if any, taken as inputs). */
export function runningThread(t: Readonly<ThreadDoc>, runId: string): ThreadDoc {
  const { _queued_inputs: _legacy, ...rest } = t;
  return { ...rest, status: 'running', _active_run_id: runId, _running_since_ms: Date.now(), _stop_reason: null };
}

/**
 * `session.thread_status_rescheduled`: `attempt` of the thread's Run `runId` ended without a result
 * (`cause`) and the Run is queued again. Once per attempt: its producer key makes a repeat a no-op.
 */
export function rescheduledEvent(threadId: string, runId: string, attempt: number, cause: string): AppendEvent {
  return {
    type: 'session.thread_status_rescheduled', payload: { run_id: runId, attempt, cause }, session_thread_id: threadId, producer_key: `run:${runId}:rescheduled:${attempt}`,
  };
}

export const recordOnlyTurnScheduler: TurnScheduler = {
  runQueued: async () => undefined,
  interruptRequested: async () => undefined,
  waitsResolved: async () => undefined,
};

/**
 * A turn of `threadId` ended (`endedRunId`: the Run it ran; `trace`: the context its end was
 * reported in; `activeOutcome`, when given: the id of the thread's outcome under way, null for
 * none, as the end's own script read it, so the hook need not read it again). Returns true when
 * the hook started the thread's next Run itself (a grader Run, a revision), so queued messages
 * wait for it.
 */
export type TurnEndHook = (session: SessionDoc, threadId: string, endedRunId: string | null, stop: StopReason, trace?: Context, activeOutcome?: string | null) => Promise<boolean>;

/**
 * Called with the ActionApproval waits an interrupt or a thread's termination ended (tool use
 * ids): their approvals lapse then (the api's approvals module). Not installed in a process
 * without that module: an approval whose wait was ended lapses there when someone tries to
 * resolve it, or at its expiry.
 */
export type WaitsEndedHook = (session: SessionDoc, threadId: string, approvalToolUseIds: string[]) => Promise<void>;

export type StopReason = { type: 'end_turn' } | { type: 'requires_action'; tool_use_ids: string[] } | { type: 'retries_exhausted' } | { type: 'interrupted' } | { type: string };

/**
 * The SessionThread state machine, shared by the API (drive events, archive) and the runtime
 * side (runner/scheduler report turn boundaries through these methods). Each transition is a
 * compare-and-swap on the thread document, then the status event is appended to the log; a turn
 * start writes the thread, its Run and the status event in one script.
 *
 * Steer-vs-queue policy: a `user.message` that arrives while a turn runs (or waits on an action)
 * is appended to the log at once and queued as input of the NEXT turn, which starts as soon as
 * the current turn ends with a stop reason other than `requires_action`. Interrupt first to steer.
 */
export class ThreadRuntime {
  /** Called when a turn ends other than `requires_action` (outcomes grade it); true = it started the thread's next Run. */
  private turnEnded: TurnEndHook | undefined;
  /** Called with the approval waits an interrupt or a termination ended. */
  private waitsEnded: WaitsEndedHook | undefined;
  /** Coordinator Sessions: delegation tool uses and child threads (docs/COORDINATION.md). */
  readonly coordinator: Coordinator;
  /** An archived Session's terminal status event, once its last turn is over. */
  readonly closer: SessionCloser;
  /** The interrupts' marks on Runs: a turn that ends waiting on an action after one reached its Run ends interrupted. */
  private readonly cancels: CancelMarks;

  constructor(
    private readonly store: SessionStore,
    private readonly scheduler: () => TurnScheduler,
  ) {
    this.coordinator = new Coordinator(store, this, scheduler);
    this.closer = new SessionCloser(store, store.redis);
    this.cancels = new CancelMarks(store.redis);
  }

  /** Installs the one turn-end hook (the outcomes module). */
  onTurnEnded(hook: TurnEndHook): void {
    this.turnEnded = hook;
  }

  /** Installs the one hook told of ended approval waits (the approvals module). */
  onWaitsEnded(hook: WaitsEndedHook): void {
    this.waitsEnded = hook;
  }

  /** The approval waits of the thread's current generation (those an interrupt or a termination ends). */
  private static approvalWaits(t: ThreadDoc): string[] {
    return Object.entries(t._waits).filter(([, w]) => w.generation === t._wait_generation && w.kind === 'approval').map(([id]) => id);
  }

  /**
   * A user.message was appended: start a turn on an idle thread, else leave it queued for the next
   * one. The message waits in the thread's input queue (a list in the Session's slot); the drive
   * path queues it in its append script (`queued: true`, with the thread as that script read it),
   * other callers have it queued here. Starting takes the whole queue as the turn's inputs and
   * writes the thread, the Run and `session.status_running` in one script, then hands the Run to
   * the scheduler. A busy thread is not written at all: the turn end starts the queued messages.
   * (Ordering: a message queued before the thread's change to idle is seen by the turn end, which
   * reads the queue after that change; one queued after it sees the idle thread and starts.)
   */
  async submitUserMessage(
    session: SessionDoc,
    threadId: string,
    eventId: string | null,
    options: {
      queued?: boolean; thread?: ThreadDoc | null;
      /** The input queue as a script just left it (the drive's append, the turn end's commit): not read again. */
      queue?: string[];
      /** The start's intent, recorded beside the append (`intendStart`): its Run id is the first attempt's. */
      intent?: TurnIntent;
      /** The trace context the turn starts in (its writes' and its job's spans' parent). */
      trace?: Context | undefined;
    } = {},
  ): Promise<{ run: RunDoc | null }> {
    if (options.intent?.spent) {
      const { intent: _spent, ...rest } = options;
      options = rest;
    }
    let seen = options.thread ?? null;
    if (eventId !== null && !options.queued) seen = await this.store.enqueueInput(session.id, threadId, eventId);
    if (seen) {
      // A terminated thread is not startable either: the intent's rank goes in both cases.
      if (options.intent && !startable(seen)) this.scheduler().runNotStarting?.(options.intent.runId);
      if (seen.status === 'terminated') throw new ApiError('runtime.invalid_transition', 'the thread is terminated');
      if (!startable(seen)) return { run: null };
    }
    for (let attempt = 0; attempt < 16; attempt++) {
      const runId = attempt === 0 && options.intent ? options.intent.runId : newId('run');
      // The scheduler records its intent before the Run is committed (crash repair), only for a
      // start that will be tried: a message into a busy thread costs no write. A message just
      // queued makes a start likely: the intent and the queue read go out together (the drive
      // path recorded it beside its append, and its append script returned the queue).
      const announce = () => this.scheduler().runStarting?.(session.id, runId, session);
      let started = false;
      try {
        const [queued] = await Promise.all([
          (attempt === 0 ? options.queue : undefined) ?? this.store.queuedInputs(session.id, threadId),
          eventId !== null && attempt === 0 ? (options.intent?.recorded ?? announce()) : undefined,
        ]);
        if (queued.length === 0 && (seen === null || (seen._queued_inputs ?? []).length === 0)) return { run: null };
        if (eventId === null || attempt > 0) await announce();
        const { run } = await this.store.startTurn(session, threadId, (t) => {
          if (t.status === 'terminated') throw new ApiError('runtime.invalid_transition', 'the thread is terminated');
          const legacy = t._queued_inputs ?? [];
          if (legacy.length + queued.length === 0 || !startable(t)) return null;
          return { thread: runningThread(t, runId), start: { runId, inputs: [...legacy, ...queued], dequeue: queued } };
        }, options.trace);
        if (!run) return { run: null };
        started = true;
        await this.queueRun(run, options.trace);
        return { run };
      } catch (err) {
        if (err instanceof InputQueueMoved) continue;
        throw err;
      } finally {
        // What the scheduler took for this start ahead of the commit (a fair-share rank) goes
        // when no Run was committed under it.
        if (!started) this.scheduler().runNotStarting?.(runId);
      }
    }
    throw new ApiError('validation.conflict', 'too much contention on this thread; the message is queued and starts with the next turn');
  }

  /**
   * The intent to start a turn, recorded before it is known whether the turn starts: the drive
   * path records it beside its append when the thread (as last read) could start one, saving a
   * round trip; `submitUserMessage` then starts the turn under its Run id. None for a thread that
   * cannot start a turn now. A thread not known without a read (undefined) may start one: the
   * intent is recorded. An intent whose turn never starts is dropped by the enqueue repair
   * (it finds no Run committed under it); its fair-share rank goes at once.
   */
  intendStart(session: SessionDoc, thread: Readonly<ThreadDoc> | undefined): TurnIntent | undefined {
    if (thread && !startable(thread)) return undefined;
    const runId = newId('run');
    const scheduler = this.scheduler();
    const recorded = Promise.resolve(scheduler.runStarting?.(session.id, runId, session));
    recorded.catch(() => undefined);
    return { runId, recorded, ahead: scheduler.runStarting !== undefined && scheduler.intentAhead === true };
  }

  /**
   * A user.message into a thread that, as this process knows it (`known`), can start a turn now:
   * the message and the turn's start in one script (`SessionStore.startTurnWithMessage`), one
   * round trip instead of two, then the Run goes to the scheduler. Only with an intent recorded
   * ahead of every later write (`TurnIntent.ahead`), so the crash repair still finds the Run.
   * Null, with nothing written, when the thread moved on, messages wait in its queue or the
   * message is a replay: the caller appends it and starts the turn as usual (same intent, under
   * another Run id when a job went behind the start: `TurnIntent.spent`). When the scheduler can,
   * the Run's job goes right behind the start (`TurnScheduler.sendBehind`).
   */
  async startWithMessage(session: SessionDoc, known: Readonly<ThreadDoc>, message: AppendEvent, intent: TurnIntent, trace?: Context): Promise<{ event: LogEvent; run: RunDoc } | null> {
    if (!intent.ahead || !startable(known) || (known._queued_inputs ?? []).length > 0) return null;
    const next = runningThread(known, intent.runId);
    const scheduler = this.scheduler();
    // The Run's job goes right behind the start, when the scheduler can send it so.
    let settle: ((committed: RunDoc | null) => Promise<void>) | undefined;
    const behind = scheduler.sendBehind ? (run: RunDoc) => {
      const job = scheduler.sendBehind?.(run, trace);
      return job && { run: job.run, send: () => void (settle = job.send()) };
    } : undefined;
    const settled = (committed: RunDoc | null) => settle?.(committed).catch(() => undefined);
    // No Run under the intent (or none known): its job and rank go, and its Run id is not used again.
    const withdraw = () => {
      void settled(null);
      intent.spent = true;
    };
    let started: Awaited<ReturnType<SessionStore['startTurnWithMessage']>>;
    try {
      started = await this.store.startTurnWithMessage(session, known, message, next, intent.runId, trace, behind);
    } catch (err) {
      // No Run was committed under the intent (or the answer was lost: the repair enqueues a Run
      // committed all the same): its rank goes (as in submitUserMessage), and its job if one went.
      if (settle) withdraw();
      else scheduler.runNotStarting?.(intent.runId);
      throw err;
    }
    if (!started) {
      // The caller appends the message and starts the turn as usual, under another Run id.
      if (settle) withdraw();
      return null;
    }
    // With the job sent, what is left (its rank, the Run's enqueue record) is not the caller's to
    // wait for, and waits for the caller's own work (the response) to be done.
    if (settle) setImmediate(() => void settled(started.run));
    else await this.queueRun(started.run, trace);
    return { event: started.event, run: started.run };
  }

  /**
   * A committed Run goes to its queue. The caller goes on once the job's add is on its way to
   * Redis, not once it is answered: the rest (the Run's pool and `enqueued_at`, the outbox
   * entry's removal) happens while the caller answers its client, and what fails after that is
   * the enqueue repair's (the start's outbox entry stays until the Run is enqueued; the engine
   * logs the failure; a failure before the add left still reaches the caller, the Run committed
   * either way). The add is held back for its connection's one write of the turn, which leaves
   * from `setImmediate`: two turns of the event loop later it has left, so the caller's own work
   * (the response) does not delay it.
   */
  private async queueRun(run: RunDoc, trace?: Context): Promise<void> {
    const queued = this.scheduler().runQueued(run, trace);
    queued.catch(() => undefined);
    await Promise.race([queued, new Promise<void>((r) => setImmediate(() => setImmediate(r)))]);
  }

  /**
   * `user.interrupt`. A running (or rescheduling) thread's Run is asked to stop; a thread that
   * waits on an action ends its wait here (`interruptWait`), and so does one whose Run ended
   * `requires_action` before the interrupt reached it. On a coordinator's primary thread it also
   * interrupts every child: a running or rescheduling one's Run is asked to stop, and one waiting
   * on a client's answer ends its wait as above (the user stopping the Session stops all of it).
   */
  async interrupt(session: SessionDoc, threadId: string, trace?: Context): Promise<void> {
    let t = await this.store.thread(session.id, threadId);
    const asked = t.status === 'running' || t.status === 'rescheduling' ? t._active_run_id : null;
    if (asked !== null) {
      await this.scheduler().interruptRequested(session.id, threadId, asked, trace);
      t = await this.store.thread(session.id, threadId);
    }
    if (waitsOnAction(t)) {
      const { thread: now, ended } = await this.interruptWait(session, threadId, trace);
      // The waits were answered and the continuation Run started meanwhile: that Run is stopped.
      if (!ended && now._active_run_id !== null && now._active_run_id !== asked && (now.status === 'running' || now.status === 'rescheduling')) {
        await this.scheduler().interruptRequested(session.id, threadId, now._active_run_id, trace);
      }
    } else if (asked === null && startable(t) && session.archived_at === null) {
      // A thread with nothing to stop: messages still queued for it (an earlier interrupt's end
      // written, the process gone before it started them) start now; none queued, nothing changes.
      await this.submitUserMessage(session, threadId, null, { thread: t, trace });
    }
    if (threadId !== session._primary_thread_id || !session.agent.multiagent) return;
    const { ids } = await this.store.threadIds(session.id, 0, 1000);
    const children = await this.store.threads(session.id, ids);
    await Promise.all(children.map(async (c) => {
      if (!c || c.id === threadId) return;
      if (c._active_run_id && (c.status === 'running' || c.status === 'rescheduling')) {
        await this.scheduler().interruptRequested(session.id, c.id, c._active_run_id, trace);
      } else if (waitsOnAction(c)) {
        await this.interruptWait(session, c.id, trace);
      }
    }));
  }

  /**
   * `user.interrupt` on a thread that waits on an action: its turn ended `requires_action` on
   * custom tool results, confirmations, question answers, ActionApprovals or (a coordinator) its
   * delegation uses, and its next Run has not started (the waits may all be answered already).
   * The ended Run has succeeded, so there is nothing for the scheduler to stop: the wait itself
   * ends, in one script with its events. Each use of the wait generation that has no tool result
   * in the log gets an `agent.tool_result` saying it was interrupted (`is_error`, `interrupted`),
   * so the conversation stays well formed, and `session.status_idle` `{type: interrupted}` ends
   * the turn. The thread is idle with no Run, and its wait generation moves on: a late answer
   * to the cancelled wait is refused as no longer current, and an ActionApproval resolved later
   * continues nothing. A thread that no longer waits is left as it is (`ended` false), so a
   * repeated interrupt writes nothing more. After the write, as after any turn end: a
   * coordinator's `wait_threads` on this child is answered, an outcome under way ends
   * `interrupted`, and messages queued during the wait start the next turn.
   */
  private async interruptWait(session: SessionDoc, threadId: string, trace?: Context): Promise<{ thread: ThreadDoc; ended: boolean }> {
    const stop: StopReason = { type: 'interrupted' };
    let events: AppendEvent[] = [];
    let endedRunId: string | null = null;
    let moved = false;
    let approvals: string[] = [];
    const { thread: next, queued, activeOutcome } = await this.store.endTurnWith(session.id, threadId, (t) => {
      moved = false;
      // A closed Session's terminal status event is its last: its waits stay as they are.
      if (!waitsOnAction(t) || t._closed === true) return null;
      moved = true;
      endedRunId = t._active_run_id;
      approvals = ThreadRuntime.approvalWaits(t);
      const gen = t._wait_generation;
      const waits = { ...t._waits };
      events = [];
      for (const [id, w] of Object.entries(t._waits)) {
        if (w.generation !== gen) continue;
        if (w.kind === 'delegation') {
          // A delegation use answered already has its agent.tool_result; an open one is answered
          // under the key of its answer, so the coordinator's own answer can no longer land.
          if (w.answered_event_id !== null) continue;
          const eventId = newEventId();
          events.push({
            id: eventId, type: 'agent.tool_result', session_thread_id: threadId, producer_key: `delegation:${id}:${gen}`,
            payload: { tool_use_id: id, content: 'Interrupted by user.interrupt before the child threads finished.', is_error: true, delegation: true, interrupted: true },
          });
          waits[id] = { ...w, answered_event_id: eventId, answer_fingerprint: null };
          continue;
        }
        // A drive answer or an ActionApproval's resolution is not a tool result yet: the
        // continuation Run that would have turned it into one never runs.
        events.push({
          type: 'agent.tool_result', session_thread_id: threadId, producer_key: `interrupt:${id}:${gen}`,
          payload: { tool_use_id: id, content: 'Interrupted by user.interrupt before the turn continued.', is_error: true, interrupted: true },
        });
      }
      events.push({ type: 'session.status_idle', payload: { stop_reason: stop }, session_thread_id: threadId, producer_key: `interrupt:${t._active_run_id ?? ''}:${gen}:idle` });
      return { ...t, _active_run_id: null, _stop_reason: stop, _wait_generation: gen + 1, _waits: waits };
    }, () => events, trace);
    if (!moved) return { thread: next, ended: false };
    crashPoint('interrupt-wait-written');
    if (approvals.length > 0 && this.waitsEnded) await this.waitsEnded(session, threadId, approvals);
    if (session.agent.multiagent || next.parent_thread_id !== null) await this.coordinator.turnEnded(session, next);
    if (this.turnEnded && (await this.turnEnded(session, threadId, endedRunId, stop, trace, activeOutcome))) return { thread: next, ended: true };
    if (session.archived_at === null) await this.submitUserMessage(session, threadId, null, { thread: next, trace, ...(queued ? { queue: queued } : {}) });
    else await this.closer.settle(session.id);
    return { thread: next, ended: true };
  }

  /**
   * The startup mark `markStarted` would write, planned from the thread as this process knows it
   * without a read (`peekThread`), for a caller to write beside a document of its own in one
   * script (`DocumentStore.swapWith`, checked against `expected`): undefined when the thread is
   * not known here, null when it needs no mark. After a write that did not take it (a stale
   * guess), `markStarted` does the rest.
   */
  plannedStartupMark(sessionId: string, threadId: string): { id: string; next: ThreadDoc; expected: number } | null | undefined {
    const known = this.store.peekThread(sessionId, threadId);
    if (!known) return known === null ? null : undefined;
    if (known._startup_ms !== null || known._running_since_ms === null) return null;
    const next: ThreadDoc = { ...known, _startup_ms: Date.now() - known._running_since_ms, version: known.version + 1, updated_at: new Date().toISOString() };
    return { id: threadId, next, expected: known.version };
  }

  /** A planned startup mark was written (beside another document): this process knows the thread as it is now. */
  startupMarked(thread: ThreadDoc): void {
    this.store.noteThreadWritten(thread);
  }

  /** Runtime side: the Run's sandbox came up (startup time is measured from turn start). */
  async markStarted(sessionId: string, threadId: string): Promise<void> {
    // The startup time is written once, at the thread's first start, and never changes after: a
    // thread this process knows to carry it already needs neither a write nor a read.
    const known = this.store.peekThread(sessionId, threadId);
    if (known && known._startup_ms !== null) return;
    await this.store.updateThread(sessionId, threadId, (t) =>
      t._running_since_ms === null || t._startup_ms !== null ? null : { ...t, _startup_ms: Date.now() - t._running_since_ms });
  }

  /**
   * The tool uses of the thread's turn under way (since its start, `session.status_running`
   * without `attempt`) that have no `agent.tool_result` in the log yet, oldest first.
   */
  private async openUsesOfTurn(sessionId: string, threadId: string, isPrimary: boolean): Promise<string[]> {
    const mine = (e: LogEvent) => e.session_thread_id === threadId || (isPrimary && e.session_thread_id === null);
    const results = new Set<string>();
    const open: string[] = [];
    let before: number | null = null;
    for (let scanned = 0; scanned < 100_000;) {
      const page = await this.store.log.rangeBackward(sessionId, before, 500);
      if (page.length === 0) break;
      for (const e of page) {
        if (!mine(e)) continue;
        const p = (e.payload ?? {}) as { tool_use_id?: unknown; id?: unknown; attempt?: unknown };
        if (e.type === 'agent.tool_result' && typeof p.tool_use_id === 'string') results.add(p.tool_use_id);
        else if (e.type === 'agent.tool_use' && typeof p.id === 'string' && !results.has(p.id)) open.push(p.id);
        else if ((e.type === 'session.status_running' && p.attempt === undefined) || e.type === 'session.status_idle') return open.reverse();
      }
      scanned += page.length;
      before = (page[page.length - 1] as LogEvent).seq;
    }
    return open.reverse();
  }

  /**
   * Runtime side: the turn ended. `requires_action` registers the waits of a new generation;
   * any other stop reason frees the thread and starts the next turn if messages were queued.
   *
   * `runId`: the Run whose end this is. Its end applies once and only to that Run's own turn; a
   * repeated report of the same end (the scheduler's reconciliation after a crash) finds the
   * thread already moved and re-runs only the later steps, each of them idempotent (the
   * `session.status_idle` append under the producer key `run:<run>:idle`, the coordinator's and
   * outcomes' hooks, the start of queued messages), as long as that end is still the thread's
   * last move. So a process that dies anywhere inside a turn end leaves nothing undone.
   *
   * `fresh`: `session` was read just now, after the Run ended (no second read of it here); the
   * thread returned is then the one this end wrote, unless the end started the next turn.
   *
   * `trace`: the context the end is reported in (the parent of its appends' and the next turn's spans).
   *
   * `run`: the Run's own end, written by the same script as the thread's (see `RunRide`); when it
   * cannot be (the thread does not move: its end is not this call's to write), nothing is written
   * and `RideRefused` is thrown before any later step.
   */
  async endTurn(
    session: SessionDoc, threadId: string, stop: StopReason, waits: { tool_use_id: string; kind: WaitKind }[] = [],
    options: {
      runId?: string; fresh?: boolean; trace?: Context | undefined; run?: RunRide;
      /**
       * The turn ends without its runner (canceled while rescheduling, retries exhausted): each
       * tool use of the turn left without a result gets one saying so (`is_error`; `interrupted`
       * when interrupted), with the end, so the conversation stays well formed.
       */
      closeOpenUses?: { content: string; interrupted: boolean };
    } = {},
  ): Promise<ThreadDoc> {
    const runId = options.runId ?? null;
    const now = Date.now();
    let endedRunId: string | null = null;
    let moved = false;
    // A coordinator's delegation tool uses wait for the control plane, not for a client.
    const delegations = stop.type === 'requires_action' ? await this.coordinator.classify(session, threadId, waits) : new Map<string, never>();
    // Written down before the waits are: if this process dies before it carries them out and no
    // repeat of this end comes (the runner gone too), the scheduler's sweep does.
    if (delegations.size > 0) await this.coordinator.carrying(session.id);
    const idle: AppendEvent = {
      type: 'session.status_idle', payload: { stop_reason: stop }, session_thread_id: threadId, ...(runId !== null ? { producer_key: `run:${runId}:idle` } : {}),
    };
    const close = options.closeOpenUses;
    const closing: AppendEvent[] = close && runId !== null
      ? (await this.openUsesOfTurn(session.id, threadId, threadId === session._primary_thread_id)).map((id) => ({
        type: 'agent.tool_result', session_thread_id: threadId, producer_key: `run:${runId}:closed:${id}`,
        payload: { tool_use_id: id, content: close.content, is_error: true, ...(close.interrupted ? { interrupted: true } : {}) },
      }))
      : [];
    const ending = closing.length > 0 ? () => [...closing, idle] : idle;
    const { thread: next, appended, queued, activeOutcome } = await this.store.endTurnWith(session.id, threadId, (t) => {
      endedRunId = t._active_run_id;
      moved = false;
      if (t.status === 'terminated') return null;
      if (runId !== null && (t._active_run_id !== runId || (t.status !== 'running' && t.status !== 'rescheduling'))) return null;
      moved = true;
      const ranMs = t._running_since_ms !== null ? now - t._running_since_ms : 0;
      const base = {
        ...t, status: 'idle' as const, _running_since_ms: null, _running_ms_total: t._running_ms_total + ranMs, _stop_reason: stop, _ended_run_id: t._active_run_id,
      };
      if (stop.type === 'requires_action') {
        const gen = t._wait_generation + 1;
        const w = { ...t._waits };
        for (const x of waits) {
          const d = delegations.get(x.tool_use_id);
          w[x.tool_use_id] = { generation: gen, kind: d ? 'delegation' : x.kind, answered_event_id: null, answer_fingerprint: null, ...(d ? { delegation: d } : {}) };
        }
        return { ...base, _wait_generation: gen, _waits: w };
      }
      return { ...base, _active_run_id: null };
    }, ending, options.trace, options.run);
    if (options.run && !options.run.written) throw new RideRefused('the thread did not move');
    if (runId !== null && !moved && next.status !== 'terminated') {
      // Already ended: repair the later steps only while this Run's end is the thread's last move.
      if (next.status !== 'idle' || next._ended_run_id !== runId) return next;
      endedRunId = runId;
    }
    crashPoint('turn-end-written');
    // The end's own write appended the event; a repeated end (or one that did not move the
    // thread) appends it here, once per Run (its producer key).
    if (!appended) await this.store.log.append(session.id, [...closing, idle], { trace: options.trace });
    // An archived Session takes no new work: queued messages stay in the log but start no turn.
    // A Session handed in fresh may predate an archive made during the turn: the thread just
    // written says so (`_archived`).
    const read = options.fresh ? session : await this.store.docs.get<SessionDoc>(sessionTag(session.id), session.id);
    const live = read?.type === 'session' && read.archived_at === null && next._archived === true ? { ...read, archived_at: next.updated_at } : read;
    // A user.interrupt that reached this Run while its end was on the way marked the Run, then
    // looked for waits before they were written: it found none to end. Its mark is seen here
    // (mark then look, write then check: one side sees the other), so the waits just written end
    // as interrupted, and a coordinator's delegation uses start no child.
    if (stop.type === 'requires_action' && endedRunId !== null && waitsOnAction(next) && live?.type === 'session' && (await this.cancels.marked(session.id, endedRunId))) {
      await this.interruptWait(live, threadId, options.trace);
      return this.store.thread(session.id, threadId);
    }
    if (live?.type === 'session' && (live.agent.multiagent || next.parent_thread_id !== null)) await this.coordinator.turnEnded(live, next);
    if (stop.type !== 'requires_action' && this.turnEnded && live?.type === 'session' && next.status !== 'terminated') {
      if (await this.turnEnded(live, threadId, endedRunId, stop, options.trace, activeOutcome)) return this.store.thread(session.id, threadId);
    }
    if (stop.type !== 'requires_action' && live?.type === 'session' && live.archived_at === null) {
      // Everything queued during the turn becomes the input of the next one, in arrival order
      // (the queue is read after the thread became idle: see submitUserMessage).
      // The queue as the end's own script read it (after the thread's end): not read again.
      const { run } = await this.submitUserMessage(live, threadId, null, { thread: next, trace: options.trace, ...(queued ? { queue: queued } : {}) });
      if (options.fresh && !run) return next;
    } else if (live?.type === 'session' && live.archived_at !== null) {
      // The end of an archived Session's last turn: its terminal status event follows.
      await this.closer.settle(session.id);
    }
    return this.store.thread(session.id, threadId);
  }

  /** Runtime side: a transient runner failure with retries left (`attempt` of the thread's Run ended, for `cause`). */
  async reschedule(session: SessionDoc, threadId: string, attempt: number, cause: string): Promise<ThreadDoc> {
    const t = await this.store.updateThread(session.id, threadId, (cur) => {
      if (cur.status !== 'running' || cur._active_run_id === null) throw new ApiError('runtime.invalid_transition', `a ${cur.status} thread cannot be rescheduled`);
      return { ...cur, status: 'rescheduling' };
    });
    await this.store.log.append(session.id, [rescheduledEvent(threadId, t._active_run_id ?? '', attempt, cause)]);
    return t;
  }

  /**
   * Runtime side: a later attempt of the thread's Run started (its lease was accepted). The
   * thread, `rescheduling` since the attempt before it ended, runs again, and
   * `session.status_running` says so as at the turn's start (`{run_id, attempt}`, producer key
   * `status:<run>:running:<attempt>`), written by one script with the thread. A thread in any
   * other state (running already, its turn ended, another Run's turn) is left as it is, so a
   * start reported again writes nothing more.
   */
  async resumed(sessionId: string, threadId: string, runId: string, attempt: number, trace?: Context): Promise<void> {
    await this.store.updateThreadWith(sessionId, threadId, (t) =>
      t.status === 'rescheduling' && t._active_run_id === runId ? { ...t, status: 'running' } : null, {
      type: 'session.status_running', payload: { run_id: runId, attempt }, session_thread_id: threadId, producer_key: `status:${runId}:running:${attempt}`,
    }, trace);
  }

  /** Runtime side: rescheduling gave up; the thread stays addressable. */
  async retriesExhausted(session: SessionDoc, threadId: string): Promise<ThreadDoc> {
    return this.endTurn(session, threadId, { type: 'retries_exhausted' });
  }

  /** Runtime side: unrecoverable terminal error. */
  async terminate(session: SessionDoc, threadId: string, reason = 'error'): Promise<ThreadDoc> {
    const now = Date.now();
    let approvals: string[] = [];
    const t = await this.store.updateThread(session.id, threadId, (cur) => {
      if (cur.status === 'terminated') return null;
      approvals = ThreadRuntime.approvalWaits(cur);
      return {
        ...cur, status: 'terminated', _active_run_id: null,
        _running_ms_total: cur._running_ms_total + (cur._running_since_ms !== null ? now - cur._running_since_ms : 0), _running_since_ms: null,
      };
    });
    await this.store.log.append(session.id, [{ type: 'session.thread_status_terminated', payload: { reason }, session_thread_id: threadId }]);
    if (approvals.length > 0 && this.waitsEnded) await this.waitsEnded(session, threadId, approvals);
    return t;
  }
}
