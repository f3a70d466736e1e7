import { ApiError, Id, newId, nowIso, Obj, Page, Type } from '@agentplane/core';
import { DEFAULT_RESOURCES, type HarnessProfile, type SandboxProfile } from '@agentplane/domain';
import { ADMINS, READERS, WRITERS, type Caller } from '../http/caller.js';
import { CURRENT_VERSION, defineOperation, json, type Operation } from '../http/operation.js';
import { requireWorkspace, workspaceInBoundary } from '../http/workspace-scope.js';
import type { ApiDeps } from '../deps.js';
import {
  AgentDeploymentSchema, BindingRevisionSchema, BindingSchema, ConnectedHarnessSchema, CreateBindingBody, CreateConnectedHarnessBody,
  CreateDeploymentBody, CreateHarnessProfileBody, CreateSandboxProfileBody, DeployBody, DeploymentSessionBody, DeployResult,
  HarnessProfileSchema, HarnessRevisionBody, ListDeploymentsQuery, PatchBindingBody, PatchDeploymentBody, ProfileListQuery,
  PublishBindingRevisionBody, PublishRevisionBody, RevisionSchema, SandboxProfileSchema, SandboxRevisionBody,
} from './schemas.js';
import { DeploymentService, HARNESS_PROFILE_KEYS, headView, profileView, SANDBOX_PROFILE_KEYS, type RevisionDoc } from './service.js';

const svc = (deps: ApiDeps) => new DeploymentService(deps);
const readers = { kind: 'bearer', roles: READERS } as const;
/** Writes need a Workspace root or admin key. */
const admins = { kind: 'bearer', roles: ADMINS } as const;

const WsPath = Obj({ workspace_id: Id('workspace') });
const DeploymentPath = Obj({ agent_deployment_id: Id('agentDeployment') });
const RevisionPath = Obj({ agent_deployment_id: Id('agentDeployment'), revision_number: Type.Integer({ minimum: 1 }) });
const BindingPath = Obj({ agent_deployment_connection_binding_id: Id('agentDeploymentConnectionBinding') });
const BindingRevisionPath = Obj({ agent_deployment_connection_binding_id: Id('agentDeploymentConnectionBinding'), revision_number: Type.Integer({ minimum: 1 }) });
const HarnessPath = Obj({ connected_harness_id: Id('connectedHarness') });
const HprofPath = Obj({ harness_profile_id: Id('harnessProfile') });
const HprofRevPath = Obj({ harness_profile_id: Id('harnessProfile'), revision_number: Type.Integer({ minimum: 1 }) });
const SprofPath = Obj({ sandbox_profile_id: Id('sandboxProfile') });
const SprofRevPath = Obj({ sandbox_profile_id: Id('sandboxProfile'), revision_number: Type.Integer({ minimum: 1 }) });
const PageOnly = Obj({ limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100 })), page: Type.Optional(Type.String({ pattern: '^c1_[0-9a-z]+$', maxLength: 512 })) });
/** The revision reads list `2026-08-24` in their reference; the general value is accepted too. */
const REVISION_READ_VERSIONS = ['2026-08-24', CURRENT_VERSION] as const;

function publisher(caller: Caller): RevisionDoc['published_by'] {
  return { kind: 'api_key', api_key_id: caller.credentialId };
}

type HarnessInput = {
  display_name?: string | null | undefined; kind: 'builtin' | 'connected'; supported_topologies?: ('split' | 'colocated')[] | undefined;
  connected_harness_id?: string | null | undefined; metadata?: Record<string, string> | undefined;
};
async function harnessConfig(deps: ApiDeps, ws: string, b: HarnessInput) {
  if (b.kind === 'connected') {
    if (!b.connected_harness_id) throw new ApiError('validation.malformed', 'body.connected_harness_id: a connected harness profile names its ConnectedHarness');
    if (b.supported_topologies !== undefined) throw new ApiError('validation.malformed', 'body.supported_topologies: only a builtin harness has topologies');
    await svc(deps).getConnectedHarness(ws, b.connected_harness_id);
  } else if (b.connected_harness_id) {
    throw new ApiError('validation.malformed', 'body.connected_harness_id: only a connected harness profile names one');
  }
  return {
    display_name: b.display_name ?? null, kind: b.kind,
    supported_topologies: b.kind === 'builtin' ? (b.supported_topologies ?? ['split', 'colocated']) : [],
    connected_harness_id: b.kind === 'connected' ? (b.connected_harness_id ?? null) : null, metadata: b.metadata ?? {},
  };
}

type SandboxInput = Omit<SandboxProfile, 'id' | 'type' | 'workspace_id' | 'key' | 'driver' | 'tier' | 'version' | 'archived_at' | 'created_at' | 'updated_at' | 'display_name' | 'resources' | 'network' | 'retention_mode' | 'packages' | 'metadata'> & {
  display_name?: string | null | undefined; resources?: SandboxProfile['resources'] | undefined; network?: SandboxProfile['network'] | undefined;
  retention_mode?: SandboxProfile['retention_mode'] | undefined; packages?: SandboxProfile['packages'] | undefined; metadata?: Record<string, string> | undefined;
};
function sandboxConfig(b: SandboxInput) {
  return {
    display_name: b.display_name ?? null, image: b.image, driver: 'docker' as const, tier: 'container' as const, resources: b.resources ?? DEFAULT_RESOURCES,
    network: b.network ?? { mode: 'none' as const }, retention_mode: b.retention_mode ?? 'durable', packages: b.packages ?? {}, metadata: b.metadata ?? {},
  };
}

export const deploymentOperations: Operation[] = [
  // ---- AgentDeployment heads ----
  defineOperation({
    operationId: 'agentDeployments.createAgentDeployment', method: 'POST', path: '/v1/organizations/workspaces/{workspace_id}/agent-deployments',
    audit: { target: 'response' }, summary: 'Create the deployment head of an Agent (current_revision_number 0; the id is deterministic over Workspace and Agent)',
    auth: admins, params: WsPath, body: CreateDeploymentBody, response: AgentDeploymentSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      await workspaceInBoundary(caller, params.workspace_id, deps);
      return json(201, headView(await svc(deps).create(params.workspace_id, body)));
    },
  }),
  defineOperation({
    operationId: 'agentDeployments.listAgentDeployments', method: 'GET', path: '/v1/organizations/workspaces/{workspace_id}/agent-deployments',
    summary: 'List deployment heads (cursor; exact `key` and `status` filters)', auth: readers, params: WsPath, query: ListDeploymentsQuery,
    response: Page(AgentDeploymentSchema), mcp: 'full',
    async handler({ caller, params, query, deps }) {
      await workspaceInBoundary(caller, params.workspace_id, deps);
      const page = await svc(deps).list(params.workspace_id, query);
      return json(200, { data: page.data.map(headView), next_page: page.next_page });
    },
  }),
  defineOperation({
    operationId: 'agentDeployments.getAgentDeployment', method: 'GET', path: '/v1/agent-deployments/{agent_deployment_id}',
    summary: 'Read a deployment head', auth: readers, params: DeploymentPath, response: AgentDeploymentSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, headView(await svc(deps).get(requireWorkspace(caller), params.agent_deployment_id)));
    },
  }),
  defineOperation({
    operationId: 'agentDeployments.updateAgentDeployment', method: 'PATCH', path: '/v1/agent-deployments/{agent_deployment_id}',
    audit: { target: 'agent_deployment_id' }, summary: 'Change display_name or archive (terminal), fenced on expected_resource_version',
    auth: admins, params: DeploymentPath, body: PatchDeploymentBody, response: AgentDeploymentSchema, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      return json(200, headView(await svc(deps).patch(requireWorkspace(caller), params.agent_deployment_id, body)));
    },
  }),

  // ---- Revisions ----
  defineOperation({
    operationId: 'agentDeployments.publishAgentDeploymentRevision', method: 'POST', path: '/v1/agent-deployments/{agent_deployment_id}/revisions',
    audit: { target: 'agent_deployment_id' },
    summary: 'Publish a complete snapshot as the next immutable revision (compare-and-swap on expected_resource_version; an identical replay returns the revision)',
    auth: admins, params: DeploymentPath, body: PublishRevisionBody, response: RevisionSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      const r = await svc(deps).publish(requireWorkspace(caller), params.agent_deployment_id, body, publisher(caller));
      return json(r.status, r.revision);
    },
  }),
  defineOperation({
    operationId: 'agentDeployments.listAgentDeploymentRevisions', method: 'GET', path: '/v1/agent-deployments/{agent_deployment_id}/revisions',
    summary: 'List the revisions of a deployment, oldest first', auth: readers, versions: REVISION_READ_VERSIONS, params: DeploymentPath, query: PageOnly,
    response: Page(RevisionSchema), mcp: 'full',
    async handler({ caller, params, query, deps }) {
      return json(200, await svc(deps).listRevisions(requireWorkspace(caller), params.agent_deployment_id, query));
    },
  }),
  defineOperation({
    operationId: 'agentDeployments.getAgentDeploymentRevision', method: 'GET', path: '/v1/agent-deployments/{agent_deployment_id}/revisions/{revision_number}',
    summary: 'Read one immutable revision', auth: readers, versions: REVISION_READ_VERSIONS, params: RevisionPath, response: RevisionSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, await svc(deps).revision(requireWorkspace(caller), params.agent_deployment_id, params.revision_number));
    },
  }),

  // ---- Sessions against a deployment (designed: docs/DEPLOYMENTS.md) ----
  defineOperation({
    operationId: 'agentDeployments.createDeploymentSession', method: 'POST', path: '/v1/agent-deployments/{agent_deployment_id}/sessions',
    audit: { target: 'response' },
    summary: "Create a Session under the deployment's current revision (its agent release, sandbox, pool and topology)",
    auth: { kind: 'bearer', roles: WRITERS }, params: DeploymentPath, body: DeploymentSessionBody,
    response: Type.Unsafe<Record<string, unknown>>({ type: 'object', description: 'Session (docs/API.md)' }), successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, idempotencyKey, deps }) {
      const ws = requireWorkspace(caller);
      const deployment = await svc(deps).sessionPin(ws, params.agent_deployment_id);
      return json(201, await deps.sessions.create(ws, body, idempotencyKey, { deployment }));
    },
  }),

  // ---- Deploy ----
  defineOperation({
    operationId: 'agents.deployAgent', method: 'POST', path: '/v1/agents/{agent_id}/deploy',
    audit: { target: 'agent_id' },
    summary: "Ensure the target Workspace's deployment of this Agent and publish an exact-pin revision when the target holds every profile the release names",
    auth: { kind: 'bearer', roles: ADMINS, organizationScope: true }, params: Obj({ agent_id: Id('agent') }), body: DeployBody, response: DeployResult,
    idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      await workspaceInBoundary(caller, body.target_workspace_id, deps);
      const r = await svc(deps).deploy(requireWorkspace(caller), params.agent_id, body.agent_release_number, body.target_workspace_id);
      return json(200, { ...r, agent_deployment: headView(r.agent_deployment) });
    },
  }),

  // ---- Connection bindings ----
  defineOperation({
    operationId: 'agentDeployments.createConnectionBinding', method: 'POST', path: '/v1/agent-deployments/{agent_deployment_id}/connection-bindings',
    audit: { target: 'response' }, summary: 'Bind a Connection to the deployment (a head; its snapshots are revisions)',
    auth: admins, params: DeploymentPath, body: CreateBindingBody, response: BindingSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      if (body.agent_deployment_id !== params.agent_deployment_id) throw new ApiError('validation.malformed', 'body.agent_deployment_id differs from the path');
      return json(201, headView(await svc(deps).createBinding(requireWorkspace(caller), params.agent_deployment_id, body)));
    },
  }),
  defineOperation({
    operationId: 'agentDeployments.getConnectionBinding', method: 'GET', path: '/v1/agent-deployment-connection-bindings/{agent_deployment_connection_binding_id}',
    summary: 'Read a connection binding head', auth: readers, params: BindingPath, response: BindingSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, headView(await svc(deps).getBinding(requireWorkspace(caller), params.agent_deployment_connection_binding_id)));
    },
  }),
  defineOperation({
    operationId: 'agentDeployments.updateConnectionBinding', method: 'PATCH', path: '/v1/agent-deployment-connection-bindings/{agent_deployment_connection_binding_id}',
    audit: { target: 'agent_deployment_connection_binding_id' }, summary: 'Change display_name or status, fenced on expected_resource_version',
    auth: admins, params: BindingPath, body: PatchBindingBody, response: BindingSchema, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      return json(200, headView(await svc(deps).patchBinding(requireWorkspace(caller), params.agent_deployment_connection_binding_id, body)));
    },
  }),
  defineOperation({
    operationId: 'agentDeployments.publishConnectionBindingRevision', method: 'POST', path: '/v1/agent-deployment-connection-bindings/{agent_deployment_connection_binding_id}/revisions',
    audit: { target: 'agent_deployment_connection_binding_id' },
    summary: 'Publish an immutable binding snapshot; new Sessions use it only after a new deployment revision selects it',
    auth: admins, params: BindingPath, body: PublishBindingRevisionBody, response: BindingRevisionSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      const r = await svc(deps).publishBinding(requireWorkspace(caller), params.agent_deployment_connection_binding_id, body);
      return json(r.status, r.revision);
    },
  }),
  defineOperation({
    operationId: 'agentDeployments.getConnectionBindingRevision', method: 'GET',
    path: '/v1/agent-deployment-connection-bindings/{agent_deployment_connection_binding_id}/revisions/{revision_number}',
    summary: 'Read one immutable binding revision', auth: readers, params: BindingRevisionPath, response: BindingRevisionSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, await svc(deps).bindingRevision(requireWorkspace(caller), params.agent_deployment_connection_binding_id, params.revision_number));
    },
  }),

  // ---- ConnectedHarnesses (designed) ----
  defineOperation({
    operationId: 'connectedHarnesses.createConnectedHarness', method: 'POST', path: '/v1/organizations/workspaces/{workspace_id}/connected-harnesses',
    audit: { target: 'response' }, summary: 'Register a customer-operated harness with its non-secret capability-set digest',
    auth: admins, params: WsPath, body: CreateConnectedHarnessBody, response: ConnectedHarnessSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      await workspaceInBoundary(caller, params.workspace_id, deps);
      return json(201, headView(await svc(deps).createConnectedHarness(params.workspace_id, body)));
    },
  }),
  defineOperation({
    operationId: 'connectedHarnesses.listConnectedHarnesses', method: 'GET', path: '/v1/organizations/workspaces/{workspace_id}/connected-harnesses',
    summary: 'List ConnectedHarnesses', auth: readers, params: WsPath, query: PageOnly, response: Page(ConnectedHarnessSchema), mcp: 'full',
    async handler({ caller, params, query, deps }) {
      await workspaceInBoundary(caller, params.workspace_id, deps);
      const page = await svc(deps).listConnectedHarnesses(params.workspace_id, query);
      return json(200, { data: page.data.map(headView), next_page: page.next_page });
    },
  }),
  defineOperation({
    operationId: 'connectedHarnesses.getConnectedHarness', method: 'GET', path: '/v1/connected-harnesses/{connected_harness_id}',
    summary: 'Read a ConnectedHarness', auth: readers, params: HarnessPath, response: ConnectedHarnessSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, headView(await svc(deps).getConnectedHarness(requireWorkspace(caller), params.connected_harness_id)));
    },
  }),

  // ---- HarnessProfiles (designed) ----
  defineOperation({
    operationId: 'harnessProfiles.createHarnessProfile', method: 'POST', path: '/v1/organizations/workspaces/{workspace_id}/harness-profiles',
    audit: { target: 'response' }, summary: 'Create a HarnessProfile (revision 1) under a Workspace-unique key',
    auth: admins, params: WsPath, body: CreateHarnessProfileBody, response: HarnessProfileSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      await workspaceInBoundary(caller, params.workspace_id, deps);
      const s = svc(deps);
      const now = nowIso();
      const doc: HarnessProfile = {
        id: newId('harnessProfile'), type: 'harness_profile', workspace_id: params.workspace_id, key: body.key,
        ...(await harnessConfig(deps, params.workspace_id, body)), version: 1, archived_at: null, created_at: now, updated_at: now,
      };
      return json(201, profileView(await s.createProfile(s.harnessProfiles, HARNESS_PROFILE_KEYS, doc)));
    },
  }),
  defineOperation({
    operationId: 'harnessProfiles.listHarnessProfiles', method: 'GET', path: '/v1/organizations/workspaces/{workspace_id}/harness-profiles',
    summary: 'List HarnessProfiles (latest revisions; exact `key` filter)', auth: readers, params: WsPath, query: ProfileListQuery, response: Page(HarnessProfileSchema), mcp: 'full',
    async handler({ caller, params, query, deps }) {
      await workspaceInBoundary(caller, params.workspace_id, deps);
      const s = svc(deps);
      const page = await s.listProfiles(s.harnessProfiles, HARNESS_PROFILE_KEYS, params.workspace_id, query);
      return json(200, { data: page.data.map(profileView), next_page: page.next_page });
    },
  }),
  defineOperation({
    operationId: 'harnessProfiles.getHarnessProfile', method: 'GET', path: '/v1/harness-profiles/{harness_profile_id}',
    summary: 'Read a HarnessProfile (latest revision)', auth: readers, params: HprofPath, response: HarnessProfileSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, profileView(await svc(deps).harnessProfiles.get(requireWorkspace(caller), params.harness_profile_id)));
    },
  }),
  defineOperation({
    operationId: 'harnessProfiles.publishHarnessProfileRevision', method: 'POST', path: '/v1/harness-profiles/{harness_profile_id}/revisions',
    audit: { target: 'harness_profile_id' }, summary: 'Publish the next immutable revision (complete, fenced on expected_revision_number)',
    auth: admins, params: HprofPath, body: HarnessRevisionBody, response: HarnessProfileSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      const ws = requireWorkspace(caller);
      const config = await harnessConfig(deps, ws, body);
      return json(201, profileView(await svc(deps).harnessProfiles.newVersion(ws, params.harness_profile_id, body.expected_revision_number, (cur) => ({ ...cur, ...config }))));
    },
  }),
  defineOperation({
    operationId: 'harnessProfiles.getHarnessProfileRevision', method: 'GET', path: '/v1/harness-profiles/{harness_profile_id}/revisions/{revision_number}',
    summary: 'Read one immutable HarnessProfile revision', auth: readers, params: HprofRevPath, response: HarnessProfileSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, profileView(await svc(deps).harnessProfiles.getVersion(requireWorkspace(caller), params.harness_profile_id, params.revision_number)));
    },
  }),

  // ---- SandboxProfiles (designed) ----
  defineOperation({
    operationId: 'sandboxProfiles.createSandboxProfile', method: 'POST', path: '/v1/organizations/workspaces/{workspace_id}/sandbox-profiles',
    audit: { target: 'response' }, summary: 'Create a SandboxProfile (revision 1) under a Workspace-unique key',
    auth: admins, params: WsPath, body: CreateSandboxProfileBody, response: SandboxProfileSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      await workspaceInBoundary(caller, params.workspace_id, deps);
      const s = svc(deps);
      const now = nowIso();
      const doc: SandboxProfile = {
        id: newId('sandboxProfile'), type: 'sandbox_profile', workspace_id: params.workspace_id, key: body.key,
        ...sandboxConfig(body), version: 1, archived_at: null, created_at: now, updated_at: now,
      };
      return json(201, profileView(await s.createProfile(s.sandboxProfiles, SANDBOX_PROFILE_KEYS, doc)));
    },
  }),
  defineOperation({
    operationId: 'sandboxProfiles.listSandboxProfiles', method: 'GET', path: '/v1/organizations/workspaces/{workspace_id}/sandbox-profiles',
    summary: 'List SandboxProfiles (latest revisions; exact `key` filter)', auth: readers, params: WsPath, query: ProfileListQuery, response: Page(SandboxProfileSchema), mcp: 'full',
    async handler({ caller, params, query, deps }) {
      await workspaceInBoundary(caller, params.workspace_id, deps);
      const s = svc(deps);
      const page = await s.listProfiles(s.sandboxProfiles, SANDBOX_PROFILE_KEYS, params.workspace_id, query);
      return json(200, { data: page.data.map(profileView), next_page: page.next_page });
    },
  }),
  defineOperation({
    operationId: 'sandboxProfiles.getSandboxProfile', method: 'GET', path: '/v1/sandbox-profiles/{sandbox_profile_id}',
    summary: 'Read a SandboxProfile (latest revision)', auth: readers, params: SprofPath, response: SandboxProfileSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, profileView(await svc(deps).sandboxProfiles.get(requireWorkspace(caller), params.sandbox_profile_id)));
    },
  }),
  defineOperation({
    operationId: 'sandboxProfiles.publishSandboxProfileRevision', method: 'POST', path: '/v1/sandbox-profiles/{sandbox_profile_id}/revisions',
    audit: { target: 'sandbox_profile_id' }, summary: 'Publish the next immutable revision (complete, fenced on expected_revision_number)',
    auth: admins, params: SprofPath, body: SandboxRevisionBody, response: SandboxProfileSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      const config = sandboxConfig(body);
      return json(201, profileView(await svc(deps).sandboxProfiles.newVersion(requireWorkspace(caller), params.sandbox_profile_id, body.expected_revision_number, (cur) => ({ ...cur, ...config }))));
    },
  }),
  defineOperation({
    operationId: 'sandboxProfiles.getSandboxProfileRevision', method: 'GET', path: '/v1/sandbox-profiles/{sandbox_profile_id}/revisions/{revision_number}',
    summary: 'Read one immutable SandboxProfile revision', auth: readers, params: SprofRevPath, response: SandboxProfileSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, profileView(await svc(deps).sandboxProfiles.getVersion(requireWorkspace(caller), params.sandbox_profile_id, params.revision_number)));
    },
  }),
];
