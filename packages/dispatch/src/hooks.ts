import type { Job } from 'bullmq';
import { extractTrace, newId, type Context, type Logger } from '@agentplane/core';
import { cancelOnRunner } from '@agentplane/gateway';
import type { Redis } from '@agentplane/store';
import type { CancelMarks, RunJobData, RunQueues } from '@agentplane/lease';
import type { RunLifecycle } from '@agentplane/domain';
import type { DispatchHooks } from './dispatcher.js';
import type { DispatchMetrics } from './metrics.js';

const LEASE_LOST = 'lease lost: the runner stopped renewing it';

/** The turn's trace context the API put on the job: the parent of what is recorded for its Run here. */
const traceOf = (data: RunJobData): Context => extractTrace(data.trace);

/**
 * Every attempt numbered below the returned bound is over, for a job just read from Redis:
 * BullMQ's attempt counter only grows, so a counter read before the state holds for that state
 * too. An active job may still hold its latest attempt; a waiting or delayed one holds none.
 * Null when the job is finished (the gateway or the reconciler ends the Run then).
 */
async function settledBelow(job: Job<RunJobData>): Promise<number | null> {
  const started = job.attemptsStarted;
  const state = await job.getState();
  if (state === 'completed' || state === 'failed' || state === 'unknown') return null;
  return state === 'active' ? started : started + 1;
}

/** What placing a Run means for the Run document, the thread and the metrics. */
export function runHooks(d: {
  poolId: string; queues: RunQueues; lifecycle: RunLifecycle; metrics: DispatchMetrics; log: Logger;
  /** Where lease.cancel frames are routed from, and the grace a cancelled Run gets to stop. */
  redis: Redis; interruptGraceMs: number;
  /** Interrupts of Runs (see `CancelMarks`): a lost lease of an interrupted Run ends it. */
  cancels: CancelMarks;
}): DispatchHooks {
  const data = async (runId: string): Promise<RunJobData | undefined> => (await d.queues.job(d.poolId, runId))?.data;
  const exhausted = async (runId: string, reason: string, code = 'retries_exhausted'): Promise<void> => {
    const job = await data(runId);
    if (!job) return;
    await d.queues.dequeued(d.poolId, job.workspace_id, runId);
    await d.lifecycle.failed(job.session_id, runId, null, { class: 'infrastructure', code, message: reason }, traceOf(job));
  };
  const lost = (n: number) => {
    if (n > 0) d.metrics.rescheduled(d.poolId, 'lease_lost', n);
  };
  return {
    async leased(job: Job<RunJobData>, runnerId: string, leaseId: string, attempt: number, recorded: boolean) {
      d.metrics.leased(d.poolId, job.data);
      await Promise.all([
        d.queues.dequeued(d.poolId, job.data.workspace_id, job.data.run_id, { leased: true }),
        // An acceptance learnt from the fence (the answer was lost) may not be on the Run yet.
        recorded ? undefined : d.lifecycle.leased(job.data.session_id, job.data.run_id, { lease_id: leaseId, runner_id: runnerId, attempt }),
      ]);
    },
    offerAnswered(outcome) {
      d.metrics.offered(d.poolId, outcome);
    },
    async waiting(job: Job<RunJobData>, reason: string, trace?: Context) {
      await d.lifecycle.waiting(job.data.session_id, job.data.run_id, reason, job.data.pool_id, trace ?? traceOf(job.data));
    },
    async stalled(runId: string) {
      const job = await d.queues.job(d.poolId, runId);
      if (!job?.data) return;
      d.metrics.leaseExpired(d.poolId);
      // Over the lost-lease limit: the turn ends now, even if no dispatcher takes the job soon.
      if (job.deferredFailure) return exhausted(runId, job.deferredFailure);
      const below = await settledBelow(job);
      if (below === null) return;
      lost(await d.lifecycle.leaseLost(job.data.session_id, runId, below, LEASE_LOST, traceOf(job.data)));
      // Interrupted while its runner held it, then lost with that runner: the interrupt ends it
      // now, not when a runner next takes it (none may come). The end is recorded first, then
      // the job goes (one a dispatcher took meanwhile is dropped there: the mark bars it).
      if (below > job.attemptsStarted && (await d.cancels.marked(job.data.session_id, runId))) {
        await d.queues.dequeued(d.poolId, job.data.workspace_id, runId);
        if (await d.lifecycle.canceled(job.data.session_id, runId, 'interrupted while its runner was lost', traceOf(job.data), { onlyQueued: true })) {
          await d.queues.cancelQueued(d.poolId, runId);
          await d.cancels.clear(job.data.session_id, runId);
        }
      }
    },
    async retaken(job: Job<RunJobData>, trace?: Context) {
      // The first attempt has nothing before it; a later one may follow a loss nobody recorded.
      if (job.attemptsStarted <= 1) return;
      lost(await d.lifecycle.leaseLost(job.data.session_id, job.data.run_id, job.attemptsStarted, LEASE_LOST, trace ?? traceOf(job.data)));
    },
    exhausted,
    async interrupted(job: Job<RunJobData>, trace?: Context) {
      await d.queues.dequeued(d.poolId, job.data.workspace_id, job.data.run_id);
      await d.lifecycle.canceled(job.data.session_id, job.data.run_id, 'interrupted while queued', trace ?? traceOf(job.data));
    },
    async cancelLease(job: Job<RunJobData>, runnerId: string, leaseId: string, attempt: number) {
      const payload = { lease_id: leaseId, attempt, reason: 'user.interrupt', grace_ms: d.interruptGraceMs };
      await cancelOnRunner(d.redis, job.data.workspace_id, runnerId, payload, newId('event'));
    },
  };
}
