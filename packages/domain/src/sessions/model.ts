import type { StoredDoc } from '@agentplane/store';
import type { AgentSnapshot } from '../agents/model.js';
import type { DeploymentPin } from '../deployments/profiles.js';
import type { SpecSkill } from '../skills/model.js';

export type ThreadStatus = 'running' | 'idle' | 'rescheduling' | 'terminated';

export interface SessionResource extends StoredDoc {
  type: 'repository' | 'file' | 'memory' | 'uploaded_project';
  /** repository */
  url?: string;
  ref?: string | null;
  /** file */
  file_id?: string;
  /** memory */
  memory_store_id?: string;
  access?: 'read_only' | 'read_write';
  /** uploaded_project: the Project and the revision pinned when the resource was added. */
  project_id?: string;
  revision_number?: number;
  mount_path?: string | null;
}

export interface Budget {
  max_list_cost: { amount: number; currency: 'USD' };
}

/** Stored Session document (`ap:{s:<sess>}:doc:<sess>`). Internal fields start with `_`. */
export interface SessionDoc extends StoredDoc {
  type: 'session';
  workspace_id: string;
  agent: AgentSnapshot;
  environment_id: string;
  environment_version: number;
  title: string | null;
  budget: Budget | null;
  metadata: Record<string, string>;
  resources: SessionResource[];
  vault_ids: string[];
  outcome_evaluations: unknown[];
  archived_at: string | null;
  automation_id?: string;
  /** Set when the Session was created against an AgentDeployment: the revision it runs under (docs/DEPLOYMENTS.md). */
  agent_deployment?: DeploymentPin;
  /** A skill proposal's verification Session: the drafted skill its Runs place beside the Agent's (docs/SKILLS.md). */
  _skills?: SpecSkill[];
  _primary_thread_id: string;
  /**
   * A Session created with an Idempotency-Key (its id derived from the key): the create's request
   * fingerprint, which a retry under the key must match to be answered with this Session.
   */
  _keyed_fingerprint?: string;
  /**
   * Resources added with an Idempotency-Key (their ids derived from the key): each one's request
   * fingerprint, which a retry under the key must match to be answered with it.
   */
  _keyed_resources?: Record<string, string>;
}

/** What is left after DELETE: enough to answer `session_deleted` again and report the gap. */
export interface SessionTombstone extends StoredDoc {
  type: 'session_tombstone';
  workspace_id: string;
  erased_at: string;
  /** The erased Session's `_keyed_fingerprint`: a retry of its create is still told apart from another request under the key. */
  _keyed_fingerprint?: string;
}

/**
 * What answers a waiting tool use: a custom tool result, a confirmation, a question answer, or
 * (`approval`) the resolution of its ActionApproval, or (`delegation`) the control plane when a
 * coordinator's delegation tool use is done (docs/COORDINATION.md); neither is a drive event.
 */
export type WaitKind = 'custom_tool' | 'confirmation' | 'question' | 'approval' | 'delegation';

export interface PendingWait {
  generation: number;
  kind: WaitKind;
  /** The drive event that answered it (null while pending). */
  answered_event_id: string | null;
  answered_seq?: number;
  /** Canonical JSON of the answering payload, for exact-replay detection. */
  answer_fingerprint: string | null;
  /** A delegation tool use: what the coordinator asked (docs/COORDINATION.md). */
  delegation?: { tool: string; input: Record<string, unknown> };
}

/** Stored SessionThread document (`ap:{s:<sess>}:doc:<sthr>`). */
export interface ThreadDoc extends StoredDoc {
  type: 'session_thread';
  session_id: string;
  workspace_id: string;
  agent: AgentSnapshot;
  parent_thread_id: string | null;
  status: ThreadStatus;
  archived_at: string | null;
  /** Order of spawn: 0 for the primary thread. */
  _spawn: number;
  _active_run_id: string | null;
  /**
   * Written by earlier versions only: user.message ids queued in the document. Queued messages
   * now wait in the thread's input queue (`SessionStore.queuedInputs`); a turn start takes these first.
   */
  _queued_inputs?: string[];
  _wait_generation: number;
  _waits: Record<string, PendingWait>;
  _running_since_ms: number | null;
  _running_ms_total: number;
  _startup_ms: number | null;
  /** Set by archive: stats are reported from these frozen values. */
  _frozen_stats: ThreadStats | null;
  _stop_reason: unknown;
  /**
   * The Run whose turn end was the thread's last move (absent on documents of earlier
   * versions): a repeated end report of that Run re-runs the turn end's later steps (crash repair).
   */
  _ended_run_id?: string | null;
  /**
   * Set once the Session's terminal status event is written (`SessionStore.closeSettled`): the
   * thread starts no turn from then on, so that event stays the Session's last status event.
   */
  _closed?: boolean;
  /**
   * Set when the Session was archived while one of its turns was under way
   * (`SessionStore.closeSettled` found it busy): a turn's end reads it in the thread it writes,
   * whatever Session document it was handed, so it starts nothing more and closes the Session.
   */
  _archived?: boolean;
}

export interface ThreadStats {
  running_seconds: number | null;
  elapsed_seconds: number | null;
  startup_seconds: number | null;
}

/**
 * Run status machine (docs/RUNS.md): queued → (waiting ⇄ queued) → leased → running →
 * succeeded | failed | canceled; a lost lease or an infrastructure failure goes back to queued
 * (a new attempt) while attempts remain.
 */
export type RunStatus = 'queued' | 'waiting' | 'leased' | 'running' | 'succeeded' | 'failed' | 'canceled';

/** One lease of a Run: which runner held it and how it ended. */
export interface RunAttempt {
  attempt: number;
  lease_id: string;
  runner_id: string;
  leased_at: string;
  ended_at: string | null;
  outcome: 'running' | 'succeeded' | 'lost' | 'infrastructure_failure' | 'work_failure' | 'canceled' | null;
  cause: string | null;
}

/** Dispatch timestamps, so latency can be broken down from the Run itself. */
export interface RunTimestamps {
  accepted_at: string;
  enqueued_at: string | null;
  leased_at: string | null;
  started_at: string | null;
  first_event_at: string | null;
  ended_at: string | null;
}

/** One turn: an immutable Run derived from the Session's configuration at turn start. */
export interface RunDoc extends StoredDoc {
  type: 'run';
  session_id: string;
  workspace_id: string;
  session_thread_id: string;
  status: RunStatus;
  agent: AgentSnapshot;
  environment_id: string;
  environment_version: number;
  input_event_ids: string[];
  /** Set by the scheduler. */
  runner_pool_id?: string | null;
  attempts?: RunAttempt[];
  timestamps?: RunTimestamps;
  /** Why a queued Run is not leased yet (no runner, all busy, …). */
  waiting_reason?: string | null;
  stop_reason?: unknown;
  failure?: { class: string; code: string; message: string } | null;
  /** Answers of the previous Run's blocking tool uses (a continuation Run). */
  continues_run_id?: string | null;
  /** A grader Run (docs/OUTCOMES.md): which evaluation it performs; it runs no agent turn. */
  grader?: GraderRunInfo;
  /** What the grader Run's model step saw and answered, as its runner reported it. */
  grader_result?: GraderRunResult;
  /** The deployment revision the Run executes under (copied from its Session): pool and topology come from it. */
  agent_deployment?: DeploymentPin;
}

export interface GraderRunInfo {
  outcome_id: string;
  evaluation_id: string;
  iteration: number;
  routing_key: string;
}

export interface GraderRunResult {
  input: { system: string; messages: unknown[] };
  output: string;
  usage: Record<string, number> | null;
}

const sec = (ms: number) => Math.round(ms) / 1000;

export function threadStats(t: ThreadDoc, now = Date.now()): ThreadStats {
  if (t._frozen_stats) return t._frozen_stats;
  const live = t._running_since_ms !== null ? now - t._running_since_ms : 0;
  return {
    running_seconds: t._running_ms_total + live > 0 || t._running_since_ms !== null ? sec(t._running_ms_total + live) : null,
    elapsed_seconds: t._running_since_ms !== null ? sec(live) : null,
    startup_seconds: t._startup_ms !== null ? sec(t._startup_ms) : null,
  };
}

export interface Usage {
  input_tokens: number;
  output_tokens: number;
  cache_read_input_tokens: number;
  cache_creation_input_tokens: number;
}

export const USAGE_FIELDS: readonly (keyof Usage)[] = ['input_tokens', 'output_tokens', 'cache_read_input_tokens', 'cache_creation_input_tokens'];

export function usageFrom(counters: Record<string, string>, prefix: string): Usage {
  const out = {} as Usage;
  for (const f of USAGE_FIELDS) out[f] = Number(counters[`${prefix}usage.${f}`] ?? 0);
  return out;
}

export function sessionStats(counters: Record<string, string>): Record<string, number | string | null> {
  const n = (k: string) => Number(counters[`s.${k}`] ?? 0);
  return {
    events: n('events'),
    user_messages: n('events.user.message'),
    agent_messages: n('events.agent.message'),
    tool_uses: n('events.agent.tool_use'),
    last_event_at: counters.last_event_at ?? null,
  };
}

export function publicDoc<T extends object>(doc: T): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  for (const [k, v] of Object.entries(doc)) if (!k.startsWith('_')) out[k] = v;
  return out;
}
