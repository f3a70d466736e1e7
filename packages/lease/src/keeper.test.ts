import { randomUUID } from 'node:crypto';
import { Worker, type Job } from 'bullmq';
import { describe, expect, it } from 'vitest';
import { DEFAULT_LEASE_CONFIG } from './config.js';
import { LeaseFence } from './fence.js';
import { LeaseKeeper, type Lease } from './keeper.js';
import { queuePrefix, RUN_QUEUE, RunQueues, type RunJobData } from './queues.js';
import { useEmbeddedRedis } from './redis.test-support.js';
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
});
