import { Worker, type Job } from 'bullmq';
import { describe, expect, it } from 'vitest';
import { DEFAULT_LEASE_CONFIG } from './config.js';
import { queuePrefix, RUN_QUEUE, RunQueues, type RunJobData } from './queues.js';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import type { RunRequirements } from './requirements.js';

const redisOf = useEmbeddedRedis('queues');

const POOL = 'rpool_ranks';
const WS = 'wrkspc_ranks';
const fair = `${queuePrefix(POOL)}:fair:${WS}`;
const job = (run: string) => ({ run_id: run, session_id: 'sess_x', thread_id: 'sthr_x', workspace_id: WS, pool_id: POOL, requirements: {} as RunRequirements, accepted_at_ms: Date.now() });

describe('fair-share ranks taken ahead of the enqueue', () => {
  it('a rank taken ahead is the job priority; ranks whose Run never got a job are pruned once old enough, the others kept', async () => {
    const redis = redisOf();
    // The fair-share commands on a connection of their own, as the api and scheduler run them.
    const commands = redis.duplicate();
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
    // Removed: the Run leaves the fair set; the next one of its workspace comes after run_b.
    await queues.dequeued(POOL, WS, 'run_a');
    expect(await redis.zrange(fair, 0, -1)).toEqual(['run_b']);
    expect(await queues.rank(POOL, WS, 'run_c')).toBe(3);
    await queues.queue(POOL).close();
    commands.disconnect();
  });
});

describe('the order a backlog is served in', () => {
  /** Queue each Run as the API does (rank taken, then the job), in the given workspace of `pool`. */
  const queueRuns = async (queues: RunQueues, pool: string, ws: string, runs: string[]): Promise<void> => {
    for (const run of runs) await queues.enqueue({ ...job(run), workspace_id: ws, pool_id: pool }, await queues.rank(pool, ws, run));
  };
  /** Take `n` jobs in the order BullMQ hands them out, each leased (and so dequeued) as it is taken. */
  const take = async (queues: RunQueues, worker: Worker<RunJobData>, pool: string, n: number): Promise<string[]> => {
    const out: string[] = [];
    for (let i = 0; i < n; i++) {
      const j = (await worker.getNextJob(`token-${pool}-${i}`, { block: false })) as Job<RunJobData> | undefined;
      if (!j) break;
      await queues.dequeued(pool, j.data.workspace_id, j.data.run_id, { leased: true });
      out.push(j.data.run_id);
    }
    return out;
  };

  it('first in, first out within a workspace, however far its backlog drains between arrivals', async () => {
    const redis = redisOf();
    const pool = 'rpool_fifo';
    const queues = new RunQueues(redis, DEFAULT_LEASE_CONFIG);
    const worker = new Worker<RunJobData>(RUN_QUEUE, null, { connection: redis.duplicate({ maxRetriesPerRequest: null }), prefix: queuePrefix(pool), autorun: false });
    await queueRuns(queues, pool, WS, ['a1', 'a2', 'a3', 'a4', 'a5']);
    expect(await take(queues, worker, pool, 3)).toEqual(['a1', 'a2', 'a3']);
    // Two were still waiting when these came: they go after them, not before.
    await queueRuns(queues, pool, WS, ['a6', 'a7']);
    expect(await take(queues, worker, pool, 2)).toEqual(['a4', 'a5']);
    await queueRuns(queues, pool, WS, ['a8']);
    expect(await take(queues, worker, pool, 10)).toEqual(['a6', 'a7', 'a8']);
    // A set an earlier version wrote (scored by the time ranked) does not push new ranks to the end.
    await redis.zadd(`${queuePrefix(pool)}:fair:wrkspc_old`, Date.now(), 'run_old');
    expect(await queues.rank(pool, 'wrkspc_old', 'run_new')).toBe(1);
    expect(await queues.rank(pool, 'wrkspc_old', 'run_newer')).toBe(2);
    await worker.close();
    await queues.queue(pool).close();
  });

  it('workspaces in turn: a backlog delays another workspace by at most one Run, wherever its drain is', async () => {
    const redis = redisOf();
    const pool = 'rpool_turns';
    const queues = new RunQueues(redis, DEFAULT_LEASE_CONFIG);
    const worker = new Worker<RunJobData>(RUN_QUEUE, null, { connection: redis.duplicate({ maxRetriesPerRequest: null }), prefix: queuePrefix(pool), autorun: false });
    await queueRuns(queues, pool, 'wrkspc_busy', ['b1', 'b2', 'b3', 'b4', 'b5', 'b6', 'b7', 'b8']);
    expect(await take(queues, worker, pool, 4)).toEqual(['b1', 'b2', 'b3', 'b4']);
    // A second workspace arrives mid-drain with a backlog of its own: the two take turns.
    await queueRuns(queues, pool, 'wrkspc_new', ['n1', 'n2', 'n3']);
    const order = await take(queues, worker, pool, 20);
    expect(order.filter((r) => r.startsWith('b'))).toEqual(['b5', 'b6', 'b7', 'b8']);
    expect(order.filter((r) => r.startsWith('n'))).toEqual(['n1', 'n2', 'n3']);
    expect(order.indexOf('n1')).toBeLessThanOrEqual(1);
    expect(order.indexOf('n2')).toBeLessThanOrEqual(3);
    expect(order.indexOf('n3')).toBeLessThanOrEqual(5);
    // Once nothing of the pool waits, the rounds start over: a later Run ranks first again.
    await queueRuns(queues, pool, 'wrkspc_new', ['later']);
    expect(await queues.rank(pool, 'wrkspc_new', 'later')).toBe(1);
    await worker.close();
    await queues.queue(pool).close();
  });
});


describe('a job sent behind its start (sendBehind)', () => {
  it('waits at the lowest priority, behind every ranked job, until it gets its rank; a withdrawn one goes', async () => {
    const redis = redisOf();
    const commands = redis.duplicate();
    const pool = 'rpool_behind';
    const queues = new RunQueues(redis, DEFAULT_LEASE_CONFIG, commands);
    expect(queues.sendsBehind(commands)).toBe(true);
    expect(queues.sendsBehind(redis)).toBe(false);
    const data = (run: string) => ({ ...job(run), pool_id: pool });
    const order = async () => (await queues.queue(pool).getJobs(['prioritized'], 0, -1, true)).map((j) => j.id);
    await queues.enqueue(data('run_ranked_2'), 2);
    const sent = await queues.sendBehind(data('run_behind'));
    await queues.enqueue(data('run_ranked_5'), 5);
    // Before its rank is known it overtakes no one, even Runs queued after it.
    expect(sent.data.rank).toBeUndefined();
    expect(await order()).toEqual(['run_ranked_2', 'run_ranked_5', 'run_behind']);
    // Ranked: in its place (a Run of the same rank queued before it still goes first).
    await queues.ranked(sent, 2);
    expect((await queues.job(pool, 'run_behind'))?.priority).toBe(2);
    expect(await order()).toEqual(['run_ranked_2', 'run_behind', 'run_ranked_5']);
    // A job gone (a start that did not commit withdrew it) is left alone by a late rank.
    const lost = await queues.sendBehind(data('run_lost'));
    await queues.withdraw(pool, 'run_lost');
    expect(await queues.job(pool, 'run_lost')).toBeUndefined();
    await queues.ranked(lost, 1);
    expect(await queues.job(pool, 'run_lost')).toBeUndefined();
    await queues.close();
    commands.disconnect();
  });
});
