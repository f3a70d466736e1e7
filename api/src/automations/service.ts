import { DelayedError, type Queue, type Job, type JobSchedulerJson, type JobsOptions, type RepeatOptions } from 'bullmq';
import { ApiError, crashPoint, Counter, ID_PREFIXES, newId, nowIso, sha256Hex, type Logger, type Metrics } from '@agentplane/core';
import { eventLogKeys, keys, tags, type LogEvent } from '@agentplane/store';
import { QueueHost } from '../queue-host.js';
import type { IdentityService } from '@agentplane/domain';
import type { PermissionStore } from '../governance/permissions.js';
import type { PolicyStore } from '../governance/policies.js';
import type { SessionService } from '../sessions/service.js';
import type { RunDoc, SessionDoc, ThreadDoc } from '@agentplane/domain';
import { cronRepeatStrategy } from './cron.js';
import { expandPrompt } from './prompt.js';
import type { SessionEventTap, TappedAppend } from '../events/tap.js';
import { CachedMemberSet } from '../events/member-set.js';
import { automationKeys, type AutomationStore } from './store.js';
import { AUTOMATION_FIRING_KEY } from '../sessions/metadata.js';
import {
  TERMINAL_FIRING, firingsOf, type AdmissionDisposition, type AutomationDoc, type FiringDoc, type FiringOutcome, type FiringSourceKind, type ScheduleTrigger,
} from './model.js';

/** The automations queue: its prefix carries a hash tag, so every key of the queue is in one slot. */
export const AUTOMATION_QUEUE_PREFIX = 'ap:{q:automations}';
const QUEUE = 'automations';
const FIRE_ATTEMPTS = 3;
const WATCH_MAX_DELAY_MS = 10_000;
/** The Job Scheduler of a schedule Automation. */
export const schedulerId = (automationId: string): string => `automation-${automationId}`;
/** How often the schedule reconciliation runs at most (besides once at start). */
const RECONCILE_EVERY_MS = 60_000;
/**
 * At most this many Automations in a row (docs/AUTOMATIONS.md, "Subscriptions"): a firing caused
 * by a turn of a Session that a chain of this many firings made is refused.
 */
export const MAX_AUTOMATION_CHAIN = 5;

interface TickData {
  workspace_id: string;
  automation_id: string;
  /** A tick run again after its work threw (`retryTick`): when the scheduler's tick was due. */
  due_ms?: number;
}
/** A schedule tick whose work throws is run this many times in all (`retryTick`). */
const TICK_ATTEMPTS = 3;
interface FiringJobData { workspace_id: string; firing_id: string; polls?: number }
/** A subscription event to turn into a firing of one Automation (an `event` job; docs/AUTOMATIONS.md, "Subscriptions"). */
interface EventJobData {
  workspace_id: string;
  automation_id: string;
  /** What identifies the event (a Session event id, an endpoint and its disable time). */
  event_key: string;
  source: FiringDoc['source'];
  payload: Record<string, unknown>;
  filters: string[];
  chain: string[];
}
/** An `event` job whose work throws runs this many times in all; its last failure is a `failed` firing. */
export const EVENT_ATTEMPTS = 5;

export interface AutomationServiceDeps {
  redisUrl: string;
  store: AutomationStore;
  sessions: SessionService;
  identity: IdentityService;
  permissions: PermissionStore;
  /** ActionPolicies: the firing's drive (`user.message` by the service Principal) is decided like a REST drive. */
  policies: PolicyStore;
  log: Logger;
  metrics: Metrics;
  /** How often receipts whose work may not be queued are swept (ms). */
  sweepIntervalMs: number;
  /** Session appends, for subscription triggers. */
  tap: SessionEventTap;
  /** A schedule tick more than this late counts as missed (docs/AUTOMATIONS.md, "Missed fires"). */
  missedAfterMs: number;
}

/**
 * Firings: the receipt, admission, the Session and its turn, and the outcome when the turn ends.
 * Schedules are BullMQ Job Schedulers on the `automations` queue; the worker runs in every api
 * process (jobs are taken once), so no process needs another's domain logic.
 */
export class AutomationService {
  private readonly host: QueueHost;
  readonly queue: Queue;
  private readonly firings: Counter<'source' | 'status'>;

  constructor(private readonly d: AutomationServiceDeps) {
    // Cron times come from the zone's wall clock (`cron.ts`), for the first tick (the queue) and each following one (the worker).
    this.host = new QueueHost({
      name: 'automations', label: 'automations', queue: QUEUE, prefix: AUTOMATION_QUEUE_PREFIX, redisUrl: d.redisUrl, log: d.log,
      settings: { repeatStrategy: cronRepeatStrategy },
    });
    this.queue = this.host.queue;
    this.subWorkspaces = new CachedMemberSet(d.store.redis, automationKeys.subscribers());
    this.firings = new Counter({ name: 'agentplane_automation_firings_total', help: 'Automation firings by source and final status', labelNames: ['source', 'status'], registers: [d.metrics] });
  }

  get store(): AutomationStore {
    return this.d.store;
  }

  // ---- schedules -----------------------------------------------------------------------------

  /**
   * The Automation's BullMQ Job Scheduler follows its document: present while it is active with a
   * schedule, removed otherwise. The document is read here, not taken from the caller, and read
   * again after the scheduler was written: when it changed meanwhile (another request, or the
   * reconciliation, wrote it), the scheduler follows again, so the last writer always leaves the
   * scheduler matching the stored document. A scheduler that already matches is left alone (its
   * pending tick, overdue or not, keeps its time).
   */
  async syncSchedule(ws: string, id: string): Promise<void> {
    let a = await this.d.store.docs.get<AutomationDoc>(tags.workspace(ws), id);
    for (let round = 0; round < 8; round++) {
      await this.applySchedule(ws, id, a);
      const after = await this.d.store.docs.get<AutomationDoc>(tags.workspace(ws), id);
      if (scheduleKey(after) === scheduleKey(a)) return;
      a = after;
    }
    this.d.log.warn({ automation_id: id }, 'the schedule kept changing while it was written; the reconciliation will finish it');
  }

  private async applySchedule(ws: string, id: string, a: AutomationDoc | null): Promise<void> {
    const trigger = a && a.status === 'active' && a.trigger.type === 'schedule' ? a.trigger : null;
    if (a?.trigger.type === 'schedule') await this.d.store.redis.sadd(automationKeys.schedules(), `${ws}/${id}`);
    if (!trigger) {
      await this.queue.removeJobScheduler(schedulerId(id));
      if (!a) await this.d.store.redis.srem(automationKeys.schedules(), `${ws}/${id}`);
      return;
    }
    const current = await this.queue.getJobScheduler(schedulerId(id));
    if (current && schedulerMatches(current, trigger)) return;
    await this.queue.upsertJobScheduler(schedulerId(id), scheduleRepeat(trigger, Date.now()), {
      name: 'tick',
      data: { workspace_id: ws, automation_id: id } satisfies TickData,
      opts: { removeOnComplete: true, removeOnFail: { age: 24 * 3600 } },
    });
  }

  private lastReconcile = 0;

  /**
   * Job Schedulers against schedule Automations, for what a crash between a document's write and
   * its scheduler's (or an older release) left behind: every schedule Automation gets the
   * scheduler its document asks for, and a scheduler whose Automation is gone, paused or not a
   * schedule is removed. Runs at start and in the sweep (at most once a minute).
   */
  async reconcileSchedules(): Promise<void> {
    this.lastReconcile = Date.now();
    const seen = new Set<string>();
    let cursor = '0';
    do {
      const [next, batch] = await this.d.store.redis.sscan(automationKeys.schedules(), cursor, 'COUNT', 500);
      cursor = next;
      for (const m of batch) {
        const [ws, id] = m.split('/');
        if (!ws || !id || seen.has(id)) continue;
        seen.add(id);
        await this.syncSchedule(ws, id);
      }
    } while (cursor !== '0');
    for (const s of await this.queue.getJobSchedulers(0, -1)) {
      const id = s.key.startsWith('automation-') ? s.key.slice('automation-'.length) : null;
      if (!id || seen.has(id)) continue;
      const data = s.template?.data as Partial<TickData> | undefined;
      const ws = data?.workspace_id ?? (await this.d.store.redis.get(automationKeys.home(id)));
      if (ws) await this.syncSchedule(ws, id);
      else await this.queue.removeJobScheduler(s.key);
    }
  }

  async nextScheduledAt(id: string): Promise<string | null> {
    const s = await this.queue.getJobScheduler(schedulerId(id));
    return s?.next ? new Date(s.next).toISOString() : null;
  }

  // ---- firing --------------------------------------------------------------------------------

  /**
   * Writes the durable receipt (`pending`) and queues its work. The prompt is expanded here, so a
   * payload that makes it too long is refused (400) before any receipt exists.
   */
  async fire(a: AutomationDoc, source: FiringDoc['source'], event: unknown, opts: FireOptions = {}): Promise<FiringDoc> {
    const status = opts.status ?? 'pending';
    const id = opts.id ?? newId('automationFiring');
    const now = nowIso();
    const prompt = expandPrompt(a.prompt, { event, firing_id: id, automation_id: a.id, source: source.kind, fired_at: now });
    const f: FiringDoc = {
      id, type: 'automation_firing', workspace_id: a.workspace_id, automation_id: a.id, source, status, attempt_count: 0,
      outcome: null, session_id: null, run_id: null, error: status === 'skipped' ? 'missed_schedule' : null,
      admission: { disposition: status === 'skipped' ? 'not_applicable' : 'pending', check_configured: checkConfigured(a) },
      started_at: null, ended_at: null, through_sequence: 0, stop_reason: null, _prompt: prompt, _attempts: [], version: 1, created_at: now, updated_at: now,
      ...(opts.filtering ? { _filtering: opts.filtering } : {}),
      ...(opts.chain && opts.chain.length > 0 ? { _chain: opts.chain } : {}),
    };
    // A receipt named ahead (a tick, an event, an ingest delivery) already written by an earlier
    // run of the same work is that run's: it is neither written nor counted again.
    if (!(await this.d.store.createFiring(f))) return (await this.d.store.docs.get<FiringDoc>(tags.workspace(a.workspace_id), id)) ?? f;
    await this.d.store.count(a.workspace_id, a.id, status === 'skipped' ? 'skipped' : 'fires');
    if (status === 'skipped') {
      await this.d.store.settled(f);
      this.finalMetric(f.source.kind, 'skipped');
      return f;
    }
    await this.enqueueFire(f.workspace_id, f.id);
    return f;
  }

  private async enqueueFire(ws: string, firingId: string): Promise<void> {
    const old = await this.queue.getJob(firingId);
    // Its attempts are spent: the firing could not start. The worker's `failed` handler records
    // that; this records it when that handler never ran (its api died first).
    if (old && old.attemptsMade >= FIRE_ATTEMPTS && (await old.isFailed())) return this.startFailed(ws, firingId);
    await this.addOnce('fire', { workspace_id: ws, firing_id: firingId } satisfies FiringJobData, {
      jobId: firingId, attempts: FIRE_ATTEMPTS, backoff: { type: 'exponential', delay: 500 },
      removeOnComplete: true, removeOnFail: { age: 24 * 3600 },
    });
  }

  private async enqueueWatch(ws: string, firingId: string, delayMs = 100): Promise<void> {
    await this.addOnce('watch', { workspace_id: ws, firing_id: firingId, polls: 0 } satisfies FiringJobData, {
      jobId: `watch-${firingId}`, delay: delayMs, removeOnComplete: true, removeOnFail: { age: 24 * 3600 },
    });
  }

  /**
   * Queues a firing's job under its fixed id (never twice). A failed job of that id (its work
   * threw, e.g. while Redis restarted, or its worker died twice) is removed first: kept, it would
   * make the add do nothing, and a receipt that is not settled would wait for the failed job to
   * expire (a day), a `running` one holding its Automation's concurrency slot all that time.
   */
  private async addOnce(name: 'fire' | 'watch', data: FiringJobData, opts: JobsOptions & { jobId: string }): Promise<void> {
    const old = await this.queue.getJob(opts.jobId);
    if (old && (await old.isFailed())) await this.queue.remove(opts.jobId);
    await this.queue.add(name, data, opts);
  }

  private finalMetric(source: FiringSourceKind, status: string): void {
    this.firings.inc({ source, status });
  }

  private async refuse(f: FiringDoc, disposition: AdmissionDisposition, error: string): Promise<void> {
    const done = await this.d.store.updateFiring(f.workspace_id, f.id, (cur) => cur.status !== 'pending' ? null : {
      ...cur, status: 'refused', error, admission: { ...cur.admission, disposition }, ended_at: nowIso(),
    }, f);
    if (done.status === 'refused') {
      await this.d.store.count(f.workspace_id, f.automation_id, 'admission_refusals');
      this.finalMetric(f.source.kind, 'refused');
    }
    await this.d.store.settled(f);
  }

  /** Admission then start: the Session (with `automation_id`) and its first turn. Safe to run again. */
  private async startFiring(data: FiringJobData): Promise<void> {
    const ws = data.workspace_id;
    let f = await this.d.store.docs.get<FiringDoc>(tags.workspace(ws), data.firing_id);
    if (!f) return;
    if (f.status === 'running') return this.enqueueWatch(ws, f.id);
    if (f.status !== 'pending') return this.d.store.settled(f);
    f = await this.d.store.updateFiring(ws, f.id, (cur) => cur.status !== 'pending' ? null : {
      ...cur, attempt_count: cur.attempt_count + 1, _attempts: [...cur._attempts, { at: nowIso(), error: null }],
    }, f);
    if (f.status !== 'pending') return;
    const a = await this.d.store.docs.get<AutomationDoc>(tags.workspace(ws), f.automation_id);
    if (!a) return this.refuse(f, 'refused_paused', 'automation_deleted');
    if (a.status !== 'active') return this.refuse(f, 'refused_paused', 'automation_paused');
    // A disabled Workspace (or Organization) admits no credential; nor does it admit its Automations.
    if (await this.d.store.tenancyDisabled(ws)) return this.refuse(f, 'refused_governance', 'auth.disabled_tenancy');
    // A chain of Automations feeding each other's Sessions ends here (docs/AUTOMATIONS.md, "Subscriptions").
    if (chainRefused(f._chain ?? [], a.id)) return this.refuse(f, 'refused_loop', 'automation_loop');
    // Governance: the service Principal must be active and hold `invoke` on the Agent (or the Workspace).
    try {
      await this.d.identity.activePrincipal(ws, a.principal_id);
      await this.d.permissions.require(ws, a.principal_id, 'invoke', { type: 'agent', id: a.agent.id });
    } catch (err) {
      if (ApiError.isRefusal(err)) return this.refuse(f, 'refused_governance', err.type);
      throw err;
    }
    // The same ActionPolicy decision a REST drive gets (the pipeline's `drive` check): only
    // `allow` passes; nobody can approve at this boundary, so `require_approval` refuses too.
    const decision = await this.d.policies.decide(ws, { kind: 'drive', name: 'user.message', principal_id: a.principal_id }, {
      actor: { id: a.principal_id, credential_id: null }, target: a.agent.id, request_id: f.id, refusesApproval: true,
    });
    if (decision.decision !== 'allow') return this.refuse(f, 'refused_governance', 'policy.denied');
    if (!(await this.d.store.admit(ws, a.id, f.id, a.max_concurrent_firings))) return this.refuse(f, 'refused_concurrency', 'concurrency_limit');
    let sessionId: string;
    try {
      // Only a retry can find a Session an earlier attempt created.
      sessionId = (f.attempt_count > 1 ? await this.existingSession(ws, a.id, f.id) : null) ?? await this.createSession(a, f);
    } catch (err) {
      if (err instanceof ApiError && err.type === 'budget.exceeded') {
        await this.d.store.release(ws, a.id, f.id);
        return this.refuse(f, 'refused_budget', err.type);
      }
      if (ApiError.isRefusal(err)) {
        // The Agent or Environment is gone or archived: retrying will not help.
        await this.d.store.release(ws, a.id, f.id);
        await this.fail(f, err.type);
        return;
      }
      throw err;
    }
    const runId = await this.activeRun(ws, sessionId);
    await this.d.store.updateFiring(ws, f.id, (cur) => cur.status !== 'pending' ? null : {
      ...cur, status: 'running', session_id: sessionId, run_id: runId, started_at: nowIso(),
      admission: { ...cur.admission, disposition: 'admitted', check_configured: checkConfigured(a) },
    });
    await this.enqueueWatch(ws, f.id);
  }

  /** A retry after a crash between creating the Session and recording it finds that Session instead of making another. */
  private async existingSession(ws: string, automationId: string, firingId: string): Promise<string | null> {
    const ids = await this.d.store.redis.zrevrange(keys.index(tags.workspace(ws), `sessions:automation:${automationId}:all`), 0, 49);
    for (const id of ids) {
      const s = await this.d.sessions.store.docs.get<SessionDoc>(tags.session(id), id);
      if (s?.metadata[AUTOMATION_FIRING_KEY] === firingId) return id;
    }
    return null;
  }

  private async createSession(a: AutomationDoc, f: FiringDoc): Promise<string> {
    const s = await this.d.sessions.create(a.workspace_id, {
      agent: a.agent.version === null ? { id: a.agent.id } : { id: a.agent.id, version: a.agent.version },
      environment_id: a.environment_id,
      ...(a.budget ? { budget: { max_list_cost: { amount: a.budget.max_list_cost.amount } } } : {}),
      title: `${a.name} (${f.source.kind})`,
      metadata: { [AUTOMATION_FIRING_KEY]: f.id },
      initial_events: [{ type: 'user.message', payload: { content: f._prompt, authored_by: a.principal_id, caused_by: { kind: 'automation', id: f.id } } }],
    }, `automation-firing:${f.id}`, { automationId: a.id });
    return String(s.id);
  }

  private async activeRun(ws: string, sessionId: string): Promise<string | null> {
    const s = await this.d.sessions.store.get(ws, sessionId);
    const t = await this.d.sessions.store.docs.get<ThreadDoc>(tags.session(sessionId), s._primary_thread_id);
    return t?._active_run_id ?? null;
  }

  private async fail(f: FiringDoc, error: string): Promise<void> {
    const done = await this.d.store.updateFiring(f.workspace_id, f.id, (cur) => cur.status !== 'pending' ? null : {
      ...cur, status: 'failed', error, ended_at: nowIso(),
      _attempts: cur._attempts.map((x, i) => (i === cur._attempts.length - 1 ? { ...x, error } : x)),
    });
    if (done.status === 'failed') {
      await this.d.store.count(f.workspace_id, f.automation_id, 'failures');
      this.finalMetric(f.source.kind, 'failed');
    }
    await this.d.store.settled(f);
  }

  /** A firing whose `fire` job spent its attempts: its slot is released and its receipt `failed` (`start_failed`). */
  private async startFailed(ws: string, firingId: string): Promise<void> {
    const f = await this.d.store.docs.get<FiringDoc>(tags.workspace(ws), firingId);
    if (!f) return;
    await this.d.store.release(f.workspace_id, f.automation_id, f.id);
    await this.fail(f, 'start_failed');
  }

  /**
   * A Session made by a firing appended a turn-ending event: its watcher runs now instead of at
   * its next poll (the poll stays as the backstop for a missed message).
   */
  private async nudgeWatch(t: TappedAppend): Promise<void> {
    if (!t.firing_id) return;
    if (!(await t.events()).some((e) => turnEnd(e.type, e.payload))) return;
    const job = await this.queue.getJob(`watch-${t.firing_id}`);
    if (job && (await job.isDelayed())) await job.promote().catch(() => undefined);
  }

  /** Reads the Session's log after what it read last; completes the firing when the turn ended. */
  private async watch(job: Job<FiringJobData>, token: string | undefined): Promise<void> {
    const { workspace_id: ws, firing_id: id } = job.data;
    const f = await this.d.store.docs.get<FiringDoc>(tags.workspace(ws), id);
    if (!f || f.status !== 'running' || !f.session_id) return;
    const log = this.d.sessions.store.log;
    const state = await log.state(f.session_id);
    let ended: { outcome: FiringOutcome; stop: string } | null = state.erased ? { outcome: 'canceled', stop: 'session_erased' } : null;
    let through = f.through_sequence;
    while (!ended) {
      const batch = await log.range(f.session_id, through, 500);
      if (batch.length === 0) break;
      for (const e of batch) {
        through = e.seq;
        ended = turnEnd(e.type, e.payload);
        if (ended) break;
      }
    }
    if (ended) {
      const end = ended;
      const done = await this.d.store.updateFiring(ws, id, (cur) => cur.status !== 'running' ? null : {
        ...cur, status: 'completed', outcome: end.outcome, stop_reason: end.stop, ended_at: nowIso(), through_sequence: through,
      });
      await this.d.store.release(ws, f.automation_id, id);
      if (done.status === 'completed') {
        await this.d.store.count(ws, f.automation_id, end.outcome === 'succeeded' ? 'succeeded' : 'failures');
        this.finalMetric(f.source.kind, `completed_${end.outcome}`);
      }
      await this.d.store.settled(f);
      return;
    }
    if (through !== f.through_sequence) {
      await this.d.store.updateFiring(ws, id, (cur) => cur.status !== 'running' || cur.through_sequence >= through ? null : { ...cur, through_sequence: through });
    }
    const polls = (job.data.polls ?? 0) + 1;
    await job.updateData({ ...job.data, polls });
    // The tap promotes this job when the turn ends; the poll is the backstop (100 ms doubling to 10 s).
    await job.moveToDelayed(Date.now() + Math.min(WATCH_MAX_DELAY_MS, 100 * 2 ** Math.min(polls, 7)), token);
    throw new DelayedError();
  }

  /**
   * A scheduler's tick: its work, and when that throws, its run again queued before the job is
   * failed (`retryTick`), so no crash between the failure and the retry loses the tick.
   */
  private async tick(job: Job<TickData>): Promise<void> {
    try {
      await this.tickWork(job);
    } catch (err) {
      // The last run of a tick run again: its firing is recorded failed, not dropped unseen.
      if (job.data.due_ms !== undefined && job.attemptsMade + 1 >= (job.opts.attempts ?? 1)) {
        const a = await this.d.store.docs.get<AutomationDoc>(tags.workspace(job.data.workspace_id), job.data.automation_id);
        if (a && a.trigger.type === 'schedule') {
          const scheduledAt = new Date(job.data.due_ms).toISOString();
          this.d.log.warn({ automation_id: a.id, due_at: scheduledAt, err: err instanceof Error ? err.message : String(err) }, 'a schedule tick could not fire');
          await this.unfired(a, tickFiringId(a.id, scheduledAt), { kind: 'schedule', scheduled_at: scheduledAt }, 'fire_failed');
          return;
        }
      }
      await this.retryTick(job, err);
      throw err;
    }
  }

  private async tickWork(job: Job<TickData>): Promise<void> {
    const { workspace_id: ws, automation_id: id } = job.data;
    const a = await this.d.store.docs.get<AutomationDoc>(tags.workspace(ws), id);
    if (!a || a.status !== 'active' || a.trigger.type !== 'schedule') return;
    const dueMs = job.data.due_ms ?? tickDueMs(job, id);
    // Due before the current schedule began: a tick of an earlier one (queued before a pause and
    // run after the resume, or made under times since changed). The new scheduler makes its own.
    if (a._schedule_since_ms !== undefined && dueMs < a._schedule_since_ms) return;
    const late = Date.now() - dueMs > this.d.missedAfterMs;
    const scheduledAt = new Date(dueMs).toISOString();
    // A tick run again (its worker died mid-tick, its job stalled) finds the firing it made: one
    // firing per due time. A firing made but not yet queued is the outbox's to queue.
    const firingId = tickFiringId(id, scheduledAt);
    if (await this.d.store.docs.get<FiringDoc>(tags.workspace(ws), firingId)) return;
    const source = { kind: 'schedule' as const, scheduled_at: scheduledAt };
    try {
      await this.fire(a, source, { scheduled_at: scheduledAt }, { id: firingId, status: late && a.trigger.on_missed === 'skip' ? 'skipped' : 'pending' });
    } catch (err) {
      // A refusal no run again changes (the prompt empty or over 64 KiB once expanded): the
      // tick's firing is recorded failed with the error's type, at once.
      if (!ApiError.isRefusal(err)) throw err;
      this.d.log.warn({ automation_id: a.id, firing_id: firingId, err: err.message }, 'a schedule tick could not fire');
      await this.unfired(a, firingId, source, err.type);
    }
  }

  /**
   * A scheduler's tick whose work threw (Redis restarting, say) is not lost: it is queued again as
   * a one-off job carrying its due time, which BullMQ retries with backoff, up to TICK_ATTEMPTS
   * runs in all. Its firing keeps the tick's due time and id, so it is made late rather than
   * never, and still once; a pause or a new schedule meanwhile drops it as it would the tick.
   * The retry is queued while the tick's job is still active, before BullMQ fails it: a crash
   * before the retry is queued leaves the job active, and BullMQ's stalled check runs it again;
   * a crash after leaves the retry (a tick run twice finds the firing the first run made).
   */
  private async retryTick(job: Job<TickData>, err: unknown): Promise<void> {
    if (job.data.due_ms !== undefined) return; // already the retry: BullMQ retries it
    const id = job.data.automation_id;
    const dueMs = tickDueMs(job, id);
    this.d.log.warn({ automation_id: id, due_at: new Date(dueMs).toISOString(), err: err instanceof Error ? err.message : String(err) }, 'a schedule tick failed; it runs again');
    await this.queueTickAgain(job);
  }

  /** The one-off run again of a failed scheduler tick (its id names the tick, so it is queued once while it waits). */
  private async queueTickAgain(job: Job<TickData>): Promise<void> {
    if (job.data.due_ms !== undefined) return;
    const { workspace_id: ws, automation_id: id } = job.data;
    const dueMs = tickDueMs(job, id);
    await this.queue.add('tick', { workspace_id: ws, automation_id: id, due_ms: dueMs } satisfies TickData, {
      jobId: `tick-again-${id}-${dueMs}`, delay: 1000, attempts: TICK_ATTEMPTS - 1, backoff: { type: 'exponential', delay: 1000 },
      removeOnComplete: true, removeOnFail: { age: 24 * 3600 },
    });
  }

  // ---- subscriptions -------------------------------------------------------------------------

  private readonly subWorkspaces: CachedMemberSet;
  private readonly subsCache = new Map<string, { at: number; list: AutomationDoc[] }>();

  /** A Workspace gained a subscription Automation: the tap starts looking at its Sessions. */
  async subscribed(ws: string): Promise<void> {
    await this.d.store.redis.sadd(automationKeys.subscribers(), ws);
    this.subWorkspaces.invalidate();
    this.subsCache.delete(ws);
  }

  /** Whether the Workspace has subscription Automations (answered at once while the cache is fresh). */
  private wantsWorkspace(ws: string): boolean | Promise<boolean> {
    return this.subWorkspaces.has(ws);
  }

  private async subscriptionsOf(ws: string): Promise<AutomationDoc[]> {
    const c = this.subsCache.get(ws);
    if (c && Date.now() - c.at < 1000) return c.list;
    const ids = await this.d.store.subscriptionIds(ws);
    const list = (await this.d.store.docs.getMany<AutomationDoc>(tags.workspace(ws), ids)).filter((a) => a.status === 'active' && a.trigger.type === 'subscription');
    this.subsCache.set(ws, { at: Date.now(), list });
    return list;
  }

  /**
   * Fires once per Automation and event, whichever api heard it first: the event becomes one
   * `event` job (its id follows from the Automation and the event, so every api that heard it
   * queues the same one), whose work makes the firing (`fireEvent`).
   */
  private async fireOnce(a: AutomationDoc, eventKey: string, source: FiringDoc['source'], payload: Record<string, unknown>, filters: string[], chain: string[] = []): Promise<void> {
    await this.queue.add('event', { workspace_id: a.workspace_id, automation_id: a.id, event_key: eventKey, source, payload, filters, chain } satisfies EventJobData, {
      jobId: eventJobId(a.id, eventKey), attempts: EVENT_ATTEMPTS, backoff: { type: 'exponential', delay: 500 },
      removeOnComplete: true, removeOnFail: { age: 24 * 3600 },
    });
  }

  /**
   * An event's firing. Its id follows from the Automation and the event, so a run of the job
   * again (it threw, or its api died and BullMQ's stalled check ran it again), or a second job of
   * the same event queued after the first was removed, finds the firing made and makes no other.
   * A failure is retried by BullMQ (EVENT_ATTEMPTS runs, exponential backoff); the last one, and
   * a refusal that no retry changes (a prompt too long once expanded), is recorded as a `failed`
   * firing, so no event is dropped unseen.
   */
  private async fireEvent(job: Job<EventJobData>): Promise<void> {
    const d = job.data;
    const id = eventFiringId(d.automation_id, d.event_key);
    if (await this.d.store.docs.get<FiringDoc>(tags.workspace(d.workspace_id), id)) return;
    crashPoint('automation-event-claimed');
    const a = await this.d.store.docs.get<AutomationDoc>(tags.workspace(d.workspace_id), d.automation_id);
    if (!a || a.trigger.type !== 'subscription') return;
    try {
      await this.fire(a, d.source, d.payload, { id, filtering: { event_type: String(d.payload.type), filters: d.filters }, chain: d.chain });
    } catch (err) {
      const final = ApiError.isRefusal(err);
      if (!final && job.attemptsMade + 1 < (job.opts.attempts ?? 1)) throw err;
      this.d.log.warn({ automation_id: a.id, firing_id: id, err: err instanceof Error ? err.message : String(err) }, 'a subscription event could not fire');
      await this.unfired(a, id, d.source, final ? err.type : 'fire_failed', { filtering: { event_type: String(d.payload.type), filters: d.filters }, chain: d.chain });
    }
  }

  /** The receipt of a tick or an event that could not fire: `failed`, with its error, never run. */
  private async unfired(a: AutomationDoc, id: string, source: FiringDoc['source'], error: string, opts: Pick<FireOptions, 'filtering' | 'chain'> = {}): Promise<void> {
    const now = nowIso();
    const f: FiringDoc = {
      id, type: 'automation_firing', workspace_id: a.workspace_id, automation_id: a.id, source, status: 'failed', attempt_count: 0,
      outcome: null, session_id: null, run_id: null, error, admission: { disposition: 'not_applicable', check_configured: checkConfigured(a) },
      started_at: null, ended_at: now, through_sequence: 0, stop_reason: null, _prompt: '', _attempts: [], version: 1, created_at: now, updated_at: now,
      ...(opts.filtering ? { _filtering: opts.filtering } : {}),
      ...(opts.chain && opts.chain.length > 0 ? { _chain: opts.chain } : {}),
    };
    if (!(await this.d.store.docs.create(tags.workspace(a.workspace_id), f, [firingsOf(a.id)]))) return;
    await this.d.store.count(a.workspace_id, a.id, 'fires');
    await this.d.store.count(a.workspace_id, a.id, 'failures');
    this.finalMetric(source.kind, 'failed');
  }

  /**
   * The Automations upstream of a Session's turns, oldest first: those of the firing that made the
   * Session and of the firings before it (empty for a Session nobody's firing made).
   */
  private async chainOf(t: TappedAppend): Promise<string[]> {
    if (!t.automation_id) return [];
    const parent = t.firing_id ? await this.d.store.docs.get<FiringDoc>(tags.workspace(t.workspace_id), t.firing_id) : null;
    return [...(parent?._chain ?? []), t.automation_id];
  }

  /**
   * Whether a turn-ending `session.status_idle` ends a grader Run of an outcome (docs/OUTCOMES.md)
   * rather than an agent turn. Only a Session that started an evaluation can have one: its Run is
   * the one the thread's last `session.status_running` before the idle names.
   */
  private async endsGraderRun(sessionId: string, e: LogEvent): Promise<boolean> {
    if (e.type !== 'session.status_idle') return false;
    const log = this.d.sessions.store.log;
    const evaluations = await this.d.sessions.store.redis.hget(eventLogKeys.stats(sessionId), 's.events.session.outcome_evaluation_started');
    if (!evaluations || Number(evaluations) === 0) return false;
    let before = e.seq;
    for (let page = 0; page < 50; page++) {
      const batch = await log.rangeBackward(sessionId, before, 200);
      for (const x of batch) {
        if (x.session_thread_id !== e.session_thread_id) continue;
        if (x.type === 'session.outcome_evaluation_started') return true;
        if (x.type === 'session.status_running') {
          const runId = (x.payload as { run_id?: unknown } | null)?.run_id;
          if (typeof runId !== 'string') return false;
          const run = await this.d.sessions.store.docs.get<RunDoc>(tags.session(sessionId), runId);
          return run?.grader !== undefined;
        }
      }
      const last = batch[batch.length - 1];
      if (batch.length < 200 || !last) return false;
      before = last.seq;
    }
    return false;
  }

  /**
   * `session.turn_ended`: a Session of the Workspace ended an agent turn (never the Automation's
   * own Sessions, never the end of an outcome's grader Run).
   */
  private async onAppend(t: TappedAppend): Promise<void> {
    const subs = (await this.subscriptionsOf(t.workspace_id)).filter((a) => a.trigger.type === 'subscription' && a.trigger.event === 'session.turn_ended');
    if (subs.length === 0) return;
    let chain: string[] | undefined;
    for (const e of await t.events()) {
      const end = turnEnd(e.type, e.payload);
      if (!end) continue;
      if (await this.endsGraderRun(t.session_id, e)) continue;
      for (const a of subs) {
        if (a.trigger.type !== 'subscription' || a.trigger.event !== 'session.turn_ended' || t.automation_id === a.id) continue;
        const filters: string[] = [];
        if (a.trigger.filter.stop_reasons.length > 0) {
          if (!a.trigger.filter.stop_reasons.includes(end.stop)) continue;
          filters.push('stop_reasons');
        }
        if (a.trigger.filter.agent_ids.length > 0) {
          if (!t.agent_id || !a.trigger.filter.agent_ids.includes(t.agent_id)) continue;
          filters.push('agent_ids');
        }
        chain ??= await this.chainOf(t);
        await this.fireOnce(a, e.id, { kind: 'subscription', event_type: 'session.turn_ended', event_id: e.id }, {
          type: 'session.turn_ended', event_id: e.id, session_id: t.session_id, session_thread_id: e.session_thread_id, agent_id: t.agent_id,
          stop_reason: end.stop, seq: e.seq, occurred_at: e.created_at,
        }, filters, chain);
      }
    }
  }

  /** `webhook_endpoint.disabled`: an outbound endpoint was disabled after a delivery exhausted its attempts. */
  async endpointDisabled(e: { id: string; workspace_id: string; disabled_at: string | null }): Promise<void> {
    if (!(await this.wantsWorkspace(e.workspace_id))) return;
    for (const a of await this.subscriptionsOf(e.workspace_id)) {
      if (a.trigger.type !== 'subscription' || a.trigger.event !== 'webhook_endpoint.disabled') continue;
      const ids = a.trigger.filter.webhook_endpoint_ids;
      if (ids.length > 0 && !ids.includes(e.id)) continue;
      await this.fireOnce(a, `${e.id}@${e.disabled_at ?? ''}`, { kind: 'subscription', event_type: 'webhook_endpoint.disabled', event_id: e.id }, {
        type: 'webhook_endpoint.disabled', webhook_endpoint_id: e.id, reason: 'delivery_failed', disabled_at: e.disabled_at,
      }, ids.length > 0 ? ['webhook_endpoint_ids'] : []);
    }
  }

  // ---- worker and sweep ----------------------------------------------------------------------

  start(): void {
    const worker = this.host.startWorker(async (job: Job, token?: string) => {
      if (job.name === 'tick') return this.tick(job as Job<TickData>);
      if (job.name === 'fire') return this.startFiring(job.data as FiringJobData);
      if (job.name === 'event') return this.fireEvent(job as Job<EventJobData>);
      if (job.name === 'watch') return this.watch(job as Job<FiringJobData>, token);
    }, { concurrency: 16, settings: { repeatStrategy: cronRepeatStrategy } });
    if (!worker) return;
    worker.on('failed', (job, err) => {
      if (job?.name === 'tick') {
        crashPoint('automation-tick-failed');
        // Its run again was queued before the job failed (`tick`); when that add itself failed
        // (the error the job failed with), this queues it. A second run of the tick finds the
        // firing the first made, so queuing it twice fires nothing twice.
        void this.queueTickAgain(job as Job<TickData>).catch((e: unknown) => this.d.log.error({ err: e }, 'queueing a failed schedule tick again failed'));
        return;
      }
      if (!job || job.name !== 'fire' || job.attemptsMade < FIRE_ATTEMPTS) return;
      const data = job.data as FiringJobData;
      this.d.log.warn({ firing_id: data.firing_id, err: err.message }, 'automation firing could not start');
      void this.startFailed(data.workspace_id, data.firing_id).catch((e: unknown) => this.d.log.error({ err: e }, 'recording a failed firing failed'));
    });
    this.d.tap.on({ wants: (f) => this.wantsWorkspace(f.workspace_id) }, (t) => this.onAppend(t));
    // A firing's Session, and only the appends that may end its turn.
    this.d.tap.on({ wants: (f) => f.firing_id !== null, types: TURN_END_TYPES }, (t) => this.nudgeWatch(t));
    this.host.sweepEvery(this.d.sweepIntervalMs, () => this.sweep(), 'firing outbox sweep failed')();
  }

  /**
   * Receipts whose work a crash may have lost (older than a few seconds and not settled): a
   * `pending` one is queued again (same job id, so never twice), a `running` one gets its watcher.
   */
  async sweep(): Promise<void> {
    if (Date.now() - this.lastReconcile >= Math.max(RECONCILE_EVERY_MS, this.d.sweepIntervalMs)) {
      await this.reconcileSchedules().catch((err: unknown) => this.d.log.warn({ err }, 'schedule reconciliation failed'));
    }
    const members = await this.d.store.redis.zrangebyscore(automationKeys.outbox(), '-inf', Date.now() - 5000, 'LIMIT', 0, 200);
    for (const m of members) {
      const [ws, id] = m.split('/');
      if (!ws || !id) continue;
      const f = await this.d.store.docs.get<FiringDoc>(tags.workspace(ws), id);
      if (!f || TERMINAL_FIRING.has(f.status)) {
        await this.d.store.redis.zrem(automationKeys.outbox(), m);
        continue;
      }
      if (f.status === 'pending') await this.enqueueFire(ws, id);
      else await this.enqueueWatch(ws, id, 0);
    }
  }

  close(): Promise<void> {
    return this.host.close();
  }
}

export interface FireOptions {
  /** `skipped`: a missed schedule tick under `on_missed: skip` (recorded, never run). */
  status?: 'pending' | 'skipped';
  /** The receipt's id when the caller names it ahead (an ingest delivery claims it first). */
  id?: string;
  /** Subscriptions: the event type and the filters it passed. */
  filtering?: FiringDoc['_filtering'];
  /** Subscriptions: the Automations upstream of the Session whose turn fired it, oldest first. */
  chain?: string[];
}

/**
 * `admission.check_configured`: whether the firing is admitted against a spend check of its own,
 * the Automation's `budget` (the Session budget its Sessions are created with; `check_usage` in
 * the trace is what that Session used). Workspace budgets apply to every Session either way.
 */
export const checkConfigured = (a: Pick<AutomationDoc, 'budget'>): boolean => a.budget !== null;

/** Whether a firing of `automationId` with these Automations upstream is refused: a loop, or a chain too long. */
export function chainRefused(chain: readonly string[], automationId: string): boolean {
  return chain.includes(automationId) || chain.length >= MAX_AUTOMATION_CHAIN;
}

/**
 * The BullMQ repeat options of a schedule. An interval's first tick is one interval after the
 * scheduler is made (create, resume, a new interval), not at once; a scheduler that is only
 * written again with the same interval keeps its times (BullMQ reads `startDate` only for a
 * scheduler without a previous tick or whose interval changed).
 */
export function scheduleRepeat(t: ScheduleTrigger, nowMs: number): RepeatOptions {
  return 'cron' in t ? { pattern: t.cron, tz: t.timezone } : { every: t.interval_seconds * 1000, startDate: nowMs + t.interval_seconds * 1000 };
}

/** Whether a stored Job Scheduler already runs the trigger's schedule. */
export function schedulerMatches(s: JobSchedulerJson, t: ScheduleTrigger): boolean {
  if ('cron' in t) return s.pattern === t.cron && (s.tz ?? 'UTC') === t.timezone && !s.every;
  return Number(s.every) === t.interval_seconds * 1000 && !s.pattern;
}

/** What decides an Automation's scheduler: its schedule while active, else nothing. */
function scheduleKey(a: AutomationDoc | null): string {
  if (!a || a.status !== 'active' || a.trigger.type !== 'schedule') return 'none';
  return JSON.stringify(a.trigger);
}

/** The job of a subscription event of an Automation: the same for every api that heard it. */
export function eventJobId(automationId: string, eventKey: string): string {
  return `event-${automationId}-${sha256Hex(eventKey).slice(0, 40)}`;
}

/** The id of the firing of a subscription event of an Automation: the same for every run of its job. */
export function eventFiringId(automationId: string, eventKey: string): string {
  return `${ID_PREFIXES.automationFiring}_${sha256Hex(`${automationId}\0event\0${eventKey}`).slice(0, 32)}`;
}

/**
 * When a tick was due. A Job Scheduler names each job it makes `repeat:<scheduler id>:<due ms>`;
 * the job's `delay` is no guide (BullMQ sets it to 0 when it promotes the delayed job, leaving
 * `timestamp`, the time the job was made: one period early).
 */
/** The id of the firing of an Automation's tick due at `scheduledAt`: the same for every run of that tick. */
export function tickFiringId(automationId: string, scheduledAt: string): string {
  return `${ID_PREFIXES.automationFiring}_${sha256Hex(`${automationId}\0${scheduledAt}`).slice(0, 32)}`;
}

export function tickDueMs(job: Pick<Job, 'id' | 'timestamp' | 'delay'>, automationId: string): number {
  const prefix = `repeat:${schedulerId(automationId)}:`;
  if (job.id?.startsWith(prefix)) {
    const due = Number(job.id.slice(prefix.length));
    if (Number.isSafeInteger(due) && due > 0) return due;
  }
  return job.timestamp + (job.delay ?? 0);
}

/** The event types that can end a firing's turn (`turnEnd`). */
const TURN_END_TYPES = ['session.status_completed', 'session.status_failed', 'session.status_canceled', 'session.status_idle'] as const;

/** Whether an event ends the firing's turn, and how. `requires_action` is a Run boundary, not the end. */
export function turnEnd(type: string, payload: unknown): { outcome: FiringOutcome; stop: string } | null {
  if (type === 'session.status_completed') return { outcome: 'succeeded', stop: 'completed' };
  if (type === 'session.status_failed') return { outcome: 'failed', stop: 'failed' };
  if (type === 'session.status_canceled') return { outcome: 'canceled', stop: 'canceled' };
  if (type !== 'session.status_idle') return null;
  const sr = (payload as { stop_reason?: { type?: unknown } } | null)?.stop_reason?.type;
  const stop = typeof sr === 'string' ? sr : 'unknown';
  if (stop === 'requires_action') return null;
  if (stop === 'end_turn') return { outcome: 'succeeded', stop };
  if (stop === 'interrupted' || stop === 'canceled') return { outcome: 'canceled', stop };
  return { outcome: 'failed', stop };
}
