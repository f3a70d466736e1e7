import type { Context } from '@agentplane/core';
import type { LeaseRecord, RunnerCapabilities } from '@agentplane/lease';

/** A runner as the scheduler sees it: from its presence (never lease authority, only a hint). */
export interface RunnerView {
  runner_id: string;
  pool_id: string;
  status: 'starting' | 'ready' | 'draining';
  /**
   * As the presence reported them. Apart from `available_slots`, never changed in place: a
   * runner's new presence is a new object (the dispatcher keeps what it matched per object).
   */
  capabilities: RunnerCapabilities;
  /** When the presence was last written (its `available_slots` reflect leases up to then). */
  seen_at?: string;
  /** The gateway node holding the runner's socket when its presence was written (a routing hint). */
  node_id?: string;
}

/** Where the scheduler reads which runners exist and which are ready. */
export interface RunnerDirectory {
  /**
   * Runners of the pool with a live presence: possibly a view up to a second old, refreshed
   * meanwhile (presence is a hint); `fresh`: read now unless the view was read just now. A view
   * may be served again as the same array, and a runner whose presence did not change as the
   * same object: their readers never change either (the dispatcher keeps what it worked out per
   * array and per capabilities object).
   */
  live(poolId: string, fresh?: boolean): Promise<RunnerView[]>;
  /** Last known capabilities of every runner ever enrolled in the pool (for "can never be served"). */
  enrolled(poolId: string): Promise<RunnerCapabilities[]>;
}

/** An offer: the lease record the gateway will look up, plus its timing. */
export interface LeaseOffer extends Omit<LeaseRecord, 'reply_to'> {
  lease_ms: number;
  heartbeat_ms: number;
  offer_expires_at_ms: number;
}

/**
 * `recorded`: accepted, and the Run already records the lease (the gateway wrote it before
 * answering). `withdrawn`: never sent, its body was withdrawn (the Run was interrupted meanwhile).
 * `timeout` and `rejected` are final: that runner can no longer take the lease (an offer not taken
 * is withdrawn in one script with the runner's claim, and counts as `accepted` when the claim came
 * first), so the lease id may go to the next runner or back to the queue.
 */
export type OfferOutcome = 'accepted' | 'recorded' | 'rejected' | 'timeout' | 'withdrawn';

/** A lease as planned when its Run is taken, before a runner is chosen. */
export type LeasePlan = Omit<LeaseOffer, 'runner_id' | 'offer_expires_at_ms'>;

/**
 * What every offer of one lease carries besides its record (the turn spec), prepared once; null
 * when it was withdrawn before any offer went out (no offer carrying it is sent).
 */
export type OfferBody = Promise<Record<string, unknown> | null>;

/** Delivers an offer to a runner (through whichever gateway holds its socket) and reports the answer. */
export interface OfferChannel {
  /**
   * Start preparing the offers' body as soon as the Run is taken, so its reads overlap the
   * dispatcher's own checks. A body that fails makes each offer that carries it `rejected`.
   */
  prepare(plan: LeasePlan): OfferBody;
  /**
   * `nodeId`: the runner's gateway node as its presence said (a hint; delivery falls back to a
   * lookup). `specFollows`: the runner speaks `lease-spec-v1`, so the offer may go at once without
   * the body, which follows in a `lease.spec` frame once it is ready (and is never sent when it
   * was withdrawn): the runner's acceptance and the lease's claim overlap the body's preparation.
   * A channel with many offers out may send the body inside the offer all the same.
   * `trace`: the placement's trace context (the offer span's parent).
   */
  offer(offer: LeaseOffer, timeoutMs: number, body: OfferBody, nodeId?: string, specFollows?: boolean, trace?: Context): Promise<OfferOutcome>;
}
