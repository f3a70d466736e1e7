import { envInt } from '@agentplane/core';
/** Lease timing. Defaults follow the field's convergence (docs/ARCHITECTURE.md, "Leases"). */
export interface LeaseConfig {
  /** Lease length: the BullMQ job lock of an accepted Run attempt. */
  leaseMs: number;
  /** The runner renews every leaseMs / 3. */
  heartbeatMs: number;
  /** How long a runner has to accept an offer before it goes to another runner. */
  offerTimeoutMs: number;
  /** Offers per dispatch before the Run waits for capacity. */
  maxOffers: number;
  /** BullMQ attempts = leases a Run may fail with an infrastructure error. */
  maxAttempts: number;
  /** First retry delay; doubles per attempt. */
  backoffMs: number;
  /** Lost leases (runner gone, lock expired) a Run survives before it is exhausted. */
  maxStalledCount: number;
  /** How often expired locks are detected. */
  stalledIntervalMs: number;
  /** Margin by which the Session fence expires before the BullMQ lock. */
  fenceMarginMs: number;
  /**
   * How long a pool goes without a Run queued (and with an empty queue) before a scheduler stops
   * dispatching it, closing its worker's connection (docs/RUNS.md, "Idle pools"). Read by the
   * API too: it re-marks a pool's activity a quarter of this often (`poolMarkRefreshMs`).
   */
  poolIdleMs: number;
}

export const DEFAULT_LEASE_CONFIG: LeaseConfig = Object.freeze({
  leaseMs: 30_000,
  heartbeatMs: 10_000,
  offerTimeoutMs: 5_000,
  maxOffers: 3,
  maxAttempts: 5,
  backoffMs: 1_000,
  maxStalledCount: 3,
  stalledIntervalMs: 5_000,
  fenceMarginMs: 1_000,
  poolIdleMs: 300_000,
});

/** Parse the lease settings (shared by the API/gateway and the scheduler config modules). */
export function leaseConfigFrom(env: Readonly<Record<string, string | undefined>>): LeaseConfig {
  const int = (name: string, fallback: number, min: number, max?: number): number => envInt(env, name, fallback, min, max);
  const leaseMs = int('LEASE_MS', DEFAULT_LEASE_CONFIG.leaseMs, 2000);
  return Object.freeze({
    leaseMs,
    // A renewal must come well inside the lease, and the fence must leave most of it usable.
    heartbeatMs: int('LEASE_HEARTBEAT_MS', Math.floor(leaseMs / 3), 100, Math.floor(leaseMs / 2)),
    offerTimeoutMs: int('OFFER_TIMEOUT_MS', DEFAULT_LEASE_CONFIG.offerTimeoutMs, 100),
    maxOffers: int('MAX_OFFERS', DEFAULT_LEASE_CONFIG.maxOffers, 1),
    maxAttempts: int('RUN_MAX_ATTEMPTS', DEFAULT_LEASE_CONFIG.maxAttempts, 1),
    backoffMs: int('RUN_BACKOFF_MS', DEFAULT_LEASE_CONFIG.backoffMs, 0),
    maxStalledCount: int('RUN_MAX_LOST_LEASES', DEFAULT_LEASE_CONFIG.maxStalledCount, 0),
    stalledIntervalMs: int('STALLED_INTERVAL_MS', Math.min(DEFAULT_LEASE_CONFIG.stalledIntervalMs, Math.floor(leaseMs / 2)), 100),
    fenceMarginMs: int('FENCE_MARGIN_MS', Math.min(DEFAULT_LEASE_CONFIG.fenceMarginMs, Math.floor(leaseMs / 4)), 0, Math.floor(leaseMs / 4)),
    poolIdleMs: int('POOL_IDLE_MS', DEFAULT_LEASE_CONFIG.poolIdleMs, 1000),
  });
}

/** Environment variables of the lease settings, for launchers that pass them through. */
export const LEASE_ENV = ['LEASE_MS', 'LEASE_HEARTBEAT_MS', 'OFFER_TIMEOUT_MS', 'MAX_OFFERS', 'RUN_MAX_ATTEMPTS', 'RUN_BACKOFF_MS', 'RUN_MAX_LOST_LEASES', 'STALLED_INTERVAL_MS', 'FENCE_MARGIN_MS', 'POOL_IDLE_MS'] as const;
