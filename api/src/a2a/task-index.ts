/**
 * Where an A2A task's Session is listed for its caller: the task index ListTasks reads
 * (docs/A2A.md, "Redis keys"), named from the Session's metadata.
 */
import { isId } from '@agentplane/core';
import type { SessionDoc } from '@agentplane/domain';

/** Session metadata naming the placement and Principal a task belongs to. */
export const META = { installation: 'a2a_installation_id', scope: 'a2a_surface_scope_id', principal: 'a2a_principal_id' } as const;

/** A Principal's task index on a placement, as `keys.index` names it in the Workspace's slot: `ap:{w:<ws>}:idx:a2a_tasks:<aini>:<surf>:<prin>`. */
export function tasksIndexName(installationId: string, scopeId: string, principalId: string): string {
  return `a2a_tasks:${installationId}:${scopeId}:${principalId}`;
}

/**
 * The Workspace listings an A2A task's Session is in (index names of its `{w:<ws>}` slot): the
 * task index of the Principal and placement its metadata names; none for another Session. The
 * Session's deletion leaves them in the transaction that leaves its own listings
 * (`SessionStore.erase`), so ListTasks does not meet deleted tasks.
 */
export function a2aTaskListings(s: Readonly<Pick<SessionDoc, 'metadata'>>): string[] {
  const installation = s.metadata[META.installation];
  const scope = s.metadata[META.scope];
  const principal = s.metadata[META.principal];
  if (!isId('agentInstallation', installation) || !isId('surfaceScope', scope) || !isId('principal', principal)) return [];
  return [tasksIndexName(installation, scope, principal)];
}
