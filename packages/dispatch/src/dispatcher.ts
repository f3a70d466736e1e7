import { randomUUID } from 'node:crypto';
import { UnrecoverableError, Worker, type Job } from 'bullmq';
import { ATTR, extractTrace, inSpan, SpanKind, type Context, type Logger } from '@agentplane/core';
import { matchCapabilities, queuePrefix, RUN_QUEUE, type CancelMarks, type LeaseConfig, type RunJobData, type RunQueues } from '@agentplane/lease';
import { SpecTooLarge } from '@agentplane/domain';
import { LEASE_SPEC_PROTOCOL } from '@agentplane/protocol';
import type { Redis } from '@agentplane/store';
import { StaticFit } from './static-fit.js';
import type { LeasePlan, OfferBody, OfferChannel, OfferOutcome, RunnerDirectory, RunnerView } from './directory.js';

/** What the scheduler reports about a Run while placing it (Run status, session events, metrics). */
export interface DispatchHooks {
  /** `recorded`: the Run already records this lease (the gateway wrote it before answering). */
  leased(job: Job<RunJobData>, runnerId: string, leaseId: string, attempt: number, recorded: boolean): Promise<void>;
  /**
   * `trace` (here and below): the placement's context, the parent of the records' spans; without
   * it, the trace the API put on the job.
   */
  waiting(job: Job<RunJobData>, reason: string, trace?: Context): Promise<void>;
  /** A lease was lost (lock expired): the Run goes back to the queue. */
  stalled(runId: string): Promise<void>;
  /**
   * The Run was taken for another attempt (`job.attemptsStarted`): every earlier attempt is
   * over. Called before anything is offered, so a loss that was never recorded (the process
   * that saw the stall died) is recorded ahead of the new attempt's events.
   */
  retaken(job: Job<RunJobData>, trace?: Context): Promise<void>;
  /**
   * The Run lost more leases than allowed (`RUN_MAX_LOST_LEASES`), or its turn spec cannot be
   * built whatever runner takes it (`code` then says why): it fails for good.
   */
  exhausted(runId: string, reason: string, code?: string): Promise<void>;
  /** The Run was interrupted while this dispatcher held it, and its job is gone: the turn ends. */
  interrupted(job: Job<RunJobData>, trace?: Context): Promise<void>;
  /** The Run was interrupted while its offer was out, and the runner took it: cancel it there. */
  cancelLease(job: Job<RunJobData>, runnerId: string, leaseId: string, attempt: number): Promise<void>;
  /** How one offer ended (for the offers metric). */
  offerAnswered?(outcome: Exclude<OfferOutcome, 'withdrawn'>): void;
}

export interface DispatcherOptions {
  poolId: string;
  queues: RunQueues;
  /** A dedicated connection for BullMQ's blocking reads (maxRetriesPerRequest: null). */
  connection: Redis;
  directory: RunnerDirectory;
  offers: OfferChannel;
  hooks: DispatchHooks;
  config: LeaseConfig;
  log: Logger;
  /** How long a Run that no ready runner can take right now waits before it is tried again. */
  capacityRetryMs?: number;
  /** Interrupts of Runs a dispatcher holds (see `CancelMarks`). */
  cancels: CancelMarks;
}

/**
 * An offer body that resolves only once the placement's checks passed: null (withdrawn) when they
 * found a cancel mark, so the offer carrying it is never sent.
 */
function withheldUntil(checked: Promise<boolean>, body: OfferBody): OfferBody {
  const withheld = Promise.all([body, checked]).then(([spec, marked]) => (marked ? null : spec));
  withheld.catch(() => undefined);
  return withheld;
}

/**
 * Places the Runs of one pool on its runners. BullMQ is the lease engine: `getNextJob` takes a
 * Run with a fresh lock token (the lease id), the offer goes to a matching runner with a free
 * slot, and the runner's acceptance extends that same lock to a full lease. Expired locks are
 * found by BullMQ's stalled check and the Run is offered again; the fencing token keeps the
 * runner that lost it from writing. Several schedulers may run the same pool at once.
 */
export class PoolDispatcher {
  private readonly worker: Worker<RunJobData>;
  private stopped = false;
  private loopDone: Promise<void> = Promise.resolve();
  /** Offers in flight per runner, so one runner is not offered more than its free slots. */
  private readonly reserved = new Map<string, number>();
  /**
   * Leases this dispatcher placed on a runner since its presence was last written: presence
   * slots lag by a heartbeat, and without this every Run of a burst lands on the same runner.
   */
  private readonly granted = new Map<string, { seen: string | undefined; n: number }>();
  private inFlight = 0;
  /** Called when the last placement under way ends (`stop` waits for it). */
  private onIdle: (() => void) | undefined;
  /** Runs already reported as waiting for capacity (so the report is made once per wait). */
  private readonly markedWaiting = new Set<string>();
  /** Which runners could serve which Runs, per presence view (see StaticFit). */
  private readonly fit = new StaticFit();
  /** The ready runners of each view the directory served (see `ready`). */
  private readonly readyOf = new WeakMap<readonly RunnerView[], RunnerView[]>();
  private lastWaitingScan = 0;
  private wake: (() => void) | undefined;

  constructor(private readonly o: DispatcherOptions) {
    this.worker = new Worker<RunJobData>(RUN_QUEUE, null, {
      connection: o.connection,
      prefix: queuePrefix(o.poolId),
      autorun: false,
      lockDuration: o.config.leaseMs,
      maxStalledCount: o.config.maxStalledCount,
      stalledInterval: o.config.stalledIntervalMs,
      drainDelay: 1,
    });
    this.worker.on('error', (err) => o.log.warn({ err: err.message, pool: o.poolId }, 'dispatcher worker error'));
    this.worker.on('stalled', (jobId) => {
      void o.hooks.stalled(jobId).catch((err: unknown) => o.log.error({ err, jobId }, 'stalled hook failed'));
    });
  }

  start(): void {
    void this.worker.startStalledCheckTimer();
    this.loopDone = this.loop();
  }

  /** Nudge the loop (a runner became ready or freed a slot). */
  poke(): void {
    this.wake?.();
  }

  /** No placement under way (a pool may be let go only then). */
  get idle(): boolean {
    return this.inFlight === 0;
  }

  /**
   * Stop taking Runs. Placements under way end first (each makes no further offer and gives its
   * Run back unless the offer out is taken), so no job is left held under this dispatcher's
   * lock until it expires: that would delay the Run by a lease and count as a lost lease.
   */
  async stop(): Promise<void> {
    this.stopped = true;
    this.poke();
    await this.loopDone;
    if (this.inFlight > 0) await new Promise<void>((resolve) => (this.onIdle = resolve));
    await this.worker.close();
  }

  /**
   * The pool's ready runners. `fresh`: not from a view the directory may serve while it refreshes
   * it (see `RunnerDirectory.live`). A view the directory serves again (the same array, as it
   * does between two reads) is filtered once.
   */
  private async ready(fresh = false): Promise<RunnerView[]> {
    const all = await this.o.directory.live(this.o.poolId, fresh);
    let ready = this.readyOf.get(all);
    if (!ready) this.readyOf.set(all, (ready = all.filter((r) => r.status === 'ready')));
    return ready;
  }

  /**
   * Whether `runners` have more free slots than the placements under way may take: counted only
   * until they do (with room to spare, after the first runner or two), not over the whole pool.
   */
  private hasRoom(runners: readonly RunnerView[]): boolean {
    let free = 0;
    for (const r of runners) {
      free += Math.max(0, (r.capabilities.available_slots ?? 0) - this.load(r));
      if (free > this.inFlight) return true;
    }
    return false;
  }

  /** Slots of a runner taken since its presence was written: offers out plus leases granted. */
  private load(r: RunnerView): number {
    const g = this.granted.get(r.runner_id);
    // Without a presence timestamp there is no telling what the slots already count.
    const since = g && r.seen_at !== undefined && g.seen === r.seen_at ? g.n : 0;
    return (this.reserved.get(r.runner_id) ?? 0) + since;
  }

  /**
   * The runners to offer a Run to, best first, at most `maxOffers`: those that can take it now,
   * most effective free slots first, equal ones in random order (so load spreads). Each runner's
   * load is counted once, and only the best few are picked out, not the whole pool sorted.
   */
  private candidates(runners: readonly RunnerView[], req: RunJobData['requirements']): RunnerView[] {
    const fit: { r: RunnerView; free: number; k: number }[] = [];
    const key = StaticFit.key(req);
    for (const r of runners) {
      const free = (r.capabilities.available_slots ?? 0) - this.load(r);
      if (free > 0 && this.fit.fits(r.capabilities, req, key)) fit.push({ r, free, k: Math.random() });
    }
    const picked: RunnerView[] = [];
    for (let n = Math.min(this.o.config.maxOffers, fit.length); picked.length < n;) {
      let best = picked.length;
      for (let i = best + 1; i < fit.length; i++) {
        const a = fit[i]!;
        const b = fit[best]!;
        if (a.free > b.free || (a.free === b.free && a.k < b.k)) best = i;
      }
      [fit[picked.length], fit[best]] = [fit[best]!, fit[picked.length]!];
      picked.push(fit[picked.length]!.r);
    }
    return picked;
  }

  private sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const t = setTimeout(resolve, ms);
      this.wake = () => {
        clearTimeout(t);
        resolve();
      };
    });
  }

  private async loop(): Promise<void> {
    while (!this.stopped) {
      try {
        let runners = await this.ready();
        // A view that shows no room may be one the directory is refreshing: look again, read now.
        if (!this.hasRoom(runners)) runners = await this.ready(true);
        if (!this.hasRoom(runners)) {
          if (Date.now() - this.lastWaitingScan > 1000) await this.reportWaiting(runners.length === 0);
          await this.sleep(250);
          continue;
        }
        const token = randomUUID();
        const job = (await this.worker.getNextJob(token, { block: true })) as Job<RunJobData> | undefined;
        if (!job || this.stopped) {
          if (job) await job.moveToWait(token).catch(() => undefined);
          continue;
        }
        this.inFlight++;
        void this.tracedPlace(job, token)
          .catch((err: unknown) => this.o.log.error({ err, run: job.id }, 'placing a run failed'))
          .finally(() => {
            if (--this.inFlight === 0) this.onIdle?.();
          });
      } catch (err) {
        if (this.stopped) break;
        this.o.log.warn({ err: err instanceof Error ? err.message : String(err), pool: this.o.poolId }, 'dispatch loop error; retrying');
        await this.sleep(500);
      }
    }
  }

  /** No capacity: say so on the Runs at the head of the queue instead of leaving them silently queued. */
  private async reportWaiting(noRunner: boolean): Promise<void> {
    this.lastWaitingScan = Date.now();
    const head = (await this.o.queues.queue(this.o.poolId).getJobs(['prioritized', 'wait'], 0, 49)) as Job<RunJobData>[];
    const reason = noRunner ? 'no ready runner in the pool' : 'every runner in the pool is busy';
    for (const job of head) {
      if (!job?.data || this.markedWaiting.has(job.data.run_id)) continue;
      if (this.markedWaiting.size > 10_000) this.markedWaiting.clear();
      this.markedWaiting.add(job.data.run_id);
      await this.o.hooks.waiting(job, reason);
    }
  }

  /** One placement attempt, in a CONSUMER span continuing the trace the API put on the job. */
  private tracedPlace(job: Job<RunJobData>, token: string): Promise<void> {
    return inSpan(`process ${RUN_QUEUE}`, {
      kind: SpanKind.CONSUMER, parent: extractTrace(job.data.trace),
      attributes: {
        [ATTR.messagingSystem]: 'bullmq', [ATTR.messagingOperationType]: 'process', [ATTR.messagingOperationName]: 'process',
        [ATTR.messagingDestinationName]: RUN_QUEUE, [ATTR.messagingMessageId]: job.data.run_id, 'agentplane.pool.id': this.o.poolId,
        'agentplane.run.attempt': job.attemptsStarted,
      },
    }, (_span, ctx) => this.place(job, token, ctx));
  }

  /** `trace`: the placement span's context (the parent of the offers' spans). */
  private async place(job: Job<RunJobData>, token: string, trace: Context): Promise<void> {
    this.markedWaiting.delete(job.data.run_id);
    // A Run that lost more leases than allowed comes back from the stalled check marked, not
    // failed: BullMQ fails it only inside its own processor, which this dispatcher does not use.
    if (job.deferredFailure) {
      await job.moveToFailed(new UnrecoverableError(job.deferredFailure), token, false).catch(() => undefined);
      await this.o.hooks.exhausted(job.data.run_id, job.deferredFailure);
      return;
    }
    const plan: LeasePlan = {
      lease_id: token,
      run_id: job.data.run_id,
      session_id: job.data.session_id,
      thread_id: job.data.thread_id,
      workspace_id: job.data.workspace_id,
      pool_id: job.data.pool_id,
      attempt: job.attemptsStarted,
      lease_ms: this.o.config.leaseMs,
      heartbeat_ms: this.o.config.heartbeatMs,
    };
    // The checks (a cancel mark, or no Run: a job sent behind a start that did not commit; the
    // earlier attempts' ends) run beside the first offer's preparation: its body's reads and its
    // lease record. A first attempt's body is prepared at once; a later attempt's waits until the
    // earlier attempts' ends are recorded (the spec reads what they wrote). No body is sent
    // before the checks pass; a first attempt's offer to a runner that takes its spec later
    // (`lease-spec-v1`) goes at once, without it: a cancel mark (or no Run) then refuses the
    // lease's claim at the gateway, and the Run ends below.
    const checked = Promise.all([
      this.o.cancels.barred(job.data.session_id, job.data.run_id),
      this.o.hooks.retaken(job, trace).catch((err: unknown) => this.o.log.warn({ err, run: job.id }, 'recording the earlier attempts failed')),
    ]).then(([barred]) => barred);
    checked.catch(() => undefined);
    const early = job.attemptsStarted <= 1 ? this.o.offers.prepare(plan) : undefined;
    const req = job.data.requirements;
    let runners = await this.ready();
    let candidates = this.candidates(runners, req);
    // Nobody in a view the directory may be refreshing: look again, read now, before giving up.
    if (candidates.length === 0) {
      runners = await this.ready(true);
      candidates = this.candidates(runners, req);
    }

    if (candidates.length === 0) {
      if (await checked) return this.cancelTaken(job, token, trace);
      const everyone = [...runners.map((r) => r.capabilities), ...(await this.o.directory.enrolled(this.o.poolId))];
      const verdicts = everyone.map((c) => matchCapabilities(req, c));
      if (everyone.length > 0 && verdicts.every((v) => !v.ok)) {
        // Nobody here can serve it (e.g. a gvisor Environment in a pool of runc-only runners): it
        // waits, saying why, for a runner that can (or for an interrupt), checked less often.
        const reason = `no runner in the pool can serve this Run: ${verdicts.map((v) => (v.ok ? '' : v.reason)).filter(Boolean)[0] ?? 'unknown'}`;
        await this.o.hooks.waiting(job, reason, trace);
        return this.giveBack(job, token, Math.max(2_000, 5 * (this.o.capacityRetryMs ?? 1000)), trace);
      }
      const reason = everyone.length === 0 ? 'no runner is enrolled in the pool' : 'every matching runner is busy or offline';
      await this.o.hooks.waiting(job, reason, trace);
      return this.giveBack(job, token, this.o.capacityRetryMs ?? 1000, trace);
    }

    const body = withheldUntil(checked, early ?? checked.then((marked) => (marked ? null : this.o.offers.prepare(plan))));
    // A spec that no runner could take (heavier than a frame even fitted) fails the Run at once:
    // offered again, it would be built and refused again, for good.
    const built: { unbuildable: SpecTooLarge | null } = { unbuildable: null };
    body.catch((err: unknown) => {
      if (err instanceof SpecTooLarge) built.unbuildable = err;
    });
    // Keep the lock while offers are out; the runner's acceptance replaces it with a full lease.
    // Renewed well inside the lock's length too: an offer window longer than the lease (settings
    // allow it) would otherwise let the lock expire, and the stalled check take the Run back.
    const keepMs = Math.max(500, Math.min(this.o.config.offerTimeoutMs / 2, this.o.config.leaseMs / 3));
    const keep = setInterval(() => void job.extendLock(token, this.o.config.leaseMs).catch(() => undefined), keepMs);
    try {
      for (const runner of candidates) {
        this.reserved.set(runner.runner_id, (this.reserved.get(runner.runner_id) ?? 0) + 1);
        let outcome;
        try {
          outcome = await this.o.offers.offer(
            { ...plan, runner_id: runner.runner_id, offer_expires_at_ms: Date.now() + this.o.config.offerTimeoutMs },
            this.o.config.offerTimeoutMs,
            body,
            runner.node_id,
            early !== undefined && runner.capabilities.plane_protocols?.includes(LEASE_SPEC_PROTOCOL) === true,
            trace,
          );
        } finally {
          const left = (this.reserved.get(runner.runner_id) ?? 1) - 1;
          if (left <= 0) this.reserved.delete(runner.runner_id);
          else this.reserved.set(runner.runner_id, left);
        }
        // Withdrawn: a cancel mark was found, and the offer was never sent.
        if (outcome === 'withdrawn') return this.cancelTaken(job, token, trace);
        const failure = built.unbuildable;
        if (failure !== null && outcome !== 'accepted' && outcome !== 'recorded') {
          await job.moveToFailed(new UnrecoverableError(failure.message), token, false).catch(() => undefined);
          await this.o.hooks.exhausted(job.data.run_id, failure.message, 'spec_too_large');
          return;
        }
        this.o.hooks.offerAnswered?.(outcome);
        if (outcome === 'accepted' || outcome === 'recorded') {
          const g = this.granted.get(runner.runner_id);
          this.granted.set(runner.runner_id, { seen: runner.seen_at, n: g && g.seen === runner.seen_at ? g.n + 1 : 1 });
          const [, interrupted] = await Promise.all([
            this.o.hooks.leased(job, runner.runner_id, token, job.attemptsStarted, outcome === 'recorded'),
            this.o.cancels.marked(job.data.session_id, job.data.run_id),
          ]);
          // The mark stays: the lease's heartbeats find it too, should this lease.cancel be lost.
          if (interrupted) await this.o.hooks.cancelLease(job, runner.runner_id, token, job.attemptsStarted);
          return;
        }
        // Not taken. An offer that went ahead of its checks may have met a cancel mark or an
        // ended Run (found by the checks, or since: the gateway refused the lease's claim): the
        // Run ends here.
        if ((await checked) || (await this.o.cancels.barred(job.data.session_id, job.data.run_id))) return this.cancelTaken(job, token, trace);
        // Stopping: the Run goes back to the queue at once, for another scheduler to place.
        if (this.stopped) return this.giveBack(job, token, 0, trace);
      }
    } finally {
      clearInterval(keep);
    }
    await this.o.hooks.waiting(job, 'offered runners did not accept in time', trace);
    await this.giveBack(job, token, this.o.capacityRetryMs ?? 1000, trace);
  }

  /**
   * Return a job to the queue for a later try, then honour an interrupt marked meanwhile: the
   * check comes after the move, so a mark made before it is seen here, and one made after it
   * finds the job back in the queue, where the interrupt removes it itself. The turn ends before
   * the job goes: a crash in between leaves the job, still barred, for the next take to drop; the
   * other order left a queued Run with no job, which nothing would end. (The mark refuses any
   * lease meanwhile, so ending the Run cannot stop one that runs.)
   */
  private async giveBack(job: Job<RunJobData>, token: string, delayMs: number, trace: Context): Promise<void> {
    await job.moveToDelayed(Date.now() + delayMs, token).catch(() => undefined);
    const { session_id: sessionId, run_id: runId } = job.data;
    if (!(await this.o.cancels.barred(sessionId, runId))) return;
    await this.o.hooks.interrupted(job, trace);
    await this.o.queues.cancelQueued(this.o.poolId, runId);
    await this.o.cancels.clear(sessionId, runId);
  }

  /**
   * A job taken with an interrupt marked on it, or with no Run (its start did not commit): the
   * turn ends (nothing to end for no Run) and the job leaves the queue.
   */
  private async cancelTaken(job: Job<RunJobData>, token: string, trace: Context): Promise<void> {
    // The turn ends first: a crash before the job is gone leaves it to stall back and be taken
    // again, still marked; the end is a compare-and-swap that happens once.
    await this.o.hooks.interrupted(job, trace);
    await job.moveToFailed(new UnrecoverableError('interrupted while queued'), token, false).catch(() => undefined);
    await job.remove().catch(() => undefined);
    await this.o.cancels.clear(job.data.session_id, job.data.run_id);
  }
}
