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
});
