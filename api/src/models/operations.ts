import type { ServerResponse } from 'node:http';
import { ApiError, Id, Obj, Page, Type } from '@agentplane/core';
import type { ModelRequest } from '@agentplane/protocol';
import { tags, type StoredDoc } from '@agentplane/store';
import { ADMINS, READERS, WRITERS } from '../http/caller.js';
import { createOnce } from '../http/keyed-create.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { namedWorkspaceRead, namedWorkspaceWrite, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { workspaceInBoundary } from '../http/workspace-scope.js';
import { credentialHead } from './model.js';
import { dayKey, monthKey } from './usage.js';
import {
  CreateModelCredentialBody, CreateRevisionBody, CreateRoutingProfileBody, KeyFilterQuery, ModelCredentialSchema, ModelRequestBody,
  PutWorkspaceBudgetBody, RevokeModelCredentialBody, RotateModelCredentialBody, RoutingProfileSchema, RoutingRevisionSchema,
  SessionUsageSchema, WorkspaceBudgetSchema, WorkspaceDailyUsageSchema, WorkspaceUsageSchema,
} from './schemas.js';
import type { StepPlan } from './gateway-service.js';
import type { ApiDeps } from '../deps.js';

const WsPath = Obj({ workspace_id: Id('workspace') });
const CredPath = Obj({ model_credential_id: Id('modelCredential') });
const ProfilePath = Obj({ model_routing_profile_id: Id('modelRoutingProfile') });
const RevisionPath = Obj({ model_routing_profile_id: Id('modelRoutingProfile'), revision_number: Type.Integer({ minimum: 1 }) });
const SessionPath = Obj({ session_id: Id('session') });

/** Resolves once `res` drains, closes or errors, or `signal` aborts. */
function drained(res: ServerResponse, signal: AbortSignal): Promise<void> {
  if (signal.aborted || res.destroyed) return Promise.resolve();
  return new Promise((resolve) => {
    const done = (): void => {
      res.off('drain', done);
      res.off('close', done);
      res.off('error', done);
      signal.removeEventListener('abort', done);
      resolve();
    };
    res.on('drain', done);
    res.on('close', done);
    res.on('error', done);
    signal.addEventListener('abort', done, { once: true });
  });
}

/** Server-sent model-gateway-v1 events: `event: <type>`, `data: <event JSON>`. */
function streamStep(deps: ApiDeps, plan: StepPlan) {
  return {
    kind: 'stream' as const,
    async write(res: ServerResponse, outer: AbortSignal) {
      const ac = new AbortController();
      const stop = () => ac.abort();
      outer.addEventListener('abort', () => { if (!res.writableEnded) stop(); }, { once: true });
      res.on('close', () => { if (!res.writableEnded) stop(); });
      // A client that left while the step was planned closed the response before these listeners
      // were there: the step ends at once (no provider call) and its budget reservation goes.
      if (outer.aborted || res.destroyed || !res.socket || res.socket.destroyed) stop();
      try {
        res.writeHead(200, { 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache', 'x-accel-buffering': 'no' });
        res.flushHeaders();
        for await (const ev of deps.models.gateway.execute(plan, ac.signal)) {
          if (ac.signal.aborted) break;
          // A client that reads slowly (or not at all) holds the stream back: the next event waits
          // until the socket drains, instead of piling up in memory.
          if (!res.write(`event: ${ev.type}\ndata: ${JSON.stringify(ev)}\n\n`)) await drained(res, ac.signal);
        }
        res.end();
      } finally {
        // Whatever stopped the stream before its step ran, the reservation goes now (a no-op once
        // the step released it).
        await plan.reservation?.release();
      }
    },
  };
}

export const modelOperations: Operation[] = [
  // ---- ModelCredentials ----
  namedWorkspaceWrite('POST', {
    operationId: 'models.createModelCredential', path: '/v1/organizations/workspaces/{workspace_id}/model-credentials',
    audit: { target: 'response' },
    summary: 'Store a provider credential (custody workspace_vault); the secret is sealed and never returned',
    auth: { kind: 'bearer', roles: ADMINS }, params: WsPath, body: CreateModelCredentialBody, response: ModelCredentialSchema,
    successStatus: 201, idempotency: 'optional', mcp: 'never',
  }, async (ws, { body, deps, keyed }) => {
    await deps.models.profiles.ensureDefaults(ws);
    // Made once per keyed request: the retry of a create that died after writing (crash point
    // `model-credential-created`) is answered the credential it wrote, not refused for its key.
    const credentials = deps.models.credentials;
    return credentialHead(await createOnce('modelCredential', keyed, (id) => credentials.find(ws, id), (id) => credentials.createDoc(ws, body, id)));
  }),
  namedWorkspaceRead({
    operationId: 'models.listModelCredentials', path: '/v1/organizations/workspaces/{workspace_id}/model-credentials',
    summary: 'List secret-free ModelCredential heads (filter by logical key with `key`)', auth: { kind: 'bearer', roles: READERS },
    params: WsPath, query: Obj(KeyFilterQuery), response: Page(ModelCredentialSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    await deps.models.profiles.ensureDefaults(ws);
    return deps.models.credentials.list(ws, { limit: query.limit ?? 20, page: query.page, key: query.key });
  }),
  workspaceRead({
    operationId: 'models.getModelCredential', path: '/v1/model-credentials/{model_credential_id}',
    summary: 'Read a secret-free ModelCredential head', auth: { kind: 'bearer', roles: READERS }, params: CredPath,
    response: ModelCredentialSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.models.credentials.get(ws, params.model_credential_id)),
  workspaceWrite('POST', {
    operationId: 'models.rotateModelCredential', path: '/v1/model-credentials/{model_credential_id}/rotate',
    audit: { target: 'model_credential_id' },
    summary: 'Replace the provider secret: a new generation becomes active at once', auth: { kind: 'bearer', roles: ADMINS },
    params: CredPath, body: RotateModelCredentialBody, response: ModelCredentialSchema, idempotency: 'optional', mcp: 'never',
  }, (ws, { params, body, deps }) => deps.models.credentials.rotate(ws, params.model_credential_id, body.secret, body.expected_generation_number)),
  workspaceWrite('POST', {
    operationId: 'models.revokeModelCredential', path: '/v1/model-credentials/{model_credential_id}/revoke',
    audit: { target: 'model_credential_id' },
    summary: 'Revoke a ModelCredential (irreversible; the secret is erased)', auth: { kind: 'bearer', roles: ADMINS },
    params: CredPath, body: RevokeModelCredentialBody, response: ModelCredentialSchema, idempotency: 'optional', mcp: 'full',
  }, (ws, { params, body, deps }) => deps.models.credentials.revoke(ws, params.model_credential_id, body.expected_resource_version)),
  workspaceWrite('POST', {
    operationId: 'models.checkModelCredentialHealth', path: '/v1/model-credentials/{model_credential_id}/health-check',
    audit: { target: 'model_credential_id' },
    summary: "Probe the provider with the credential and record health_status", auth: { kind: 'bearer', roles: ADMINS },
    params: CredPath, body: Obj({}), response: ModelCredentialSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.models.credentials.healthCheck(ws, params.model_credential_id, AbortSignal.timeout(15_000))),

  // ---- Model routing profiles ----
  namedWorkspaceWrite('POST', {
    operationId: 'models.createRoutingProfile', path: '/v1/organizations/workspaces/{workspace_id}/model-routing-profiles',
    audit: { target: 'response' },
    summary: 'Create a model routing profile (revision 1) addressed by a logical key', auth: { kind: 'bearer', roles: ADMINS },
    params: WsPath, body: CreateRoutingProfileBody, response: RoutingProfileSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, async (ws, { body, deps, keyed }) => {
    const profiles = deps.models.profiles;
    await profiles.ensureDefaults(ws);
    // Made once per keyed request: the retry of a create that died after writing (crash point
    // `model-routing-profile-created`) is answered the profile it wrote, not refused for its key.
    return (await createOnce('modelRoutingProfile', keyed, (id) => profiles.findCreated(ws, id), (id) => profiles.createAs(ws, body, id))).view;
  }),
  namedWorkspaceRead({
    operationId: 'models.listRoutingProfiles', path: '/v1/organizations/workspaces/{workspace_id}/model-routing-profiles',
    summary: 'List model routing profiles with their latest candidates (filter by logical key with `key`)', auth: { kind: 'bearer', roles: READERS },
    params: WsPath, query: Obj(KeyFilterQuery), response: Page(RoutingProfileSchema), mcp: 'full',
  }, async (ws, { query, deps }) => {
    await deps.models.profiles.ensureDefaults(ws);
    return deps.models.profiles.list(ws, { limit: query.limit ?? 20, page: query.page, key: query.key });
  }),
  workspaceRead({
    operationId: 'models.getRoutingProfile', path: '/v1/model-routing-profiles/{model_routing_profile_id}',
    summary: 'Read a model routing profile (latest revision)', auth: { kind: 'bearer', roles: READERS }, params: ProfilePath,
    response: RoutingProfileSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.models.profiles.get(ws, params.model_routing_profile_id)),
  workspaceWrite('POST', {
    operationId: 'models.createRoutingProfileRevision', path: '/v1/model-routing-profiles/{model_routing_profile_id}/revisions',
    audit: { target: 'response' },
    summary: 'Publish a new immutable revision (complete candidate list, not a patch)', auth: { kind: 'bearer', roles: ADMINS },
    params: ProfilePath, body: CreateRevisionBody, response: RoutingProfileSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, (ws, { params, body, deps, keyed }) =>
    // Published once per keyed request: the retry of one whose first attempt died after publishing
    // (crash point `model-routing-revision-written`) is answered that revision, not a second one.
    deps.models.profiles.addRevision(ws, params.model_routing_profile_id, body.candidates, body.expected_revision_number, keyed?.write('modelRoutingProfile'))),
  workspaceRead({
    operationId: 'models.getRoutingProfileRevision', path: '/v1/model-routing-profiles/{model_routing_profile_id}/revisions/{revision_number}',
    summary: 'Read one immutable revision of a routing profile', auth: { kind: 'bearer', roles: READERS }, params: RevisionPath,
    response: RoutingRevisionSchema, mcp: 'full',
  }, async (ws, { params, deps }) => {
    await deps.models.profiles.getDoc(ws, params.model_routing_profile_id);
    return deps.models.profiles.revision(ws, params.model_routing_profile_id, params.revision_number);
  }),

  // ---- Model steps: the gateway over REST (operators try a profile; the runner uses its WebSocket) ----
  defineOperation({
    operationId: 'models.runModelStepStream', method: 'POST', path: '/v1/organizations/workspaces/{workspace_id}/model-steps',
    audit: { target: 'workspace_id' },
    summary: 'Run one model step through the routing profile and stream model-gateway-v1 events (SSE)',
    auth: { kind: 'bearer', roles: WRITERS }, params: WsPath, body: ModelRequestBody, mcp: 'never',
    async handler({ caller, params, body, deps, trace }) {
      await workspaceInBoundary(caller, params.workspace_id, deps);
      const request: ModelRequest = { ...body, tools: body.tools ?? [] } as ModelRequest;
      return streamStep(deps, await deps.models.gateway.plan(params.workspace_id, request, { trace }));
    },
  }),

  // ---- Usage and budgets ----
  defineOperation({
    operationId: 'models.getWorkspaceUsage', method: 'GET', path: '/v1/organizations/workspaces/{workspace_id}/usage',
    summary: 'Model token usage and list cost of the workspace: total, current UTC day and month, and its budget',
    auth: { kind: 'bearer', roles: READERS }, params: WsPath, response: WorkspaceUsageSchema, mcp: 'compact',
    async handler({ caller, params, deps }) {
      await workspaceInBoundary(caller, params.workspace_id, deps);
      const ws = params.workspace_id;
      const now = new Date();
      const [total, day, month, budget] = await Promise.all([
        deps.models.usage.read({ kind: 'workspace', workspace_id: ws }),
        deps.models.usage.read({ kind: 'workspace', workspace_id: ws, period: { kind: 'day', at: now } }),
        deps.models.usage.read({ kind: 'workspace', workspace_id: ws, period: { kind: 'month', at: now } }),
        deps.models.budgets.getWorkspaceBudget(ws),
      ]);
      return json(200, {
        type: 'workspace_model_usage', workspace_id: ws, total,
        current_day: { period_start: `${dayKey(now)}T00:00:00.000Z`, summary: day },
        current_month: { period_start: `${monthKey(now)}-01T00:00:00.000Z`, summary: month },
        budget,
      });
    },
  }),
  namedWorkspaceRead({
    operationId: 'models.getWorkspaceDailyUsage', path: '/v1/organizations/workspaces/{workspace_id}/usage/daily',
    summary: 'Model token usage and list cost of the workspace per UTC day, the last `days` days (default 30, at most 366) ending today',
    auth: { kind: 'bearer', roles: READERS }, params: WsPath,
    query: Obj({ days: Type.Optional(Type.Integer({ minimum: 1, maximum: 366 })) }), response: WorkspaceDailyUsageSchema, mcp: 'full',
  }, async (ws, { query, deps }) => {
    const days = await deps.models.usage.daily(ws, query.days ?? 30);
    return { type: 'workspace_model_usage_daily', workspace_id: ws, days };
  }),
  workspaceRead({
    operationId: 'models.getSessionUsage', path: '/v1/sessions/{session_id}/usage',
    summary: 'Model token usage and list cost of a Session, or of one of its threads or Runs',
    auth: { kind: 'bearer', roles: READERS, principal: true }, permission: { action: 'observe', target: 'session_id' }, params: SessionPath,
    query: Obj({ thread_id: Type.Optional(Id('thread')), run_id: Type.Optional(Id('run')) }), response: SessionUsageSchema, mcp: 'compact',
  }, async (ws, { params, query, deps }) => {
    if (query.thread_id && query.run_id) throw new ApiError('validation.malformed', 'query: give thread_id or run_id, not both');
    // The Session document decides the boundary; counters recorded for a Session id with no
    // document (a step attributed by a runner before the Session was read) carry their own.
    const session = await deps.docs.get<StoredDoc & { workspace_id?: string; type?: string }>(tags.session(params.session_id), params.session_id);
    const owner = session ? session.workspace_id : await deps.models.usage.sessionWorkspace(params.session_id);
    if (owner !== ws) throw new ApiError('validation.not_found', 'session not found');
    // A deleted Session answers 404 on every operation, this one included.
    if (session?.type === 'session_tombstone') throw new ApiError('validation.not_found', 'the session was deleted and its event log erased');
    const s = params.session_id;
    // A thread or Run named must be the Session's own (a documented Session only: see above).
    if (session && query.thread_id) await deps.sessions.store.thread(s, query.thread_id);
    if (session && query.run_id && !(await deps.sessions.store.run(s, query.run_id))) throw new ApiError('validation.not_found', `run ${query.run_id} not found in this session`);
    const summary = await deps.models.usage.read(
      query.thread_id ? { kind: 'thread', session_id: s, thread_id: query.thread_id }
        : query.run_id ? { kind: 'run', session_id: s, run_id: query.run_id } : { kind: 'session', session_id: s });
    return { type: 'session_model_usage', session_id: s, thread_id: query.thread_id ?? null, run_id: query.run_id ?? null, summary };
  }),
  namedWorkspaceRead({
    operationId: 'models.getWorkspaceBudget', path: '/v1/organizations/workspaces/{workspace_id}/budget',
    summary: "Read the workspace's model budget", auth: { kind: 'bearer', roles: READERS }, params: WsPath,
    response: WorkspaceBudgetSchema, mcp: 'full',
  }, async (ws, { deps }) => {
    const b = await deps.models.budgets.getWorkspaceBudget(ws);
    if (!b) throw new ApiError('validation.not_found', 'this workspace has no budget');
    return b;
  }),
  namedWorkspaceWrite('PUT', {
    operationId: 'models.putWorkspaceBudget', path: '/v1/organizations/workspaces/{workspace_id}/budget',
    audit: { target: 'workspace_id' },
    summary: "Set the workspace's model budget (list cost in USD per UTC day, month, or lifetime)", auth: { kind: 'bearer', roles: ADMINS },
    params: WsPath, body: PutWorkspaceBudgetBody, response: WorkspaceBudgetSchema, idempotency: 'optional', mcp: 'full',
  }, (ws, { body, deps }) => deps.models.budgets.setWorkspaceBudget(ws, body.max_list_cost.amount, body.period)),
  namedWorkspaceWrite('DELETE', {
    operationId: 'models.deleteWorkspaceBudget', path: '/v1/organizations/workspaces/{workspace_id}/budget',
    audit: { target: 'workspace_id' },
    summary: "Remove the workspace's model budget", auth: { kind: 'bearer', roles: ADMINS }, params: WsPath,
    response: Obj({ workspace_id: Id('workspace'), type: Type.Literal('budget_deleted') }), mcp: 'full',
  }, async (ws, { deps }) => {
    if (!(await deps.models.budgets.clearWorkspaceBudget(ws))) throw new ApiError('validation.not_found', 'this workspace has no budget');
    return { workspace_id: ws, type: 'budget_deleted' };
  }),
];
