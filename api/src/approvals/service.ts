import { ApiError, crashPoint, newId, nowIso, type Context, type Logger } from '@agentplane/core';
import type { DelayedJobs } from '@agentplane/lease';
import { keys, PRODUCER_KEY_TTL_MS, tags, type AppendResult, type DocumentStore, type Redis, type StoredDoc } from '@agentplane/store';
import type { AuditActor, AuditLog } from '../audit/store.js';
import type { PolicyStore } from '../governance/policies.js';
import type { ToolKind } from '../governance/policy-eval.js';
import type { WaitKind } from '@agentplane/domain';
import type { SessionStore } from '@agentplane/domain';
import type { TurnScheduler } from '@agentplane/domain';
import { notCovered } from './coverage.js';
import { RunAuthors } from './run-authors.js';

export const APPROVAL_STATUSES = ['pending', 'approved', 'denied', 'expired'] as const;
export type ApprovalStatus = (typeof APPROVAL_STATUSES)[number];

/** One `require_approval` decision on one tool use of a Run, waiting for (or holding) its answer. */
export interface ActionApproval extends StoredDoc {
  type: 'action_approval';
  workspace_id: string;
  session_id: string;
  session_thread_id: string;
  run_id: string;
  tool_use_id: string;
  tool: { kind: ToolKind; name: string; connection_id: string | null };
  /** The tool use's input, as the model asked for it (what the approver decides on). */
  input: unknown;
  /** The Principals the call was made for (the authors of the Run's input messages). */
  principal_ids: string[];
  /** The `require_approval` ActionPolicy that asked for it. */
  rule_id: string | null;
  status: ApprovalStatus;
  expires_at: string;
  resolved_at: string | null;
  resolved_by: AuditActor | null;
  reason: string | null;
}

export const APPROVALS = 'action_approvals';

/** The `session.action_approval_requested` event of an approval (appended once, by producer key). */
const requestedEvent = (a: ActionApproval) => ({
  type: 'session.action_approval_requested', session_thread_id: a.session_thread_id, producer_key: `approval:${a.id}:requested`,
  payload: { approval_id: a.id, tool_use_id: a.tool_use_id, tool: { kind: a.tool.kind, name: a.tool.name }, rule_id: a.rule_id, expires_at: a.expires_at },
});
export const bySession = (sessionId: string): string => `action_approvals:session:${sessionId}`;
/** `ap:{s:<sess>}:approvals`: tool_use_id → approval id (one approval per tool use). */
const toolUseKey = (sessionId: string): string => keys.scoped(tags.session(sessionId), 'approvals');

export interface ApprovalJob extends Record<string, unknown> {
  workspace_id: string;
  approval_id: string;
}

export interface ApprovalConfig {
  /** Expiry of an approval whose rule sets none. */
  defaultExpirySeconds: number;
  /** Upper bound of any approval's expiry (a rule's own value is clamped to it). */
  maxExpirySeconds: number;
}

/** The lease a tool use is checked for (from the lease record). */
export interface ToolUseContext {
  workspace_id: string;
  session_id: string;
  thread_id: string;
  run_id: string;
  runner_id: string;
  /** The trace context of the runner's check (the parent of the approval's spans). */
  trace?: Context | undefined;
}

export interface ToolUseCheck {
  tool_use_id: string;
  tool: { kind: 'builtin' | 'custom' | 'mcp'; name: string; connection_id?: string | undefined };
  input: unknown;
}

export interface ToolUseDecision {
  decision: 'allow' | 'deny' | 'require_approval';
  rule_id: string | null;
  message: string;
}

const PLATFORM: AuditActor = { id: 'platform', credential_id: null };

/**
 * ActionApprovals: a `require_approval` decision at the tool-call boundary becomes one approval
 * per tool use; the tool use waits (a thread wait of kind `approval`) until a Principal or key
 * with `approve` resolves it, or it expires (a BullMQ delayed job). Resolving answers the wait,
 * which continues the turn; the next check of the use reads the approval (approved → allow,
 * denied or expired → deny). docs/GOVERNANCE.md, "ActionApprovals".
 */
export class ApprovalService {
  readonly authors: RunAuthors;

  constructor(private readonly d: {
    redis: Redis;
    docs: DocumentStore;
    audit: AuditLog;
    policies: PolicyStore;
    sessions: SessionStore;
    scheduler: () => TurnScheduler;
    jobs: DelayedJobs<ApprovalJob>;
    config: ApprovalConfig;
    log: Logger;
  }) {
    this.authors = new RunAuthors(d.sessions);
  }

  /** Handle due expiry jobs in this process. */
  startExpiry(): void {
    this.d.jobs.work(
      (job) => this.expire(job.workspace_id, job.approval_id),
      (err) => this.d.log.warn({ err: err.message }, 'approval expiry worker error'),
    );
  }

  async close(): Promise<void> {
    await this.d.jobs.close();
  }

  async get(ws: string, id: string): Promise<ActionApproval> {
    const doc = await this.d.docs.get<ActionApproval>(tags.workspace(ws), id);
    if (!doc || doc.type !== 'action_approval' || doc.workspace_id !== ws) throw new ApiError('validation.not_found', `action approval ${id} not found`);
    return doc;
  }

  /** The approval of one tool use of a Session, if one was requested. */
  async forToolUse(ws: string, sessionId: string, toolUseId: string): Promise<ActionApproval | null> {
    const id = await this.d.redis.hget(toolUseKey(sessionId), toolUseId);
    if (!id) return null;
    // The claim precedes the document by one write: a concurrent check may see the claim first.
    for (let i = 0; i < 40; i++) {
      const doc = await this.d.docs.get<ActionApproval>(tags.workspace(ws), id);
      if (doc) return doc;
      await new Promise((r) => setTimeout(r, 25));
    }
    return null;
  }

  /**
   * The tool-call boundary inside Runs: the Workspace's ActionPolicies for the Run's author
   * Principals (the strictest decision wins), combined with the use's approval, if any.
   */
  async checkToolUse(ctx: ToolUseContext, q: ToolUseCheck): Promise<ToolUseDecision> {
    const existing = await this.forToolUse(ctx.workspace_id, ctx.session_id, q.tool_use_id);
    if (existing?.status === 'denied' || existing?.status === 'expired') {
      // The refusal of the call is a decision of its own, recorded as such.
      await this.d.policies.recordSettled(ctx.workspace_id, existing, { id: ctx.run_id, credential_id: ctx.runner_id }, ctx.session_id);
      if (existing.status === 'denied') {
        const by = existing.resolved_by?.id ?? 'an approver';
        return { decision: 'deny', rule_id: existing.rule_id, message: `ActionApproval ${existing.id} was denied by ${by}${existing.reason ? `: ${existing.reason}` : ''}` };
      }
      return { decision: 'deny', rule_id: existing.rule_id, message: `ActionApproval ${existing.id} expired at ${existing.expires_at} without a decision` };
    }
    let principals: string[];
    try {
      principals = await this.authors.of(ctx.session_id, ctx.run_id);
    } catch (err) {
      // Without its authors the Principal-scoped rules cannot be applied: fail closed.
      this.d.log.error({ err, run: ctx.run_id }, 'could not read the Run author Principals; denying');
      return { decision: 'deny', rule_id: null, message: "the Run's author Principals could not be determined, so its ActionPolicies cannot be applied; denied (fail closed)" };
    }
    // The approval of a tool use covers that very call (same tool and input), for the Run that
    // asked or the one that continues after the use's wait; never another call under the same
    // tool use id, nor a later Run of the Session.
    const covered = existing ? await notCovered(this.d, existing, ctx.run_id, q.tool, q.input) : null;
    // The authors are read above whatever the rules (the approval names them): each is decided.
    const decision = await this.d.policies.decideForPrincipals(
      ctx.workspace_id, { kind: q.tool.kind, name: q.tool.name, connection_id: q.tool.connection_id, input: q.input }, principals,
      { actor: { id: ctx.run_id, credential_id: ctx.runner_id }, target: ctx.session_id, ...(existing?.status === 'approved' && covered === null ? { settledApproval: 'approved' as const } : {}) },
    );
    if (decision.decision === 'deny') return { decision: 'deny', rule_id: decision.rule_id, message: decision.explanation };
    if (existing?.status === 'approved' && covered === null) {
      return { decision: 'allow', rule_id: existing.rule_id, message: `approved in ActionApproval ${existing.id} by ${existing.resolved_by?.id ?? 'an approver'}` };
    }
    if (existing && covered !== null && decision.decision === 'require_approval') {
      return { decision: 'deny', rule_id: decision.rule_id, message: `${decision.explanation}; ActionApproval ${existing.id} of ${q.tool_use_id} does not cover this call: ${covered}` };
    }
    if (decision.decision === 'require_approval') {
      // An approval already written may lack what follows its write (its process died there):
      // the check of its use, asked again, completes it.
      if (existing?.status === 'pending') await this.announce(existing, ctx);
      const a = existing ?? (await this.request(ctx, q, principals, decision.rule_id));
      if (a.status !== 'pending') return this.checkToolUse(ctx, q);
      return { decision: 'require_approval', rule_id: decision.rule_id, message: `${decision.explanation}; waiting for ActionApproval ${a.id} (expires ${a.expires_at})` };
    }
    return { decision: 'allow', rule_id: decision.rule_id, message: decision.explanation };
  }

  /**
   * Creates the approval of a tool use (once: a concurrent second request gets the first). The
   * tool use's claim names the approval's id first; a claim whose holder died before it wrote the
   * approval is written now, under the id it names (a holder that was only slow finds it written).
   */
  private async request(ctx: ToolUseContext, q: ToolUseCheck, principals: string[], ruleId: string | null): Promise<ActionApproval> {
    let id = newId('approval');
    const claimed = await this.d.redis.hsetnx(toolUseKey(ctx.session_id), q.tool_use_id, id);
    if (!claimed) {
      const first = await this.forToolUse(ctx.workspace_id, ctx.session_id, q.tool_use_id);
      if (first) return first;
      const held = await this.d.redis.hget(toolUseKey(ctx.session_id), q.tool_use_id);
      if (!held) throw new ApiError('runtime.internal', `the approval of ${q.tool_use_id} is claimed but absent`);
      id = held;
    }
    let expiry = this.d.config.defaultExpirySeconds;
    if (ruleId) {
      const rule = await this.d.policies.get(ctx.workspace_id, ruleId).catch(() => null);
      if (rule?.approval_expires_in_seconds) expiry = rule.approval_expires_in_seconds;
    }
    expiry = Math.min(expiry, this.d.config.maxExpirySeconds);
    const now = Date.now();
    const doc: ActionApproval = {
      id, type: 'action_approval', workspace_id: ctx.workspace_id, session_id: ctx.session_id, session_thread_id: ctx.thread_id,
      run_id: ctx.run_id, tool_use_id: q.tool_use_id,
      tool: { kind: q.tool.kind, name: q.tool.name, connection_id: q.tool.connection_id ?? null },
      input: q.input ?? null, principal_ids: principals, rule_id: ruleId, status: 'pending',
      expires_at: new Date(now + expiry * 1000).toISOString(), resolved_at: null, resolved_by: null, reason: null,
      version: 1, created_at: new Date(now).toISOString(), updated_at: new Date(now).toISOString(),
    };
    // The expiry job before the approval: a written approval always has one (a job whose approval
    // was never written finds nothing to expire).
    await this.scheduleExpiry(doc);
    if (!(await this.d.docs.create(tags.workspace(ctx.workspace_id), doc, [APPROVALS, bySession(ctx.session_id)]))) {
      const written = await this.forToolUse(ctx.workspace_id, ctx.session_id, q.tool_use_id);
      if (!written) throw new ApiError('runtime.internal', `the approval of ${q.tool_use_id} is claimed but absent`);
      return written;
    }
    crashPoint('approval-written');
    await this.announce(doc, ctx);
    return doc;
  }

  private async scheduleExpiry(a: ActionApproval): Promise<void> {
    await this.d.jobs.schedule(a.id, Date.parse(a.expires_at), { workspace_id: a.workspace_id, approval_id: a.id });
  }

  /**
   * What follows a pending approval's write, idempotently: its expiry job (scheduled once per
   * id), its `session.action_approval_requested` event (once, by producer key) and, with that
   * event's first append, its audit record.
   */
  private async announce(a: ActionApproval, ctx: ToolUseContext): Promise<void> {
    await this.scheduleExpiry(a);
    const r = await this.d.sessions.log.append(a.session_id, [requestedEvent(a)], { trace: ctx.trace });
    await this.recordRequested(a, r, ctx.runner_id);
  }

  /** The `action_approval.requested` audit record, when `r` (an append) wrote the request event first. */
  private async recordRequested(a: ActionApproval, r: AppendResult, credentialId: string | null): Promise<void> {
    if (r.ok && !r.events.some((e, i) => e.type === 'session.action_approval_requested' && r.duplicate[i] === false)) return;
    await this.record(a.workspace_id, { id: a.principal_ids[0] ?? a.run_id, credential_id: credentialId }, 'action_approval.requested', a.id, 'requested', a.rule_id);
  }

  /**
   * `approve` / `deny` from a Principal or key: pending → approved | denied, once (compare-and-
   * swap; `expectedVersion` makes a stale view 409 `validation.conflict`). An approval that is no
   * longer pending (resolved, expired, or past its expiry) is 409 `runtime.invalid_transition`.
   */
  async resolve(
    ws: string, id: string, verdict: 'approve' | 'deny',
    opts: { expectedVersion?: number | undefined; reason?: string | null | undefined; /** The resolving request's trace context. */ trace?: Context | undefined },
    actor: AuditActor,
  ): Promise<ActionApproval> {
    const current = await this.get(ws, id);
    const session = await this.d.sessions.get(ws, current.session_id);
    if (current.status === 'pending' && session.archived_at !== null) {
      throw new ApiError('runtime.invalid_transition', `the session ${session.id} is archived: it takes no new work, so its approvals can no longer be resolved`);
    }
    if (current.status === 'pending' && Date.parse(current.expires_at) <= Date.now()) {
      await this.expire(ws, id);
      throw new ApiError('runtime.invalid_transition', `action approval ${id} expired at ${current.expires_at}; it can no longer be resolved`);
    }
    // A tool use whose wait was ended (its turn interrupted, its thread terminated) never runs:
    // the approval lapses instead of recording a resolution for a call that cannot happen. (A
    // wait not registered yet, the Run that asked still reporting its waits, is not ended.)
    if (current.status === 'pending') {
      const thread = await this.d.sessions.thread(current.session_id, current.session_thread_id).catch(() => null);
      const wait = thread?._waits[current.tool_use_id];
      if (thread && (thread.status === 'terminated' || (wait !== undefined && wait.generation !== thread._wait_generation))) {
        await this.expire(ws, id);
        throw new ApiError('runtime.invalid_transition', `the wait of ${current.tool_use_id} was ended (its turn was interrupted): action approval ${id} lapsed and can no longer be resolved`);
      }
    }
    let settled: ActionApproval | null = null;
    let lapsed = false;
    const next = await this.d.docs.update<ActionApproval>(tags.workspace(ws), id, (a) => {
      if (a.status !== 'pending') {
        settled = a;
        throw new ApiError('runtime.invalid_transition', `action approval ${id} is already ${a.status}; it can be resolved once`);
      }
      // Checked again in the compare-and-swap: a request slow to get here does not resolve an
      // approval past its expiry.
      if (Date.parse(a.expires_at) <= Date.now()) {
        lapsed = true;
        throw new ApiError('runtime.invalid_transition', `action approval ${id} expired at ${a.expires_at}; it can no longer be resolved`);
      }
      return { ...a, status: verdict === 'approve' ? 'approved' : 'denied', resolved_at: nowIso(), resolved_by: actor, reason: opts.reason ?? null };
    }, { expectedVersion: opts.expectedVersion, notFound: 'action approval', current }).catch(async (err: unknown) => {
      // Resolved already, perhaps by a request whose process died before it settled: settling is
      // idempotent, so the refused retry finishes that work (the wait answered, the turn on) first.
      if (settled !== null) await this.settle(settled, opts.trace);
      if (lapsed) await this.expire(ws, id);
      throw err;
    });
    crashPoint('approval-resolved');
    await this.settle(next, opts.trace);
    return next;
  }

  /**
   * The waits of these tool uses were ended (their turn interrupted, their thread terminated):
   * their approvals lapse now (pending → expired, the event appended, the expiry recorded), not
   * at their expiry or at the next try to resolve them.
   */
  async lapse(ws: string, sessionId: string, toolUseIds: readonly string[]): Promise<void> {
    for (const toolUseId of toolUseIds) {
      const a = await this.forToolUse(ws, sessionId, toolUseId);
      if (a?.status === 'pending') await this.expire(ws, a.id);
    }
  }

  /** The expiry job: pending → expired (anything else is left as it is). */
  async expire(ws: string, id: string): Promise<void> {
    const doc = await this.d.docs.get<ActionApproval>(tags.workspace(ws), id);
    if (!doc || doc.type !== 'action_approval') return;
    let moved = false;
    const next = await this.d.docs.update<ActionApproval>(tags.workspace(ws), id, (a) => {
      moved = false;
      if (a.status !== 'pending') return null;
      moved = true;
      return { ...a, status: 'expired', resolved_at: nowIso() };
    }, { notFound: 'action approval', current: doc });
    if (!moved) return;
    await this.record(ws, PLATFORM, 'action_approval.expired', id, 'expired', next.rule_id);
    await this.settle(next);
  }

  /**
   * A resolved approval answers its tool use's wait: the resolution event is appended (once, by
   * producer key) and the wait marked answered and reported to the scheduler, which continues the
   * turn when it was the last open wait of the thread's generation. Idempotent: called after every
   * resolution and again after the Run that asked registers its waits (the approval may be
   * resolved before the Run ended).
   */
  async settle(a: ActionApproval, trace?: Context): Promise<void> {
    if (a.status === 'pending') return;
    const type = a.status === 'expired' ? 'session.action_approval_expired' : 'session.action_approval_resolved';
    // The request event goes first (a no-op once appended, while its producer key is remembered):
    // an approval whose requesting process died before announcing it still has its request in the
    // log before its resolution. An approval older than a day short of that memory was announced
    // long ago, or never will be: its request is not appended again.
    const recent = Date.now() - Date.parse(a.created_at) < PRODUCER_KEY_TTL_MS - 24 * 3600 * 1000;
    const r = await this.d.sessions.log.append(a.session_id, [...(recent ? [requestedEvent(a)] : []), {
      type, session_thread_id: a.session_thread_id, producer_key: `approval:${a.id}:${a.status}`,
      payload: {
        approval_id: a.id, tool_use_id: a.tool_use_id, status: a.status,
        ...(a.status === 'expired' ? { expires_at: a.expires_at } : { resolved_by: a.resolved_by?.id ?? null, reason: a.reason }),
      },
    }], { trace });
    if (!r.ok) return; // the Session was deleted: nothing waits any more
    await this.recordRequested(a, r, null);
    const event = r.events.find((e) => e.type === type);
    if (!event) return; // its body fell out of retention: the wait was answered long ago
    // The generation of the use's wait when it is the thread's current one and waits for this approval.
    const ours: { generation: number | null } = { generation: null };
    const gone = (err: unknown) => {
      if (err instanceof ApiError && err.type === 'validation.not_found') return null;
      throw err;
    };
    const thread = await this.d.sessions.updateThread(a.session_id, a.session_thread_id, (t) => {
      const w = t._waits[a.tool_use_id];
      ours.generation = w && w.generation === t._wait_generation && w.kind === 'approval' ? w.generation : null;
      if (!w || w.answered_event_id !== null || ours.generation === null) return null;
      const waits = { ...t._waits, [a.tool_use_id]: { ...w, answered_event_id: event.id, answered_seq: event.seq, answer_fingerprint: null } };
      return { ...t, _waits: waits };
    }).catch(gone);
    // The use's wait, answered now or already (a settle cut off by a crash, done again), is
    // reported: the scheduler continues the turn when it was the last open wait of its generation
    // and the Session is not archived (an archived Session takes no new work: the wait is
    // answered, but no turn continues), once (its start is a compare-and-swap from the waiting Run).
    if (!thread || ours.generation === null) return;
    await this.d.scheduler().waitsResolved(a.session_id, a.session_thread_id, thread._active_run_id, ours.generation).catch(gone);
  }

  /** Session delete: its approvals (which hold tool inputs) are removed with it; retry-safe. */
  async eraseSession(ws: string, sessionId: string): Promise<void> {
    const tag = tags.workspace(ws);
    const ids = await this.d.redis.zrange(keys.index(tag, bySession(sessionId)), 0, -1);
    for (let i = 0; i < ids.length; i += 500) {
      const m = this.d.redis.multi();
      for (const id of ids.slice(i, i + 500)) m.del(keys.doc(tag, id)).zrem(keys.index(tag, APPROVALS), id);
      await m.exec();
    }
    await this.d.redis.del(keys.index(tag, bySession(sessionId)));
    await this.d.redis.del(toolUseKey(sessionId));
  }

  /**
   * Waits a Run reported: a use whose approval is pending, or that this very Run opened, waits
   * for the approval (kind `approval`), not for a drive event. A use a later Run reports blocking
   * after its approval was resolved waits for what its tool asks (an `always_ask` confirmation,
   * a custom tool's result).
   */
  async waitKinds(ws: string, sessionId: string, runId: string, waits: { tool_use_id: string; kind: WaitKind }[]): Promise<{ tool_use_id: string; kind: WaitKind }[]> {
    if (waits.length === 0) return waits;
    const ids = await this.d.redis.hmget(toolUseKey(sessionId), ...waits.map((w) => w.tool_use_id));
    const found = ids.filter((x): x is string => x !== null);
    if (found.length === 0) return waits;
    const docs = new Map((await this.d.docs.getMany<ActionApproval>(tags.workspace(ws), found)).map((a) => [a.id, a]));
    return waits.map((w, i) => {
      const a = ids[i] ? docs.get(ids[i] as string) : undefined;
      return a && (a.status === 'pending' || a.run_id === runId) ? { ...w, kind: 'approval' as const } : w;
    });
  }

  /** After a Run's waits are registered: approvals resolved meanwhile answer them now. */
  async settleWaits(ws: string, sessionId: string, waits: { tool_use_id: string; kind: WaitKind }[]): Promise<void> {
    for (const w of waits) {
      if (w.kind !== 'approval') continue;
      const a = await this.forToolUse(ws, sessionId, w.tool_use_id);
      if (a && a.status !== 'pending') await this.settle(a);
    }
  }

  private async record(ws: string, actor: AuditActor, action: string, target: string, outcome: 'requested' | 'expired', detail: string | null): Promise<void> {
    try {
      await this.d.audit.append(ws, { actor, action, target, outcome, status: null, detail, request_id: null });
    } catch (err) {
      this.d.log.error({ err, workspace: ws, approval: target }, 'audit append of an approval failed');
    }
  }
}
