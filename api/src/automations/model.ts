import type { StoredDoc } from '@agentplane/store';

/** How an Automation fires (docs/AUTOMATIONS.md). */
export type ScheduleTrigger =
  | { type: 'schedule'; cron: string; timezone: string; on_missed: MissedPolicy }
  | { type: 'schedule'; interval_seconds: number; on_missed: MissedPolicy };
export type WebhookTrigger = { type: 'webhook' };
/** Platform events an Automation can subscribe to (docs/AUTOMATIONS.md, "Subscriptions"). */
export type SubscriptionTrigger =
  | { type: 'subscription'; event: 'session.turn_ended'; filter: { stop_reasons: string[]; agent_ids: string[] } }
  | { type: 'subscription'; event: 'webhook_endpoint.disabled'; filter: { webhook_endpoint_ids: string[] } };
export type Trigger = ScheduleTrigger | WebhookTrigger | SubscriptionTrigger;

/** What a schedule does about fires that fell due while the platform was down. */
export type MissedPolicy = 'fire_once' | 'skip';

export interface AutomationDoc extends StoredDoc {
  type: 'automation';
  workspace_id: string;
  name: string;
  status: 'active' | 'paused';
  /** The `service` Principal the Automation executes as. */
  principal_id: string;
  agent: { id: string; version: number | null };
  environment_id: string;
  prompt: string;
  budget: { max_list_cost: { amount: number; currency: 'USD' } } | null;
  max_concurrent_firings: number;
  trigger: Trigger;
  /** Webhook triggers: where deliveries go and the state of the signing secrets (never the secrets). */
  webhook: { ingest_path: string; secret_generation: number; previous_secret_expires_at: string | null } | null;
  /**
   * When the current schedule began (ms): set by a resume and by a change of the schedule's times.
   * A tick due before it belongs to an earlier schedule (queued before a pause, or under the old
   * times) and is dropped (docs/AUTOMATIONS.md, "Pause and resume"). Internal: never shown.
   */
  _schedule_since_ms?: number;
}

/** The times a schedule trigger fires at (what its Job Scheduler is made from), or null for other triggers. */
function scheduleTimes(t: Trigger): string | null {
  if (t.type !== 'schedule') return null;
  return 'cron' in t ? `cron ${t.cron} ${t.timezone}` : `every ${t.interval_seconds}`;
}

/**
 * The Automation as it is to be stored after `cur` became `next`: when `next` starts a schedule
 * anew (resumed, or its times changed while active), it records when, so ticks of the earlier
 * schedule still queued are dropped instead of firing beside the new one's.
 */
export function stampScheduleStart(cur: AutomationDoc, next: AutomationDoc, nowMs: number): AutomationDoc {
  const times = scheduleTimes(next.trigger);
  if (next.status !== 'active' || times === null) return next;
  const anew = cur.status !== 'active' || scheduleTimes(cur.trigger) !== times;
  return anew ? { ...next, _schedule_since_ms: nowMs } : next;
}

export type FiringSourceKind = 'manual' | 'schedule' | 'webhook' | 'subscription';

/**
 * AutomationFiring states: `pending` (receipt written; not yet admitted) → `running` (Session
 * created, its turn started) → `completed` (the turn ended; `outcome` says how). From `pending`:
 * `refused` (admission said no: budget, concurrency, governance, paused), `skipped` (a missed
 * schedule fire under `on_missed: skip`) or `failed` (could not start after its attempts).
 */
export type FiringStatus = 'pending' | 'running' | 'completed' | 'refused' | 'skipped' | 'failed';
export const TERMINAL_FIRING: ReadonlySet<FiringStatus> = new Set(['completed', 'refused', 'skipped', 'failed']);
export type FiringOutcome = 'succeeded' | 'failed' | 'canceled';

export type AdmissionDisposition =
  | 'pending' | 'admitted' | 'refused_budget' | 'refused_concurrency' | 'refused_governance' | 'refused_paused' | 'refused_loop' | 'not_applicable';

export interface FiringDoc extends StoredDoc {
  type: 'automation_firing';
  workspace_id: string;
  automation_id: string;
  source: { kind: FiringSourceKind; delivery_id?: string; scheduled_at?: string; event_type?: string; event_id?: string };
  status: FiringStatus;
  attempt_count: number;
  outcome: FiringOutcome | null;
  session_id: string | null;
  run_id: string | null;
  /** A short machine code (`budget.exceeded`, `concurrency_limit`, …): never content. */
  error: string | null;
  admission: { disposition: AdmissionDisposition; check_configured: boolean };
  started_at: string | null;
  ended_at: string | null;
  /** The last Session log sequence the outcome watcher read. */
  through_sequence: number;
  stop_reason: string | null;
  /** Subscriptions: which filters the event passed (names only). */
  _filtering?: { event_type: string; filters: string[] };
  /**
   * Subscriptions: the Automations whose firings made the Session whose turn fired this one, and
   * the Sessions before it, oldest first (absent: none did). Admission refuses a loop or a long chain.
   */
  _chain?: string[];
  /** The expanded prompt (kept private: never in a view or the trace). */
  _prompt: string;
  /** Attempt history (time and error code only). */
  _attempts: { at: string; error: string | null }[];
}

export const FEEDBACK_DISPOSITIONS = ['useful', 'noisy', 'incorrect', 'too_late', 'already_handled'] as const;
export type FeedbackDisposition = (typeof FEEDBACK_DISPOSITIONS)[number];

export interface FeedbackDoc extends StoredDoc {
  type: 'automation_firing_feedback';
  workspace_id: string;
  automation_id: string;
  firing_id: string;
  authored_by: string;
  disposition: FeedbackDisposition;
}

/** Listing collections in the Workspace's slot. */
export const AUTOMATIONS = 'automations';
export const firingsOf = (automationId: string): string => `automation_firings:${automationId}`;
export const feedbackOf = (firingId: string): string => `firing_feedback:${firingId}`;

export function publicAutomation(a: AutomationDoc): Record<string, unknown> {
  const { _schedule_since_ms: _s, ...rest } = a;
  return rest;
}

/** A feedback label as the contract's Firing feedback label lists its fields (no `type`). */
export function publicFeedback(l: FeedbackDoc): Record<string, unknown> {
  const { type: _t, ...rest } = l;
  return rest;
}

export function publicFiring(f: FiringDoc): Record<string, unknown> {
  const { _prompt: _p, _attempts: _a, through_sequence: _t, _filtering: _f, _chain: _c, ...rest } = f;
  return rest;
}
