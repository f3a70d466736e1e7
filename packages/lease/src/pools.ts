import { keys, LuaScript, tags, type Redis } from '@agentplane/store';

/**
 * Pools with Runs to place. Every pool a Run was ever queued in is registered (pool id →
 * workspace id), and each carries a mark: when a Run was last queued in it (Redis's clock). A
 * scheduler dispatches the pools marked lately, and lets a pool go once it has been idle for
 * `LeaseConfig.poolIdleMs` with nothing in its queue; the next Run's mark brings it back (at once:
 * a mark that finds the pool idle for half that time wakes the schedulers). Both keys share one
 * slot, so the mark is one script.
 */
const TAG = tags.global('active_pools');
export const ACTIVE_POOLS_KEY = keys.global('active_pools');
/** Sorted set: pool id → when a Run was last queued in it (ms, Redis's clock). */
export const POOL_MARKS_KEY = keys.scoped(TAG, 'pool_marks');
/** Schedulers listen here for pools that may have gone idle getting a Run (the message: the pool id). */
export const POOL_WAKE_CHANNEL = 'ap:scheduler:pools';

/**
 * A process marks a pool at most this often (its Runs between ride on the last mark): a quarter
 * of the idle window, at most 10 s, so a mark a process skipped is never old enough for a
 * scheduler to let the pool go.
 */
export const poolMarkRefreshMs = (poolIdleMs: number): number => Math.max(1, Math.min(10_000, Math.floor(poolIdleMs / 4)));

/** KEYS: registry | marks. ARGV: pool | workspace | wake after (ms idle). Returns Redis's time (ms). */
const MARK = new LuaScript('pool_mark', `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local prev = tonumber(redis.call('ZSCORE', KEYS[2], ARGV[1]) or '0')
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], now, ARGV[1])
if now - prev > tonumber(ARGV[3]) then redis.call('PUBLISH', '${POOL_WAKE_CHANNEL}', ARGV[1]) end
return now`);

/** Mark `poolId` (of `workspaceId`) as having a Run queued now. */
export async function markPoolActive(redis: Redis, poolId: string, workspaceId: string, poolIdleMs: number): Promise<void> {
  await MARK.run(redis, [ACTIVE_POOLS_KEY, POOL_MARKS_KEY], [poolId, workspaceId, Math.floor(poolIdleMs / 2)]);
}

/** Every registered pool (pool id → workspace id). */
export async function activePools(redis: Redis): Promise<Map<string, string>> {
  return new Map(Object.entries(await redis.hgetall(ACTIVE_POOLS_KEY)));
}

/** The workspace of a registered pool (null: never registered). */
export async function poolWorkspace(redis: Redis, poolId: string): Promise<string | null> {
  return redis.hget(ACTIVE_POOLS_KEY, poolId);
}

/**
 * The pools marked within `withinMs` of Redis's clock, with their workspaces and marks, and that
 * clock (so a caller ages marks without trusting its own).
 */
export async function recentPools(redis: Redis, withinMs: number): Promise<{ now: number; pools: Map<string, { workspaceId: string; markedAt: number }> }> {
  const [sec, micro] = await redis.time();
  const now = Number(sec) * 1000 + Math.floor(Number(micro) / 1000);
  const flat = await redis.zrangebyscore(POOL_MARKS_KEY, now - withinMs, '+inf', 'WITHSCORES');
  const pools = new Map<string, { workspaceId: string; markedAt: number }>();
  if (flat.length === 0) return { now, pools };
  const ids = flat.filter((_, i) => i % 2 === 0);
  const workspaces = await redis.hmget(ACTIVE_POOLS_KEY, ...ids);
  ids.forEach((id, i) => {
    const ws = workspaces[i];
    if (ws) pools.set(id, { workspaceId: ws, markedAt: Number(flat[2 * i + 1]) });
  });
  return { now, pools };
}
