import { randomUUID } from 'node:crypto';
import { Worker, type Job } from 'bullmq';
import { describe, expect, it } from 'vitest';
import { CancelMarks } from './cancels.js';
import { DEFAULT_LEASE_CONFIG } from './config.js';
import { fenceKey, LeaseFence } from './fence.js';
import { LeaseKeeper, type Lease } from './keeper.js';
import { queuePrefix, RUN_QUEUE, RunQueues, type RunJobData } from './queues.js';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import type { RunRequirements } from './requirements.js';

const redisOf = useEmbeddedRedis('keeper');

const POOL = 'rpool_keeper';
const SESSION = `sess_${'k'.repeat(32)}`;

describe('lease keeper', () => {
  it('a first attempt works on the job as this process queued it; a retried attempt reads it back, and each ends where BullMQ says', async () => {
    const redis = redisOf();
    const config = { ...DEFAULT_LEASE_CONFIG, backoffMs: 1 };
    const queues = new RunQueues(redis, config);
    const keeper = new LeaseKeeper(queues, new LeaseFence(redis), config);
    const worker = new Worker<RunJobData>(RUN_QUEUE, null, { connection: redis.duplicate({ maxRetriesPerRequest: null }), prefix: queuePrefix(POOL), autorun: false, lockDuration: config.leaseMs });
    try {
      await queues.enqueue({ run_id: 'run_k', session_id: SESSION, thread_id: 'sthr_k', workspace_id: 'wrkspc_k', pool_id: POOL, requirements: {} as RunRequirements, accepted_at_ms: Date.now() });
      /** Take the Run's job as a dispatcher does, and the lease of that attempt. */
      const take = async (): Promise<{ job: Job<RunJobData>; lease: Lease }> => {
        const token = randomUUID();
        let job: Job<RunJobData> | undefined;
        // A retried job waits out its backoff (1 ms) in the delayed set first.
        for (let i = 0; i < 50 && !job; i++) job = (await worker.getNextJob(token, { block: false })) as Job<RunJobData> | undefined;
        if (!job) throw new Error('no job to take');
        return { job, lease: { lease_id: token, run_id: 'run_k', session_id: SESSION, pool_id: POOL, attempt: job.attemptsStarted, runner_id: 'runner_a' } };
      };

      const first = await take();
      expect(first.lease.attempt).toBe(1);
      expect(await keeper.accept(first.lease)).toBe('ok');
      // The acceptance took the job as queued (no read back): it is there once only.
      expect(queues.firstAttemptJob(POOL, 'run_k')).toBeUndefined();
      // An infrastructure failure of the first attempt is retried: the job's own counters say so.
      expect(await keeper.fail(first.lease, { class: 'infrastructure', code: 'runner_failure', message: 'lost' })).toBe('retry');
      expect((await queues.job(POOL, 'run_k'))?.attemptsMade).toBe(1);

      const second = await take();
      expect(second.lease.attempt).toBe(2);
      expect(await keeper.accept(second.lease)).toBe('ok');
      // A frame of the first attempt finds its lease gone.
      expect(await keeper.complete(first.lease, {})).toBe('lost');
      expect(await keeper.complete(second.lease, { stop_reason: { type: 'end_turn' } })).toBe('ok');
      const done = await queues.job(POOL, 'run_k');
      expect(await done?.getState()).toBe('completed');
      expect(done?.attemptsMade).toBe(2);
    } finally {
      await worker.close();
      await queues.close();
    }
  });

  it('a complete is checked, moved, then released; sent again (its answer lost, or the process gone) it is answered ok, and completes a job a crash left active', async () => {
    const redis = redisOf();
    const queues = new RunQueues(redis, DEFAULT_LEASE_CONFIG);
    const fence = new LeaseFence(redis);
    const keeper = new LeaseKeeper(queues, fence, DEFAULT_LEASE_CONFIG);
    const worker = new Worker<RunJobData>(RUN_QUEUE, null, { connection: redis.duplicate({ maxRetriesPerRequest: null }), prefix: queuePrefix(POOL), autorun: false, lockDuration: DEFAULT_LEASE_CONFIG.leaseMs });
    try {
      const leaseOf = async (run: string): Promise<Lease> => {
        await queues.enqueue({ run_id: run, session_id: SESSION, thread_id: 'sthr_k', workspace_id: 'wrkspc_k', pool_id: POOL, requirements: {} as RunRequirements, accepted_at_ms: Date.now() });
        const token = randomUUID();
        const job = (await worker.getNextJob(token, { block: false })) as Job<RunJobData> | undefined;
        if (!job) throw new Error('no job to take');
        const lease = { lease_id: token, run_id: run, session_id: SESSION, pool_id: POOL, attempt: job.attemptsStarted, runner_id: 'runner_a' };
        expect(await keeper.accept(lease)).toBe('ok');
        return lease;
      };
      const result = { stop_reason: { type: 'end_turn' } };

      const done = await leaseOf('run_again');
      expect(await keeper.complete(done, result)).toBe('ok');
      expect(await fence.holds(SESSION, done.lease_id)).toBe(false);
      // The answer was lost: the runner sends the same end again, here or to another process.
      expect(await keeper.complete(done, result)).toBe('ok');
      expect(await new LeaseKeeper(queues, fence, DEFAULT_LEASE_CONFIG).complete(done, result)).toBe('ok');
      expect(await (await queues.job(POOL, 'run_again'))?.getState()).toBe('completed');
      // Another lease of the same Run (an attempt that is not the one that completed it) is lost.
      expect(await keeper.complete({ ...done, lease_id: randomUUID(), attempt: done.attempt + 1 }, result)).toBe('lost');

      // A process that died after the check, before the move, left the job active and the fence
      // held (the runner kept renewing it): the end sent again completes it, in another process.
      const cut = await leaseOf('run_cut');
      expect(await fence.holds(SESSION, cut.lease_id)).toBe(true);
      expect(await new LeaseKeeper(queues, fence, DEFAULT_LEASE_CONFIG).complete(cut, result)).toBe('ok');
      expect(await (await queues.job(POOL, 'run_cut'))?.getState()).toBe('completed');
      expect(await fence.holds(SESSION, cut.lease_id)).toBe(false);
    } finally {
      await worker.close();
      await queues.close();
    }
  });

  it('keeps no job for a lease that ended without a normal complete or fail: refused claims, lost leases, a complete too late', async () => {
    const redis = redisOf();
    const pool = 'rpool_keeper_kept';
    const queues = new RunQueues(redis, DEFAULT_LEASE_CONFIG);
    const fence = new LeaseFence(redis);
    const keeper = new LeaseKeeper(queues, fence, DEFAULT_LEASE_CONFIG);
    const worker = new Worker<RunJobData>(RUN_QUEUE, null, { connection: redis.duplicate({ maxRetriesPerRequest: null }), prefix: queuePrefix(pool), autorun: false, lockDuration: DEFAULT_LEASE_CONFIG.leaseMs });
    const marks = new CancelMarks(redis);
    try {
      const take = async (run: string): Promise<Lease> => {
        await queues.enqueue({ run_id: run, session_id: SESSION, thread_id: 'sthr_k', workspace_id: 'wrkspc_k', pool_id: pool, requirements: {} as RunRequirements, accepted_at_ms: Date.now() });
        const token = randomUUID();
        const job = (await worker.getNextJob(token, { block: false })) as Job<RunJobData> | undefined;
        if (!job) throw new Error('no job to take');
        return { lease_id: token, run_id: run, session_id: SESSION, pool_id: pool, attempt: job.attemptsStarted, runner_id: 'runner_a' };
      };
      const N = 20;
      for (let i = 0; i < N; i++) {
        // Interrupted while the offer was out: the claim is refused.
        const refused = await take(`run_refused_${i}`);
        await marks.mark(SESSION, refused.run_id);
        expect(await keeper.accept(refused)).toBe('canceled');
        // Another runner holds the Session's lease for it: refused too.
        const taken = await take(`run_taken_${i}`);
        expect(await fence.claim({ sessionId: SESSION, token: taken.lease_id, runnerId: 'runner_b', attempt: taken.attempt, runId: taken.run_id }, 30_000)).toBe('ok');
        expect(await keeper.accept(taken)).toBe('taken');
        // Accepted, then lost: its fence dropped (a newer attempt claimed it), the heartbeat says so.
        const lost = await take(`run_lost_${i}`);
        expect(await keeper.accept(lost)).toBe('ok');
        await fence.release(SESSION, lost.lease_id);
        expect(await keeper.heartbeat(lost)).toBe('lost');
        // Accepted, then its complete came too late.
        const late = await take(`run_late_${i}`);
        expect(await keeper.accept(late)).toBe('ok');
        await fence.release(SESSION, late.lease_id);
        expect(await keeper.complete(late, {})).toBe('lost');
      }
      expect(keeper.jobsKept).toBe(0);
    } finally {
      await worker.close();
      await queues.close();
    }
  });

  it('a heartbeat that finds the fence expired (the lock still held, in the margin the fence expires ahead of it) leaves the lock to expire now, not a lease later', async () => {
    const redis = redisOf();
    const pool = 'rpool_keeper_margin';
    const queues = new RunQueues(redis, DEFAULT_LEASE_CONFIG);
    const fence = new LeaseFence(redis);
    const keeper = new LeaseKeeper(queues, fence, DEFAULT_LEASE_CONFIG);
    const worker = new Worker<RunJobData>(RUN_QUEUE, null, { connection: redis.duplicate({ maxRetriesPerRequest: null }), prefix: queuePrefix(pool), autorun: false, lockDuration: DEFAULT_LEASE_CONFIG.leaseMs });
    try {
      await queues.enqueue({ run_id: 'run_margin', session_id: SESSION, thread_id: 'sthr_k', workspace_id: 'wrkspc_k', pool_id: pool, requirements: {} as RunRequirements, accepted_at_ms: Date.now() });
      const token = randomUUID();
      const job = (await worker.getNextJob(token, { block: false })) as Job<RunJobData> | undefined;
      if (!job) throw new Error('no job to take');
      const lease: Lease = { lease_id: token, run_id: 'run_margin', session_id: SESSION, pool_id: pool, attempt: job.attemptsStarted, runner_id: 'runner_a' };
      expect(await keeper.accept(lease)).toBe('ok');
      // The runner went quiet: its fence expired, the job's lock (a margin longer) not yet.
      await redis.hset(fenceKey(SESSION), `t:${token}`, Date.now() - 1);
      const lock = `${queuePrefix(pool)}:${RUN_QUEUE}:run_margin:lock`;
      expect(await redis.pttl(lock)).toBeGreaterThan(0);
      expect(await keeper.heartbeat(lease)).toBe('lost');
      // Not renewed for a lease nobody holds: the stalled check takes the Run back at once.
      expect(await redis.pttl(lock)).toBeLessThan(1000);
      expect(await fence.holds(SESSION, token)).toBe(false);
    } finally {
      await worker.close();
      await queues.close();
    }
  });
});
