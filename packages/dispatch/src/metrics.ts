import { BUCKETS, Counter, Histogram, type Metrics } from '@agentplane/core';
import type { RunJobData } from '@agentplane/lease';

/**
 * What placing Runs reports: per-phase latency, leases, offers and their outcomes, losses. The
 * `pool` label is bounded by the runner pools the process serves (operator-created resources,
 * not request input); `cause` and `outcome` are closed sets. Every process that places Runs (the
 * scheduler; an api placing the Runs it starts while quiet) counts its own on its `/metrics`.
 */
export class DispatchMetrics {
  readonly registry: Metrics;
  private readonly waitSeconds: Histogram<'pool'>;
  private readonly enqueueSeconds: Histogram<'pool'>;
  private readonly leases: Counter<'pool'>;
  private readonly reschedules: Counter<'pool' | 'cause'>;
  private readonly expiries: Counter<'pool'>;
  private readonly offers: Counter<'pool' | 'outcome'>;

  constructor(registry: Metrics) {
    this.registry = registry;
    this.waitSeconds = new Histogram({
      name: 'agentplane_run_queue_wait_seconds', help: 'Run accepted by the API → leased to a runner, by pool',
      labelNames: ['pool'] as const, buckets: [...BUCKETS.queueWait], registers: [this.registry],
    });
    this.enqueueSeconds = new Histogram({
      name: 'agentplane_run_enqueue_seconds', help: 'Run accepted by the API → enqueued in its pool, by pool',
      labelNames: ['pool'] as const, buckets: [...BUCKETS.enqueue], registers: [this.registry],
    });
    this.leases = new Counter({ name: 'agentplane_run_leases_total', help: 'Leases granted, by pool', labelNames: ['pool'] as const, registers: [this.registry] });
    this.reschedules = new Counter({
      name: 'agentplane_run_reschedules_total', help: 'Runs sent back to the queue, by pool and cause (lease_lost)', labelNames: ['pool', 'cause'] as const, registers: [this.registry],
    });
    this.expiries = new Counter({
      name: 'agentplane_run_lease_expiries_total', help: 'Leases that expired unrenewed (the runner went silent), by pool', labelNames: ['pool'] as const, registers: [this.registry],
    });
    this.offers = new Counter({
      name: 'agentplane_lease_offers_total',
      help: 'Lease offers by pool and how they ended (accepted; rejected: declined, or the runner was connected nowhere; timeout: no answer in OFFER_TIMEOUT_MS)',
      labelNames: ['pool', 'outcome'] as const, registers: [this.registry],
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
}
