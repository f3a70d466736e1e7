import { crashPoint, newId, nowIso, type Context, type Logger } from '@agentplane/core';
import { cancelOnRunner } from '@agentplane/gateway';
import { CancelMarks, DEFAULT_LEASE_CONFIG, LeaseFence, markPoolActive, poolMarkRefreshMs, type NewRunJob, type RunQueues, type RunRequirements } from '@agentplane/lease';
import { BoundedCache, isCluster, type Redis } from '@agentplane/store';
import type { VersionedStore } from '../versioned.js';
import type { Environment } from '../environments/model.js';
import { sandboxProfileStore, sandboxVersion, type SandboxProfile } from '../deployments/profiles.js';
import type { RunnerService } from '../runners/service.js';
import type { RunDoc, SessionDoc } from '../sessions/model.js';
import type { SessionStore } from '../sessions/store.js';
import { continuable, type JobBehind, type TurnScheduler } from '../sessions/turns.js';
import { withEnqueue, type RunLifecycle } from './lifecycle.js';
import { requirementsOf } from './spec.js';
import { runSessionsKey } from './keys.js';
import { EnqueueOutbox } from './outbox.js';

export interface RunEngineDeps {
  redis: Redis;
  queues: RunQueues;
  lifecycle: RunLifecycle;
  store: SessionStore;
  environments: VersionedStore<Environment>;
  runners: RunnerService;
  log: Logger;
  /** How long a running Run gets to stop after user.interrupt before it is cancelled outright. */
  interruptGraceMs: number;
  /** `LeaseConfig.poolIdleMs` of the schedulers (the pools' marks are refreshed from it). */
  poolIdleMs?: number;
}

/** A fair-share rank taken for a Run ahead of its enqueue (`RunEngine.runStarting`). */
interface TakenRank {
  poolId: string;
  workspaceId: string;
  rank: Promise<number>;
}

const INTERRUPTED_QUEUED = 'interrupted while queued';

/** A Run's job as its pool's queue holds it. */
function jobOf(run: RunDoc, poolId: string, requirements: RunRequirements): NewRunJob {
  return {
    run_id: run.id, session_id: run.session_id, thread_id: run.session_thread_id, workspace_id: run.workspace_id, pool_id: poolId, requirements,
    accepted_at_ms: Date.parse(run.created_at),
  };
}

/** The requirements cache's key: Environment versions are immutable. */
const requirementsKey = (run: RunDoc): string => `${run.workspace_id}/${run.environment_id}/${run.environment_version}`;

/** Per-process caches of lookups that never change once they exist. */
const CACHE_ENTRIES = 4096;
/**
 * The API's side of scheduling (the `TurnScheduler` the Sessions module calls): a queued Run
 * becomes a BullMQ job in its pool's queue; an interrupt removes a queued Run or cancels the
 * leased one on its runner; answered waits continue the turn in a new Run.
 */
export class RunEngine implements TurnScheduler {
  private readonly fence: LeaseFence;
  private readonly cancels: CancelMarks;
  private readonly outbox: EnqueueOutbox;
  private readonly sandboxProfiles: VersionedStore<SandboxProfile>;
  /** `<ws>/<env>/<version>` → requirements: Environment versions are immutable. */
  private readonly requirements = new BoundedCache<string, RunRequirements>(CACHE_ENTRIES);
  /** Workspace → its default pool id: claimed once (HSETNX) and never reassigned. */
  private readonly defaultPools = new BoundedCache<string, string>(CACHE_ENTRIES);
  /** Fair-share ranks taken beside a turn start's intent (`runStarting`), by Run id, until its enqueue. */
  private readonly ranks = new BoundedCache<string, TakenRank>(CACHE_ENTRIES, { maxAgeMs: 60_000 });
  /** Pool id → the Workspace this process marked it active for, lately. */
  private readonly markedPools: BoundedCache<string, string>;
  private readonly poolIdleMs: number;

  constructor(private readonly d: RunEngineDeps) {
    this.poolIdleMs = d.poolIdleMs ?? DEFAULT_LEASE_CONFIG.poolIdleMs;
    // A pool's mark says a Run was queued in it lately: written once, then again only this often
    // (not once per Run), always well inside the time after which a scheduler lets an idle pool go.
    this.markedPools = new BoundedCache<string, string>(CACHE_ENTRIES, { maxAgeMs: poolMarkRefreshMs(this.poolIdleMs) });
    this.fence = new LeaseFence(d.redis);
    this.cancels = new CancelMarks(d.redis);
    this.outbox = new EnqueueOutbox(d.redis);
    this.sandboxProfiles = sandboxProfileStore(d.redis);
  }

  /**
   * With the Session at hand, the Run's fair-share rank is taken beside the intent, so the job
   * is added right after the commit (one round trip fewer before the scheduler can take it).
   */
  runStarting(sessionId: string, runId: string, session?: Pick<SessionDoc, 'workspace_id' | 'agent_deployment'>): Promise<void> {
    if (session) {
      const pinned = session.agent_deployment?.runner_pool_id ?? null;
      const ws = session.workspace_id;
      const poolId = pinned ?? this.defaultPools.get(ws);
      // Only when the pool is known without a read (the read would cost the round trip saved).
      if (poolId) {
        const rank = this.d.queues.rank(poolId, ws, runId);
        rank.catch(() => undefined);
        this.ranks.set(runId, { poolId, workspaceId: ws, rank });
      }
    }
    return this.outbox.add(sessionId, runId);
  }

  /**
   * The intent's record (the outbox entry) and the Session's writes share one connection when the
   * engine and the Session store were given the same client, and a single Redis runs a
   * connection's commands in the order sent: a start sent after the record cannot land without it.
   * Not so on a Cluster (the outbox and the Session live on different nodes).
   */
  get intentAhead(): boolean {
    return this.d.redis === this.d.store.redis && !isCluster(this.d.redis);
  }

  /** The start announced under `runId` did not happen: its rank goes at once (its intent is dropped by the repair). */
  runNotStarting(runId: string, taken = this.ranks.take(runId)): void {
    if (!taken) return;
    void taken.rank.then(() => this.d.queues.dequeued(taken.poolId, taken.workspaceId, runId)).catch(() => undefined);
  }

  /**
   * The Run's job right behind its start (`TurnScheduler.sendBehind`), on the connection the
   * start went out on: only when that is the connection the queues send on, to a single Redis,
   * and the job is known without a read (its pool and requirements cached, its rank taken beside
   * the intent). The start writes the Run with its enqueue recorded (the job is added right
   * behind that write), so no move of the Run follows. The Run-to-Session mapping and the pool's
   * active mark go just ahead of the job.
   */
  sendBehind(run: RunDoc, trace?: Context): JobBehind | undefined {
    if (!this.intentAhead || !this.d.queues.sendsBehind(this.d.store.redis)) return undefined;
    const ws = run.workspace_id;
    const poolId = run.agent_deployment?.runner_pool_id ?? this.defaultPools.get(ws);
    const requirements = this.requirements.get(requirementsKey(run));
    const taken = this.ranks.get(run.id);
    if (!poolId || !requirements || !taken || taken.poolId !== poolId || taken.workspaceId !== ws) return undefined;
    this.ranks.take(run.id);
    return { run: withEnqueue(run, poolId, nowIso()), send: () => this.sendJobBehind(run, requirements, taken, trace) };
  }

  private sendJobBehind(run: RunDoc, requirements: RunRequirements, taken: TakenRank, trace?: Context): (committed: RunDoc | null) => Promise<void> {
    const { poolId, workspaceId: ws } = taken;
    const ahead = this.findable(run, poolId);
    const added = this.d.queues.sendBehind(jobOf(run, poolId, requirements), trace);
    ahead.catch(() => undefined);
    added.catch(() => undefined);
    return async (committed) => {
      if (!committed) {
        this.runNotStarting(run.id, taken);
        await this.d.queues.withdraw(poolId, run.id);
        return;
      }
      // The Run as written is the guess of its next move (the acceptance), as an enqueue move's would be.
      this.d.lifecycle.written(committed);
      try {
        const [job] = await Promise.all([added, ahead]);
        const rank = await taken.rank.catch(() => this.d.queues.rank(poolId, ws, run.id));
        await Promise.all([this.d.queues.ranked(job, rank), this.outbox.remove(run.session_id, run.id)]);
      } catch (err) {
        // Queued again the usual way (the job id is the Run's: an add that did land is kept);
        // should that fail too, the start's outbox entry stays for the enqueue repair.
        this.d.log.warn({ err: err instanceof Error ? err.message : String(err), run: run.id }, 'the job sent behind a started Run was not confirmed; enqueuing it again');
        await this.runQueued(committed, trace).catch(() => undefined);
      }
    };
  }

  private async requirementsOf(run: RunDoc): Promise<RunRequirements> {
    const key = requirementsKey(run);
    const hit = this.requirements.get(key);
    if (hit) return hit;
    const req = requirementsOf(await sandboxVersion({ environments: this.d.environments, sandboxProfiles: this.sandboxProfiles }, run.workspace_id, run.environment_id, run.environment_version));
    this.requirements.set(key, req);
    return req;
  }

  private async defaultPoolId(workspaceId: string): Promise<string> {
    const hit = this.defaultPools.get(workspaceId);
    if (hit) return hit;
    const id = (await this.d.runners.defaultPool(workspaceId)).id;
    this.defaultPools.set(workspaceId, id);
    return id;
  }

  /**
   * The Run (as just written) becomes a job of its pool. The Run-to-Session mapping and the
   * pool's active mark go out with the fair-share rank (they only make an existing Run findable
   * and its pool watched, so they may precede the job); the Run records its pool and
   * `enqueued_at` once the job exists.
   */
  async runQueued(run: RunDoc, trace?: Context): Promise<void> {
    try {
      await this.enqueue(run, trace);
    } catch (err) {
      // The turn start's outbox entry stays: the scheduler's repair enqueues the Run.
      this.d.log.warn({ err: err instanceof Error ? err.message : String(err), run: run.id }, 'enqueuing a started Run failed; the enqueue repair takes it');
      throw err;
    }
  }

  private async enqueue(run: RunDoc, trace?: Context): Promise<void> {
    // A Run under a deployment revision goes to the pool the revision names; others to the default pool.
    const pinned = run.agent_deployment?.runner_pool_id ?? null;
    const [requirements, poolId] = await Promise.all([this.requirementsOf(run), pinned ?? this.defaultPoolId(run.workspace_id)]);
    const taken = this.ranks.take(run.id);
    const mine = taken !== undefined && taken.poolId === poolId && taken.workspaceId === run.workspace_id;
    if (taken && !mine) this.runNotStarting(run.id, taken);
    const rank = mine ? await taken.rank.catch(() => undefined) : undefined;
    await Promise.all([this.d.queues.enqueue(jobOf(run, poolId, requirements), rank, trace), this.findable(run, poolId)]);
    await Promise.all([this.d.lifecycle.enqueued(run.session_id, run.id, poolId, run), this.outbox.remove(run.session_id, run.id)]);
  }

  /** A queued Run's enqueue was recorded and its job is in the pool the Run names. */
  private async jobExists(run: RunDoc): Promise<boolean> {
    if (!run.timestamps?.enqueued_at || !run.runner_pool_id) return false;
    return (await this.d.queues.job(run.runner_pool_id, run.id)) !== undefined;
  }

  /**
   * What only makes an existing Run findable and its pool watched, so it may precede the job: the
   * Run-to-Session mapping and the pool's active mark.
   */
  private async findable(run: RunDoc, poolId: string): Promise<void> {
    await Promise.all([this.d.redis.hset(runSessionsKey(run.workspace_id), run.id, run.session_id), this.markActive(poolId, run.workspace_id)]);
  }

  /** The pool's active mark (the scheduler watches marked pools), unless this process wrote it lately. */
  private async markActive(poolId: string, workspaceId: string): Promise<void> {
    if (this.markedPools.get(poolId) === workspaceId) return;
    await markPoolActive(this.d.redis, poolId, workspaceId, this.poolIdleMs);
    this.markedPools.set(poolId, workspaceId);
  }

  /**
   * Runs whose turn started more than `olderThanMs` ago but whose enqueue never finished (the
   * process died in between): enqueue them now. Idempotent: the job id is the Run id, and a Run
   * that is no longer queued, already enqueued, or was never committed only leaves the outbox.
   * A Run whose start recorded its enqueue (its job sent right behind the start, `sendBehind`)
   * is enqueued again when its job is missing (the add behind a committed start failed).
   * Returns the Run ids enqueued.
   */
  async repairUnqueued(olderThanMs: number): Promise<string[]> {
    const repaired: string[] = [];
    for (const p of await this.outbox.due(olderThanMs)) {
      try {
        const run = await this.d.store.run(p.session_id, p.run_id).catch(() => null);
        if (run && run.status === 'queued' && !(await this.jobExists(run))) {
          this.d.log.warn({ run: run.id, session: run.session_id, since_ms: p.since_ms }, 'a started Run was never enqueued; enqueuing it now');
          await this.enqueue(run);
          repaired.push(run.id);
        } else {
          await this.outbox.remove(p.session_id, p.run_id);
        }
      } catch (err) {
        this.d.log.warn({ run: p.run_id, err: err instanceof Error ? err.message : String(err) }, 'enqueue repair failed; retried on the next sweep');
      }
    }
    return repaired;
  }

  /**
   * `user.interrupt` on a Run: a queued or waiting Run's job is removed and the turn ends
   * `interrupted`; a leased Run's runner gets `lease.cancel`. A job a scheduler holds while it
   * places the Run (taken, offers out) is neither: the interrupt leaves a cancel mark, which the
   * dispatcher honours after it takes the job, after it returns it to the queue, and after it
   * grants a lease. After marking, the interrupt looks once more: a lease claimed meanwhile gets
   * `lease.cancel`, a job returned meanwhile is removed. Whichever order the two sides run in,
   * one of them sees the other's write (the dispatcher checks after each of its moves, the
   * interrupt after its mark), so the Run ends without polling.
   */
  async interruptRequested(sessionId: string, _threadId: string, runId: string, trace?: Context): Promise<void> {
    const run = await this.d.store.run(sessionId, runId);
    if (!run || run.status === 'succeeded' || run.status === 'failed') return;
    // Cancelled already: the turn's end is carried out again (a crash may have cut it short; it
    // applies once), so an interrupt sent again repairs it.
    if (run.status === 'canceled') return void (await this.d.lifecycle.canceled(sessionId, runId, INTERRUPTED_QUEUED, trace));
    const pool = (run.status === 'queued' || run.status === 'waiting') ? run.runner_pool_id : undefined;
    let held = false;
    if (pool) {
      const place = await this.d.queues.jobPlace(pool, runId);
      if (place === 'queued' && (await this.endQueued(sessionId, runId, pool, trace))) return;
      // A job held (taken, offers out), or none yet (its start wrote the Run with its pool and the
      // job sent behind it is not added yet, or only the repair adds it), or a Run taken since the
      // read: the dispatcher that takes it honours the mark, a lease claimed meanwhile is
      // cancelled below, and a job that arrives meanwhile is removed below.
      held = place !== 'finished';
      if (held) await this.cancels.mark(sessionId, runId);
    } else if (run.status === 'queued' || run.status === 'waiting') {
      // Its pool is not on the Run yet (the write of the enqueue has not landed): the dispatcher
      // that takes the job honours the mark, as for a job it holds.
      await this.cancels.mark(sessionId, runId);
    } else {
      // A leased Run: the mark outlives the lease.cancel frame, so the runner's next lease
      // heartbeat repairs a frame that never reached it (its fence extension finds the mark),
      // and an attempt retried after a crash ends instead of running the turn again.
      await Promise.all([this.cancels.mark(sessionId, runId), this.cancelLease(sessionId, run.workspace_id, runId)]);
      return;
    }
    if (await this.cancelLease(sessionId, run.workspace_id, runId)) return;
    if (held && pool && (await this.d.queues.jobPlace(pool, runId)) === 'queued' && (await this.endQueued(sessionId, runId, pool, trace))) {
      await this.cancels.clear(sessionId, runId);
    }
  }

  /**
   * A queued Run is interrupted: its end is recorded first, and only then does its job go. A
   * crash in between leaves a job whose Run has ended, which the dispatcher that takes it drops
   * (`CancelMarks.barred`) and the lease claim refuses (`RunLifecycle.accepted`); the other order
   * left a queued Run with no job, which nothing would ever end. False when the Run was taken
   * meanwhile (it is no longer queued): it is cancelled on its runner instead.
   */
  private async endQueued(sessionId: string, runId: string, pool: string, trace?: Context): Promise<boolean> {
    if (!(await this.d.lifecycle.canceled(sessionId, runId, INTERRUPTED_QUEUED, trace, { onlyQueued: true }))) return false;
    crashPoint('interrupt-run-canceled');
    await this.d.queues.cancelQueued(pool, runId);
    return true;
  }

  /** Sends `lease.cancel` to the runner holding the Run's lease; false when no lease holds it. */
  private async cancelLease(sessionId: string, workspaceId: string, runId: string): Promise<boolean> {
    const lease = await this.fence.current(sessionId, runId);
    if (lease.run_id !== runId || !lease.token || !lease.runner_id) return false;
    const payload = { lease_id: lease.token, attempt: Number(lease.attempt ?? 1), reason: 'user.interrupt', grace_ms: this.d.interruptGraceMs };
    await cancelOnRunner(this.d.redis, workspaceId, lease.runner_id, payload, newId('event'));
    return true;
  }

  /**
   * A wait of generation `generation`, opened by `runId`'s turn end, was answered: the turn
   * continues in a new Run when the thread can (`continuable`: still idle on that Run at that
   * generation, no wait of it open, not closed or archived) and its Session is not archived. The
   * rule is applied here only: to the thread as read after the caller's answer was written (a
   * report that cannot start anything writes nothing; a later answer makes its own report), then
   * again in the compare-and-swap that starts the Run, so of the reports of one generation
   * (concurrent answers, a retry after a crash) the Run starts once.
   */
  async waitsResolved(sessionId: string, threadId: string, runId: string | null, generation: number): Promise<void> {
    const read = await this.d.store.thread(sessionId, threadId);
    if (!continuable(read, runId, generation)) return;
    // An archived Session takes no new work: the wait is answered, but no turn continues.
    const session = await this.d.store.get(read.workspace_id, sessionId);
    if (session.archived_at !== null) return;
    const nextRunId = newId('run');
    await this.runStarting(sessionId, nextRunId);
    const { run } = await this.d.store.startTurn(session, threadId, (t) =>
      !continuable(t, runId, generation) ? null : {
        thread: { ...t, status: 'running', _active_run_id: nextRunId, _running_since_ms: Date.now(), _stop_reason: null },
        start: { runId: nextRunId, inputs: [], continuesRunId: runId },
      });
    if (run) await this.runQueued(run);
  }
}
