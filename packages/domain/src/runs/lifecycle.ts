import { ApiError, crashPoint, nowIso, type Context, type Logger } from '@agentplane/core';
import { BoundedCache, keys, tags, type AppendEvent, type AppendResult, type SwapOutcome } from '@agentplane/store';
import type { FenceClaim, LeaseFence } from '@agentplane/lease';
import type { GraderRunResult, RunAttempt, RunDoc, RunStatus, WaitKind } from '../sessions/model.js';
import { RideRefused, type RunRide, type SessionStore } from '../sessions/store.js';
import { rescheduledEvent, type StopReason, type ThreadRuntime } from '../sessions/turns.js';

const TERMINAL: ReadonlySet<RunStatus> = new Set(['succeeded', 'failed', 'canceled']);

/** A Run's timestamps, as recorded or (none yet) as a new Run's. */
function timestampsOf(r: RunDoc): NonNullable<RunDoc['timestamps']> {
  return r.timestamps ?? { accepted_at: r.created_at, enqueued_at: null, leased_at: null, started_at: null, first_event_at: null, ended_at: null };
}

/** The Run with its enqueue recorded: the pool whose queue holds its job (unless it names one already) and the time the job was added. */
export function withEnqueue(r: RunDoc, poolId: string, at: string): RunDoc {
  return { ...r, runner_pool_id: r.runner_pool_id ?? poolId, timestamps: { ...timestampsOf(r), enqueued_at: at }, attempts: r.attempts ?? [] };
}
const RECENT_RUNS = { entries: 4096, maxAgeMs: 60_000 };

export interface TurnResult {
  stop_reason: StopReason;
  /** Blocking tool uses that end the Run with requires_action. */
  waits?: { tool_use_id: string; kind: WaitKind }[];
  /** A grader Run's report (docs/OUTCOMES.md). */
  grader?: GraderRunResult;
}

/**
 * The fence claim of a lease being accepted, made by the Run's move to running in the same script
 * (`RunLifecycle.accepted`): one round trip for both.
 */
export interface AcceptClaim {
  fence: LeaseFence;
  claim: FenceClaim;
  ttlMs: number;
}

/** The fence claim made with the Run's move was refused: nothing was written. */
class ClaimRefused extends Error {
  constructor(readonly reason: 'taken' | 'canceled') {
    super(`the lease's claim was refused (${reason})`);
  }
}

/**
 * Every move of a Run's status machine and its effect on the thread, in one place, used by the
 * scheduler (leased, waiting, lost, exhausted) and the gateway (started, completed, failed).
 * Each move is a compare-and-swap on the Run document. A terminal move ends the turn; a repeated
 * report of the same end (the scheduler reconciles finished BullMQ jobs the gateway did not
 * settle) reaches the turn end again, which applies once per Run and otherwise only repairs the
 * steps a crash may have cut off (`ThreadRuntime.endTurn`).
 */
export class RunLifecycle {
  /**
   * Run documents this process wrote last: the first guess of the next move of the same Run (a
   * runner's accept, start, first event and end reach the same process in a row), which saves
   * the read. Only a guess: the compare-and-swap checks its version. Kept as the object that was
   * written, frozen, not as its JSON: every move builds a new document from it (spreads, never
   * writes into it), so one copy serves each later move without a parse, and the write's own
   * document is kept without encoding it once more.
   */
  private readonly recent = new BoundedCache<string, Readonly<RunDoc>>(RECENT_RUNS.entries, { maxAgeMs: RECENT_RUNS.maxAgeMs });

  constructor(
    private readonly store: SessionStore,
    private readonly runtime: ThreadRuntime,
    private readonly log: Logger,
  ) {}

  private async move(
    sessionId: string, runId: string, change: (r: RunDoc) => RunDoc | null, current?: RunDoc, write?: (next: RunDoc, expected: number) => Promise<SwapOutcome>,
  ): Promise<{ run: RunDoc; moved: boolean } | null> {
    let moved = false;
    const guess = current ?? this.guess(runId);
    try {
      const run = await this.store.docs.update<RunDoc>(
        tags.session(sessionId),
        runId,
        (r) => {
          moved = false;
          const next = change(r);
          moved = next !== null;
          return next;
        },
        { notFound: 'run', ...(guess ? { current: guess } : {}), ...(write ? { write } : {}) },
      );
      if (TERMINAL.has(run.status)) this.recent.delete(runId);
      else this.remember(run);
      return { run, moved };
    } catch (err) {
      // Only a Run that is gone is skipped (a late report of a Run whose Session was deleted).
      // Anything else (Redis unreachable, a refused write, contention) wrote nothing, and the
      // caller must not go on as if it had: a job removed after an end that was not recorded
      // would leave the Run and its thread running for ever.
      if (!(err instanceof ApiError && err.type === 'validation.not_found')) throw err;
      this.log.warn({ err: err.message, run: runId }, 'run update skipped: the Run is gone');
      return null;
    }
  }

  private guess(runId: string): RunDoc | undefined {
    // Frozen at the top level: a change that wrote into it would throw, not corrupt the guess.
    return this.recent.get(runId) as RunDoc | undefined;
  }

  private remember(run: RunDoc): void {
    this.recent.set(run.id, Object.freeze(run));
  }

  private ts(r: RunDoc): NonNullable<RunDoc['timestamps']> {
    return timestampsOf(r);
  }

  /** A Run as another part of this process wrote it (its start, with the enqueue recorded: `withEnqueue`): the guess of its next move. */
  written(run: RunDoc): void {
    if (!TERMINAL.has(run.status)) this.remember({ ...run });
  }

  private endAttempt(r: RunDoc, leaseId: string | null, outcome: RunAttempt['outcome'], cause: string | null): RunAttempt[] {
    return (r.attempts ?? []).map((a) => (a.ended_at === null && (leaseId === null || a.lease_id === leaseId) ? { ...a, ended_at: nowIso(), outcome, cause } : a));
  }

  /**
   * The Run's job is in its pool's queue: the pool and the time are recorded, whatever the Run's
   * status by now (a scheduler may take the job, and even say it waits, before this write lands;
   * the interrupt of a queued Run finds its job through the pool). `current`: the Run as its
   * creator just wrote it, so the common case needs no read (the CAS checks it).
   */
  async enqueued(sessionId: string, runId: string, poolId: string, current?: RunDoc): Promise<void> {
    // Taken before the write: a retried compare-and-swap still records when the job was added.
    const at = nowIso();
    await this.move(sessionId, runId, (r) => (TERMINAL.has(r.status) || r.timestamps?.enqueued_at ? null : withEnqueue(r, poolId, at)), current);
  }

  /**
   * `poolId`: the pool whose queue holds the Run's job, recorded if the Run does not say yet.
   * `trace` (here and in the moves below): the context of the turn's work that saw it (the
   * placement, the job the API queued, the runner's report), the parent of the record's spans.
   */
  async waiting(sessionId: string, runId: string, reason: string, poolId: string, trace?: Context): Promise<void> {
    const res = await this.move(sessionId, runId, (r) =>
      (r.status !== 'queued' && r.status !== 'waiting') || r.waiting_reason === reason ? null : {
        ...r, status: 'waiting', waiting_reason: reason, runner_pool_id: r.runner_pool_id ?? poolId,
      });
    if (res?.moved) {
      await this.store.log.append(sessionId, [{
        type: 'session.run_waiting', payload: { run_id: runId, reason }, session_thread_id: res.run.session_thread_id,
        producer_key: `run:${runId}:waiting:${(res.run.attempts ?? []).length}:${reason}`,
      }], { trace });
    }
  }

  async leased(sessionId: string, runId: string, lease: { lease_id: string; runner_id: string; attempt: number }): Promise<void> {
    await this.move(sessionId, runId, (r) => {
      if (TERMINAL.has(r.status) || (r.attempts ?? []).some((a) => a.lease_id === lease.lease_id)) return null;
      const attempt: RunAttempt = { attempt: lease.attempt, lease_id: lease.lease_id, runner_id: lease.runner_id, leased_at: nowIso(), ended_at: null, outcome: 'running', cause: null };
      const t = this.ts(r);
      return { ...r, status: 'leased', waiting_reason: null, attempts: [...(r.attempts ?? []), attempt], timestamps: { ...t, leased_at: t.leased_at ?? nowIso() } };
    });
  }

  /**
   * The runner accepted the lease and starts the turn: `leased` and `started` in one move (one
   * compare-and-swap instead of two). A Run another reporter already recorded as leased by this
   * lease only moves on to running. With `claim`, the lease's fence is claimed by the same script
   * as the move (alone when the Run needs no move); a refused claim writes nothing and is the
   * answer (`taken`, `canceled`). A Run that has ended answers `canceled`, its fence not claimed.
   */
  async accepted(sessionId: string, runId: string, lease: { lease_id: string; runner_id: string; attempt: number }, claim?: AcceptClaim): Promise<'ok' | 'taken' | 'canceled'> {
    const marking = this.startupMarking(sessionId, runId, claim);
    let res: Awaited<ReturnType<RunLifecycle['move']>>;
    try {
      res = await this.move(sessionId, runId, (r) => {
        if (TERMINAL.has(r.status)) return null;
        const known = (r.attempts ?? []).some((a) => a.lease_id === lease.lease_id);
        if (known && r.status !== 'leased') return null;
        const at = nowIso();
        const t = this.ts(r);
        const attempts = known ? r.attempts ?? [] : [...(r.attempts ?? []), { attempt: lease.attempt, lease_id: lease.lease_id, runner_id: lease.runner_id, leased_at: at, ended_at: null, outcome: 'running', cause: null } satisfies RunAttempt];
        return { ...r, status: 'running', waiting_reason: null, attempts, timestamps: { ...t, leased_at: t.leased_at ?? at, started_at: t.started_at ?? at } };
      }, undefined, marking.write);
    } catch (err) {
      if (err instanceof ClaimRefused) return err.reason;
      throw err;
    }
    // An ended Run is never leased: an interrupt records a queued Run's end before it removes the
    // job, so a job left behind may still be offered. A claim made by a write that then met the
    // ended Run (its compare-and-swap went stale) is given back.
    if (res && TERMINAL.has(res.run.status)) {
      if (claim && marking.claimed()) await claim.fence.release(claim.claim.sessionId, claim.claim.token);
      return 'canceled';
    }
    // No Run to move: a job sent behind a turn start that did not commit
    // (`RunQueues.sendBehind`) is never leased (read only here, off the common path).
    if (!res && claim && !(await this.store.run(sessionId, runId))) return 'canceled';
    // No write carried the claim (the Run is past this move already): it goes alone.
    if (claim && !marking.claimed()) {
      const alone = await claim.fence.claim(claim.claim, claim.ttlMs);
      if (alone !== 'ok') return alone;
    }
    if (res?.moved && !marking.marked()) await this.runtime.markStarted(sessionId, res.run.session_thread_id).catch(() => undefined);
    if (res) await this.resumeRetried(sessionId, res.run, lease.lease_id);
    return 'ok';
  }

  /**
   * A later attempt of a Run started: its thread, `rescheduling` since the attempt before it
   * ended, runs again (`ThreadRuntime.resumed`, with `session.status_running`). A first attempt
   * needs nothing (the turn's start moved the thread) and costs no read. Decided on the Run as
   * the move left or found it: a start reported again completes a thread's move a crash cut off,
   * and otherwise writes nothing.
   */
  private async resumeRetried(sessionId: string, run: RunDoc, leaseId: string): Promise<void> {
    const attempts = run.attempts ?? [];
    const mine = attempts.find((a) => a.lease_id === leaseId && a.ended_at === null);
    if (run.status !== 'running' || !mine || attempts.length < 2) return;
    await this.runtime.resumed(sessionId, run.session_thread_id, run.id, mine.attempt).catch((err: unknown) => {
      this.log.warn({ err: err instanceof Error ? err.message : String(err), run: run.id }, 'the retried attempt\'s thread was not moved back to running');
    });
  }

  /**
   * A Run's move to running that writes its thread's startup mark in the same script when the
   * thread is known here without a read (`ThreadRuntime.plannedStartupMark`): one round trip
   * instead of two. `marked()`: the mark went with the move (else `markStarted` follows it).
   * With `claim`, the first write also claims the lease's fence, first, in the same script
   * (`LeaseFence.claimAndSwap`; a refusal throws `ClaimRefused`, nothing written); `claimed()`
   * says whether a write made it (a retry after a stale version writes without claiming again).
   */
  private startupMarking(sessionId: string, runId: string, claim?: AcceptClaim): {
    write: (next: RunDoc, expected: number) => Promise<SwapOutcome>; marked: () => boolean; claimed: () => boolean;
  } {
    let marked = false;
    let claimed = false;
    return {
      marked: () => marked,
      claimed: () => claimed,
      write: async (next, expected) => {
        marked = false;
        const tag = tags.session(sessionId);
        const mark = this.runtime.plannedStartupMark(sessionId, next.session_thread_id);
        let r: { outcome: SwapOutcome; alsoWritten: boolean };
        if (claim && !claimed) {
          const c = await claim.fence.claimAndSwap(claim.claim, claim.ttlMs, { key: keys.doc(tag, runId), expected, json: JSON.stringify(next) },
            mark ? { key: keys.doc(tag, mark.id), expected: mark.expected, json: JSON.stringify(mark.next) } : undefined);
          if (c.claim !== 'ok') throw new ClaimRefused(c.claim);
          claimed = true;
          r = c;
        } else if (!mark) {
          return this.store.docs.swap(tag, runId, next, expected);
        } else {
          r = await this.store.docs.swapWith(tag, runId, next, expected, mark);
        }
        if (r.alsoWritten && mark) {
          marked = true;
          this.runtime.startupMarked(mark.next);
        }
        return r.outcome;
      },
    };
  }

  async started(sessionId: string, runId: string): Promise<void> {
    const marking = this.startupMarking(sessionId, runId);
    const res = await this.move(sessionId, runId, (r) => {
      if (r.status !== 'leased') return null;
      const t = this.ts(r);
      return { ...r, status: 'running', timestamps: { ...t, started_at: t.started_at ?? nowIso() } };
    }, undefined, marking.write);
    if (res?.moved && !marking.marked()) await this.runtime.markStarted(sessionId, res.run.session_thread_id).catch(() => undefined);
    const open = res?.run.attempts?.find((a) => a.ended_at === null);
    if (res && open) await this.resumeRetried(sessionId, res.run, open.lease_id);
  }

  /**
   * A lease's first events and the Run's `first_event_at` in one script: the Run's
   * compare-and-swap rides on the fenced append (a stale or lost lease refuses both), one round
   * trip instead of two, and the Run never records a first event that is not in the log. A Run
   * that already records its first event, or that is gone, gets the events appended alone.
   */
  async appendFirstEvents(sessionId: string, runId: string, events: readonly AppendEvent[], options: { fence: string; trace?: Context | undefined }): Promise<AppendResult> {
    const tag = tags.session(sessionId);
    const guess = this.guess(runId);
    // What the commit answered (set inside the write, which the update may run more than once).
    const out: { result: AppendResult | null } = { result: null };
    try {
      const run = await this.store.docs.update<RunDoc>(tag, runId, (r) => (r.timestamps?.first_event_at ? null : { ...r, timestamps: { ...this.ts(r), first_event_at: nowIso() } }), {
        notFound: 'run',
        ...(guess ? { current: guess } : {}),
        write: async (next, expected) => {
          const r = await this.store.log.commit(sessionId, [{ key: keys.doc(tag, runId), body: JSON.stringify(next), expectedVersion: expected }], events, options);
          if (r.ok) {
            out.result = r;
            return { kind: 'written' };
          }
          switch (r.reason) {
            case 'stale':
              return { kind: 'stale', current: r.current };
            case 'missing':
              return { kind: 'missing' };
            case 'fenced':
            case 'erased':
              // Refused whole: nothing was written, and the loop ends here with the refusal.
              out.result = r;
              return { kind: 'written' };
            default:
              throw new Error(`the first events of run ${runId} met an unexpected '${r.reason}'`);
          }
        },
      });
      if (out.result?.ok) this.remember(run);
    } catch (err) {
      // Only a Run that is gone falls through to a plain append (a failed write is the caller's).
      if (out.result !== null || !(err instanceof ApiError && err.type === 'validation.not_found')) throw err;
    }
    return out.result ?? this.store.log.append(sessionId, events, options);
  }

  /** The runner finished the turn. `trace`: the context of the runner's report (the turn end's spans' parent). */
  async succeeded(sessionId: string, runId: string, leaseId: string | null, result: TurnResult, trace?: Context): Promise<void> {
    const change = (r: RunDoc): RunDoc | null => TERMINAL.has(r.status) ? null : {
      ...r, status: 'succeeded', stop_reason: result.stop_reason, attempts: this.endAttempt(r, leaseId, 'succeeded', null),
      ...(r.grader && result.grader ? { grader_result: result.grader } : {}),
      timestamps: { ...this.ts(r), ended_at: nowIso() },
    };
    // The Run as this process last wrote it (its accept and first event usually came here): its
    // end rides on the turn end's script, one write instead of two, and the Run and its thread
    // end together. Anything else (no such Run here, or it moved since, or the thread is not in
    // this Run's turn) writes nothing there, and the Run is written first, the turn ended after.
    const guess = this.guess(runId);
    const next = guess ? change(guess) : null;
    // (A Session that cannot be read now takes the other order too: the Run's end is written first.)
    const known = guess && next ? await this.store.get(guess.workspace_id, sessionId).catch(() => null) : null;
    if (guess && next && known) {
      const ride: RunRide = {
        key: keys.doc(tags.session(sessionId), runId),
        body: JSON.stringify({ ...next, version: guess.version + 1, updated_at: nowIso() }),
        expectedVersion: guess.version,
      };
      try {
        await this.runtime.endTurn(known, guess.session_thread_id, result.stop_reason, result.waits ?? [], { runId, fresh: true, trace, run: ride });
        return;
      } catch (err) {
        if (!(err instanceof RideRefused)) throw err;
      } finally {
        if (ride.written) this.recent.delete(runId);
      }
    }
    const res = await this.move(sessionId, runId, change);
    if (!res || (!res.moved && res.run.status !== 'succeeded')) return;
    crashPoint('run-succeeded-written');
    const session = await this.store.get(res.run.workspace_id, sessionId);
    await this.runtime.endTurn(session, res.run.session_thread_id, result.stop_reason, result.waits ?? [], { runId, fresh: true, trace });
  }

  /** An attempt failed for an infrastructure reason and will be retried (`leaseId` null: every open attempt was lost). */
  async rescheduled(sessionId: string, runId: string, leaseId: string | null, cause: string, trace?: Context): Promise<void> {
    await this.endLost(sessionId, runId, (a) => leaseId === null || a.lease_id === leaseId, leaseId === null ? 'lost' : 'infrastructure_failure', cause, trace);
  }

  /**
   * The runner came back without this lease (its process restarted) and the Run will be retried:
   * the attempt was lost, as if its lease had expired, only noticed sooner.
   */
  async abandoned(sessionId: string, runId: string, leaseId: string, cause: string, trace?: Context): Promise<void> {
    await this.endLost(sessionId, runId, (a) => a.lease_id === leaseId, 'lost', cause, trace);
  }

  /**
   * The lease engine has moved past every attempt numbered below `below` (BullMQ's attempt
   * counter only grows): those still open lost their lease without a report. Called by whoever
   * notices first (the stalled handler, the sweep of BullMQ's stalled records, the dispatch of
   * the next attempt); returns how many attempts this call ended.
   */
  async leaseLost(sessionId: string, runId: string, below: number, cause: string, trace?: Context): Promise<number> {
    return this.endLost(sessionId, runId, (a) => a.attempt < below, 'lost', cause, trace);
  }

  /**
   * Record attempts that ended without a result, once each, in an order that survives a crash at
   * any point: first the thread goes `rescheduling` and `session.thread_status_rescheduled` is
   * appended under the producer key `run:<run>:rescheduled:<attempt>`, then the attempt is ended
   * on the Run. Until then the attempt stays open, so any later call finds it again, and the
   * producer key turns the repeated append into a no-op: never lost, never duplicated.
   */
  private async endLost(sessionId: string, runId: string, pick: (a: RunAttempt) => boolean, outcome: RunAttempt['outcome'], cause: string, trace?: Context): Promise<number> {
    const run = await this.store.run(sessionId, runId);
    if (!run || TERMINAL.has(run.status)) return 0;
    const lost = (run.attempts ?? []).filter((a) => a.ended_at === null && pick(a)).sort((a, b) => a.attempt - b.attempt);
    if (lost.length === 0) return 0;
    const threadId = run.session_thread_id;
    const thread = await this.store.updateThread(sessionId, threadId, (t) =>
      t._active_run_id === runId && t.status === 'running' ? { ...t, status: 'rescheduling' } : null,
    ).catch((err: unknown) => {
      this.log.debug({ err: err instanceof Error ? err.message : String(err), run: runId }, 'thread gone; no reschedule event');
      return null;
    });
    // Only the thread's own turn is rescheduled: an ended turn or another Run's turn gets no event.
    if (thread?._active_run_id === runId && thread.status === 'rescheduling') {
      await this.store.log.append(sessionId, lost.map((a) => rescheduledEvent(threadId, runId, a.attempt, cause)), { trace });
    }
    const ids = new Set(lost.map((a) => a.lease_id));
    const res = await this.move(sessionId, runId, (r) => {
      if (TERMINAL.has(r.status) || !(r.attempts ?? []).some((a) => a.ended_at === null && ids.has(a.lease_id))) return null;
      const attempts = (r.attempts ?? []).map((a) => (a.ended_at === null && ids.has(a.lease_id) ? { ...a, ended_at: nowIso(), outcome, cause } : a));
      // A later attempt already leased keeps the Run where it is; otherwise it is queued again.
      const live = attempts.some((a) => a.ended_at === null);
      return { ...r, attempts, status: !live && (r.status === 'leased' || r.status === 'running') ? 'queued' : r.status };
    });
    return res?.moved ? lost.length : 0;
  }

  /** Final failure: retries exhausted, unservable, or the agent's own failure. */
  async failed(sessionId: string, runId: string, leaseId: string | null, failure: { class: string; code: string; message: string }, trace?: Context): Promise<void> {
    const res = await this.move(sessionId, runId, (r) =>
      TERMINAL.has(r.status) ? null : {
        ...r, status: 'failed', failure, attempts: this.endAttempt(r, leaseId, failure.class === 'work' ? 'work_failure' : 'lost', failure.message),
        timestamps: { ...this.ts(r), ended_at: nowIso() },
      });
    if (!res || (!res.moved && res.run.status !== 'failed')) return;
    const session = await this.store.get(res.run.workspace_id, sessionId);
    const stop: StopReason = failure.code === 'retries_exhausted' ? { type: 'retries_exhausted' } : { type: 'error', error: { code: failure.code, message: failure.message } } as StopReason;
    // A tool use its lost runner never answered is answered as not done, with the end.
    await this.runtime.endTurn(session, res.run.session_thread_id, stop, [], {
      runId, fresh: true, trace, closeOpenUses: { content: `The tool call did not return: the Run failed (${failure.code}) before its result.`, interrupted: false },
    });
  }

  /**
   * The Run ends `canceled` and its turn `interrupted`; true when the Run is canceled (by this
   * call or before it). `onlyQueued`: only a Run still waiting for a runner (queued, waiting) is
   * moved; one a lease was claimed for meanwhile is left to be cancelled on its runner.
   */
  async canceled(sessionId: string, runId: string, reason: string, trace?: Context, options: { onlyQueued?: boolean } = {}): Promise<boolean> {
    const movable = (r: RunDoc): boolean => !TERMINAL.has(r.status) && (!options.onlyQueued || r.status === 'queued' || r.status === 'waiting');
    const res = await this.move(sessionId, runId, (r) =>
      !movable(r) ? null : { ...r, status: 'canceled', attempts: this.endAttempt(r, null, 'canceled', reason), timestamps: { ...this.ts(r), ended_at: nowIso() } });
    if (!res || (!res.moved && res.run.status !== 'canceled')) return false;
    const session = await this.store.get(res.run.workspace_id, sessionId);
    // Canceled where no runner holds it (queued again after a lost runner): the runner that would
    // have answered its open tool uses as interrupted is gone, so the end does.
    await this.runtime.endTurn(session, res.run.session_thread_id, { type: 'interrupted' }, [], {
      runId, fresh: true, trace, closeOpenUses: { content: 'Interrupted by user.interrupt before the tool call returned.', interrupted: true },
    });
    return true;
  }
}
