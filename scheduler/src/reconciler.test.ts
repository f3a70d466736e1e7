import { randomUUID } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { Worker, type Job } from 'bullmq';
import { createLogger } from '@agentplane/core';
import type { RunLifecycle, TurnResult } from '@agentplane/domain';
import { DEFAULT_LEASE_CONFIG, queuePrefix, RUN_QUEUE, RunQueues, type RunJobData, type RunRequirements } from '@agentplane/lease';
import { type Redis } from '@agentplane/store';
import { reconcilePool, repairStalls, STALLS_FROM_START } from './reconciler.js';

const log = createLogger({ name: 'test', level: 'silent' });
const POOL = 'rpool_reconcile';
const SESSION = `sess_${'r'.repeat(32)}`;

let redis: Redis;
const testRedis = useEmbeddedRedis('reconcile');
beforeAll(async () => {
  redis = testRedis();
});

/** The lifecycle's ends as the reconciliation reports them; `failing` Runs fail their report (Redis unreachable). */
function recorder(failing: Set<string>): { ends: Map<string, TurnResult>; lifecycle: Pick<RunLifecycle, 'succeeded' | 'failed'> } {
  const ends = new Map<string, TurnResult>();
  return {
    ends,
    lifecycle: {
      succeeded: async (_sessionId, runId, _leaseId, result) => {
        if (failing.has(runId)) throw new Error('Connection is closed.');
        ends.set(runId, result);
      },
      failed: async () => undefined,
    },
  };
}

describe('the reconciliation of completed jobs', () => {
  it('replays the turn end the job carries (waits as mapped, a grader\'s report); a replay that fails keeps its job for the next scan without holding back the others', async () => {
    const queues = new RunQueues(redis, DEFAULT_LEASE_CONFIG);
    const worker = new Worker<RunJobData>(RUN_QUEUE, null, { connection: redis.duplicate({ maxRetriesPerRequest: null }), prefix: queuePrefix(POOL), autorun: false });
    try {
      /** A Run's job completed in BullMQ only, as if the process that completed it died right after. */
      const completed = async (runId: string, result: Record<string, unknown>): Promise<void> => {
        await queues.enqueue({ run_id: runId, session_id: SESSION, thread_id: 'sthr_r', workspace_id: 'wrkspc_r', pool_id: POOL, requirements: {} as RunRequirements, accepted_at_ms: Date.now() });
        const token = randomUUID();
        const job = (await worker.getNextJob(token, { block: false })) as Job<RunJobData> | undefined;
        if (!job) throw new Error('no job to take');
        await job.moveToCompleted(result, token, false);
      };
      const grader = { input: { system: 'grade it', messages: [] }, output: '{"result":"satisfied"}', usage: { input_tokens: 3 } };
      const waits = [{ tool_use_id: 'toolu_1', kind: 'approval' }];
      await completed('run_grader', { stop_reason: { type: 'requires_action' }, waits, grader });
      await completed('run_plain', { stop_reason: { type: 'end_turn' } });

      const down = recorder(new Set(['run_grader']));
      expect(await reconcilePool(POOL, queues, down.lifecycle, log, Date.now() + 60_000)).toBe(1);
      expect(down.ends.get('run_plain')).toEqual({ stop_reason: { type: 'end_turn' } });
      expect(await queues.job(POOL, 'run_plain')).toBeUndefined();
      // Its end not recorded: the job stays for the next scan.
      expect(await (await queues.job(POOL, 'run_grader'))?.getState()).toBe('completed');

      const up = recorder(new Set());
      expect(await reconcilePool(POOL, queues, up.lifecycle, log, Date.now() + 60_000)).toBe(1);
      expect(up.ends.get('run_grader')).toEqual({ stop_reason: { type: 'requires_action' }, waits, grader });
      expect(await queues.job(POOL, 'run_grader')).toBeUndefined();
    } finally {
      await worker.close();
      await queues.close();
    }
  });
});

describe('the replay of stalls', () => {
  it('records each stalled Run once; one whose record fails is tried again at the next scan, the others not held back', async () => {
    const pool = 'rpool_stalls';
    const queues = new RunQueues(redis, DEFAULT_LEASE_CONFIG);
    // As BullMQ's stalled check writes them, in the script that moves the job back.
    const events = `${queuePrefix(pool)}:${RUN_QUEUE}:events`;
    await redis.xadd(events, '*', 'event', 'stalled', 'jobId', 'run_a');
    await redis.xadd(events, '*', 'event', 'waiting', 'jobId', 'run_a');
    await redis.xadd(events, '*', 'event', 'stalled', 'jobId', 'run_b');
    const recorded: string[] = [];
    let failing = true;
    const stalled = async (runId: string): Promise<void> => {
      if (runId === 'run_a' && failing) throw new Error('the append reached 0 of 1 replicas in time');
      recorded.push(runId);
    };
    const first = await repairStalls(pool, queues, stalled, STALLS_FROM_START, log);
    expect(recorded).toEqual(['run_b']);
    expect([...first.retry]).toEqual(['run_a']);
    // Still failing: kept, nothing else replayed.
    const second = await repairStalls(pool, queues, stalled, first, log);
    expect([recorded, [...second.retry], second.at]).toEqual([['run_b'], ['run_a'], first.at]);
    failing = false;
    const third = await repairStalls(pool, queues, stalled, second, log);
    expect([recorded, [...third.retry]]).toEqual([['run_b', 'run_a'], []]);
    await redis.xadd(events, '*', 'event', 'stalled', 'jobId', 'run_c');
    await repairStalls(pool, queues, stalled, third, log);
    expect(recorded).toEqual(['run_b', 'run_a', 'run_c']);
    await queues.close();
  });
});
