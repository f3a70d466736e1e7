import { expect } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import type { TurnEvent } from './turns.js';

type Err = { error: { type: string; message: string } };
/** The wire error type and message of a refused response. */
export const errType = (r: { body: unknown }): string | undefined => (r.body as Err).error?.type;
export const errMsg = (r: { body: unknown }): string => (r.body as Err).error?.message ?? '';

/** A new person Principal in `workspaceId`, created with an organization-scoped client. */
export async function createPrincipal(root: HttpClient, workspaceId: string, name: string): Promise<string> {
  return (await root.with({ workspaceId }).post<{ id: string }>(`/v1/organizations/workspaces/${workspaceId}/principals`, {
    external_subject_id: `${name}-${Math.random()}`, principal_type: 'person', display_name: name,
  })).id;
}

/** A new access credential of a Principal (the secret is returned once). */
export async function createCredential(root: HttpClient, principalId: string, audience: 'api_mcp' | 'a2a' = 'api_mcp'): Promise<{ id: string; secret: string }> {
  return root.post<{ id: string; secret: string }>(`/v1/principals/${principalId}/access-credentials`, { audience }, { idempotencyKey: `c-${Math.random()}` });
}

/**
 * A turn whose tool use an ActionPolicy denied: it ended `end_turn`, the tool result is the
 * refusal naming the rule, and the model's reply says the call was not run.
 */
export function expectPolicyRefusal(events: TurnEvent[], ruleId: string): Record<string, unknown> | undefined {
  expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
  const refused = events.filter((e) => e.type === 'agent.tool_result')[0]?.payload;
  expect(refused).toMatchObject({ is_error: true, denied: true, policy_rule_id: ruleId });
  expect(String(refused?.content)).toContain(`refused by the workspace's ActionPolicy ${ruleId}`);
  expect(JSON.stringify(events.filter((e) => e.type === 'agent.message'))).toContain('Not run');
  return refused;
}
