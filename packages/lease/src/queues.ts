import { Job, Queue, type JobsOptions } from 'bullmq';
import { ATTR, injectTrace, inSpan, SpanKind, type Context, type TraceCarrier } from '@agentplane/core';
import { BoundedCache, isCluster, LuaScript, type Redis } from '@agentplane/store';
import type { LeaseConfig } from './config.js';
import type { RunRequirements } from './requirements.js';

/** BullMQ queue of one runner pool. Its prefix carries a hash tag: every key of the queue is in one slot. */
export const queuePrefix = (poolId: string): string => `ap:{q:${poolId}}`;
export const RUN_QUEUE = 'runs';

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
  /** The fair-share rank the job was added at; absent for a job sent behind its start (`RunQueues.sendBehind`), ranked later. */
  rank?: number;
  /** W3C context of the enqueuing span (tracing on only): the scheduler's span continues the trace. */
  trace?: TraceCarrier;
}

/** A Run's job as its producer gives it: the queue adds its rank, enqueue time and trace context. */
export type NewRunJob = Omit<RunJobData, 'rank' | 'enqueued_at_ms' | 'trace'>;

/**
 * Fair share across workspaces, first in, first out within each: a Run's BullMQ priority is its
 * **rank**, the round it is served in. Every workspace's next Run is in the current round (the
 * rank of the Run last leased), and each later one of the same workspace in the round after the
 * one before it; BullMQ serves the lowest rank first and equal ranks in the order they came. So
 * the pool serves its busy workspaces in turn (one workspace's backlog of 10,000 delays another's
 * single Run by at most one dispatch per other busy workspace), and a workspace's own Runs never
 * overtake each other. When no Run of the pool is ranked and not yet leased, the rounds start
 * over at 1; a backlog that never drains for over two million rounds has its later Runs share the
 * last rank (first in, first out across workspaces too) until it does.
 *
 * Keys, all in the pool queue's hash tag: `fair:<ws>`, a workspace's ranked Runs not yet leased
 * (score: the rank); `fair_taken:<ws>`, when each was ranked (for the prune); `fair_round`, the
 * current round; `fair_ws`, the workspaces with ranked Runs not yet leased.
 */
const fairKeys = (poolId: string, workspaceId: string): string[] => {
  const p = queuePrefix(poolId);
  return [`${p}:fair:${workspaceId}`, `${p}:fair_taken:${workspaceId}`, `${p}:fair_round`, `${p}:fair_ws`];
};

/**
 * Lua, KEYS as fairKeys: a workspace left with no ranked Run drops its times and leaves the busy
 * workspaces (`ws`: the ARGV holding its id); the last one to leave ends the pool's rounds.
 */
const LEFT_EMPTY = (ws: string): string => `if redis.call('ZCARD', KEYS[1]) == 0 then
  redis.call('DEL', KEYS[2])
  redis.call('SREM', KEYS[4], ${ws})
  if redis.call('SCARD', KEYS[4]) == 0 then redis.call('DEL', KEYS[3]) end
end`;

/**
 * A Run's rank (its own if it has one). KEYS: fairKeys; ARGV[1]: the Run, ARGV[2]: now (ms),
 * ARGV[3]: the highest rank, ARGV[4]: the workspace. The workspace's last rank is the highest
 * score not above ARGV[3] (a set written by an earlier version scored its Runs by time).
 */
const RANK = new LuaScript(
  'fair_rank',
  `local held = redis.call('ZSCORE', KEYS[1], ARGV[1])
if held then return tonumber(held) end
local max = tonumber(ARGV[3])
local rank = tonumber(redis.call('GET', KEYS[3]) or '0')
local last = redis.call('ZREVRANGEBYSCORE', KEYS[1], max, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)[2]
if last then rank = math.max(rank, tonumber(last) + 1) end
if rank < 1 then rank = 1 elseif rank > max then rank = max end
redis.call('ZADD', KEYS[1], rank, ARGV[1])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
redis.call('SADD', KEYS[4], ARGV[4])
return rank`,
);

/**
 * A Run leaves its workspace's ranks. KEYS: fairKeys; ARGV[1]: the Run, ARGV[2]: the workspace,
 * ARGV[3]: '1' when it was leased (the current round moves up to its rank), ARGV[4]: the highest
 * rank. The last ranked Run of the pool to go ends the rounds.
 */
const UNRANK = new LuaScript(
  'fair_unrank',
  `local r = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not r then return 0 end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
r = tonumber(r)
if ARGV[3] == '1' and r <= tonumber(ARGV[4]) and r > tonumber(redis.call('GET', KEYS[3]) or '0') then redis.call('SET', KEYS[3], r) end
${LEFT_EMPTY('ARGV[2]')}
return 1`,
);

/*
 * Ranks whose Run never got a job: of the workspace's lowest ARGV[3] ranks (where such ranks end
 * up as the rounds pass them), those taken before ARGV[1] (ms; a rank with no time recorded
 * counts as old) without a job hash are removed. KEYS: fairKeys; ARGV[2]: the job key prefix
 * (`<queue prefix>:runs:`, the same hash tag); ARGV[4]: the workspace. Returns how many went.
 */
const PRUNE_RANKS = new LuaScript(
  'fair_prune',
  `local gone = 0
for _, id in ipairs(redis.call('ZRANGE', KEYS[1], 0, tonumber(ARGV[3]) - 1)) do
  if tonumber(redis.call('HGET', KEYS[2], id) or '0') < tonumber(ARGV[1]) and redis.call('EXISTS', ARGV[2] .. id) == 0 then
    redis.call('ZREM', KEYS[1], id)
    redis.call('HDEL', KEYS[2], id)
    gone = gone + 1
  end
end
if gone > 0 then
${LEFT_EMPTY('ARGV[4]')}
end
return gone`,
);

/** The pool's queue on `connection`, made once per `made`. */
function poolQueue(made: Map<string, Queue>, connection: Redis, poolId: string): Queue {
  let q = made.get(poolId);
  if (!q) {
    q = new Queue(RUN_QUEUE, { connection, prefix: queuePrefix(poolId) });
    // A Queue re-emits its connection's errors, which the connection's owner logs; unheard, BullMQ
    // prints each to stderr raw (hundreds of lines a second while Redis is away).
    q.on('error', () => undefined);
    made.set(poolId, q);
  }
  return q;
}

/** A rank as a BullMQ priority (1 is served first; ranks past the highest share it). */
const priorityOf = (rank: number): number => Math.min(Math.max(1, rank), MAX_PRIORITY);

/** A Run's job sent in a PRODUCER span (`trace`: its parent); `send` gets the span's context, which the job carries. */
function sent<T>(data: Pick<RunJobData, 'run_id' | 'pool_id'>, trace: Context | undefined, send: (ctx: Context) => Promise<T>): Promise<T> {
  return inSpan(`send ${RUN_QUEUE}`, {
    kind: SpanKind.PRODUCER,
    attributes: {
      [ATTR.messagingSystem]: 'bullmq', [ATTR.messagingOperationType]: 'send', [ATTR.messagingOperationName]: 'send',
      [ATTR.messagingDestinationName]: RUN_QUEUE, [ATTR.messagingMessageId]: data.run_id, 'agentplane.pool.id': data.pool_id,
    },
    parent: trace,
  }, (_span, ctx) => send(ctx));
}

/** Where a Run's job is (`RunQueues.jobPlace`). */
export type JobPlace = 'queued' | 'active' | 'finished' | 'absent';

async function placeOf(job: Job<RunJobData>): Promise<JobPlace> {
  const state = await job.getState();
  if (state === 'active') return 'active';
  if (state === 'completed' || state === 'failed') return 'finished';
  return state === 'unknown' ? 'absent' : 'queued';
}

export class RunQueues {
  private readonly queues = new Map<string, Queue>();
  /** The pools' queues on `commands`, for jobs sent behind a write of that connection (`sendBehind`). */
  private readonly behindQueues = new Map<string, Queue>();
  /**
   * Jobs this process added, by pool and Run, for a minute: the acceptance of a Run's first
   * lease (usually through the API that queued it) takes the job from here instead of reading it
   * back. A job as added is what a first attempt needs: its id and options, no attempt made.
   */
  private readonly added = new BoundedCache<string, Job<RunJobData>>(4096, { maxAgeMs: 60_000 });

  /**
   * `connection` carries BullMQ's queues (it never gives up on a command). The fair-share set
   * and the reads of the queue's keys go on `commands` when given: a request-path connection
   * whose commands of a turn share one write (every platform connection's do), so a rank taken
   * beside an append, or a dequeue beside a lease's other writes, shares their socket write.
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
    return poolQueue(this.queues, this.connection, poolId);
  }

  /**
   * The Run's fair-share rank in its pool (taking it if it has none yet; idempotent). Taken
   * ahead of the enqueue (`enqueue(data, rank)`) it saves a round trip; a rank whose Run never
   * gets a job is removed by `pruneRanks`.
   */
  async rank(poolId: string, workspaceId: string, runId: string): Promise<number> {
    return Number(await RANK.run(this.commands, fairKeys(poolId, workspaceId), [runId, Date.now(), MAX_PRIORITY, workspaceId]));
  }

  /** Remove ranks taken before `before` (ms) whose Run has no job (its turn never started, or its job is gone). */
  async pruneRanks(poolId: string, workspaceId: string, before: number, limit = 500): Promise<number> {
    return Number(await PRUNE_RANKS.run(this.commands, fairKeys(poolId, workspaceId), [before, `${queuePrefix(poolId)}:${RUN_QUEUE}:`, limit, workspaceId]));
  }

  /** `rank`: taken ahead with `rank()` (else taken here first). `trace`: the context the Run is queued in (the send span's parent). */
  async enqueue(data: NewRunJob, rank?: number, trace?: Context): Promise<RunJobData> {
    return sent(data, trace, (ctx) => this.add(data, rank, ctx));
  }

  private async add(data: NewRunJob, ranked: number | undefined, ctx: Context): Promise<RunJobData> {
    const rank = ranked ?? (await this.rank(data.pool_id, data.workspace_id, data.run_id));
    const full = this.jobData(data, rank, ctx);
    this.added.set(`${data.pool_id}/${data.run_id}`, await this.queue(data.pool_id).add('run', full, this.jobOptions(data.run_id, rank)));
    return full;
  }

  private jobData(data: NewRunJob, rank: number | undefined, ctx: Context): RunJobData {
    // The job carries the send span's context: the scheduler's span for it is its child.
    const trace = injectTrace(ctx);
    return { ...data, ...(rank !== undefined ? { rank } : {}), enqueued_at_ms: Date.now(), ...(trace ? { trace } : {}) };
  }

  private jobOptions(runId: string, rank: number): JobsOptions {
    return {
      jobId: runId,
      priority: priorityOf(rank),
      attempts: this.config.maxAttempts,
      backoff: { type: 'exponential', delay: this.config.backoffMs },
      removeOnComplete: { age: 24 * 3600 },
      removeOnFail: { age: 7 * 24 * 3600 },
    };
  }

  /**
   * True when a job sent with `sendBehind` goes out on `redis` after every command issued on it
   * before: `redis` is the connection this instance sends its commands on, to a single Redis
   * (which runs one connection's commands in the order sent; a Cluster splits them by slot).
   */
  sendsBehind(redis: Redis): boolean {
    return this.commands === redis && !isCluster(redis);
  }

  /**
   * A Run's job, sent on the commands connection behind the write that starts the Run, before
   * that write is answered: one round trip fewer before a scheduler can take it. Call it right
   * after issuing the start on that connection (`sendsBehind`): Redis runs the add after the
   * start, so the job never exists before its Run does. Its fair-share rank, taken beside the
   * start, is not known yet: the job goes in at the lowest priority, where it overtakes no one
   * (a Run taken there was next anyway), until `ranked` moves it to its rank. A start that did
   * not commit leaves a job for no Run: `withdraw` removes it, and a scheduler that took it first
   * finds no Run and drops it. Resolves once the job is added.
   */
  sendBehind(data: NewRunJob, trace?: Context): Promise<Job<RunJobData>> {
    return sent(data, trace, (ctx) => this.behindQueue(data.pool_id).add('run', this.jobData(data, undefined, ctx), this.jobOptions(data.run_id, MAX_PRIORITY)));
  }

  /**
   * A job sent behind its start (`sendBehind`), once the start committed, gets its fair-share
   * rank (nothing to move once a scheduler took it: its priority only orders the queue; nor once
   * it is gone), and may be taken by its first attempt's acceptance here (`firstAttemptJob`).
   */
  async ranked(job: Job<RunJobData>, rank: number): Promise<void> {
    this.added.set(`${job.data.pool_id}/${job.data.run_id}`, job);
    const priority = priorityOf(rank);
    if (priority === MAX_PRIORITY) return;
    await job.changePriority({ priority }).catch(() => undefined);
  }

  /** The job sent behind a start that did not commit goes (unless a scheduler holds it: it finds no Run and drops it). */
  async withdraw(poolId: string, runId: string): Promise<void> {
    await this.behindQueue(poolId).remove(runId).catch(() => undefined);
  }

  private behindQueue(poolId: string): Queue {
    return poolQueue(this.behindQueues, this.commands, poolId);
  }

  /**
   * The Run left the queue for good (leased, removed, unservable, exhausted); idempotent.
   * `leased`: it left because a runner took it, so its round is the pool's current one.
   */
  async dequeued(poolId: string, workspaceId: string, runId: string, options: { leased?: boolean } = {}): Promise<void> {
    await UNRANK.run(this.commands, fairKeys(poolId, workspaceId), [runId, workspaceId, options.leased ? '1' : '0', MAX_PRIORITY]);
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
   * Where a Run's job is: `queued` (waiting its turn: removable), `active` (a scheduler holds it,
   * placing it or leased), `finished` (completed or failed), `absent` (no such job).
   */
  async jobPlace(poolId: string, runId: string): Promise<JobPlace> {
    const job = await this.job(poolId, runId);
    return job ? placeOf(job) : 'absent';
  }

  /**
   * Removes a Run's job that is not taken: `canceled` when it was removed; `active` when a
   * scheduler holds it (placing it, or leased); `finished` when it completed or failed; `absent`
   * when there is no such job.
   */
  async cancelQueued(poolId: string, runId: string): Promise<'canceled' | 'active' | 'finished' | 'absent'> {
    const job = await this.job(poolId, runId);
    if (!job) return 'absent';
    const state = await placeOf(job);
    if (state !== 'queued') return state;
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
    await Promise.all([...this.queues.values(), ...this.behindQueues.values()].map((q) => q.close()));
  }
}
