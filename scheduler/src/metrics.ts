import { BUCKETS, Counter, createMetrics, Gauge, Histogram, type Metrics } from '@agentplane/core';
import type { RunJobData, RunQueues } from '@agentplane/lease';

const STATES = ['wait', 'prioritized', 'delayed', 'active'] as const;

/**
 * Backlog and per-phase latency, so operators can autoscale pools. The `pool` label is bounded by
 * the runner pools this scheduler serves (operator-created resources, not request input);
 * `cause` and `state` are closed sets.
 */
export class SchedulerMetrics {
  readonly registry: Metrics = createMetrics();
  private readonly waitSeconds = new Histogram({
    name: 'agentplane_run_queue_wait_seconds', help: 'Run accepted by the API → leased to a runner, by pool',
    labelNames: ['pool'] as const, buckets: [...BUCKETS.queueWait], registers: [this.registry],
  });
  private readonly enqueueSeconds = new Histogram({
    name: 'agentplane_run_enqueue_seconds', help: 'Run accepted by the API → enqueued in its pool, by pool',
    labelNames: ['pool'] as const, buckets: [...BUCKETS.enqueue], registers: [this.registry],
  });
  private readonly leases = new Counter({ name: 'agentplane_run_leases_total', help: 'Leases granted, by pool', labelNames: ['pool'] as const, registers: [this.registry] });
  private readonly reschedules = new Counter({
    name: 'agentplane_run_reschedules_total', help: 'Runs sent back to the queue, by pool and cause (lease_lost)', labelNames: ['pool', 'cause'] as const, registers: [this.registry],
  });
  private readonly expiries = new Counter({
    name: 'agentplane_run_lease_expiries_total', help: 'Leases that expired unrenewed (the runner went silent), by pool', labelNames: ['pool'] as const, registers: [this.registry],
  });
  private readonly offers = new Counter({
    name: 'agentplane_lease_offers_total',
    help: 'Lease offers by pool and how they ended (accepted; rejected: declined, or the runner was connected nowhere; timeout: no answer in OFFER_TIMEOUT_MS)',
    labelNames: ['pool', 'outcome'] as const, registers: [this.registry],
  });
  private readonly counts = new Map<string, Record<string, number>>();

  constructor(dispatched: () => number = () => 0) {
    const counts = this.counts;
    new Gauge({
      name: 'agentplane_scheduler_pools_dispatched', help: 'Runner pools this scheduler dispatches now (idle pools are let go: POOL_IDLE_MS)',
      registers: [this.registry],
      collect() {
        this.set(dispatched());
      },
    });
    new Gauge({
      name: 'agentplane_run_queue_depth', help: 'Runs in a pool queue, by pool and state (wait, prioritized, delayed, active)', labelNames: ['pool', 'state'] as const,
      registers: [this.registry],
      collect() {
        // Pools no longer dispatched drop out of the gauge.
        this.reset();
        for (const [pool, c] of counts) for (const state of STATES) this.set({ pool, state }, c[state] ?? 0);
      },
    });
  }

  leased(poolId: string, job: RunJobData): void {
    this.leases.inc({ pool: poolId });
    this.waitSeconds.observe({ pool: poolId }, Math.max(0, Date.now() - job.accepted_at_ms) / 1000);
    this.enqueueSeconds.observe({ pool: poolId }, Math.max(0, job.enqueued_at_ms - job.accepted_at_ms) / 1000);
  }

  offered(poolId: string, outcome: 'accepted' | 'recorded' | 'rejected' | 'timeout'): void {
    this.offers.inc({ pool: poolId, outcome: outcome === 'recorded' ? 'accepted' : outcome });
  }

  leaseExpired(poolId: string): void {
    this.expiries.inc({ pool: poolId });
  }

  rescheduled(poolId: string, cause: 'lease_lost', n = 1): void {
    this.reschedules.inc({ pool: poolId, cause }, n);
  }

  /** Refresh queue depths (wait, prioritized, delayed, active) for the pools this process serves. */
  async refresh(queues: RunQueues, pools: readonly string[]): Promise<void> {
    for (const pool of pools) this.counts.set(pool, await queues.depth(pool));
  }

  /** A pool's job counts at the last refresh (every state `RunQueues.depth` reads). */
  depthOf(pool: string): Readonly<Record<string, number>> | undefined {
    return this.counts.get(pool);
  }

  /** A pool no longer dispatched here: its depths leave the gauge. */
  forget(pool: string): void {
    this.counts.delete(pool);
  }
}
