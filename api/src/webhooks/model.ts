import type { StoredDoc } from '@agentplane/store';

/** An outbound webhook endpoint (`whe_`): where a Workspace's Session events are delivered, signed. */
export interface EndpointDoc extends StoredDoc {
  type: 'webhook_endpoint';
  workspace_id: string;
  url: string;
  description: string | null;
  /** Event types delivered (exact names); empty = every Session event. */
  event_types: string[];
  status: 'enabled' | 'disabled';
  /** Why a disabled endpoint is disabled: `operator` (by an update) or `delivery_failed` (a delivery exhausted its attempts). */
  disabled_reason: 'operator' | 'delivery_failed' | null;
  disabled_at: string | null;
  secret_generation: number;
  previous_secret_expires_at: string | null;
}

export const ENDPOINTS = 'webhook_endpoints';

export function publicEndpoint(e: EndpointDoc): Record<string, unknown> {
  return { ...e };
}

/** One line of an endpoint's delivery log. */
export interface DeliveryRecord {
  /** The `webhook-id` of the message (the event id; stable across retries). */
  message_id: string;
  event_type: string;
  session_id: string | null;
  seq: number;
  attempt: number;
  status_code: number;
  latency_ms: number;
  outcome: 'succeeded' | 'failed';
  error: string | null;
  /**
   * The wait a throttled answer (429 or 503) asked for with a valid `Retry-After`, in ms, capped
   * at one hour; the next attempt waited at least this long. Null otherwise.
   */
  retry_after_ms: number | null;
  test: boolean;
  at: string;
}
