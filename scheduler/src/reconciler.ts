import { extractTrace, type Logger } from '@agentplane/core';
import { boundedGraderResult, type RunLifecycle, type TurnResult } from '@agentplane/domain';
import type { RunJobData, RunQueues } from '@agentplane/lease';
import type { Job } from 'bullmq';

/** Finished jobs are left alone this long, so the normal path (the gateway) reports them first. */
const GRACE_MS = 3000;

/**
 * The turn's end a completed job carries: the gateway completes the job with the end it records
 * (stop reason, the waits as the approvals mapped them, a grader Run's report), so a replay ends
 * the turn as the live path would have. (A grader's report is bounded again: a job completed by
 * an earlier version carries the runner's own.)
 */
export function turnEndOf(returnvalue: unknown): TurnResult {
  const result = (returnvalue ?? {}) as Partial<TurnResult>;
  const grader = result.grader ? boundedGraderResult(result.grader) : undefined;
  return {
    stop_reason: result.stop_reason ?? { type: 'end_turn' },
    ...(result.waits ? { waits: result.waits } : {}),
    ...(grader ? { grader } : {}),
  };
}

/**
 * Crash safety for the moves that happen outside the scheduler's hands: BullMQ has finished a
 * Run (completed by a runner, failed for good) but the process that should have ended the turn
 * died first. Every move of the Run life cycle is a compare-and-swap that no-ops once the Run is
 * terminal, so reporting again is safe; a reconciled job is then removed from the queue. A job
 * whose end could not be recorded (Redis unreachable, say) stays for the next scan.
 */
export async function reconcilePool(poolId: string, queues: RunQueues, lifecycle: Pick<RunLifecycle, 'succeeded' | 'failed'>, log: Logger, now = Date.now()): Promise<number> {
  let done = 0;
  const each = async (job: Job<RunJobData>, end: () => Promise<void>): Promise<void> => {
    try {
      await end();
      done++;
    } catch (err) {
      log.warn({ err: err instanceof Error ? err.message : String(err), pool: poolId, run: job.data.run_id }, 'reconciling a finished run failed; retried on the next scan');
    }
  };
  // The normal path removes a finished job once the Run records its end: only jobs finished
  // before the grace period are read at all.
  for (const job of await queues.finishedBefore(poolId, 'completed', now - GRACE_MS)) {
    await each(job, async () => {
      await lifecycle.succeeded(job.data.session_id, job.data.run_id, null, turnEndOf(job.returnvalue), extractTrace(job.data.trace));
      await job.remove().catch(() => undefined);
    });
  }
  for (const job of await queues.finishedBefore(poolId, 'failed', now - GRACE_MS)) {
    await each(job, async () => {
      const reason = job.failedReason ?? 'failed';
      // Lost leases over the limit are failed as unrecoverable too, but they are no work failure.
      const lostTooOften = /stalled more than allowable limit/.test(reason);
      const agent = !lostTooOften && (/UnrecoverableError/.test(job.stacktrace?.join('\n') ?? '') || /no runner in the pool can serve/.test(reason));
      await lifecycle.failed(job.data.session_id, job.data.run_id, null, {
        class: agent ? 'work' : 'infrastructure',
        code: /no runner in the pool can serve/.test(reason) ? 'no_eligible_runner' : agent ? 'work_failed' : 'retries_exhausted',
        message: reason,
      }, extractTrace(job.data.trace));
      await queues.dequeued(poolId, job.data.workspace_id, job.data.run_id);
      await job.remove().catch(() => undefined);
    });
  }
  if (done > 0) log.info({ pool: poolId, reconciled: done }, 'reconciled finished runs');
  return done;
}

/** Where the replay of a pool's stalls stands: the stream entry read last, and losses to record again. */
export interface StallCursor {
  at: string;
  /** Runs whose loss could not be recorded (Redis failing over, say): tried again at the next scan. */
  retry: ReadonlySet<string>;
}

export const STALLS_FROM_START: StallCursor = { at: '-', retry: new Set() };

/**
 * Crash safety for lost leases: BullMQ's stalled check records every Run it moves back to wait in
 * the queue's event stream, in the same script as the move. The worker's in-memory `stalled`
 * event is only the fast path; if the process that ran the check died before handling it, this
 * replay of the durable record reaches the same hook, which records each loss once. A loss whose
 * record fails (its append not acknowledged by a replica while a master fails over) is tried
 * again at the next scan, not passed over with the stream: otherwise the attempt would stay open
 * on the Run with its thread rescheduling, until a later attempt happened to record it. Returns
 * where to continue from.
 */
export async function repairStalls(poolId: string, queues: RunQueues, stalled: (runId: string) => Promise<void>, from: StallCursor, log: Logger): Promise<StallCursor> {
  const retry = new Set<string>();
  const record = async (runId: string): Promise<void> => {
    try {
      await stalled(runId);
    } catch (err) {
      retry.add(runId);
      log.warn({ err, pool: poolId, run: runId }, 'recording a lost lease failed; trying again at the next scan');
    }
  };
  for (const runId of from.retry) await record(runId);
  let at = from.at;
  for (;;) {
    const page = await queues.stalledAfter(poolId, at);
    for (const runId of page.runIds) if (!retry.has(runId)) await record(runId);
    at = page.cursor;
    if (!page.more) return { at, retry };
  }
}
