import { ApiError, crashPoint, newId, nowIso, sha256Hex, type Context, type Logger } from '@agentplane/core';
import { eventLogKeys, keys, LuaScript, newEventId, tags, type AppendEvent, type LogEvent, type StoredDoc } from '@agentplane/store';
import type { FileStore } from '../files/store.js';
import type { SessionDoc, ThreadDoc } from '../sessions/model.js';
import { activeOutcomesKey, type SessionStore } from '../sessions/store.js';
import { runningThread, startable, type StopReason, type ThreadRuntime, type TurnScheduler } from '../sessions/turns.js';
import { GRADER_LIMITS, parseVerdict, rubricCriteria, type CriterionVerdict, type Verdict } from './grader.js';

/** A drive event's payload as the api validated it (`user.define_outcome`). */
type DrivePayload = Record<string, unknown>;

/** How an outcome ended (docs/OUTCOMES.md). */
export type OutcomeResult = 'satisfied' | 'failed' | 'max_iterations_reached' | 'interrupted';

export type RubricRef = string | { type: 'file'; file_id: string };

/** One outcome of a thread (`ap:{s:<sess>}:doc:<outc_>`), listed in the Session's `outcomes` index. */
export interface OutcomeDoc extends StoredDoc {
  type: 'outcome';
  session_id: string;
  workspace_id: string;
  thread_id: string;
  define_event_id: string;
  description: string;
  rubric: RubricRef;
  max_iterations: number;
  grader_model: string;
  /** `working`: an agent turn runs; `grading`: the grader Run runs; `ended`: see `result`. */
  status: 'working' | 'grading' | 'ended';
  result: OutcomeResult | null;
  evaluation_count: number;
  revision_count: number;
  grader_run_id: string | null;
  current_evaluation: { id: string; iteration: number; started_at: string } | null;
  ended_at: string | null;
  /**
   * The Run of the outcome's first turn, started by the define's own commit (a define sent to a
   * Session, or in a new Session's `initial_events`); absent for an outcome written before
   * defines started their turn, whose turn was started after the define's append.
   */
  first_run_id?: string;
}

/** One entry of the Session's `outcome_evaluations`. */
export interface OutcomeEvaluation {
  id: string;
  outcome_id: string;
  iteration: number;
  result: Verdict | 'interrupted';
  criteria: CriterionVerdict[];
  explanation: string | null;
  run_id: string | null;
  usage: Record<string, number> | null;
  started_at: string;
  ended_at: string;
}

export const DEFAULT_MAX_ITERATIONS = 3;
export const MAX_ITERATIONS_LIMIT = 20;
/** The routing profile key a Workspace sets up to grade every outcome that names none. */
export const DEFAULT_GRADER_PROFILE_KEY = 'outcome-grader';

export interface OutcomeServiceDeps {
  store: SessionStore;
  runtime: ThreadRuntime;
  scheduler: () => TurnScheduler;
  log: Logger;
  /** For rubrics given as a File (absent: File rubrics are refused). */
  files?: FileStore;
  /** Whether the workspace has a routing profile with this key (absent: every key is accepted). */
  hasProfile?: (ws: string, key: string) => Promise<boolean>;
}

/** Clears a thread's active outcome only if it is still this one. */
const CLEAR_ACTIVE = new LuaScript('outcome-clear-active',
  "if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end return 0");

const hashId = (prefix: string, seed: string): string => `${prefix}_${sha256Hex(seed).slice(0, 32)}`;

const busy = (): ApiError => new ApiError('runtime.invalid_transition', 'the thread already works on an outcome');

/**
 * Outcomes: `user.define_outcome` starts a turn; each turn that ends normally is graded by a
 * grader Run on the same thread (leased and metered like any Run); `needs_revision` starts the
 * next turn with the explanation as its input; the outcome ends `satisfied`, `failed`,
 * `max_iterations_reached` or `interrupted`. Every step is a compare-and-swap on the outcome
 * document and an event with a producer key, so a repeated report changes nothing.
 */
export class OutcomeService {
  constructor(private readonly d: OutcomeServiceDeps) {}

  private tag(sessionId: string) {
    return tags.session(sessionId);
  }

  private activeKey(sessionId: string): string {
    return activeOutcomesKey(sessionId);
  }

  get(sessionId: string, id: string): Promise<OutcomeDoc | null> {
    return readOutcome(this.d.store, sessionId, id);
  }

  /** `known`: the thread's active outcome id as a script just read it (null: none); read here when absent. */
  async active(sessionId: string, threadId: string, known?: string | null): Promise<OutcomeDoc | null> {
    const id = known !== undefined ? known : await this.d.store.redis.hget(this.activeKey(sessionId), threadId);
    const doc = id ? await this.get(sessionId, id) : null;
    return doc && doc.status !== 'ended' ? doc : null;
  }

  /** The routing profile that grades an outcome: its own, else the workspace's `outcome-grader`, else the agent's model. */
  async graderModel(session: SessionDoc, requested: string | undefined): Promise<string> {
    if (requested) {
      if (this.d.hasProfile && !(await this.d.hasProfile(session.workspace_id, requested))) {
        throw new ApiError('model.no_eligible_model', `body.payload.grader_model: no routing profile '${requested}' in this workspace`);
      }
      return requested;
    }
    if (this.d.hasProfile && (await this.d.hasProfile(session.workspace_id, DEFAULT_GRADER_PROFILE_KEY))) return DEFAULT_GRADER_PROFILE_KEY;
    return session.agent.model;
  }

  /**
   * Before a new Session is written: its thread takes the define of its `initial_events`, and the
   * rubric File exists. Only a check, made before anything of the Session is written:
   * `defineInNewSession` makes the define and takes the thread in one step.
   */
  async admit(session: SessionDoc, thread: ThreadDoc, p: DrivePayload): Promise<void> {
    this.checkThread(thread);
    await this.holderToReplace(session.id, thread.id);
    await this.checkPayload(session, p);
  }

  /** A define needs its thread free to start a turn: idle, no Run, no unanswered wait (else 409). */
  private checkThread(thread: Readonly<ThreadDoc>): void {
    if (!startable(thread)) {
      throw new ApiError('runtime.invalid_transition', 'an outcome starts on an idle thread (no turn running or waiting for an answer)');
    }
  }

  /**
   * The thread's claim a define may replace: the id of an outcome that is over (it ended, or its
   * document is gone) but still names the thread, or null when none does. 409 while an outcome
   * works on the thread.
   */
  private async holderToReplace(sessionId: string, threadId: string): Promise<string | null> {
    const holder = await this.d.store.redis.hget(this.activeKey(sessionId), threadId);
    if (holder && (await this.active(sessionId, threadId, holder))) throw busy();
    return holder;
  }

  /** The define's references: its rubric File exists and is small enough; its grader's routing profile exists. */
  private async checkPayload(session: SessionDoc, p: DrivePayload): Promise<void> {
    const rubric = p.rubric as RubricRef;
    if (typeof rubric !== 'string') {
      if (!this.d.files) throw new ApiError('validation.malformed', 'body.payload.rubric: File rubrics are not served here');
      const file = await this.d.files.get(session.workspace_id, rubric.file_id);
      if (file.size_bytes > GRADER_LIMITS.rubricBytes) throw new ApiError('validation.malformed', `body.payload.rubric: the File holds more than ${GRADER_LIMITS.rubricBytes} bytes`);
      // As an inline rubric: text of at least one character (UTF-8), never graded against nothing.
      if (file.size_bytes === 0) throw new ApiError('validation.malformed', 'body.payload.rubric: the File is empty');
      const bytes = await rubricBytes(this.d.files, session.workspace_id, rubric.file_id);
      try {
        new TextDecoder('utf-8', { fatal: true }).decode(bytes);
      } catch {
        throw new ApiError('validation.malformed', 'body.payload.rubric: the File is not UTF-8 text');
      }
    }
    await this.graderModel(session, p.grader_model as string | undefined);
  }

  /**
   * A `user.define_outcome` for a Session's thread, written whole by one commit of the Session's
   * event log (`commitDefine`): the define event, the outcome document, the thread's claim on it
   * (`outcomes:active`), `session.outcome_started` and the outcome's first turn. Of two defines
   * sent together one only is written: the other is 409 `runtime.invalid_transition` and writes
   * nothing. A define whose producer key names an earlier append answers that append's event (a
   * retry), without a check; so does one that lost its commit to the same producer key's append
   * (the same request sent twice at once): the thread it finds taken is taken by its own event.
   */
  async appendDefine(session: SessionDoc, thread: ThreadDoc, p: DrivePayload, producerKey: string | undefined, trace?: Context): Promise<LogEvent> {
    if (producerKey) {
      const prior = await this.priorEvent(session.id, producerKey);
      if (prior) return prior;
    }
    try {
      await this.checkPayload(session, p);
      const eventId = newEventId();
      const define: AppendEvent = { id: eventId, type: 'user.define_outcome', payload: p, session_thread_id: thread.id, ...(producerKey ? { producer_key: producerKey } : {}) };
      const events = await this.commitDefine(session, thread, [define], trace);
      const ev = events?.[0];
      if (ev) return ev;
      throw new ApiError('runtime.invalid_transition', 'the event log refused the append');
    } catch (err) {
      // The same request appended meanwhile (its commit won, or its producer key refused this
      // one's): its event is the answer, as for a retry after it.
      if (producerKey && err instanceof ApiError && err.status === 409) {
        const prior = await this.priorEvent(session.id, producerKey);
        if (prior) return prior;
      }
      throw err;
    }
  }

  /**
   * A new Session's `initial_events` holding a `user.define_outcome` (checked by `admit`), written
   * by one commit of its event log like a define sent to a Session (`commitDefine`): the initial
   * events, the outcome document, the thread's claim, `session.outcome_started` and the outcome's
   * first turn, whose input is every initial event in order (the messages beside the define are
   * the outcome's first input with it). A process that dies after the Session's documents are
   * written and before this commit leaves a Session with no event; one that dies after it leaves
   * the Run to the scheduler's enqueue repair: never a define without its outcome and turn.
   * `producerKey`: the create's batch key (event i is keyed `<producerKey>#<i>`); an earlier
   * append under it answers its events.
   */
  async defineInNewSession(session: SessionDoc, thread: ThreadDoc, initial: ReadonlyArray<{ type: string; payload: DrivePayload }>, producerKey: string | undefined, trace?: Context): Promise<LogEvent[]> {
    if (!initial.some((e) => e.type === 'user.define_outcome')) throw new ApiError('validation.malformed', 'initial_events: no user.define_outcome');
    const keyed = producerKey ? initial.map((_, i) => `${producerKey}#${i}`) : [];
    // Appended before under the same keys (the same create again): those events are the answer.
    // Looked up only once the commit refused: a new Session's log has none.
    const prior = async (): Promise<LogEvent[] | null> => {
      const found: LogEvent[] = [];
      for (const k of keyed) {
        const ev = await this.priorEvent(session.id, k);
        if (!ev) return null;
        found.push(ev);
      }
      return found.length > 0 ? found : null;
    };
    const events: AppendEvent[] = initial.map((e, i) => ({
      id: newEventId(), type: e.type, payload: e.payload, session_thread_id: thread.id, ...(keyed[i] ? { producer_key: keyed[i] } : {}),
    }));
    try {
      const committed = await this.commitDefine(session, thread, events, trace);
      if (committed) return committed.slice(0, events.length);
    } catch (err) {
      if (!(err instanceof ApiError && err.status === 409)) throw err;
      const after = await prior();
      if (after) return after;
      throw err;
    }
    const after = await prior();
    if (after) return after;
    throw new ApiError('runtime.invalid_transition', 'the event log refused the append');
  }

  /**
   * One commit of the Session's event log that appends `clients` (client events of the thread,
   * each with its id named ahead, exactly one of them the `user.define_outcome`) and starts the
   * outcome: the outcome document, the thread's claim on it (`outcomes:active`),
   * `session.outcome_started` and the outcome's first turn (the thread's compare-and-swap to
   * `running`, its Run `queued` with `clients` as its input, after any messages still queued on
   * the thread, and `session.status_running`). The thread is checked free (idle, no Run, no
   * unanswered wait) as the version that the commit compares: a thread that moved meanwhile is
   * read again and checked again, so the check and the start are one step. The Run's id is
   * recorded in the enqueue outbox before the commit (`TurnScheduler.runStarting`), so a process
   * that dies after the commit and before the Run reaches its queue leaves the Run to the
   * scheduler's enqueue repair: a committed define always gets its turn. Returns the committed
   * events (`clients` first), or null when a producer key of `clients` names an earlier append
   * (nothing written).
   */
  private async commitDefine(session: SessionDoc, thread: Readonly<ThreadDoc>, clients: readonly AppendEvent[], trace: Context | undefined): Promise<LogEvent[] | null> {
    const define = clients.find((e) => e.type === 'user.define_outcome');
    const eventId = define?.id;
    if (!define || !eventId || clients.some((e) => !e.id)) throw new ApiError('validation.malformed', 'a define commit names its events ahead');
    const inputs = clients.map((e) => e.id ?? eventId);
    const base = await this.newDoc(session, thread.id, eventId, define.payload as DrivePayload);
    const tag = this.tag(session.id);
    const started: AppendEvent = {
      type: 'session.outcome_started', session_thread_id: thread.id, producer_key: `outcome:${base.id}:started`,
      payload: { outcome_id: base.id, description: base.description, max_iterations: base.max_iterations, grader_model: base.grader_model },
    };
    const scheduler = this.d.scheduler();
    let known: Readonly<ThreadDoc> = thread;
    // The thread's queued inputs, once a commit found its queue not empty: the turn takes them first.
    let queued: string[] = [];
    for (let attempt = 0; attempt < 16; attempt++) {
      this.checkThread(known);
      const replaces = await this.holderToReplace(session.id, known.id);
      const runId = newId('run');
      const doc: OutcomeDoc = { ...base, first_run_id: runId };
      await scheduler.runStarting?.(session.id, runId, session);
      let committed = false;
      try {
        const { result: r, run } = await this.d.store.startTurnWithEvents(session, known, runningThread(known, runId),
          { runId, inputs: [...(known._queued_inputs ?? []), ...queued, ...inputs], dequeue: queued },
          [...clients, started], {
            docs: [{ key: keys.doc(tag, doc.id), body: JSON.stringify(doc), expectedVersion: null, index: { key: keys.index(tag, 'outcomes'), score: Date.parse(doc.created_at), member: doc.id } }],
            claim: { key: this.activeKey(session.id), field: known.id, value: doc.id, replaces }, trace,
          });
        if (r.ok) {
          committed = true;
          // Crash tests: the outcome and its turn are committed, the Run is not in its queue yet.
          crashPoint('outcome-define-committed');
          await scheduler.runQueued(run, trace);
          return r.events;
        }
        if (r.reason === 'claimed') throw busy();
        if (r.reason === 'erased') throw new ApiError('validation.not_found', 'the session was deleted and its event log erased');
        if (r.reason === 'stale' && r.index === 0) {
          known = JSON.parse(r.current) as ThreadDoc;
          continue;
        }
        if (r.reason === 'missing' && r.index === 0) throw new ApiError('validation.not_found', 'thread not found');
        if (r.reason === 'queue') {
          queued = await this.d.store.queuedInputs(session.id, known.id);
          continue;
        }
        if (r.reason === 'replay') return null;
        throw new ApiError('runtime.invalid_transition', 'the event log refused the append');
      } finally {
        // What the scheduler took for the start ahead of the commit (a fair-share rank) goes
        // when no Run was committed under it; the outbox entry is dropped by the repair.
        if (!committed) scheduler.runNotStarting?.(runId);
      }
    }
    throw new ApiError('validation.conflict', 'too much contention on this thread; send the define again');
  }

  /** The event an earlier append with this producer key was given (null: none; 404 when it is no longer retained). */
  private async priorEvent(sessionId: string, producerKey: string): Promise<LogEvent | null> {
    const seq = Number(await this.d.store.redis.hget(eventLogKeys.producers(sessionId), producerKey));
    if (!Number.isInteger(seq) || seq <= 0) return null;
    const [event] = await this.d.store.log.range(sessionId, seq - 1, 1, seq);
    if (!event) throw new ApiError('validation.not_found', 'the original event is no longer retained');
    return event;
  }

  private async newDoc(session: SessionDoc, threadId: string, eventId: string, p: DrivePayload): Promise<OutcomeDoc> {
    const now = nowIso();
    return {
      id: hashId('outc', eventId), type: 'outcome', session_id: session.id, workspace_id: session.workspace_id, thread_id: threadId, define_event_id: eventId,
      description: String(p.description), rubric: p.rubric as RubricRef,
      max_iterations: Math.min(MAX_ITERATIONS_LIMIT, Math.max(1, Number(p.max_iterations ?? DEFAULT_MAX_ITERATIONS))),
      grader_model: await this.graderModel(session, p.grader_model as string | undefined),
      status: 'working', result: null, evaluation_count: 0, revision_count: 0, grader_run_id: null, current_evaluation: null, ended_at: null,
      version: 1, created_at: now, updated_at: now,
    };
  }

  /**
   * The define event was appended: record the outcome (when `appendDefine` has not already) and
   * start its first turn. Retry-safe.
   * `trace`: the context of the request that defined it (the parent of its spans).
   */
  async defined(session: SessionDoc, threadId: string, event: LogEvent, trace?: Context): Promise<OutcomeDoc> {
    const id = hashId('outc', event.id);
    let doc = await this.get(session.id, id);
    if (!doc) {
      const fresh = await this.newDoc(session, threadId, event.id, event.payload as DrivePayload);
      await this.d.store.docs.create(this.tag(session.id), fresh, ['outcomes']);
      doc = (await this.get(session.id, id)) ?? fresh;
    }
    // A retry after the outcome ended: nothing to start again. A define whose commit started
    // the first turn has nothing left to do either (a Run its process did not queue is queued by
    // the scheduler's enqueue repair).
    if (doc.status === 'ended' || doc.first_run_id !== undefined) return doc;
    const claimed = (await this.d.store.redis.hsetnx(this.activeKey(session.id), threadId, id)) === 1
      || (await this.d.store.redis.hget(this.activeKey(session.id), threadId)) === id;
    if (!claimed) {
      // Another outcome holds the thread (only a define that did not take it can get here): this one ends at once.
      await this.finish(doc, 'failed', 'the thread already works on another outcome', undefined, trace);
      return (await this.get(session.id, id)) ?? doc;
    }
    await this.append(session.id, threadId, 'session.outcome_started', {
      outcome_id: id, description: doc.description, max_iterations: doc.max_iterations, grader_model: doc.grader_model,
    }, `outcome:${id}:started`, trace);
    await this.d.runtime.submitUserMessage(session, threadId, event.id, { trace });
    return (await this.get(session.id, id)) ?? doc;
  }

  private async append(sessionId: string, threadId: string, type: string, payload: Record<string, unknown>, producerKey: string, trace: Context | undefined): Promise<LogEvent | null> {
    const r = await this.d.store.log.append(sessionId, [{ type, payload, session_thread_id: threadId, producer_key: producerKey }], { trace });
    return r.ok ? (r.events[0] ?? null) : null;
  }

  private update(o: OutcomeDoc, change: (cur: OutcomeDoc) => OutcomeDoc | null): Promise<OutcomeDoc> {
    return this.d.store.docs.update<OutcomeDoc>(this.tag(o.session_id), o.id, (cur) => {
      const next = change(cur);
      return next ? { ...next, updated_at: nowIso() } : null;
    }, { notFound: 'outcome' });
  }

  /**
   * The turn-end hook (`ThreadRuntime.onTurnEnded`): grade, revise or end the thread's outcome.
   * `trace`: the context the turn's end was reported in (the parent of the outcome's spans).
   */
  async turnEnded(session: SessionDoc, threadId: string, endedRunId: string | null, stop: StopReason, trace?: Context, activeOutcome?: string | null): Promise<boolean> {
    const o = await this.active(session.id, threadId, activeOutcome);
    if (!o) return false;
    const gradingEnded = o.status === 'grading' && endedRunId === o.grader_run_id;
    if (session.archived_at !== null && !gradingEnded) {
      // An archived Session takes no new work: no grading, no revision. (A grader Run that ran
      // to its end is recorded all the same: `graded` starts no revision on an archived Session.)
      await this.finish(o, 'interrupted', 'the session was archived', undefined, trace);
      return false;
    }
    try {
      if (o.status === 'grading') {
        if (endedRunId !== o.grader_run_id) return false;
        return await this.graded(session, o, endedRunId, stop, trace);
      }
      if (stop.type === 'end_turn') return await this.startGrading(session, o, trace);
      await this.finish(o, stop.type === 'interrupted' ? 'interrupted' : 'failed', `the agent's turn ended with ${stop.type}`, undefined, trace);
      return false;
    } catch (err) {
      this.d.log.warn({ err: err instanceof Error ? err.message : String(err), outcome: o.id }, 'outcome step failed; the outcome ends failed');
      await this.finish(o, 'failed', 'the platform could not continue the outcome', undefined, trace).catch(() => undefined);
      return false;
    }
  }

  /**
   * The Session was archived. An outcome whose thread has no Run under way ends `interrupted`
   * now: its turn waits on an answer (a question, a custom tool result, a confirmation) that an
   * archived Session no longer takes, so no turn end would ever end it. One whose thread runs (an
   * agent turn, a grader Run) ends at that Run's end (`turnEnded`). Retry-safe: an outcome that
   * ended already is left as it is.
   */
  async sessionArchived(session: SessionDoc, trace?: Context): Promise<void> {
    const claims = await this.d.store.redis.hgetall(this.activeKey(session.id));
    for (const [threadId, outcomeId] of Object.entries(claims)) {
      const o = await this.active(session.id, threadId, outcomeId);
      // A grader Run under way: its end records the evaluation, then ends the outcome.
      if (!o || o.status === 'grading') continue;
      const thread = await this.d.store.thread(session.id, threadId).catch(() => null);
      if (thread && (thread.status === 'running' || thread.status === 'rescheduling')) continue;
      await this.finish(o, 'interrupted', 'the session was archived', undefined, trace, true);
    }
  }

  private async startGrading(session: SessionDoc, o: OutcomeDoc, trace: Context | undefined): Promise<boolean> {
    const iteration = o.evaluation_count + 1;
    const evaluationId = hashId('oeval', `${o.id}:${iteration}`);
    const runId = newId('run');
    const started_at = nowIso();
    const cur = await this.update(o, (c) => (c.status !== 'working' ? null : {
      ...c, status: 'grading', grader_run_id: runId, current_evaluation: { id: evaluationId, iteration, started_at },
    }));
    if (cur.grader_run_id !== runId) return false;
    await this.d.scheduler().runStarting?.(session.id, runId);
    let taken = false;
    const { run } = await this.d.store.startTurn(session, o.thread_id, (t) => {
      taken = t.status === 'running' || t.status === 'rescheduling';
      return t.status !== 'idle' || t._active_run_id !== null ? null : {
        thread: { ...t, status: 'running', _active_run_id: runId, _running_since_ms: Date.now(), _stop_reason: null },
        start: { runId, inputs: [], grader: { outcome_id: o.id, evaluation_id: evaluationId, iteration, routing_key: o.grader_model } },
      };
    }, trace);
    if (!run) {
      this.d.scheduler().runNotStarting?.(runId);
      if (taken) return this.gradingDeferred(session, cur, runId, trace);
      await this.finish(cur, 'failed', 'the thread was not free for grading', undefined, trace);
      return false;
    }
    // The grader Run is the thread's active Run from here on, so user.interrupt reaches it.
    await this.append(session.id, o.thread_id, 'session.outcome_evaluation_started', {
      outcome_id: o.id, evaluation_id: evaluationId, iteration, run_id: runId,
    }, `outcome:${o.id}:evaluation:${iteration}:started`, trace);
    await this.d.scheduler().runQueued(run, trace);
    return true;
  }

  /**
   * The agent's turn ended, but another turn took the thread before the grader Run could (a
   * message sent in the instant between the two found the thread idle): the outcome goes back to
   * `working`, and that turn's end grades it (or ends it, as any turn end of the outcome would).
   * Should that turn have ended already (its end found the outcome grading, and left it to this
   * grading), its end is taken up here.
   */
  private async gradingDeferred(session: SessionDoc, o: OutcomeDoc, runId: string, trace: Context | undefined): Promise<boolean> {
    const back = await this.update(o, (c) => (c.status !== 'grading' || c.grader_run_id !== runId ? null : {
      ...c, status: 'working', grader_run_id: null, current_evaluation: null,
    }));
    if (back.status !== 'working') return false;
    const t = await this.d.store.thread(session.id, o.thread_id);
    const ended = t._ended_run_id ?? null;
    if (t.status !== 'idle' || t._active_run_id !== null || ended === null || t._stop_reason === null || (t._stop_reason as StopReason).type === 'requires_action') return false;
    return this.turnEnded(session, o.thread_id, ended, t._stop_reason as StopReason, trace, o.id);
  }

  private async graded(session: SessionDoc, o: OutcomeDoc, runId: string | null, stop: StopReason, trace: Context | undefined): Promise<boolean> {
    const run = runId ? await this.d.store.run(session.id, runId) : null;
    const ev = o.current_evaluation ?? { id: hashId('oeval', `${o.id}:${o.evaluation_count + 1}`), iteration: o.evaluation_count + 1, started_at: o.updated_at };
    const usage = run?.grader_result?.usage ?? null;
    const criteria = rubricCriteria(await this.rubricText(o).catch(() => ''));
    if (stop.type === 'interrupted') {
      await this.record(session, o, { id: ev.id, outcome_id: o.id, iteration: ev.iteration, result: 'interrupted', criteria: [], explanation: null, run_id: runId, usage, started_at: ev.started_at, ended_at: nowIso() }, o.revision_count, trace);
      await this.finish(o, 'interrupted', 'interrupted during grading', ev.iteration, trace);
      return false;
    }
    const verdict = run?.grader_result && stop.type === 'end_turn' ? parseVerdict(run.grader_result.output, criteria) : null;
    const record: OutcomeEvaluation = {
      id: ev.id, outcome_id: o.id, iteration: ev.iteration, result: verdict?.result ?? 'failed', criteria: verdict?.criteria ?? [],
      explanation: verdict ? verdict.explanation : `The grader Run gave no verdict (${stop.type === 'end_turn' ? 'its answer was not one' : `it ended with ${stop.type}`}).`,
      run_id: runId, usage, started_at: ev.started_at, ended_at: nowIso(),
    };
    const evaluationsLeft = record.result === 'needs_revision' && ev.iteration < o.max_iterations;
    // An archived Session takes no new work: the evaluation is recorded, but no revision starts.
    const revise = evaluationsLeft && session.archived_at === null;
    const event = await this.record(session, o, record, revise ? o.revision_count + 1 : o.revision_count, trace);
    if (record.result === 'satisfied') await this.finish(o, 'satisfied', null, ev.iteration, trace);
    else if (record.result === 'failed') await this.finish(o, 'failed', record.explanation, ev.iteration, trace);
    else if (evaluationsLeft && !revise) await this.finish(o, 'interrupted', 'the session was archived', ev.iteration, trace);
    else if (!revise) await this.finish(o, 'max_iterations_reached', null, ev.iteration, trace);
    else {
      // Only the call that moves the outcome from this evaluation to `working` starts the
      // revision turn: a repeated report (a stale `grading` document) finds it moved already.
      let moved = false;
      await this.update(o, (c) => {
        moved = c.status === 'grading' && c.current_evaluation?.id === ev.id;
        return !moved ? null : {
          ...c, status: 'working', grader_run_id: null, current_evaluation: null, evaluation_count: ev.iteration, revision_count: c.revision_count + 1,
        };
      });
      if (!moved || !event) return false;
      // The explanation is the next turn's input: no client event needed.
      const { run: revision } = await this.d.runtime.submitUserMessage(session, o.thread_id, event.id, { trace });
      return revision !== null;
    }
    return false;
  }

  /** Appends `session.outcome_evaluation_ended` and adds the evaluation to the Session's `outcome_evaluations`. */
  private async record(session: SessionDoc, o: OutcomeDoc, e: OutcomeEvaluation, revisions: number, trace: Context | undefined): Promise<LogEvent | null> {
    await this.d.store.update(session.workspace_id, session.id, (s) =>
      (s.outcome_evaluations as OutcomeEvaluation[]).some((x) => x.id === e.id) ? null : { ...s, outcome_evaluations: [...s.outcome_evaluations, e], updated_at: nowIso() });
    return this.append(session.id, o.thread_id, 'session.outcome_evaluation_ended', {
      ...e, evaluation_id: e.id, evaluation_count: e.iteration, revision_count: revisions,
    }, `outcome:${o.id}:evaluation:${e.iteration}:ended`, trace);
  }

  /** `unlessGrading`: an outcome whose grader Run started meanwhile is left to that Run's end. */
  private async finish(o: OutcomeDoc, result: OutcomeResult, reason: string | null, evaluations: number | undefined, trace: Context | undefined, unlessGrading = false): Promise<void> {
    const done = await this.update(o, (c) => (c.status === 'ended' || (unlessGrading && c.status === 'grading') ? null : {
      ...c, status: 'ended', result, grader_run_id: null, current_evaluation: null, ended_at: nowIso(),
      evaluation_count: evaluations ?? c.evaluation_count,
    }));
    if (done.status !== 'ended') return;
    await CLEAR_ACTIVE.run(this.d.store.redis, [this.activeKey(o.session_id)], [o.thread_id, o.id]);
    await this.append(o.session_id, o.thread_id, 'session.outcome_ended', {
      outcome_id: o.id, result: done.result, evaluation_count: done.evaluation_count, revision_count: done.revision_count,
      ...(reason ? { reason } : {}),
    }, `outcome:${o.id}:ended`, trace);
  }

  rubricText(o: Pick<OutcomeDoc, 'rubric' | 'workspace_id'>): Promise<string> {
    return rubricText(this.d.files, o);
  }

}

export async function readOutcome(store: SessionStore, sessionId: string, id: string): Promise<OutcomeDoc | null> {
  const doc = await store.docs.get<OutcomeDoc>(tags.session(sessionId), id);
  return doc?.type === 'outcome' ? doc : null;
}

/** The rubric as text: inline, or the File's content (bounded). */
export async function rubricText(files: FileStore | undefined, o: Pick<OutcomeDoc, 'rubric' | 'workspace_id'>): Promise<string> {
  if (typeof o.rubric === 'string') return o.rubric;
  if (!files) return '';
  return (await rubricBytes(files, o.workspace_id, o.rubric.file_id)).toString('utf8');
}

/** A rubric File's content, up to what a rubric may hold. */
async function rubricBytes(files: FileStore, workspaceId: string, fileId: string): Promise<Buffer> {
  const file = await files.get(workspaceId, fileId);
  const chunks: Buffer[] = [];
  let size = 0;
  for await (const c of files.read(file)) {
    chunks.push(c);
    size += c.length;
    if (size >= GRADER_LIMITS.rubricBytes) break;
  }
  return Buffer.concat(chunks).subarray(0, GRADER_LIMITS.rubricBytes);
}
