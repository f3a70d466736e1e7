import type { TokenUsage } from '@agentplane/protocol';
import type { StoredDoc } from '@agentplane/store';

export type ProposalStatus =
  | 'authoring' | 'drafted' | 'authoring_failed' | 'verifying' | 'verified' | 'verification_failed' | 'submitting' | 'submitted' | 'discarded';

export type ProposalError = 'input_session_unavailable' | 'input_sessions_too_large' | 'authoring_failed' | 'internal';

export interface VerificationResult {
  /** The grader's last evaluation: `satisfied`, `needs_revision` or `failed` (also when the attempt's turn failed before grading). */
  verdict: string;
  explanation: string | null;
  cost_tokens: number;
  completed_at: string;
}

export interface VerificationRecord {
  session: string;
  started_at: string;
  launched_at: string | null;
  source_version: number;
  principal: string;
  result: VerificationResult | null;
}

export interface SubmissionAttempt {
  source_version: number;
  skill_source: string;
  acted_as: string;
  branch: string;
  base_commit_sha: string;
  base_content_sha256: string;
  expected_base_digest: string | null;
  prepared_commit_sha: string;
  started_at: string;
}

/** Stored SkillProposal (`{w:<ws>}:doc:<skp_>`); internal fields start with `_`. */
export interface SkillProposalDoc extends StoredDoc {
  type: 'skill_proposal';
  workspace_id: string;
  status: ProposalStatus;
  source_session_ids: string[];
  agent: string;
  model_routing_profile_key: string;
  instructions: string | null;
  skill?: { name: string; description: string; kind: 'instructional'; entry: string; content_sha256: string };
  verification_material?: { task: string; rubric: string };
  verifications: VerificationRecord[];
  submission?: { skill_source: string; branch: string; commit_sha: string; submitted_at: string };
  adoption?: { skill_id: string; skill_version: number; observed_at: string };
  error?: ProposalError;
  usage: TokenUsage;
  submission_attempt?: SubmissionAttempt;
  /** The requested skill name (`skill_name`), if any. */
  _skill_name: string | null;
  /** The drafted `SKILL.md` (the single file of the skill). */
  _content?: string;
  /** The environment of the first source Session: verification Sessions run in it. */
  _environment_id: string;
  /** How far the verification watcher read the attempt's Session log. */
  _through?: number;
}

export const PAST_AUTHORING: ReadonlySet<ProposalStatus> = new Set(['drafted', 'verifying', 'verified', 'verification_failed', 'submitting', 'submitted']);
const VERIFICATION_STATES: ReadonlySet<ProposalStatus> = new Set(['verifying', 'verified', 'verification_failed']);

/**
 * The resource's six consistency rules, checked before every write (a violation is a bug, never
 * stored). `discarded` keeps what the proposal had when it was discarded.
 */
export function consistencyViolation(p: SkillProposalDoc): string | null {
  const drafted = p.skill !== undefined && p.verification_material !== undefined;
  if ((p.skill === undefined) !== (p.verification_material === undefined)) return 'skill and verification_material appear together';
  // 1. error exactly when authoring failed.
  const failed = p.status === 'authoring_failed' || (p.status === 'discarded' && !drafted && p.error !== undefined);
  if ((p.error !== undefined) !== failed) return 'error is present exactly when authoring failed';
  // 2. skill and verification_material exactly past authoring.
  if (PAST_AUTHORING.has(p.status) && !drafted) return `status ${p.status} needs skill and verification_material`;
  if ((p.status === 'authoring' || p.status === 'authoring_failed') && drafted) return `status ${p.status} has no skill yet`;
  // 3. a pending submission while submitting (may stay after submission).
  if (p.status === 'submitting' && !p.submission_attempt) return 'submitting needs submission_attempt';
  if (p.submission_attempt && p.status !== 'submitting' && p.status !== 'submitted') return 'submission_attempt outside submitting/submitted';
  // 4. submission exactly when submitted.
  if ((p.submission !== undefined) !== (p.status === 'submitted')) return 'submission is present exactly when submitted';
  // 5. adoption only after submission.
  if (p.adoption !== undefined && p.status !== 'submitted') return 'adoption only after submission';
  // 6. verification states only with a recorded attempt.
  if (VERIFICATION_STATES.has(p.status) && p.verifications.length === 0) return `status ${p.status} needs a recorded verification attempt`;
  if (p.status === 'verifying' && p.verifications.at(-1)?.result !== null) return 'verifying needs an attempt in progress';
  if ((p.status === 'verified' || p.status === 'verification_failed') && !p.verifications.at(-1)?.result) return `status ${p.status} needs the attempt's result`;
  if (p.status === 'verified' && p.verifications.at(-1)?.result?.verdict !== 'satisfied') return 'verified needs a satisfied verdict';
  return null;
}

/** The SkillProposal on the wire: exactly the contract's fields, absent ones left out. */
export function publicProposal(p: SkillProposalDoc): Record<string, unknown> {
  return {
    id: p.id, status: p.status, source_session_ids: p.source_session_ids, agent: p.agent, model_routing_profile_key: p.model_routing_profile_key,
    instructions: p.instructions,
    ...(p.skill ? { skill: p.skill } : {}),
    ...(p.verification_material ? { verification_material: p.verification_material } : {}),
    verifications: p.verifications,
    ...(p.submission ? { submission: p.submission } : {}),
    ...(p.adoption ? { adoption: p.adoption } : {}),
    ...(p.error ? { error: p.error } : {}),
    usage: p.usage,
    created_at: p.created_at, updated_at: p.updated_at, version: p.version,
    ...(p.submission_attempt ? { submission_attempt: p.submission_attempt } : {}),
  };
}
