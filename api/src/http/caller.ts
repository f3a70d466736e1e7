import type { CallerKind, Role } from '@agentplane/domain';

/** Role sets used by operation auth policies. */
export const READERS: readonly Role[] = ['root', 'admin', 'developer', 'viewer'];
export const WRITERS: readonly Role[] = ['root', 'admin', 'developer'];
export const ADMINS: readonly Role[] = ['root', 'admin'];
export const ROOT: readonly Role[] = ['root'];

/** The authenticated party of one request, after workspace resolution. */
export interface Caller {
  kind: CallerKind;
  /** id of the key or credential that authenticated the request (`key_`, `pcred_`, `rcred_`). */
  credentialId: string;
  organizationId: string;
  /** The workspace this request acts in (null only for anonymous or org-level calls with no workspace). */
  workspaceId: string | null;
  scope: 'organization' | 'workspace';
  role: Role | null;
  /** Principal credentials: the Principal. Runner credentials: the owner Principal, if any. */
  principalId: string | null;
  audience: 'api_mcp' | 'a2a' | null;
  rateLimitPerMinute: number | null;
}

export const ANONYMOUS: Caller = Object.freeze({
  kind: 'anonymous',
  credentialId: '',
  organizationId: '',
  workspaceId: null,
  scope: 'workspace',
  role: null,
  principalId: null,
  audience: null,
  rateLimitPerMinute: null,
});
