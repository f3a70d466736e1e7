import { randomBytes } from 'node:crypto';
import type { Logger } from '@agentplane/core';
import {
  ConnectionService, CredentialIndex, FileStore, IdentityService, OutcomeService, ProjectHeadReader, RedisRuntimeBearers, SkillReader, RunEngine, RunLifecycle, RunnerService,
  SessionStore, ThreadRuntime, VersionedStore, type Coordinator, type SessionCloser, sandboxProfileStore, type Environment,
} from '@agentplane/domain';
import { activePools, CancelMarks, LeaseFence, LeaseRecords, POOL_WAKE_CHANNEL, poolWorkspace, recentPools, RunQueues } from '@agentplane/lease';
import { SecretBox } from '@agentplane/core';
import { connectRedis, DocumentStore, type Redis } from '@agentplane/store';
import type { SchedulerConfig } from './config.js';
import { LeaseSpecBuilder, PoolDispatcher, PresenceDirectory, RedisOfferChannel, runHooks, type DispatchHooks } from '@agentplane/dispatch';
import { reconcilePool, repairStalls, STALLS_FROM_START, type StallCursor } from './reconciler.js';
import { SchedulerMetrics } from './metrics.js';

/** How often each pool's fair-share ranks are pruned of Runs that never got a job. */
const RANK_PRUNE_EVERY_MS = 60_000;

/** Whether a pool's queue holds anything (Runs to place or being run, or ends to reconcile). */
const hasWork = (counts: Readonly<Record<string, number>>): boolean => Object.values(counts).some((n) => n > 0);

/**
 * One scheduler process: finds pools with work, runs a PoolDispatcher per pool, and keeps
 * the Run documents and threads in step with what BullMQ decides. Stateless: any number may
 * run at once against the same Redis.
 */
export class Scheduler {
  readonly instanceId = `sch_${randomBytes(6).toString('hex')}`;
  readonly metrics = new SchedulerMetrics(() => this.dispatchers.size);
  private readonly redis: Redis;
  private readonly bull: Redis;
  private readonly sub: Redis;
  private readonly queues: RunQueues;
  private readonly pools = new Map<string, string>();
  private readonly dispatchers = new Map<string, PoolDispatcher>();
  /** Per pool: its hooks and how far BullMQ's stalled records have been replayed. */
  private readonly served = new Map<string, { hooks: DispatchHooks; stalls: StallCursor; prunedAt?: number }>();
  private readonly directory: PresenceDirectory;
  private readonly offers: RedisOfferChannel;
  private readonly lifecycle: RunLifecycle;
  private readonly cancels: CancelMarks;
  /**
   * Enqueues Runs the scheduler's own turn ends start (a message queued behind a turn that the
   * scheduler ended), and repairs Runs whose enqueue a crash interrupted.
   */
  private readonly engine: RunEngine;
  private readonly closer: SessionCloser;
  private readonly coordinator: Coordinator;
  private readonly store: SessionStore;
  private scanTimer: NodeJS.Timeout | undefined;
  private scanning = false;
  /** When (Redis's clock) the whole pool registry was last looked through for queued Runs. */
  private sweptAt = 0;
  /** Dispatchers of idle pools still closing. */
  private readonly retiring = new Set<Promise<void>>();
  /**
   * When each pool's last wake-up came (this process's clock): a wake-up that comes while a scan
   * runs, after it read the marks, keeps the pool served by that scan.
   */
  private readonly wokenAt = new Map<string, number>();
  private stopped = false;

  constructor(private readonly config: SchedulerConfig, private readonly log: Logger) {
    this.redis = connectRedis(config.redisUrl, { name: 'scheduler' });
    this.bull = connectRedis(config.redisUrl, { name: 'scheduler:bullmq', blocking: true });
    this.sub = connectRedis(config.redisUrl, { name: 'scheduler:offers', blocking: true });
    for (const c of [this.redis, this.bull, this.sub]) c.on('error', (err: Error) => log.warn({ err: err.message }, 'redis connection error'));
    this.queues = new RunQueues(this.bull, config.lease, this.redis);
    this.cancels = new CancelMarks(this.redis);
    this.store = new SessionStore(this.redis, config.appendDurability);
    // Every turn spec reads its Environment (or SandboxProfile) version: versions never change, so
    // the scheduler keeps the ones it read.
    const environments = new VersionedStore<Environment>(this.redis, 'environments', 'environment', { cacheVersions: true });
    const docs = new DocumentStore(this.redis);
    const credentials = new CredentialIndex(this.redis);
    const runners = new RunnerService(docs, this.redis, credentials, new IdentityService(docs, this.redis, credentials));
    let engine: RunEngine | undefined;
    const runtime = new ThreadRuntime(this.store, () => engine as RunEngine);
    this.lifecycle = new RunLifecycle(this.store, runtime, log);
    this.closer = runtime.closer;
    this.coordinator = runtime.coordinator;
    engine = new RunEngine({
      redis: this.redis, queues: this.queues, lifecycle: this.lifecycle, store: this.store, environments, runners, log,
      interruptGraceMs: config.interruptGraceMs, poolIdleMs: config.lease.poolIdleMs,
    });
    this.engine = engine;
    this.directory = new PresenceDirectory(this.redis, (pool) => this.pools.get(pool));
    const files = new FileStore(this.redis, docs);
    // Turns this scheduler ends (retries exhausted, interrupted while queued) move their outcome on too.
    const outcomes = new OutcomeService({ store: this.store, runtime, scheduler: () => this.engine, log, files });
    runtime.onTurnEnded((session, threadId, runId, stop, _trace, activeOutcome) => outcomes.turnEnded(session, threadId, runId, stop, undefined, activeOutcome));
    // An archive that died before it ended its outcomes: the close sweep ends them first.
    runtime.closer.beforeRepair((session) => outcomes.sessionArchived(session));
    const specs = new LeaseSpecBuilder({
      redis: this.redis, store: this.store, environments, sandboxProfiles: sandboxProfileStore(this.redis, { cacheVersions: true }), docs, files,
      projects: new ProjectHeadReader(docs), skills: new SkillReader(this.redis, docs), bearers: new RedisRuntimeBearers(this.redis, new LeaseFence(this.redis)),
      connections: config.masterKey ? new ConnectionService(docs, new SecretBox(config.masterKey)) : undefined,
    });
    this.offers = new RedisOfferChannel(this.redis, this.sub, this.instanceId, new LeaseRecords(this.redis), (o) => specs.build(o), log, config.gatewayLinks ? { metrics: this.metrics.registry } : undefined);
  }

  async start(): Promise<void> {
    await this.offers.start();
    // A pool that gets a Run after it went idle is served at once, not at the next scan.
    this.sub.on('message', (channel: string, pool: string) => {
      if (channel === POOL_WAKE_CHANNEL) void this.wake(pool).catch((err: unknown) => this.log.warn({ err, pool }, 'serving a woken pool failed'));
    });
    await this.sub.subscribe(POOL_WAKE_CHANNEL);
    await this.scanNow();
    this.scanTimer = setInterval(() => void this.scanNow().catch((err: unknown) => this.log.warn({ err }, 'pool scan failed')), this.config.poolScanMs);
    this.scanTimer.unref();
    this.log.info({ instance: this.instanceId }, 'scheduler started');
  }

  private pinging: Promise<boolean> | null = null;
  /**
   * Readiness (`/readyz`): what the scheduler needs that does not answer now, empty when ready:
   * `redis` (no PONG within `timeoutMs`; probes meanwhile share the PING), `queues` and
   * `offers_subscriber` (their connections are not connected).
   */
  async notReady(timeoutMs: number): Promise<string[]> {
    if (!this.pinging) {
      const answer = this.redis.ping().then((r) => r === 'PONG', () => false);
      let timer: NodeJS.Timeout | undefined;
      const late = new Promise<boolean>((resolve) => {
        timer = setTimeout(() => resolve(false), timeoutMs);
        timer.unref();
      });
      const current = Promise.race([answer, late]).finally(() => {
        clearTimeout(timer);
        if (this.pinging === current) this.pinging = null;
      });
      this.pinging = current;
    }
    const out: string[] = [];
    if (!(await this.pinging)) out.push('redis');
    if (this.bull.status !== 'ready') out.push('queues');
    if (this.sub.status !== 'ready') out.push('offers_subscriber');
    return out;
  }

  /** The pools this scheduler dispatches now (metrics, tests). */
  get dispatchedPools(): number {
    return this.dispatchers.size;
  }

  /** One scan at a time: a tick that finds one running skips. */
  private async scanNow(): Promise<void> {
    if (this.scanning) return;
    this.scanning = true;
    try {
      await this.scan();
    } finally {
      this.scanning = false;
    }
  }

  /** Start dispatching `pool` (of `workspaceId`) unless this scheduler does already. */
  private serve(pool: string, workspaceId: string): void {
    this.pools.set(pool, workspaceId);
    if (this.stopped || this.dispatchers.has(pool)) return;
    const hooks = runHooks({ poolId: pool, queues: this.queues, lifecycle: this.lifecycle, metrics: this.metrics, log: this.log, redis: this.redis, interruptGraceMs: this.config.interruptGraceMs, cancels: this.cancels });
    const d = new PoolDispatcher({
      poolId: pool, queues: this.queues, connection: this.bull, directory: this.directory, offers: this.offers,
      hooks, config: this.config.lease, log: this.log, capacityRetryMs: this.config.capacityRetryMs, cancels: this.cancels,
    });
    d.start();
    this.dispatchers.set(pool, d);
    this.served.set(pool, { hooks, stalls: STALLS_FROM_START });
    // Its queue depths are on /metrics from now on, not only after the next scan.
    void this.metrics.refresh(this.queues, [pool]).catch((err: unknown) => this.log.warn({ err, pool }, 'reading a pool\'s queue depth failed'));
    this.log.info({ pool, workspace: workspaceId }, 'dispatching pool');
  }

  /** A Run was queued in `pool` after it had been idle a while (its mark's wake-up). */
  private async wake(pool: string): Promise<void> {
    this.wokenAt.set(pool, Date.now());
    if (this.stopped || this.dispatchers.has(pool)) return;
    const ws = this.pools.get(pool) ?? (await poolWorkspace(this.redis, pool));
    if (ws) this.serve(pool, ws);
  }

  /**
   * Stop dispatching an idle pool: its worker's blocking connection closes, and its per-pool
   * sweeps stop. Its next Run's mark serves it again (a wake-up, else the next scan).
   */
  private retire(pool: string): void {
    const d = this.dispatchers.get(pool);
    if (!d) return;
    this.dispatchers.delete(pool);
    this.served.delete(pool);
    this.metrics.forget(pool);
    const stopping = d.stop().catch((err: unknown) => this.log.warn({ err, pool }, 'stopping an idle pool failed'));
    this.retiring.add(stopping);
    void stopping.finally(() => this.retiring.delete(stopping));
    this.log.info({ pool }, 'pool idle: no longer dispatched');
  }

  private async scan(): Promise<void> {
    if (this.stopped) return;
    const scanStarted = Date.now();
    const idleMs = this.config.lease.poolIdleMs;
    // The pools marked lately (a Run queued within the idle window) are served...
    const { now, pools: recent } = await recentPools(this.redis, idleMs);
    for (const [pool, { workspaceId }] of recent) this.serve(pool, workspaceId);
    // ...and, at start and once per idle window, every pool whose queue holds anything: Runs
    // older than their pool's mark (queued before an outage, or before this scheduler started).
    if (now - this.sweptAt >= idleMs) {
      this.sweptAt = now;
      for (const [pool, ws] of await activePools(this.redis)) {
        if (!this.dispatchers.has(pool) && hasWork(await this.queues.depth(pool))) this.serve(pool, ws);
      }
    }
    await this.metrics.refresh(this.queues, [...this.dispatchers.keys()]);
    for (const [pool, served] of this.served) {
      await reconcilePool(pool, this.queues, this.lifecycle, this.log);
      served.stalls = await repairStalls(pool, this.queues, (run) => served.hooks.stalled(run), served.stalls, this.log);
      await this.pruneRanks(pool, served);
    }
    // A pool not marked within the idle window, its queue empty and no placement under way, goes.
    // (A Run queued meanwhile marks it again: the API marks a pool at least every quarter of the
    // window, so a mark this old means no Run was queued since.)
    // A wake-up since this scan began is a mark newer than the ones it read: the Run it
    // announces may not be in the depths read either, so the pool stays.
    for (const [pool, d] of this.dispatchers) {
      const counts = this.metrics.depthOf(pool);
      const woken = (this.wokenAt.get(pool) ?? 0) >= scanStarted;
      if (!recent.has(pool) && counts && !hasWork(counts) && d.idle && !woken) this.retire(pool);
    }
    for (const [pool, at] of this.wokenAt) if (at < scanStarted) this.wokenAt.delete(pool);
    const repaired = await this.engine.repairUnqueued(this.config.enqueueRepairAfterMs);
    if (repaired.length > 0) this.log.info({ runs: repaired }, 'enqueued Runs whose enqueue was interrupted');
    // Archived Sessions whose terminal status event a crash left unwritten (same delay: an
    // archive writes its own within a round trip or two of its entry).
    const closed = await this.closer.repair(this.config.enqueueRepairAfterMs);
    if (closed.length > 0) this.log.info({ sessions: closed }, 'wrote the terminal status event of archived Sessions');
    // Coordinators whose turn end died before it carried out their delegation uses.
    const carried = await this.coordinator.repair(this.config.enqueueRepairAfterMs, this.log);
    if (carried.length > 0) this.log.info({ sessions: carried }, 'carried out the delegation uses of coordinators whose turn end was cut short');
  }

  /**
   * Fair-share ranks taken for a turn start that never committed a Run (the API took the rank
   * beside the start's intent and died, or lost the start) would count against their workspace
   * forever: once a minute, ranks older than a start can take without a job are removed.
   */
  private async pruneRanks(pool: string, served: { prunedAt?: number }): Promise<void> {
    const ws = this.pools.get(pool);
    const now = Date.now();
    if (!ws || now - (served.prunedAt ?? 0) < RANK_PRUNE_EVERY_MS) return;
    served.prunedAt = now;
    const removed = await this.queues.pruneRanks(pool, ws, now - Math.max(RANK_PRUNE_EVERY_MS, 6 * this.config.enqueueRepairAfterMs));
    if (removed > 0) this.log.info({ pool, removed }, 'removed fair-share ranks of Runs that never got a job');
  }

  async stop(): Promise<void> {
    this.stopped = true;
    if (this.scanTimer) clearInterval(this.scanTimer);
    await Promise.all([...[...this.dispatchers.values()].map((d) => d.stop()), ...this.retiring]);
    this.offers.close();
    await this.queues.close();
    for (const c of [this.sub, this.bull, this.redis]) await c.quit().catch(() => c.disconnect());
  }
}
