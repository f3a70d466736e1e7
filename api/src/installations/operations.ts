import { ApiError, Id, Nullable, Obj, Page, PageQuery, Timestamp, Type } from '@agentplane/core';
import { ADMINS, READERS } from '../http/caller.js';
import { createOnce } from '../http/keyed-create.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import type { ApiDeps } from '../deps.js';

const AgentPin = Obj({ id: Id('agent'), version: Type.Optional(Type.Integer({ minimum: 1 })) });
const ScopeIds = Type.Array(Id('surfaceScope'), { minItems: 1, maxItems: 64, uniqueItems: true });
const DisplayName = Nullable(Type.String({ minLength: 1, maxLength: 256 }));

export const AgentInstallationSchema = Obj({
  id: Id('agentInstallation'),
  type: Type.Literal('agent_installation'),
  workspace_id: Id('workspace'),
  agent: Obj({ id: Id('agent'), version: Type.Integer({ minimum: 1 }) }),
  environment_id: Id('environment'),
  surface_scope_ids: ScopeIds,
  principal_id: Id('principal'),
  display_name: DisplayName,
  status: Type.Union([Type.Literal('active'), Type.Literal('archived')]),
  version: Type.Integer(),
  created_at: Timestamp(),
  updated_at: Timestamp(),
  archived_at: Nullable(Timestamp()),
});
const InstallationPath = Obj({ installation_id: Id('agentInstallation') });

/** The exact Agent version to pin: the one named, or the current one; an archived Agent is not installed. */
async function pin(deps: ApiDeps, ws: string, agent: { id: string; version?: number | undefined }): Promise<{ id: string; version: number }> {
  const current = await deps.agents.get(ws, agent.id);
  if (current.archived_at !== null) throw new ApiError('runtime.invalid_transition', `agent ${agent.id} is archived`);
  if (agent.version === undefined) return { id: current.id, version: current.version };
  const v = await deps.agents.getVersion(ws, agent.id, agent.version);
  return { id: v.id, version: v.version };
}

async function activeScopes(deps: ApiDeps, ws: string, ids: readonly string[]): Promise<void> {
  for (const id of ids) {
    const s = await deps.surfaceScopes.get(ws, id);
    if (s.state !== 'active') throw new ApiError('runtime.invalid_transition', `surface scope ${id} is archived`);
  }
}

export const installationOperations: Operation[] = [
  defineOperation({
    operationId: 'agentInstallations.createAgentInstallation', method: 'POST', path: '/v1/agent-installations',
    audit: { target: 'response' },
    summary: 'Install an Agent (one pinned version) on SurfaceScopes; it executes as a new service Principal',
    auth: { kind: 'bearer', roles: ADMINS },
    body: Obj({ agent: AgentPin, environment_id: Id('environment'), surface_scope_ids: ScopeIds, display_name: Type.Optional(DisplayName) }),
    response: AgentInstallationSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, body, deps, keyed }) {
      const ws = requireWorkspace(caller);
      // Made once per keyed request: the retry of a create that died after writing (crash point
      // `agent-installation-created`) is answered the installation it wrote; one that died between
      // the Principal and the installation (`agent-installation-principal-created`) takes that
      // Principal (its id and subject derived the same way).
      return json(201, await createOnce('agentInstallation', keyed, (id) => deps.installations.find(ws, id), async (id) => {
        const agent = await pin(deps, ws, body.agent);
        const env = await deps.environments.get(ws, body.environment_id);
        if (env.archived_at !== null) throw new ApiError('runtime.invalid_transition', `environment ${env.id} is archived`);
        await activeScopes(deps, ws, body.surface_scope_ids);
        const principal = await createOnce('principal', keyed, (pid) => deps.identity.findPrincipal(ws, pid), (pid) => deps.identity.createPrincipal(ws, {
          external_subject_id: `agent-installation:${id}`, principal_type: 'service', display_name: `Installed agent ${agent.id} v${agent.version}`,
        }, pid), 'agent-installation-principal-created');
        return deps.installations.create(ws, {
          agent, environment_id: env.id, surface_scope_ids: body.surface_scope_ids, principal_id: principal.id, display_name: body.display_name ?? null,
        }, id);
      }, 'agent-installation-created'));
    },
  }),
  workspaceRead({
    operationId: 'agentInstallations.listAgentInstallations', path: '/v1/agent-installations',
    summary: 'List AgentInstallations, oldest first; optionally those on one SurfaceScope or in one status',
    auth: { kind: 'bearer', roles: READERS },
    query: PageQuery({ surface_scope_id: Type.Optional(Id('surfaceScope')), status: Type.Optional(Type.Union([Type.Literal('active'), Type.Literal('archived')])) }),
    response: Page(AgentInstallationSchema), mcp: 'full',
  }, (ws, { query, deps }) => deps.installations.list(ws, { ...query, limit: query.limit ?? 20 })),
  workspaceRead({
    operationId: 'agentInstallations.getAgentInstallation', path: '/v1/agent-installations/{installation_id}',
    summary: 'Read an AgentInstallation', auth: { kind: 'bearer', roles: READERS }, params: InstallationPath,
    response: AgentInstallationSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.installations.get(ws, params.installation_id)),
  defineOperation({
    operationId: 'agentInstallations.updateAgentInstallation', method: 'POST', path: '/v1/agent-installations/{installation_id}',
    audit: { target: 'installation_id' },
    summary: 'Re-pin the Agent version, replace the SurfaceScopes or rename an AgentInstallation (compare-and-swap on expected_version)',
    auth: { kind: 'bearer', roles: ADMINS }, params: InstallationPath,
    body: Obj({
      agent: Type.Optional(AgentPin), surface_scope_ids: Type.Optional(ScopeIds), display_name: Type.Optional(DisplayName),
      expected_version: Type.Optional(Type.Integer({ minimum: 1 })),
    }),
    response: AgentInstallationSchema, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      const ws = requireWorkspace(caller);
      const cur = await deps.installations.get(ws, params.installation_id);
      if (body.agent && body.agent.id !== cur.agent.id) throw new ApiError('validation.malformed', 'body.agent.id: an installation keeps its Agent; install the other Agent separately');
      const agent = body.agent ? await pin(deps, ws, body.agent) : undefined;
      if (body.surface_scope_ids) await activeScopes(deps, ws, body.surface_scope_ids);
      return json(200, await deps.installations.update(ws, params.installation_id, {
        ...(agent ? { agent } : {}),
        ...(body.surface_scope_ids ? { surface_scope_ids: body.surface_scope_ids } : {}),
        ...(body.display_name !== undefined ? { display_name: body.display_name } : {}),
      }, body.expected_version));
    },
  }),
  workspaceWrite('POST', {
    operationId: 'agentInstallations.archiveAgentInstallation', path: '/v1/agent-installations/{installation_id}/archive',
    audit: { target: 'installation_id' },
    summary: 'Archive an AgentInstallation (one-way, retry-safe): its A2A endpoints answer 404 from then on',
    auth: { kind: 'bearer', roles: ADMINS }, params: InstallationPath,
    body: Obj({ expected_version: Type.Optional(Type.Integer({ minimum: 1 })) }), response: AgentInstallationSchema, mcp: 'full',
  }, (ws, { params, body, deps }) => deps.installations.archive(ws, params.installation_id, body.expected_version)),
];
