import { Metrics } from '@agentplane/core';
import type { RunJobData, RunQueues } from '@agentplane/lease';

/** Backlog and per-phase latency, so operators can autoscale pools. */
export class SchedulerMetrics {
  readonly registry = new Metrics();
  private readonly waitSeconds = this.registry.histogram('agentplane_run_queue_wait_seconds', 'Run accepted by the API → leased to a runner');
  private readonly enqueueSeconds = this.registry.histogram('agentplane_run_enqueue_seconds', 'Run accepted by the API → enqueued in its pool');
  private readonly leases = this.registry.counter('agentplane_run_leases_total', 'Leases granted');
  private readonly reschedules = this.registry.counter('agentplane_run_reschedules_total', 'Runs sent back to the queue, by cause');
  private readonly depth = this.registry.gauge('agentplane_run_queue_depth', 'Runs in a pool queue, by state');
  private readonly counts = new Map<string, Record<string, number>>();

  leased(poolId: string, job: RunJobData): void {
    this.leases.inc({ pool: poolId });
    this.waitSeconds.observe({ pool: poolId }, (Date.now() - job.accepted_at_ms) / 1000);
    this.enqueueSeconds.observe({ pool: poolId }, Math.max(0, job.enqueued_at_ms - job.accepted_at_ms) / 1000);
  }

  rescheduled(poolId: string, cause: string, n = 1): void {
    this.reschedules.inc({ pool: poolId, cause }, n);
  }

  /** Refresh queue depths (wait, prioritized, delayed, active) for the pools this process serves. */
  async refresh(queues: RunQueues, pools: readonly string[]): Promise<void> {
    for (const pool of pools) {
      const first = !this.counts.has(pool);
      this.counts.set(pool, await queues.depth(pool));
      if (first) {
        for (const state of ['wait', 'prioritized', 'delayed', 'active']) {
          this.depth.set({ pool, state }, () => this.counts.get(pool)?.[state] ?? 0);
        }
      }
    }
  }
}
