import { keys, tags } from '@agentplane/store';
import type { SessionService } from '../sessions/service.js';
import { readOutcome, type SessionDoc, type SessionTombstone } from '@agentplane/domain';
import { FEEDBACK_DISPOSITIONS, TERMINAL_FIRING, type FeedbackDoc, type FiringDoc } from './model.js';

const n = (c: Record<string, string>, k: string): number => Number(c[k] ?? 0);

/**
 * The AutomationFiringTrace: a joined, content-free view of one firing, built from its receipt
 * and its Session's log metadata (counters, sequence numbers, stop reasons). Nothing of the
 * prompt, messages, tool payloads or model output is read into it.
 */
export async function buildTrace(f: FiringDoc, sessions: SessionService, feedback: FeedbackDoc[]): Promise<Record<string, unknown>> {
  const by = Object.fromEntries(FEEDBACK_DISPOSITIONS.map((d) => [d, 0])) as Record<string, number>;
  for (const l of feedback) by[l.disposition] = (by[l.disposition] ?? 0) + 1;

  let session: SessionDoc | SessionTombstone | null = null;
  if (f.session_id) session = await sessions.store.docs.get<SessionDoc | SessionTombstone>(tags.session(f.session_id), f.session_id);
  const live = session && session.type === 'session' ? session : null;
  const state = f.session_id ? await sessions.store.log.state(f.session_id) : null;
  const counters = live && f.session_id ? await sessions.store.log.counters(f.session_id) : {};
  const usage = live ? ((await sessions.view(live)).usage as Record<string, number>) : {};
  const u = (k: string): number => Number(usage[k] ?? 0);
  const evaluations = (live?.outcome_evaluations ?? []) as { outcome_id?: string }[];
  const lastOutcomeId = [...evaluations].reverse().find((e) => typeof e.outcome_id === 'string')?.outcome_id;
  const outcome = live && f.session_id && lastOutcomeId ? await readOutcome(sessions.store, f.session_id, lastOutcomeId) : null;
  const childThreads = live && f.session_id ? Math.max(0, (await sessions.store.redis.zcard(keys.index(tags.session(f.session_id), 'threads'))) - 1) : 0;

  let completeness: string;
  if (!f.session_id) completeness = TERMINAL_FIRING.has(f.status) ? 'complete' : 'open';
  else if (!session) completeness = 'expired';
  else if (session.type !== 'session' || state?.erased) completeness = 'erased';
  else if (f.status === 'running' || f.status === 'pending') completeness = 'open';
  else if ((state?.low ?? 1) > 1) completeness = 'truncated';
  else completeness = 'complete';
  const through = completeness === 'erased' || completeness === 'expired' ? f.through_sequence : (state?.seq ?? 0);

  const ran = f.session_id !== null;
  return {
    authority: 'firing_receipt_and_session_event_log',
    firing: {
      id: f.id, workspace_id: f.workspace_id, automation_id: f.automation_id, source: f.source, attempt_count: f.attempt_count,
      created_at: f.created_at, updated_at: f.updated_at, status: f.status, outcome: f.outcome, session_id: f.session_id, run_id: f.run_id, error: f.error,
    },
    filtering: f._filtering ? { applicable: true, event_type: f._filtering.event_type, filters_applied: f._filtering.filters, matched: true } : { applicable: false },
    steps: live
      ? {
          applicable: true, event_count: n(counters, 's.events'), user_message_count: n(counters, 's.events.user.message'),
          agent_message_count: n(counters, 's.events.agent.message'), tool_use_count: n(counters, 's.events.agent.tool_use'),
          tool_result_count: n(counters, 's.events.agent.tool_result'), turn_end_count: n(counters, 's.events.session.status_idle'),
        }
      : { applicable: false },
    children: live ? { applicable: true, thread_count: childThreads } : { applicable: false },
    execution: ran
      ? {
          applicable: true, session_id: f.session_id, run_id: f.run_id, started_at: f.started_at, ended_at: f.ended_at,
          duration_ms: f.started_at && f.ended_at ? Date.parse(f.ended_at) - Date.parse(f.started_at) : null, stop_reason: f.stop_reason,
        }
      : { applicable: false },
    delivery: { applicable: false },
    outcome_attempts: f.attempt_count > 0
      ? { applicable: true, attempt_count: f.attempt_count, attempts: f._attempts.map((a, i) => ({ attempt: i + 1, at: a.at, error: a.error })) }
      : { applicable: false },
    admission: {
      disposition: f.admission.disposition,
      check_configured: f.admission.check_configured,
      check_usage: {
        input_tokens: u('input_tokens'), cached_input_tokens: u('cache_read_input_tokens'), cache_write_input_tokens: u('cache_creation_input_tokens'),
        output_tokens: u('output_tokens'), reasoning_output_tokens: 0,
        total_tokens: u('input_tokens') + u('output_tokens') + u('cache_read_input_tokens') + u('cache_creation_input_tokens'),
      },
    },
    // The Session's latest outcome, as the platform Outcome grader recorded it (docs/OUTCOMES.md).
    outcome: {
      outcome_id: outcome?.id ?? null, result: outcome?.result ?? null,
      evaluation_count: outcome ? outcome.evaluation_count : evaluations.length, revision_count: outcome?.revision_count ?? 0,
      report: { status: 'not_requested', output_count: 0, accepted_count: 0 },
    },
    feedback: { total: feedback.length, by_disposition: by },
    completeness: { status: completeness, through_sequence: through },
  };
}
