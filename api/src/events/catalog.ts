import { DRIVE_EVENT_TYPES } from '../sessions/schemas.js';

/**
 * The catalog of Session event types (docs/API.md, "Events"): the drive events clients send, the
 * events the contract names as emitted, and the platform's own. Anything that filters by event
 * type (webhook endpoints' `event_types`) admits these names and no other.
 */
export const SESSION_EVENT_TYPES = [
  ...DRIVE_EVENT_TYPES,
  'agent.message', 'agent.thinking', 'agent.tool_use', 'agent.tool_result', 'agent.plan',
  'session.status_running', 'session.status_idle', 'session.status_completed', 'session.status_failed', 'session.status_canceled',
  'session.thread_status_rescheduled', 'session.thread_status_terminated', 'session.run_waiting',
  'session.action_approval_requested', 'session.action_approval_resolved', 'session.action_approval_expired',
  'session.outcome_started', 'session.outcome_evaluation_started', 'session.outcome_evaluation_ended', 'session.outcome_ended',
  'exec.tool_invocation',
] as const;
export type SessionEventType = (typeof SESSION_EVENT_TYPES)[number];

/** What a webhook endpoint may subscribe to: the Session events, and the synthetic `webhook.test`. */
export const WEBHOOK_EVENT_TYPES = [...SESSION_EVENT_TYPES, 'webhook.test'] as const;
