import { ApiError, Id, newId, nowIso, Obj, Page, Type } from '@agentplane/core';
import { DEFAULT_RESOURCES, withResources, type HarnessProfile, type SandboxProfile } from '@agentplane/domain';
import { ADMINS, READERS, WRITERS, type Caller } from '../http/caller.js';
import { createdId, createOnce, earlierAttempt } from '../http/keyed-create.js';
import { CURRENT_VERSION, defineOperation, json, type Operation } from '../http/operation.js';
import { namedWorkspaceRead, namedWorkspaceWrite, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace, workspaceInBoundary } from '../http/workspace-scope.js';
import { disabledWorkspace } from '../http/authenticate.js';
import type { ApiDeps } from '../deps.js';
import { sessionReplay } from '../sessions/operations.js';
import {
  AgentDeploymentSchema, BindingRevisionSchema, BindingSchema, ConnectedHarnessSchema, CreateBindingBody, CreateConnectedHarnessBody,
  CreateDeploymentBody, CreateHarnessProfileBody, CreateSandboxProfileBody, DeployBody, DeploymentSessionBody, DeployResult,
  HarnessProfileSchema, HarnessRevisionBody, ListDeploymentsQuery, PatchBindingBody, PatchDeploymentBody, ProfileListQuery,
  PublishBindingRevisionBody, PublishRevisionBody, RevisionSchema, SandboxProfileSchema, SandboxRevisionBody,
} from './schemas.js';
import { DeploymentService, HARNESS_PROFILE_KEYS, headView, profileView, SANDBOX_PROFILE_KEYS, type RevisionDoc } from './service.js';
import { keyedSession } from '../sessions/service.js';
import { refusePlatformMetadata } from '../sessions/metadata.js';

const svc = (deps: ApiDeps) => new DeploymentService(deps);

/** One page of a Workspace's HarnessProfiles or SandboxProfiles (latest revisions), as served. */
async function profilePage(deps: ApiDeps, kind: 'harness' | 'sandbox', ws: string, query: { limit?: number | undefined; page?: string | undefined; key?: string | undefined }) {
  const s = svc(deps);
  const page = kind === 'harness'
    ? await s.listProfiles(s.harnessProfiles, HARNESS_PROFILE_KEYS, ws, query)
    : await s.listProfiles(s.sandboxProfiles, SANDBOX_PROFILE_KEYS, ws, query);
  return { data: page.data.map(profileView), next_page: page.next_page };
}
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
  display_name?: string | null | undefined; resources?: Partial<SandboxProfile['resources']> | undefined; network?: SandboxProfile['network'] | undefined;
  retention_mode?: SandboxProfile['retention_mode'] | undefined; packages?: SandboxProfile['packages'] | undefined; metadata?: Record<string, string> | undefined;
};
function sandboxConfig(b: SandboxInput) {
  return {
    display_name: b.display_name ?? null, image: b.image, driver: 'docker' as const, tier: 'container' as const, resources: withResources(DEFAULT_RESOURCES, b.resources),
    network: b.network ?? { mode: 'none' as const }, retention_mode: b.retention_mode ?? 'durable', packages: b.packages ?? {}, metadata: b.metadata ?? {},
  };
}

export const deploymentOperations: Operation[] = [
  // ---- AgentDeployment heads ----
  namedWorkspaceWrite('POST', {
    operationId: 'agentDeployments.createAgentDeployment', path: '/v1/organizations/workspaces/{workspace_id}/agent-deployments',
    audit: { target: 'response' }, summary: 'Create the deployment head of an Agent (current_revision_number 0; the id is deterministic over Workspace and Agent)',
    auth: admins, params: WsPath, body: CreateDeploymentBody, response: AgentDeploymentSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, async (ws, { body, deps, keyed }) => {
    // Made once per keyed request: its id is fixed by Workspace and Agent, so the retry of a create
    // that died after writing (crash point `agent-deployment-created`) finds it taken; the one its
    // first attempt made is answered (unchanged and young, `earlierAttempt`), another's refused.
    const { doc, earlier } = await svc(deps).create(ws, body, ws, keyed ? createdId('agentDeployment', keyed) : undefined);
    if (earlier && keyed) earlierAttempt(doc, keyed); // 409 `idempotency.conflict` when changed since or too old
    return headView(doc);
  }),
  namedWorkspaceRead({
    operationId: 'agentDeployments.listAgentDeployments', path: '/v1/organizations/workspaces/{workspace_id}/agent-deployments',
    summary: 'List deployment heads (cursor; exact `key` and `status` filters)', auth: readers, params: WsPath, query: ListDeploymentsQuery,
    response: Page(AgentDeploymentSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    const page = await svc(deps).list(ws, query);
    return { data: page.data.map(headView), next_page: page.next_page };
  }),
  workspaceRead({
    operationId: 'agentDeployments.getAgentDeployment', path: '/v1/agent-deployments/{agent_deployment_id}',
    summary: 'Read a deployment head', auth: readers, params: DeploymentPath, response: AgentDeploymentSchema, mcp: 'full',
  }, async (ws, { params, deps }) => headView(await svc(deps).get(ws, params.agent_deployment_id))),
  workspaceWrite('PATCH', {
    operationId: 'agentDeployments.updateAgentDeployment', path: '/v1/agent-deployments/{agent_deployment_id}',
    audit: { target: 'agent_deployment_id' }, summary: 'Change display_name or archive (terminal), fenced on expected_resource_version',
    auth: admins, params: DeploymentPath, body: PatchDeploymentBody, response: AgentDeploymentSchema, idempotency: 'optional', mcp: 'full',
  }, async (ws, { params, body, deps }) => headView(await svc(deps).patch(ws, params.agent_deployment_id, body))),

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
  workspaceRead({
    operationId: 'agentDeployments.listAgentDeploymentRevisions', path: '/v1/agent-deployments/{agent_deployment_id}/revisions',
    summary: 'List the revisions of a deployment, oldest first', auth: readers, versions: REVISION_READ_VERSIONS, params: DeploymentPath, query: PageOnly,
    response: Page(RevisionSchema), mcp: 'full',
  }, (ws, { params, query, deps }) => svc(deps).listRevisions(ws, params.agent_deployment_id, query)),
  workspaceRead({
    operationId: 'agentDeployments.getAgentDeploymentRevision', path: '/v1/agent-deployments/{agent_deployment_id}/revisions/{revision_number}',
    summary: 'Read one immutable revision', auth: readers, versions: REVISION_READ_VERSIONS, params: RevisionPath, response: RevisionSchema, mcp: 'full',
  }, (ws, { params, deps }) => svc(deps).revision(ws, params.agent_deployment_id, params.revision_number)),

  // ---- Sessions against a deployment (designed: docs/DEPLOYMENTS.md) ----
  workspaceWrite('POST', {
    operationId: 'agentDeployments.createDeploymentSession', path: '/v1/agent-deployments/{agent_deployment_id}/sessions',
    audit: { target: 'response' },
    summary: "Create a Session under the deployment's current revision (its agent release, sandbox, pool and topology)",
    auth: { kind: 'bearer', roles: WRITERS }, actionPolicy: 'initial_events', params: DeploymentPath, body: DeploymentSessionBody,
    response: Type.Unsafe<Record<string, unknown>>({ type: 'object', description: 'Session (docs/API.md)' }), successStatus: 201, idempotency: 'optional', mcp: 'full',
    erasureSafe: sessionReplay,
  }, async (ws, { params, body, idempotencyKey, keyed, deps, trace }) => {
    refusePlatformMetadata(body.metadata);
    const deployment = await svc(deps).sessionPin(ws, params.agent_deployment_id);
    return deps.sessions.create(ws, body, idempotencyKey, { deployment, trace, ...keyedSession(keyed) });
  }),

  // ---- Deploy ----
  defineOperation({
    operationId: 'agents.deployAgent', method: 'POST', path: '/v1/agents/{agent_id}/deploy',
    audit: { target: 'agent_id', alsoIn: { workspaceField: 'target_workspace_id', resource: 'agent_deployment' } },
    summary: "Ensure the target Workspace's deployment of this Agent and publish an exact-pin revision when the target holds every profile the release names",
    auth: { kind: 'bearer', roles: ADMINS, organizationScope: true }, params: Obj({ agent_id: Id('agent') }), body: DeployBody, response: DeployResult,
    idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      // A disabled Workspace takes no deployment (403, as any request acting in it).
      const target = await workspaceInBoundary(caller, body.target_workspace_id, deps);
      if (target.status === 'disabled') throw disabledWorkspace();
      const r = await svc(deps).deploy(requireWorkspace(caller), params.agent_id, body.agent_release_number, body.target_workspace_id);
      return json(200, { ...r, agent_deployment: headView(r.agent_deployment) });
    },
  }),

  // ---- Connection bindings ----
  defineOperation({
    operationId: 'agentDeployments.createConnectionBinding', method: 'POST', path: '/v1/agent-deployments/{agent_deployment_id}/connection-bindings',
    audit: { target: 'response' }, summary: 'Bind a Connection to the deployment (a head; its snapshots are revisions)',
    auth: admins, params: DeploymentPath, body: CreateBindingBody, response: BindingSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps, keyed }) {
      if (body.agent_deployment_id !== params.agent_deployment_id) throw new ApiError('validation.malformed', 'body.agent_deployment_id differs from the path');
      // Made once per keyed request: the retry of a create that died after writing (crash point
      // `connection-binding-created`) is answered the binding it wrote, not refused for its key
      // (unique among the deployment's bindings; another request for that key is still refused).
      const ws = requireWorkspace(caller);
      const adep = params.agent_deployment_id;
      const s = svc(deps);
      return json(201, headView(await createOnce('agentDeploymentConnectionBinding', keyed, (id) => s.findBinding(ws, adep, id), (id) => s.createBinding(ws, adep, body, id), 'connection-binding-created')));
    },
  }),
  workspaceRead({
    operationId: 'agentDeployments.getConnectionBinding', path: '/v1/agent-deployment-connection-bindings/{agent_deployment_connection_binding_id}',
    summary: 'Read a connection binding head', auth: readers, params: BindingPath, response: BindingSchema, mcp: 'full',
  }, async (ws, { params, deps }) => headView(await svc(deps).getBinding(ws, params.agent_deployment_connection_binding_id))),
  workspaceWrite('PATCH', {
    operationId: 'agentDeployments.updateConnectionBinding', path: '/v1/agent-deployment-connection-bindings/{agent_deployment_connection_binding_id}',
    audit: { target: 'agent_deployment_connection_binding_id' }, summary: 'Change display_name or status, fenced on expected_resource_version',
    auth: admins, params: BindingPath, body: PatchBindingBody, response: BindingSchema, idempotency: 'optional', mcp: 'full',
  }, async (ws, { params, body, deps }) => headView(await svc(deps).patchBinding(ws, params.agent_deployment_connection_binding_id, body))),
  defineOperation({
    operationId: 'agentDeployments.publishConnectionBindingRevision', method: 'POST', path: '/v1/agent-deployment-connection-bindings/{agent_deployment_connection_binding_id}/revisions',
    audit: { target: 'agent_deployment_connection_binding_id' },
    summary: 'Publish an immutable binding snapshot; new Sessions use it only after a new deployment revision selects it',
    auth: admins, params: BindingPath, body: PublishBindingRevisionBody, response: BindingRevisionSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps, keyed }) {
      const r = await svc(deps).publishBinding(requireWorkspace(caller), params.agent_deployment_connection_binding_id, body, keyed?.write('agentDeploymentConnectionBinding'));
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
  namedWorkspaceWrite('POST', {
    operationId: 'connectedHarnesses.createConnectedHarness', path: '/v1/organizations/workspaces/{workspace_id}/connected-harnesses',
    audit: { target: 'response' }, summary: 'Register a customer-operated harness with its non-secret capability-set digest',
    auth: admins, params: WsPath, body: CreateConnectedHarnessBody, response: ConnectedHarnessSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, async (ws, { body, deps, keyed }) => {
    // Made once per keyed request: the retry of a create that died after writing (crash point
    // `connected-harness-created`) is answered the harness it wrote, not refused for its key.
    const s = svc(deps);
    return headView(await createOnce('connectedHarness', keyed, (id) => s.findConnectedHarness(ws, id), (id) => s.createConnectedHarness(ws, body, id), 'connected-harness-created'));
  }),
  namedWorkspaceRead({
    operationId: 'connectedHarnesses.listConnectedHarnesses', path: '/v1/organizations/workspaces/{workspace_id}/connected-harnesses',
    summary: 'List ConnectedHarnesses', auth: readers, params: WsPath, query: PageOnly, response: Page(ConnectedHarnessSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    const page = await svc(deps).listConnectedHarnesses(ws, query);
    return { data: page.data.map(headView), next_page: page.next_page };
  }),
  workspaceRead({
    operationId: 'connectedHarnesses.getConnectedHarness', path: '/v1/connected-harnesses/{connected_harness_id}',
    summary: 'Read a ConnectedHarness', auth: readers, params: HarnessPath, response: ConnectedHarnessSchema, mcp: 'full',
  }, async (ws, { params, deps }) => headView(await svc(deps).getConnectedHarness(ws, params.connected_harness_id))),

  // ---- HarnessProfiles (designed) ----
  namedWorkspaceWrite('POST', {
    operationId: 'harnessProfiles.createHarnessProfile', path: '/v1/organizations/workspaces/{workspace_id}/harness-profiles',
    audit: { target: 'response' }, summary: 'Create a HarnessProfile (revision 1) under a Workspace-unique key',
    auth: admins, params: WsPath, body: CreateHarnessProfileBody, response: HarnessProfileSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, async (ws, { body, deps, keyed }) => {
    const s = svc(deps);
    const now = nowIso();
    const doc: HarnessProfile = {
      id: newId('harnessProfile'), type: 'harness_profile', workspace_id: ws, key: body.key,
      ...(await harnessConfig(deps, ws, body)), version: 1, archived_at: null, created_at: now, updated_at: now,
    };
    return profileView(await s.createProfile(s.harnessProfiles, HARNESS_PROFILE_KEYS, doc, keyed));
  }),
  namedWorkspaceRead({
    operationId: 'harnessProfiles.listHarnessProfiles', path: '/v1/organizations/workspaces/{workspace_id}/harness-profiles',
    summary: 'List HarnessProfiles (latest revisions; exact `key` filter)', auth: readers, params: WsPath, query: ProfileListQuery, response: Page(HarnessProfileSchema), mcp: 'full',
  }, async (ws, { query, deps }) => profilePage(deps, 'harness', ws, query)),
  workspaceRead({
    operationId: 'harnessProfiles.getHarnessProfile', path: '/v1/harness-profiles/{harness_profile_id}',
    summary: 'Read a HarnessProfile (latest revision)', auth: readers, params: HprofPath, response: HarnessProfileSchema, mcp: 'full',
  }, async (ws, { params, deps }) => profileView(await svc(deps).harnessProfiles.get(ws, params.harness_profile_id))),
  workspaceWrite('POST', {
    operationId: 'harnessProfiles.publishHarnessProfileRevision', path: '/v1/harness-profiles/{harness_profile_id}/revisions',
    audit: { target: 'harness_profile_id' }, summary: 'Publish the next immutable revision (complete, fenced on expected_revision_number)',
    auth: admins, params: HprofPath, body: HarnessRevisionBody, response: HarnessProfileSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, async (ws, { params, body, deps, keyed }) => {
    const config = await harnessConfig(deps, ws, body);
    return profileView(await svc(deps).harnessProfiles.newVersion(ws, params.harness_profile_id, body.expected_revision_number, (cur) => ({ ...cur, ...config }), keyed?.write('harnessProfile')));
  }),
  workspaceRead({
    operationId: 'harnessProfiles.getHarnessProfileRevision', path: '/v1/harness-profiles/{harness_profile_id}/revisions/{revision_number}',
    summary: 'Read one immutable HarnessProfile revision', auth: readers, params: HprofRevPath, response: HarnessProfileSchema, mcp: 'full',
  }, async (ws, { params, deps }) => profileView(await svc(deps).harnessProfiles.getVersion(ws, params.harness_profile_id, params.revision_number))),

  // ---- SandboxProfiles (designed) ----
  namedWorkspaceWrite('POST', {
    operationId: 'sandboxProfiles.createSandboxProfile', path: '/v1/organizations/workspaces/{workspace_id}/sandbox-profiles',
    audit: { target: 'response' }, summary: 'Create a SandboxProfile (revision 1) under a Workspace-unique key',
    auth: admins, params: WsPath, body: CreateSandboxProfileBody, response: SandboxProfileSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, async (ws, { body, deps, keyed }) => {
    const s = svc(deps);
    const now = nowIso();
    const doc: SandboxProfile = {
      id: newId('sandboxProfile'), type: 'sandbox_profile', workspace_id: ws, key: body.key,
      ...sandboxConfig(body), version: 1, archived_at: null, created_at: now, updated_at: now,
    };
    return profileView(await s.createProfile(s.sandboxProfiles, SANDBOX_PROFILE_KEYS, doc, keyed));
  }),
  namedWorkspaceRead({
    operationId: 'sandboxProfiles.listSandboxProfiles', path: '/v1/organizations/workspaces/{workspace_id}/sandbox-profiles',
    summary: 'List SandboxProfiles (latest revisions; exact `key` filter)', auth: readers, params: WsPath, query: ProfileListQuery, response: Page(SandboxProfileSchema), mcp: 'full',
  }, async (ws, { query, deps }) => profilePage(deps, 'sandbox', ws, query)),
  workspaceRead({
    operationId: 'sandboxProfiles.getSandboxProfile', path: '/v1/sandbox-profiles/{sandbox_profile_id}',
    summary: 'Read a SandboxProfile (latest revision)', auth: readers, params: SprofPath, response: SandboxProfileSchema, mcp: 'full',
  }, async (ws, { params, deps }) => profileView(await svc(deps).sandboxProfiles.get(ws, params.sandbox_profile_id))),
  workspaceWrite('POST', {
    operationId: 'sandboxProfiles.publishSandboxProfileRevision', path: '/v1/sandbox-profiles/{sandbox_profile_id}/revisions',
    audit: { target: 'sandbox_profile_id' }, summary: 'Publish the next immutable revision (complete, fenced on expected_revision_number)',
    auth: admins, params: SprofPath, body: SandboxRevisionBody, response: SandboxProfileSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, async (ws, { params, body, deps, keyed }) => {
    const config = sandboxConfig(body);
    return profileView(await svc(deps).sandboxProfiles.newVersion(ws, params.sandbox_profile_id, body.expected_revision_number, (cur) => ({ ...cur, ...config }), keyed?.write('sandboxProfile')));
  }),
  workspaceRead({
    operationId: 'sandboxProfiles.getSandboxProfileRevision', path: '/v1/sandbox-profiles/{sandbox_profile_id}/revisions/{revision_number}',
    summary: 'Read one immutable SandboxProfile revision', auth: readers, params: SprofRevPath, response: SandboxProfileSchema, mcp: 'full',
  }, async (ws, { params, deps }) => profileView(await svc(deps).sandboxProfiles.getVersion(ws, params.sandbox_profile_id, params.revision_number))),
];
