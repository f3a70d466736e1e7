import { Job, Queue, type JobsOptions } from 'bullmq';
import { ATTR, injectTrace, inSpan, SpanKind, type Context, type TraceCarrier } from '@agentplane/core';
import { BoundedCache, LuaScript, type Redis } from '@agentplane/store';
import type { LeaseConfig } from './config.js';
import type { RunRequirements } from './requirements.js';

/** BullMQ queue of one runner pool. Its prefix carries a hash tag: every key of the queue is in one slot. */
export const queuePrefix = (poolId: string): string => `ap:{q:${poolId}}`;
export const RUN_QUEUE = 'runs';
const fairKey = (poolId: string, workspaceId: string): string => `${queuePrefix(poolId)}:fair:${workspaceId}`;

/** BullMQ's highest usable priority number (lower runs first). */
const MAX_PRIORITY = 2_097_151;

/** What a Run job carries: enough to place it and to find its Session. */
export interface RunJobData {
  run_id: string;
  session_id: string;
  thread_id: string;
  workspace_id: string;
  pool_id: string;
  requirements: RunRequirements;
  /** Wall-clock ms when the Run was accepted by the API. */
  accepted_at_ms: number;
  enqueued_at_ms: number;
  rank: number;
  /** W3C context of the enqueuing span (tracing on only): the scheduler's span continues the trace. */
  trace?: TraceCarrier;
}

/**
 * Fair share across workspaces: a Run's priority is its rank among its workspace's queued
 * Runs in the pool (1 = next of that workspace), kept as a sorted set per workspace. Equal ranks run FIFO, so the pool serves
 * workspaces round-robin: one workspace's backlog of 10,000 delays another's single Run by at
 * most one dispatch per other active workspace.
 */
const RANK = new LuaScript(
  'fair_rank',
  `redis.call('ZADD', KEYS[1], 'NX', ARGV[2], ARGV[1])
return redis.call('ZCARD', KEYS[1])`,
);

/*
 * Ranks whose Run never got a job: members scored before ARGV[1] (ms) without a job hash are
 * removed, at most ARGV[3] looked at. KEYS[1]: the fair set; ARGV[2]: the job key prefix
 * (`<queue prefix>:runs:`, the same hash tag). Returns how many were removed.
 */
const PRUNE_RANKS = new LuaScript(
  'fair_prune',
  `local gone = 0
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))) do
  if redis.call('EXISTS', ARGV[2] .. id) == 0 then
    redis.call('ZREM', KEYS[1], id)
    gone = gone + 1
  end
end
return gone`,
);

export class RunQueues {
  private readonly queues = new Map<string, Queue>();
  /**
   * Jobs this process added, by pool and Run, for a minute: the acceptance of a Run's first
   * lease (usually through the API that queued it) takes the job from here instead of reading it
   * back. A job as added is what a first attempt needs: its id and options, no attempt made.
   */
  private readonly added = new BoundedCache<string, Job<RunJobData>>(4096, { maxAgeMs: 60_000 });

  /**
   * `connection` carries BullMQ's queues (it never gives up on a command). The fair-share set
   * and the reads of the queue's keys go on `commands` when given: a request-path connection
   * that auto-pipelines, so a rank taken beside an append, or a dequeue beside a lease's other
   * writes, shares their socket write instead of making its own.
   */
  private readonly commands: Redis;

  constructor(
    private readonly connection: Redis,
    readonly config: LeaseConfig,
    commands?: Redis,
  ) {
    this.commands = commands ?? connection;
  }

  queue(poolId: string): Queue {
    let q = this.queues.get(poolId);
    if (!q) {
      q = new Queue(RUN_QUEUE, { connection: this.connection, prefix: queuePrefix(poolId) });
      this.queues.set(poolId, q);
    }
    return q;
  }

  /**
   * The Run's fair-share rank in its pool (taking it if it has none yet; idempotent). Taken
   * ahead of the enqueue (`enqueue(data, rank)`) it saves a round trip; a rank whose Run never
   * gets a job is removed by `pruneRanks`.
   */
  async rank(poolId: string, workspaceId: string, runId: string): Promise<number> {
    return Number(await RANK.run(this.commands, [fairKey(poolId, workspaceId)], [runId, Date.now()]));
  }

  /** Remove ranks taken before `before` (ms) whose Run has no job (its turn never started, or its job is gone). */
  async pruneRanks(poolId: string, workspaceId: string, before: number, limit = 500): Promise<number> {
    return Number(await PRUNE_RANKS.run(this.commands, [fairKey(poolId, workspaceId)], [before, `${queuePrefix(poolId)}:${RUN_QUEUE}:`, limit]));
  }

  /** `rank`: taken ahead with `rank()` (else taken here first). `trace`: the context the Run is queued in (the send span's parent). */
  async enqueue(data: Omit<RunJobData, 'rank' | 'enqueued_at_ms' | 'trace'>, rank?: number, trace?: Context): Promise<RunJobData> {
    return inSpan(`send ${RUN_QUEUE}`, {
      kind: SpanKind.PRODUCER,
      attributes: {
        [ATTR.messagingSystem]: 'bullmq', [ATTR.messagingOperationType]: 'send', [ATTR.messagingOperationName]: 'send',
        [ATTR.messagingDestinationName]: RUN_QUEUE, [ATTR.messagingMessageId]: data.run_id, 'agentplane.pool.id': data.pool_id,
      },
      parent: trace,
    }, (_span, ctx) => this.add(data, rank, ctx));
  }

  private async add(data: Omit<RunJobData, 'rank' | 'enqueued_at_ms' | 'trace'>, ranked: number | undefined, ctx: Context): Promise<RunJobData> {
    // The job carries the send span's context: the scheduler's span for it is its child.
    const trace = injectTrace(ctx);
    const rank = ranked ?? (await this.rank(data.pool_id, data.workspace_id, data.run_id));
    const full: RunJobData = { ...data, rank, enqueued_at_ms: Date.now(), ...(trace ? { trace } : {}) };
    const opts: JobsOptions = {
      jobId: data.run_id,
      priority: Math.min(Math.max(1, rank), MAX_PRIORITY),
      attempts: this.config.maxAttempts,
      backoff: { type: 'exponential', delay: this.config.backoffMs },
      removeOnComplete: { age: 24 * 3600 },
      removeOnFail: { age: 7 * 24 * 3600 },
    };
    this.added.set(`${data.pool_id}/${data.run_id}`, await this.queue(data.pool_id).add('run', full, opts));
    return full;
  }

  /** The Run left the queue for good (leased, removed, unservable, exhausted); idempotent. */
  async dequeued(poolId: string, workspaceId: string, runId: string): Promise<void> {
    await this.commands.zrem(fairKey(poolId, workspaceId), runId);
  }

  /**
   * The job of a Run's first attempt as this process added it (see `added`), once; undefined
   * when this process did not add it lately. Never for a later attempt: its counters moved.
   */
  firstAttemptJob(poolId: string, runId: string): Job<RunJobData> | undefined {
    return this.added.take(`${poolId}/${runId}`);
  }

  async job(poolId: string, runId: string): Promise<Job<RunJobData> | undefined> {
    return (await Job.fromId<RunJobData>(this.queue(poolId), runId)) ?? undefined;
  }

  /**
   * Jobs that finished (`completed` or `failed`) before `before` (ms), oldest first: BullMQ
   * scores its finished sets by finish time, so younger ones are not even read.
   */
  async finishedBefore(poolId: string, state: 'completed' | 'failed', before: number, limit = 100): Promise<Job<RunJobData>[]> {
    const q = this.queue(poolId);
    const ids = await this.commands.zrangebyscore(q.toKey(state), '-inf', before, 'LIMIT', 0, limit);
    const jobs = await Promise.all(ids.map((id) => Job.fromId<RunJobData>(q, id)));
    return jobs.filter((j): j is Job<RunJobData> => !!j?.data);
  }

  /** Remove a finished Run's job once its end is recorded on the Run (no lock holds it then). */
  async removeFinished(poolId: string, runId: string): Promise<void> {
    await this.queue(poolId).remove(runId);
  }

  /**
   * Removes a Run's job that is not taken: `canceled` when it was removed; `active` when a
   * scheduler holds it (placing it, or leased); `finished` when it completed or failed; `absent`
   * when there is no such job.
   */
  async cancelQueued(poolId: string, runId: string): Promise<'canceled' | 'active' | 'finished' | 'absent'> {
    const job = await this.job(poolId, runId);
    if (!job) return 'absent';
    const state = await job.getState();
    if (state === 'active') return 'active';
    if (state === 'completed' || state === 'failed') return 'finished';
    try {
      await job.remove();
    } catch {
      // Taken between the read and the remove (a lock now holds it).
      return 'active';
    }
    await this.dequeued(poolId, job.data.workspace_id, runId);
    return 'canceled';
  }

  /**
   * Runs BullMQ's stalled check moved back to wait (a lost lock), read from the queue's event
   * stream after `cursor` (a stream id, `-` for everything kept). The check appends that record
   * in the same script that moves the job, so it survives the process that ran the check.
   */
  async stalledAfter(poolId: string, cursor: string, count = 1000): Promise<{ runIds: string[]; cursor: string; more: boolean }> {
    const entries = await this.commands.xrange(this.queue(poolId).toKey('events'), cursor === '-' ? '-' : `(${cursor}`, '+', 'COUNT', count);
    const runIds = new Set<string>();
    for (const [, fields] of entries) {
      const f = new Map<string, string>();
      for (let i = 0; i + 1 < fields.length; i += 2) f.set(fields[i] as string, fields[i + 1] as string);
      const id = f.get('jobId');
      if (f.get('event') === 'stalled' && id) runIds.add(id);
    }
    return { runIds: [...runIds], cursor: entries.at(-1)?.[0] ?? cursor, more: entries.length === count };
  }

  async depth(poolId: string): Promise<Record<string, number>> {
    return this.queue(poolId).getJobCounts('wait', 'prioritized', 'delayed', 'active', 'failed', 'completed');
  }

  pools(): string[] {
    return [...this.queues.keys()];
  }

  async close(): Promise<void> {
    await Promise.all([...this.queues.values()].map((q) => q.close()));
  }
}
