import { describe, expect, it } from 'vitest';
import { DEFAULT_LEASE_CONFIG } from './config.js';
import { queuePrefix, RunQueues } from './queues.js';
import { useEmbeddedRedis } from './redis.test-support.js';
import type { RunRequirements } from './requirements.js';

const redisOf = useEmbeddedRedis('queues');

const POOL = 'rpool_ranks';
const WS = 'wrkspc_ranks';
const fair = `${queuePrefix(POOL)}:fair:${WS}`;
const job = (run: string) => ({ run_id: run, session_id: 'sess_x', thread_id: 'sthr_x', workspace_id: WS, pool_id: POOL, requirements: {} as RunRequirements, accepted_at_ms: Date.now() });

describe('fair-share ranks taken ahead of the enqueue', () => {
  it('a rank taken ahead is the job priority; ranks whose Run never got a job are pruned once old enough, the others kept', async () => {
    const redis = redisOf();
    // The fair-share commands on their own auto-pipelined connection, as the api and scheduler run them.
    const commands = redis.duplicate({ enableAutoPipelining: true });
    const queues = new RunQueues(redis, DEFAULT_LEASE_CONFIG, commands);
    // Taken ahead, then enqueued with it: the job carries that rank, nothing is ranked twice.
    const ahead = await queues.rank(POOL, WS, 'run_a');
    expect(ahead).toBe(1);
    const data = await queues.enqueue(job('run_a'), ahead);
    expect(data.rank).toBe(1);
    expect((await queues.job(POOL, 'run_a'))?.opts.priority).toBe(1);
    // Taken for a start that never committed: counts against the workspace until pruned.
    expect(await queues.rank(POOL, WS, 'run_lost')).toBe(2);
    expect(await queues.rank(POOL, WS, 'run_lost')).toBe(2); // idempotent
    const taken = Date.now();
    // Too young to prune: kept.
    expect(await queues.pruneRanks(POOL, WS, taken - 60_000)).toBe(0);
    expect(await redis.zrange(fair, 0, -1)).toEqual(['run_a', 'run_lost']);
    // Old enough: the one without a job goes, the queued one stays.
    expect(await queues.pruneRanks(POOL, WS, taken + 1)).toBe(1);
    expect(await redis.zrange(fair, 0, -1)).toEqual(['run_a']);
    // Without a rank taken ahead, the enqueue takes it.
    expect((await queues.enqueue(job('run_b'))).rank).toBe(2);
    // Leased (or removed): the Run leaves the fair set, and the next one of its workspace ranks first.
    await queues.dequeued(POOL, WS, 'run_a');
    expect(await redis.zrange(fair, 0, -1)).toEqual(['run_b']);
    expect(await queues.rank(POOL, WS, 'run_c')).toBe(2);
    await queues.queue(POOL).close();
    commands.disconnect();
  });
});
