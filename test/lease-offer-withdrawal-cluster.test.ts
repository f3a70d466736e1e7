import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { cancelMarkKey, fenceKey, LeaseFence, LeaseRecords, withdrawnOffersKey, type FenceClaim } from '@agentplane/lease';
import { connectRedis, keys, tags, type Redis } from '@agentplane/store';
import { redisClusterAvailable, startRedisCluster, type RedisClusterHandle } from './harness/redis-cluster.js';

/**
 * An offer's withdrawal and the claims it races are scripts over several keys: on a Redis Cluster
 * every key of one script must be in one slot (the cluster refuses the script otherwise). The
 * withdrawal runs only when an offer times out, so a platform run rarely reaches it: here each
 * script runs on a real cluster.
 */
describe.skipIf(!redisClusterAvailable())('an offer withdrawn on a Redis Cluster', () => {
  let cluster: RedisClusterHandle;
  let redis: Redis;
  beforeAll(async () => {
    cluster = await startRedisCluster();
    redis = connectRedis(cluster.url, { name: 'test' });
  }, 90_000);
  afterAll(async () => {
    redis?.disconnect();
    await cluster?.stop();
  });

  it('keeps the withdrawal, the fence and the cancel mark in the Session\'s slot: withdraw, claim, claim with the Run\'s move, each runs', async () => {
    const fence = new LeaseFence(redis);
    const s = `sess_${'c'.repeat(32)}`;
    const c: FenceClaim = { sessionId: s, token: 'lease-c1', runnerId: 'runner_a', attempt: 1, runId: 'run_c1' };
    const master = await cluster.masterOf(fenceKey(s));
    for (const key of [cancelMarkKey(s, c.runId), withdrawnOffersKey(s, c.token), keys.doc(tags.session(s), c.runId)]) {
      expect(await cluster.masterOf(key)).toBe(master);
    }

    expect(await fence.withdrawOffer(s, c.token, 'runner_a', 60_000)).toBe('withdrawn');
    expect(await fence.claim(c, 60_000)).toBe('taken');
    const doc = keys.doc(tags.session(s), c.runId);
    await redis.set(doc, JSON.stringify({ id: c.runId, version: 1, status: 'queued' }));
    const move = { key: doc, expected: 1, json: JSON.stringify({ id: c.runId, version: 2, status: 'running' }) };
    expect(await fence.claimAndSwap(c, 60_000, move)).toEqual({ claim: 'taken' });
    // The next runner offered the same lease claims it, with the Run's move.
    expect(await fence.claimAndSwap({ ...c, runnerId: 'runner_b' }, 60_000, move)).toMatchObject({ claim: 'ok', outcome: { kind: 'written' } });
    expect(await fence.withdrawOffer(s, c.token, 'runner_b', 60_000)).toBe('claimed');
    expect(await fence.current(s, c.runId)).toMatchObject({ token: c.token, runner_id: 'runner_b' });
  });

  it('removes a refused offer\'s record only while it is that runner\'s', async () => {
    const records = new LeaseRecords(redis);
    const rec = { lease_id: 'lease-c2', run_id: 'run_c2', session_id: 'sess_c2', thread_id: 'sthr_c2', workspace_id: 'wrkspc_c', pool_id: 'rpool_c', attempt: 1, reply_to: 'reply' };
    await records.put({ ...rec, runner_id: 'runner_b' }, 60_000);
    await records.removeOffer('lease-c2', 'runner_a');
    expect((await records.get('lease-c2'))?.runner_id).toBe('runner_b');
    await records.removeOffer('lease-c2', 'runner_b');
    expect(await records.get('lease-c2')).toBeNull();
  });
});
