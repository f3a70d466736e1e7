import { ApiError } from '@agentplane/core';
import { tags } from '@agentplane/store';
import type { ApiDeps } from '../deps.js';
import type { Workspace } from '@agentplane/domain';
import type { Caller } from './caller.js';

/**
 * A workspace named in a path must be inside the caller's boundary: its own workspace for a
 * workspace-bound credential, any workspace of its organization for an organization-scoped key.
 * Outside the boundary is 404, exactly like an unknown id.
 */
export async function workspaceInBoundary(caller: Caller, workspaceId: string, deps: ApiDeps): Promise<Workspace> {
  if (caller.scope === 'workspace' && caller.workspaceId !== workspaceId) throw new ApiError('validation.not_found', 'workspace not found');
  const ws = await deps.docs.get<Workspace>(tags.workspace(workspaceId), workspaceId);
  if (!ws || ws.organization_id !== caller.organizationId) throw new ApiError('validation.not_found', 'workspace not found');
  return ws;
}

/** The workspace a request acts in; every workspace-owned operation needs one. */
export function requireWorkspace(caller: Caller): string {
  if (!caller.workspaceId) throw new ApiError('validation.malformed', 'this operation needs a workspace (Service-Workspace-Id)');
  return caller.workspaceId;
}

export function requireOrganization(caller: Caller, organizationId: string): void {
  if (caller.organizationId !== organizationId) throw new ApiError('validation.not_found', 'organization not found');
}
