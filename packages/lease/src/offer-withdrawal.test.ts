import { randomUUID } from 'node:crypto';
import { Worker, type Job } from 'bullmq';
import { describe, expect, it } from 'vitest';
import { keys, tags } from '@agentplane/store';
import { DEFAULT_LEASE_CONFIG } from './config.js';
import { fenceKey, LeaseFence, withdrawnOffersKey, type FenceClaim } from './fence.js';
import { LeaseKeeper, type Lease } from './keeper.js';
import { LeaseRecords, type LeaseRecord } from './offers.js';
import { queuePrefix, RUN_QUEUE, RunQueues, type RunJobData } from './queues.js';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import type { RunRequirements } from './requirements.js';

const redisOf = useEmbeddedRedis('offer-withdrawal');

/** The hash tag of a key (the part Redis Cluster hashes). */
const tagOf = (key: string): string => /\{([^}]*)\}/.exec(key)?.[1] ?? '';

describe('an offer withdrawn in one script with the claim it races', () => {
  it('a claim after the withdrawal is refused, by claim and by claimAndSwap, and writes nothing', async () => {
    const redis = redisOf();
    const fence = new LeaseFence(redis);
    const s = `sess_${'w'.repeat(32)}`;
    const c: FenceClaim = { sessionId: s, token: 'lease-w1', runnerId: 'runner_a', attempt: 1, runId: 'run_w1' };
    expect(await fence.withdrawOffer(s, c.token, c.runnerId, 60_000)).toBe('withdrawn');
    // Kept in the Session's slot, beside the fence, for the time asked.
    expect(tagOf(withdrawnOffersKey(s, c.token))).toBe(tagOf(fenceKey(s)));
    const ttl = await redis.pttl(withdrawnOffersKey(s, c.token));
    expect(ttl).toBeGreaterThan(50_000);
    expect(ttl).toBeLessThanOrEqual(60_000);

    expect(await fence.claim(c, 60_000)).toBe('taken');
    expect(await fence.holds(s, c.token)).toBe(false);
    expect(await fence.current(s, c.runId)).toEqual({});

    const doc = keys.doc(tags.session(s), c.runId);
    await redis.set(doc, JSON.stringify({ id: c.runId, version: 1, status: 'queued' }));
    const swapped = await fence.claimAndSwap(c, 60_000, { key: doc, expected: 1, json: JSON.stringify({ id: c.runId, version: 2, status: 'running' }) });
    expect(swapped).toEqual({ claim: 'taken' });
    expect(JSON.parse((await redis.get(doc)) ?? '{}')).toMatchObject({ version: 1, status: 'queued' });
    expect(await fence.holds(s, c.token)).toBe(false);
  });

  it('a withdrawal after the runner\'s claim answers claimed, and the lease stays the runner\'s', async () => {
    const redis = redisOf();
    const fence = new LeaseFence(redis);
    const s = `sess_${'x'.repeat(32)}`;
    const c: FenceClaim = { sessionId: s, token: 'lease-x1', runnerId: 'runner_a', attempt: 1, runId: 'run_x1' };
    expect(await fence.claim(c, 60_000)).toBe('ok');
    expect(await fence.withdrawOffer(s, c.token, 'runner_a', 60_000)).toBe('claimed');
    // Nothing was withdrawn: the lease is held, and the runner's claim made again still goes.
    expect(await redis.exists(withdrawnOffersKey(s, c.token))).toBe(0);
    expect(await fence.holds(s, c.token)).toBe(true);
    expect(await fence.current(s, c.runId)).toMatchObject({ token: c.token, runner_id: 'runner_a' });
    expect(await fence.claim(c, 60_000)).toBe('ok');
  });

  it('is per runner: the next runner offered the same lease claims it, the withdrawn runner stays refused', async () => {
    const redis = redisOf();
    const fence = new LeaseFence(redis);
    const s = `sess_${'y'.repeat(32)}`;
    const first: FenceClaim = { sessionId: s, token: 'lease-y1', runnerId: 'runner_a', attempt: 1, runId: 'run_y1' };
    const next: FenceClaim = { ...first, runnerId: 'runner_b' };
    expect(await fence.withdrawOffer(s, first.token, 'runner_a', 60_000)).toBe('withdrawn');
    expect(await fence.claim(next, 60_000)).toBe('ok');
    expect(await fence.current(s, first.runId)).toMatchObject({ token: first.token, runner_id: 'runner_b' });
    expect(await fence.claim(first, 60_000)).toBe('taken');
    // Withdrawing the first runner again once the next one holds the lease changes nothing.
    expect(await fence.withdrawOffer(s, first.token, 'runner_a', 60_000)).toBe('withdrawn');
    expect(await fence.holds(s, first.token)).toBe(true);
    // The withdrawal is of that lease only: the same runner's claim of another token goes.
    expect(await fence.claim({ ...first, token: 'lease-y2', runId: 'run_y2' }, 60_000)).toBe('ok');
  });

  describe('through the lease keeper (the gateway\'s acceptance: the lock extended, then the claim)', () => {
    const config = { ...DEFAULT_LEASE_CONFIG, backoffMs: 1 };
    /** A Run's job taken as a dispatcher takes it, with the lease each runner would get. */
    async function taken(n: number) {
      const redis = redisOf();
      const queues = new RunQueues(redis, config);
      const fence = new LeaseFence(redis);
      const keeper = new LeaseKeeper(queues, fence, config);
      const pool = `rpool_withdrawal_${n}`;
      const session = `sess_${String(n).padStart(32, '0')}`;
      const worker = new Worker<RunJobData>(RUN_QUEUE, null, { connection: redis.duplicate({ maxRetriesPerRequest: null }), prefix: queuePrefix(pool), autorun: false, lockDuration: config.leaseMs });
      await queues.enqueue({ run_id: 'run_z', session_id: session, thread_id: 'sthr_z', workspace_id: 'wrkspc_z', pool_id: pool, requirements: {} as RunRequirements, accepted_at_ms: Date.now() });
      const token = randomUUID();
      const job = (await worker.getNextJob(token, { block: false })) as Job<RunJobData> | undefined;
      if (!job) throw new Error('no job to take');
      const lease = (runner: string): Lease => ({ lease_id: token, run_id: 'run_z', session_id: session, pool_id: pool, attempt: job.attemptsStarted, runner_id: runner });
      const close = async () => {
        await worker.close();
        await queues.close();
      };
      return { fence, keeper, session, token, job, lease, close };
    }

    it('an acceptance that comes after its offer was withdrawn is refused; the next runner offered the same lease takes it', async () => {
      const t = await taken(1);
      try {
        expect(await t.fence.withdrawOffer(t.session, t.token, 'runner_a', config.leaseMs * 3)).toBe('withdrawn');
        expect(await t.keeper.accept(t.lease('runner_a'))).toBe('taken');
        expect(await t.fence.holds(t.session, t.token)).toBe(false);
        expect(await t.keeper.accept(t.lease('runner_b'))).toBe('ok');
        expect(await t.fence.current(t.session, 'run_z')).toMatchObject({ token: t.token, runner_id: 'runner_b' });
        // runner_a's acceptance sent again is still refused, and takes nothing from runner_b.
        expect(await t.keeper.accept(t.lease('runner_a'))).toBe('taken');
        expect(await t.keeper.heartbeat(t.lease('runner_b'))).toBe('ok');
      } finally {
        await t.close();
      }
    });

    it('a refused acceptance leaves the job to the scheduler, which gives it back under its token; later it finds no lock', async () => {
      const t = await taken(2);
      try {
        expect(await t.fence.withdrawOffer(t.session, t.token, 'runner_a', config.leaseMs * 3)).toBe('withdrawn');
        expect(await t.keeper.accept(t.lease('runner_a'))).toBe('taken');
        await t.job.moveToDelayed(Date.now() + 60_000, t.token);
        expect(await t.job.getState()).toBe('delayed');
        expect(await t.keeper.accept(t.lease('runner_a'))).toBe('lost');
        expect(await t.fence.holds(t.session, t.token)).toBe(false);
      } finally {
        await t.close();
      }
    });
  });

  it('a refused acceptance removes its own offer\'s record only, not the next runner\'s record of the same lease', async () => {
    const redis = redisOf();
    const records = new LeaseRecords(redis);
    const rec = (runner: string): LeaseRecord => ({
      lease_id: 'lease-r1', run_id: 'run_r1', session_id: 'sess_r1', thread_id: 'sthr_r1', workspace_id: 'wrkspc_r', pool_id: 'rpool_r', attempt: 1, runner_id: runner, reply_to: 'reply',
    });
    await records.put(rec('runner_a'), 60_000);
    // The lease was offered to runner_b since (the same lease id): runner_a's late refusal leaves it.
    await records.put(rec('runner_b'), 60_000);
    await records.removeOffer('lease-r1', 'runner_a');
    expect((await records.get('lease-r1'))?.runner_id).toBe('runner_b');
    expect(await records.orphansOf('runner_a', new Set())).toEqual([]);
    expect((await records.orphansOf('runner_b', new Set())).map((r) => r.runner_id)).toEqual(['runner_b']);
    await records.removeOffer('lease-r1', 'runner_b');
    expect(await records.get('lease-r1')).toBeNull();
  });
});
