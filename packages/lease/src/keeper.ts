import { UnrecoverableError, type Job } from 'bullmq';
import { crashPoint } from '@agentplane/core';
import { BoundedCache } from '@agentplane/store';
import type { LeaseConfig } from './config.js';
import { LeaseFence, type FenceClaim } from './fence.js';
import type { RunJobData, RunQueues } from './queues.js';

/** One accepted Run attempt held by one runner. `lease_id` is the BullMQ lock token. */
export interface Lease {
  lease_id: string;
  run_id: string;
  session_id: string;
  pool_id: string;
  attempt: number;
  runner_id: string;
}

export type FailureClass = 'infrastructure' | 'agent';

export interface LeaseFailure {
  class: FailureClass;
  code: string;
  message: string;
}

/**
 * Jobs kept per lease, so a lease's frames skip reading its job back. An entry is dropped on every
 * end this process sees; ends it never sees (the runner died, or finished on another node) are
 * bounded by count and age: a job read again costs a round trip, never a wrong answer.
 */
const JOBS_KEPT = 10_000;
const JOB_KEPT_MS = 10 * 60_000;

/** Claims a lease's Session fence (`LeaseFence.claim`, or a claim with writes of its own). */
export type FenceClaimer = (fence: LeaseFence, claim: FenceClaim, ttlMs: number) => Promise<'ok' | 'taken' | 'canceled'>;

/**
 * The runner side of a lease, used by the gateway when runner frames arrive. Every operation
 * is fenced by the lock token: BullMQ refuses a stale token, and the Session fence stops a
 * stale runner's writes before BullMQ even notices the stall.
 */
export class LeaseKeeper {
  private readonly jobs = new BoundedCache<string, Job<RunJobData>>(JOBS_KEPT, { maxAgeMs: JOB_KEPT_MS });

  constructor(
    private readonly queues: RunQueues,
    private readonly fence: LeaseFence,
    private readonly config: LeaseConfig,
  ) {}

  private async jobFor(lease: Lease): Promise<Job<RunJobData> | undefined> {
    const cached = this.jobs.get(lease.lease_id);
    if (cached) return cached;
    // A first attempt's job as this process queued it, else read back.
    const job = (lease.attempt === 1 ? this.queues.firstAttemptJob(lease.pool_id, lease.run_id) : undefined) ?? await this.queues.job(lease.pool_id, lease.run_id);
    if (job) this.jobs.set(lease.lease_id, job);
    return job;
  }

  private forget(lease: Lease): void {
    this.jobs.delete(lease.lease_id);
  }

  /** How many leases' jobs are kept now. */
  get jobsKept(): number {
    return this.jobs.size;
  }

  private get fenceTtl(): number {
    return Math.max(1000, this.config.leaseMs - this.config.fenceMarginMs);
  }

  /**
   * Accept an offer: take the lock for a full lease, then claim the Session fence. `canceled`:
   * the Run was interrupted while its offer was out (its cancel mark refuses the claim); the
   * scheduler that holds the job ends it. `claim`: how the fence is claimed, when the caller
   * has writes to make with it (`LeaseFence.claimAndSwap`); by default `LeaseFence.claim`.
   */
  async accept(lease: Lease, claim: FenceClaimer = (fence, c, ttlMs) => fence.claim(c, ttlMs)): Promise<'ok' | 'lost' | 'taken' | 'canceled'> {
    const job = await this.jobFor(lease);
    if (!job) return 'lost';
    const extended = await job.extendLock(lease.lease_id, this.config.leaseMs).catch(() => 0);
    if (!extended) {
      this.forget(lease);
      return 'lost';
    }
    const claimed = await claim(this.fence, { sessionId: lease.session_id, token: lease.lease_id, runnerId: lease.runner_id, attempt: lease.attempt, runId: lease.run_id }, this.fenceTtl);
    // A refused claim ends the lease here: the gateway drops its record and revokes it.
    if (claimed !== 'ok') this.forget(lease);
    return claimed;
  }

  /**
   * Whether the lease is still held by its attempt: its Session fence is live (one Redis read).
   * False once it expired unrenewed, was released, or a newer attempt of the Run claimed it.
   */
  async holds(lease: Pick<Lease, 'session_id' | 'lease_id'>): Promise<boolean> {
    return this.fence.holds(lease.session_id, lease.lease_id);
  }

  /**
   * Whether a runner that comes back naming this lease in its hello may go on with it: its fence
   * is live, or this very attempt completed the Run's job already (the answer to its completion
   * was lost; the completion sent again is answered `ok`). A lease lost meanwhile (it expired,
   * or a newer attempt claimed the Run) is not.
   */
  async resumable(lease: Lease): Promise<boolean> {
    if (await this.fence.holds(lease.session_id, lease.lease_id)) return true;
    return this.completedBy(lease);
  }

  /**
   * Renew the lease. 'lost' means the runner must stop the Run at once; 'canceled' that the
   * lease was renewed but the Run carries a cancel mark (an interrupt): the runner is to stop it
   * and report the attempt's end, as on `lease.cancel`.
   */
  async heartbeat(lease: Lease): Promise<'ok' | 'lost' | 'canceled'> {
    const job = await this.jobFor(lease);
    if (!job) return 'lost';
    const extended = await job.extendLock(lease.lease_id, this.config.leaseMs).catch(() => 0);
    if (!extended) {
      await this.fence.release(lease.session_id, lease.lease_id);
      this.forget(lease);
      return 'lost';
    }
    const fenced = await this.fence.extend(lease.session_id, lease.lease_id, this.fenceTtl, lease.run_id);
    if (fenced === 'ok' || fenced === 'canceled') return fenced;
    this.forget(lease);
    // The fence ran out in the margin it expires ahead of the lock, and the lock was just renewed
    // for a full lease nobody holds (the runner is told the lease is lost): it is cut back, so the
    // stalled check returns the Run now instead of a lease later. Only a claim of this token that
    // ran out: a lock this token holds without one is the offering scheduler's.
    if (fenced === 'expired') await job.extendLock(lease.lease_id, 1).catch(() => 0);
    return 'lost';
  }

  /**
   * The runner finished the attempt: the fence is checked, the job moves to completed under this
   * lease's lock, and only then is the fence released. A crash before the move leaves the job
   * active and the fence held, so the complete the runner sends again (it keeps the lease until
   * this is answered) completes it; a crash after it leaves the job completed, and a complete of
   * the same lease sent again is answered `ok` (`completedBy`). While the job holds this lease's
   * lock no other attempt can claim the fence, and the runner reports the end only after its last
   * events were acknowledged, so no write meets the fence it leaves held until it expires.
   */
  async complete(lease: Lease, result: unknown): Promise<'ok' | 'lost'> {
    const job = await this.jobFor(lease);
    if (!job) return 'lost';
    try {
      if (!(await this.completeJob(job, lease, result)) && !(await this.completedBy(lease))) return 'lost';
      crashPoint('lease-job-completed');
      await this.fence.release(lease.session_id, lease.lease_id);
      return 'ok';
    } finally {
      this.forget(lease);
    }
  }

  /** True when this call moved the job to completed: the fence was live and the lock this lease's. */
  private async completeJob(job: Job<RunJobData>, lease: Lease, result: unknown): Promise<boolean> {
    if (!(await this.fence.holds(lease.session_id, lease.lease_id))) return false;
    crashPoint('lease-complete-checked');
    return job.moveToCompleted(result, lease.lease_id, false).then(() => true, () => false);
  }

  /**
   * The Run's job was completed by this lease's attempt already (a complete sent again after its
   * answer was lost). BullMQ counts every take of a job, so no other lease shares the attempt.
   */
  private async completedBy(lease: Lease): Promise<boolean> {
    const job = await this.queues.job(lease.pool_id, lease.run_id);
    return job !== undefined && job.attemptsStarted === lease.attempt && (await job.getState()) === 'completed';
  }

  /**
   * End the attempt with a failure. Infrastructure failures are retried by BullMQ with
   * exponential backoff while attempts remain; the agent's own failures are final.
   */
  async fail(lease: Lease, failure: LeaseFailure): Promise<'retry' | 'final' | 'lost'> {
    const job = await this.jobFor(lease);
    if (!job) return 'lost';
    await this.fence.release(lease.session_id, lease.lease_id);
    this.forget(lease);
    const err = failure.class === 'agent' ? new UnrecoverableError(failure.message) : new Error(failure.message);
    err.name = failure.class === 'agent' ? 'UnrecoverableError' : `InfrastructureError:${failure.code}`;
    const willRetry = failure.class === 'infrastructure' && job.attemptsMade + 1 < (job.opts.attempts ?? 1);
    try {
      await job.moveToFailed(err, lease.lease_id, false);
    } catch {
      return 'lost';
    }
    return willRetry ? 'retry' : 'final';
  }

  /**
   * The runner came back without this lease (its process restarted): end the attempt now as an
   * infrastructure failure instead of waiting for the lock to expire. An offer never accepted
   * (no fence claimed) is left to the offering scheduler.
   */
  async abandon(lease: Lease, message: string): Promise<'retry' | 'final' | 'lost' | 'not_accepted'> {
    if (!(await this.fence.holds(lease.session_id, lease.lease_id))) return 'not_accepted';
    return this.fail(lease, { class: 'infrastructure', code: 'runner_restarted', message });
  }

  /**
   * The Run's end (after `complete`, or a final `fail`) is recorded on the Run: its job leaves
   * the queue now instead of waiting for the scheduler's sweep of finished jobs.
   */
  async finished(lease: Lease): Promise<void> {
    await this.queues.removeFinished(lease.pool_id, lease.run_id);
  }

  /** The runner gave the offer back (declined, or cancelled before starting): requeue without using an attempt. */
  async giveBack(lease: Lease): Promise<void> {
    const job = await this.jobFor(lease);
    this.forget(lease);
    await this.fence.release(lease.session_id, lease.lease_id);
    if (job) await job.moveToWait(lease.lease_id).catch(() => undefined);
  }
}
