import { describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { activePools, markPoolActive, POOL_MARKS_KEY, POOL_WAKE_CHANNEL, poolMarkRefreshMs, recentPools } from './pools.js';

const redis = useEmbeddedRedis('pools');

/** The wake-ups published while `fn` runs (the subscription is confirmed before it starts). */
async function wakesDuring(fn: () => Promise<void>): Promise<string[]> {
  const sub = redis.connect('sub');
  const got: string[] = [];
  sub.on('message', (ch: string, pool: string) => void (ch === POOL_WAKE_CHANNEL && got.push(pool)));
  await sub.subscribe(POOL_WAKE_CHANNEL);
  await fn();
  // A PING on the subscriber answers after every message published before it.
  await sub.ping();
  await sub.unsubscribe();
  return got;
}

describe('pool marks', () => {
  it('register the pool, stamp it with Redis\'s clock, and wake the schedulers only when the pool was idle for half the window', async () => {
    const wakes = await wakesDuring(async () => {
      await markPoolActive(redis(), 'rpool_a', 'wrkspc_a', 60_000);
      await markPoolActive(redis(), 'rpool_a', 'wrkspc_a', 60_000);
      await redis().zadd(POOL_MARKS_KEY, 1, 'rpool_a');
      await markPoolActive(redis(), 'rpool_a', 'wrkspc_a', 60_000);
    });
    // The first mark (never marked) and the one after a long idle wake; the one right after does not.
    expect(wakes).toEqual(['rpool_a', 'rpool_a']);
    expect((await activePools(redis())).get('rpool_a')).toBe('wrkspc_a');
    const { now, pools } = await recentPools(redis(), 60_000);
    expect(pools.get('rpool_a')?.workspaceId).toBe('wrkspc_a');
    expect(now - (pools.get('rpool_a')?.markedAt ?? 0)).toBeLessThan(5_000);
  });

  it('recentPools leaves out pools not marked within the window', async () => {
    await markPoolActive(redis(), 'rpool_old', 'wrkspc_b', 60_000);
    await redis().zadd(POOL_MARKS_KEY, 1, 'rpool_old');
    const { pools } = await recentPools(redis(), 60_000);
    expect(pools.has('rpool_old')).toBe(false);
    expect((await activePools(redis())).get('rpool_old')).toBe('wrkspc_b');
  });

  it('a process re-marks well inside the idle window', () => {
    expect(poolMarkRefreshMs(300_000)).toBe(10_000);
    expect(poolMarkRefreshMs(2_000)).toBe(500);
    expect(poolMarkRefreshMs(1_000) * 4).toBeLessThanOrEqual(1_000);
  });
});
