import { extractTrace, type Logger } from '@agentplane/core';
import type { RunLifecycle, TurnResult } from '@agentplane/domain';
import type { RunQueues } from '@agentplane/lease';

/** Finished jobs are left alone this long, so the normal path (the gateway) reports them first. */
const GRACE_MS = 3000;

/**
 * Crash safety for the moves that happen outside the scheduler's hands: BullMQ has finished a
 * Run (completed by a runner, failed for good) but the process that should have ended the turn
 * died first. Every move of the Run life cycle is a compare-and-swap that no-ops once the Run is
 * terminal, so reporting again is safe; a reconciled job is then removed from the queue.
 */
export async function reconcilePool(poolId: string, queues: RunQueues, lifecycle: RunLifecycle, log: Logger, now = Date.now()): Promise<number> {
  let done = 0;
  // The normal path removes a finished job once the Run records its end: only jobs finished
  // before the grace period are read at all.
  for (const job of await queues.finishedBefore(poolId, 'completed', now - GRACE_MS)) {
    const result = (job.returnvalue ?? {}) as Partial<TurnResult>;
    await lifecycle.succeeded(job.data.session_id, job.data.run_id, null, {
      stop_reason: result.stop_reason ?? { type: 'end_turn' },
      ...(result.waits ? { waits: result.waits } : {}),
    }, extractTrace(job.data.trace));
    await job.remove().catch(() => undefined);
    done++;
  }
  for (const job of await queues.finishedBefore(poolId, 'failed', now - GRACE_MS)) {
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
    done++;
  }
  if (done > 0) log.info({ pool: poolId, reconciled: done }, 'reconciled finished runs');
  return done;
}

/**
 * Crash safety for lost leases: BullMQ's stalled check records every Run it moves back to wait in
 * the queue's event stream, in the same script as the move. The worker's in-memory `stalled`
 * event is only the fast path; if the process that ran the check died before handling it, this
 * replay of the durable record reaches the same hook, which records each loss once. Returns the
 * cursor to continue from.
 */
export async function repairStalls(poolId: string, queues: RunQueues, stalled: (runId: string) => Promise<void>, cursor: string, log: Logger): Promise<string> {
  let at = cursor;
  for (;;) {
    const page = await queues.stalledAfter(poolId, at);
    for (const runId of page.runIds) {
      await stalled(runId).catch((err: unknown) => log.warn({ err, pool: poolId, run: runId }, 'recording a lost lease failed'));
    }
    at = page.cursor;
    if (!page.more) return at;
  }
}
