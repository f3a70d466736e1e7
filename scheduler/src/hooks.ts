import type { Job } from 'bullmq';
import type { Logger } from '@agentplane/core';
import type { RunJobData, RunQueues } from '@agentplane/lease';
import type { RunLifecycle } from '@agentplane/api';
import type { DispatchHooks } from './dispatcher.js';
import type { SchedulerMetrics } from './metrics.js';

/** What placing a Run means for the Run document, the thread and the metrics. */
export function runHooks(d: { poolId: string; queues: RunQueues; lifecycle: RunLifecycle; metrics: SchedulerMetrics; log: Logger }): DispatchHooks {
  const data = async (runId: string): Promise<RunJobData | undefined> => (await d.queues.job(d.poolId, runId))?.data;
  return {
    async leased(job: Job<RunJobData>, runnerId: string, leaseId: string, attempt: number) {
      d.metrics.leased(d.poolId, job.data);
      await d.queues.dequeued(d.poolId, job.data.workspace_id, job.data.run_id);
      await d.lifecycle.leased(job.data.session_id, job.data.run_id, { lease_id: leaseId, runner_id: runnerId, attempt });
    },
    async waiting(job: Job<RunJobData>, reason: string) {
      await d.lifecycle.waiting(job.data.session_id, job.data.run_id, reason);
    },
    async unservable(job: Job<RunJobData>, reason: string) {
      await d.queues.dequeued(d.poolId, job.data.workspace_id, job.data.run_id);
      await d.lifecycle.failed(job.data.session_id, job.data.run_id, null, { class: 'unservable', code: 'no_eligible_runner', message: reason });
    },
    async stalled(runId: string) {
      d.metrics.rescheduled(d.poolId, 'lease_lost');
      const job = await data(runId);
      if (job) await d.lifecycle.rescheduled(job.session_id, runId, null, 'lease lost: the runner stopped renewing it');
    },
    async exhausted(runId: string, reason: string) {
      const job = await data(runId);
      if (!job) return;
      await d.queues.dequeued(d.poolId, job.workspace_id, runId);
      await d.lifecycle.failed(job.session_id, runId, null, { class: 'infrastructure', code: 'retries_exhausted', message: reason });
    },
  };
}
