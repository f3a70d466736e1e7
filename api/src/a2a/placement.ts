import { ApiError, isId } from '@agentplane/core';
import { tags } from '@agentplane/store';
import type { Agent, Workspace } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import type { AgentInstallation } from '../installations/store.js';
import type { SurfaceScope } from '../surface-scopes/store.js';

/** One active AgentInstallation on one of its active SurfaceScopes: what an A2A endpoint serves. */
export interface Placement {
  workspaceId: string;
  installation: AgentInstallation;
  scope: SurfaceScope;
  /** The pinned Agent version. */
  agent: Agent;
}

const notFound = (what: string) => new ApiError('validation.not_found', `no A2A agent is served here: ${what}`);

/**
 * Resolves (and rechecks, on every request) a placement. An archived Agent, an archived or
 * disabled Workspace, an inactive installation, an archived scope (or one whose external
 * installation is archived), or a scope the installation is not placed on all look alike: 404.
 */
export async function resolvePlacement(deps: ApiDeps, workspaceId: string, installationId: string, scopeId: string): Promise<Placement> {
  if (!isId('workspace', workspaceId) || !isId('agentInstallation', installationId) || !isId('surfaceScope', scopeId)) throw notFound('malformed path');
  const ws = await deps.docs.get<Workspace>(tags.workspace(workspaceId), workspaceId);
  if (!ws || ws.status === 'disabled') throw notFound('workspace');
  const installation = await deps.installations.get(workspaceId, installationId).catch(() => null);
  if (!installation || installation.status !== 'active') throw notFound('installation');
  if (!installation.surface_scope_ids.includes(scopeId)) throw notFound('the installation is not placed on this surface scope');
  const scope = await deps.surfaceScopes.get(workspaceId, scopeId).catch(() => null);
  if (!scope || scope.state !== 'active') throw notFound('surface scope');
  // A scope of an external installation (a chat workspace the platform was installed into) is
  // served while that installation is: archived (uninstalled), its scopes' agents are not.
  if (scope.external_installation_id !== null) {
    const ext = await deps.surfaceScopes.getInstallation(workspaceId, scope.external_installation_id).catch(() => null);
    if (!ext || ext.state !== 'active') throw notFound('external installation');
  }
  const head = await deps.agents.get(workspaceId, installation.agent.id).catch(() => null);
  if (!head || head.archived_at !== null) throw notFound('agent');
  const agent = head.version === installation.agent.version ? head : await deps.agents.getVersion(workspaceId, installation.agent.id, installation.agent.version).catch(() => null);
  if (!agent) throw notFound('agent version');
  return { workspaceId, installation, scope, agent };
}

export const A2A_PREFIX = '/a2a/v1/workspaces/';
const PATH_RE = /^\/a2a\/v1\/workspaces\/([^/]+)\/agent-installations\/([^/]+)\/surface-scopes\/([^/]+)(\/agent-card\.json)?$/;

/** Parses an A2A path: the JSON-RPC endpoint, or its Agent Card (`…/agent-card.json`). */
export function parseA2aPath(path: string): { workspaceId: string; installationId: string; scopeId: string; card: boolean } | null {
  const m = PATH_RE.exec(path);
  if (!m) return null;
  return { workspaceId: m[1] as string, installationId: m[2] as string, scopeId: m[3] as string, card: m[4] !== undefined };
}

export function endpointPath(p: { workspaceId: string; installationId: string; scopeId: string }): string {
  return `${A2A_PREFIX}${p.workspaceId}/agent-installations/${p.installationId}/surface-scopes/${p.scopeId}`;
}
