import { ApiError, Id, Nullable, Obj, Timestamp, Type, type Static } from '@agentplane/core';
import type { Connection } from '@agentplane/domain';
import { isHeaderValue } from '../vaults/service.js';

export const ConnectionUrl = Type.String({ minLength: 8, maxLength: 2048, pattern: '^https?://[^\\s]+$', description: 'Streamable HTTP endpoint of the MCP server' });
export const ConnectionName = Type.String({ minLength: 1, maxLength: 200 });
export const ConnectionAuthInput = Type.Union([
  Obj({ type: Type.Literal('none') }),
  Obj({ type: Type.Literal('bearer'), token: Type.String({ minLength: 1, maxLength: 8192, description: 'Sent upstream as Authorization: Bearer; stored sealed, never returned' }) }),
]);

export const ConnectionSchema = Obj({
  id: Id('connection'),
  type: Type.Literal('connection'),
  workspace_id: Id('workspace'),
  name: Type.String(),
  kind: Type.Literal('mcp_server'),
  transport: Type.Literal('streamable_http'),
  url: Type.String(),
  auth: Type.Union([Obj({ type: Type.Literal('none') }), Obj({ type: Type.Literal('bearer'), secret_hint: Type.String() })]),
  status: Type.Union([Type.Literal('active'), Type.Literal('archived')]),
  archived_at: Nullable(Timestamp()),
  version: Type.Integer(),
  created_at: Timestamp(),
  updated_at: Timestamp(),
});
export type ConnectionView = Static<typeof ConnectionSchema>;

/** The wire form: the sealed secret never leaves the service. */
export function view(c: Connection): ConnectionView {
  const auth = c.auth.type === 'bearer' ? { type: 'bearer' as const, secret_hint: c.auth.secret_hint } : { type: 'none' as const };
  return { ...c, auth };
}

/**
 * The check of a Connection's upstream token beyond the schema (400 `validation.malformed`,
 * nothing stored): sent upstream as `Authorization: Bearer <token>`, it must be a valid header
 * value as written (visible ASCII, spaces or tabs only between characters), like a vault
 * `mcp_bearer` value: anything else could never be sent. The message never quotes the token.
 */
export function checkConnectionFields(input: { auth?: { type: 'none' } | { type: 'bearer'; token: string } | undefined }): void {
  if (input.auth?.type === 'bearer' && !isHeaderValue(input.auth.token)) {
    throw new ApiError('validation.malformed', 'body.auth.token: the token is sent in an HTTP header (Authorization: Bearer): visible ASCII characters only, with spaces or tabs only between them');
  }
}
