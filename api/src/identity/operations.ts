import { Id, Obj, Page, PageQuery, Type, Patch } from '@agentplane/core';
import { tags } from '@agentplane/store';
import { ADMINS, READERS, ROOT } from '../http/caller.js';
import { createOnce, priorAttempt } from '../http/keyed-create.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { namedWorkspaceWrite } from '../http/workspace-operation.js';
import { requireOrganization, workspaceInBoundary } from '../http/workspace-scope.js';
import type { ApiKey, PrincipalAccessCredential, Workspace } from '@agentplane/domain';
import { GATEWAY_CONTROL_CHANNEL, type GatewayControlMessage } from '@agentplane/gateway';
import {
  ApiKeySchema, Audience, CreateApiKeyBody, CreatePrincipalBody, GenerationFenceBody, PatchApiKeyBody,
  PrincipalCredentialSchema, PrincipalSchema, VersionFenceBody, WorkspaceSchema,
} from './schemas.js';

const OrgPath = Obj({ organization_id: Id('organization') });
const KeyPath = Obj({ api_key_id: Id('apiKey') });
const WsPath = Obj({ workspace_id: Id('workspace') });
const PrincipalPath = Obj({ principal_id: Id('principal') });
const CredPath = Obj({ credential_id: Id('principalCredential') });
const orgRoot = { kind: 'bearer', roles: ROOT, organizationScope: true } as const;

/** A stored key-secret response may be replayed only while that key generation is still live and unchanged. */
async function apiKeyReplayable(stored: unknown, deps: Parameters<NonNullable<Operation['replayable']>>[1]): Promise<boolean> {
  const s = stored as ApiKey;
  const live = await deps.docs.get<ApiKey>(tags.org(s.organization_id), s.id);
  return !!live && live.status === 'active' && live.version === s.version && live.generation_number === s.generation_number;
}

async function credentialReplayable(stored: unknown, deps: Parameters<NonNullable<Operation['replayable']>>[1]): Promise<boolean> {
  const s = stored as PrincipalAccessCredential;
  const live = await deps.docs.get<PrincipalAccessCredential>(tags.workspace(s.workspace_id), s.id);
  return !!live && live.status === 'active' && live.version === s.version;
}

export const identityOperations: Operation[] = [
  // ---- Workspaces ----
  defineOperation({
    operationId: 'organizations.createWorkspace', method: 'POST', path: '/v1/organizations/{organization_id}/workspaces',
    audit: { target: 'response' },
    summary: 'Create a Workspace in the Organization', auth: orgRoot, params: OrgPath,
    body: Obj({ name: Type.String({ minLength: 1, maxLength: 200 }) }), response: WorkspaceSchema, successStatus: 201,
    idempotency: 'optional', idempotencyScope: 'organization', mcp: 'full',
    async handler({ caller, params, body, deps, keyed }) {
      const org = params.organization_id;
      requireOrganization(caller, org);
      // Made once per keyed request: the retry of a create that died after writing (crash point
      // `workspace-created`, before its place in the list) answers that Workspace, listed.
      return json(201, await createOnce('workspace', keyed, (id) => deps.identity.findWorkspace(org, id), (id) => deps.identity.createWorkspace(org, body.name, id)));
    },
  }),
  defineOperation({
    operationId: 'organizations.listWorkspaces', method: 'GET', path: '/v1/organizations/{organization_id}/workspaces',
    summary: 'List the Workspaces of the Organization', auth: orgRoot, params: OrgPath, query: PageQuery({}),
    response: Page(WorkspaceSchema), mcp: 'full',
    async handler({ caller, params, query, deps }) {
      requireOrganization(caller, params.organization_id);
      const { ids, next_page } = await deps.docs.listIds(tags.org(params.organization_id), 'workspaces', { limit: query.limit ?? 20, page: query.page, order: 'asc' });
      const data = await Promise.all(ids.map((id) => deps.docs.get(tags.workspace(id), id)));
      return json(200, { data: data.filter(Boolean), next_page });
    },
  }),
  defineOperation({
    operationId: 'organizations.getWorkspace', method: 'GET', path: '/v1/organizations/workspaces/{workspace_id}',
    summary: 'Read a Workspace', auth: { kind: 'bearer', roles: READERS }, params: WsPath, response: WorkspaceSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, await workspaceInBoundary(caller, params.workspace_id, deps));
    },
  }),
  namedWorkspaceWrite('PATCH', {
    operationId: 'organizations.updateWorkspace', path: '/v1/organizations/workspaces/{workspace_id}',
    audit: { target: 'workspace_id' },
    summary: 'Rename, disable or re-enable a Workspace', auth: orgRoot, params: WsPath,
    body: Patch({
      expected_version: Type.Optional(Type.Integer({ minimum: 1 })),
      name: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
      status: Type.Optional(Type.Union([Type.Literal('active'), Type.Literal('disabled')])),
    }),
    response: WorkspaceSchema, mcp: 'full',
  }, async (ws, { body, deps }) => {
    const next = await deps.docs.update<Workspace>(tags.workspace(ws), ws, (w) => ({
      ...w,
      ...(body.name !== undefined ? { name: body.name } : {}),
      ...(body.status !== undefined ? { status: body.status } : {}),
    }), { expectedVersion: body.expected_version, notFound: 'workspace', unchangedKeepsVersion: true });
    // Its keys stop working at once (the read cache is told by Redis); its runners' sockets are
    // closed now too, not at their next standing re-check.
    if (next.status === 'disabled') await deps.redis.publish(GATEWAY_CONTROL_CHANNEL, JSON.stringify({ kind: 'workspace_disabled', workspace_id: ws } satisfies GatewayControlMessage));
    return next;
  }),

  // ---- API keys ----
  defineOperation({
    operationId: 'apiKeys.createApiKey', method: 'POST', path: '/v1/organizations/{organization_id}/api-keys',
    audit: { target: 'response' },
    summary: 'Create an API key; the secret is returned once', auth: orgRoot, params: OrgPath, body: CreateApiKeyBody,
    response: ApiKeySchema, successStatus: 201, idempotency: 'required', idempotencyScope: 'organization', sensitive: true, mcp: 'never',
    replayable: apiKeyReplayable,
    async handler({ caller, params, body, deps, keyed }) {
      const org = params.organization_id;
      requireOrganization(caller, org);
      // Made once per request under its (required) key: the retry of a create that died after
      // writing the key (crash point `api-key-created`, before its secret is live) answers that
      // key with a new first secret, the first attempt's never having been shown.
      const { id, earlier } = await priorAttempt('apiKey', keyed, (id) => deps.identity.findApiKey(org, id));
      const { key, secret } = earlier ? await deps.identity.reissueFirstApiKeySecret(org, earlier) : await deps.identity.createApiKey(org, body, id, 'api-key-created');
      return json(201, { ...key, secret });
    },
  }),
  defineOperation({
    operationId: 'apiKeys.listApiKeys', method: 'GET', path: '/v1/organizations/{organization_id}/api-keys',
    summary: 'List API key metadata (never secrets)', auth: orgRoot, params: OrgPath, query: PageQuery({}),
    response: Page(ApiKeySchema), mcp: 'never',
    async handler({ caller, params, query, deps }) {
      requireOrganization(caller, params.organization_id);
      return json(200, await deps.docs.list(tags.org(params.organization_id), 'api_keys', { limit: query.limit ?? 20, page: query.page, order: 'asc' }));
    },
  }),
  defineOperation({
    operationId: 'apiKeys.getApiKey', method: 'GET', path: '/v1/api-keys/{api_key_id}', summary: 'Read API key metadata',
    auth: orgRoot, params: KeyPath, response: ApiKeySchema, mcp: 'never',
    async handler({ caller, params, deps }) {
      return json(200, await deps.identity.getApiKey(caller.organizationId, params.api_key_id));
    },
  }),
  defineOperation({
    operationId: 'apiKeys.updateApiKey', method: 'PATCH', path: '/v1/api-keys/{api_key_id}',
    audit: { target: 'api_key_id' },
    summary: 'Rename, re-role or re-limit an API key', auth: orgRoot, params: KeyPath, body: PatchApiKeyBody,
    response: ApiKeySchema, mcp: 'never',
    async handler({ caller, params, body, deps }) {
      const { expected_version, ...patch } = body;
      return json(200, await deps.identity.patchApiKey(caller.organizationId, params.api_key_id, patch, expected_version));
    },
  }),
  defineOperation({
    operationId: 'apiKeys.rotateApiKey', method: 'POST', path: '/v1/api-keys/{api_key_id}/rotate',
    audit: { target: 'api_key_id' },
    summary: 'Replace the secret of an API key; the old secret stops working at once', auth: orgRoot, params: KeyPath,
    body: VersionFenceBody, response: ApiKeySchema, idempotency: 'required', idempotencyScope: 'organization', sensitive: true, mcp: 'never',
    replayable: apiKeyReplayable,
    async handler({ caller, params, body, deps }) {
      const { key, secret } = await deps.identity.rotateApiKey(caller.organizationId, params.api_key_id, body.expected_version);
      return json(200, { ...key, secret });
    },
  }),
  defineOperation({
    operationId: 'apiKeys.revokeApiKey', method: 'POST', path: '/v1/api-keys/{api_key_id}/revoke',
    audit: { target: 'api_key_id' },
    summary: 'Revoke an API key (irreversible, retry-safe)', auth: orgRoot, params: KeyPath, body: VersionFenceBody,
    response: ApiKeySchema, idempotency: 'optional', idempotencyScope: 'organization', mcp: 'never',
    async handler({ caller, params, body, deps }) {
      return json(200, await deps.identity.revokeApiKey(caller.organizationId, params.api_key_id, body.expected_version));
    },
  }),

  // ---- Principals ----
  namedWorkspaceWrite('POST', {
    operationId: 'principals.createPrincipal', path: '/v1/organizations/workspaces/{workspace_id}/principals',
    audit: { target: 'response' },
    summary: 'Create a Principal (a person or service identity) in the Workspace', auth: { kind: 'bearer', roles: ADMINS },
    params: WsPath, body: CreatePrincipalBody, response: PrincipalSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, (ws, { body, deps, keyed }) => createOnce('principal', keyed, (id) => deps.identity.findPrincipal(ws, id), (id) => deps.identity.createPrincipal(ws, body, id), 'principal-created')),
  defineOperation({
    operationId: 'principals.listPrincipals', method: 'GET', path: '/v1/organizations/workspaces/{workspace_id}/principals',
    summary: 'List the Principals of the Workspace', auth: { kind: 'bearer', roles: READERS }, params: WsPath,
    query: PageQuery({ status: Type.Optional(Type.Union([Type.Literal('active'), Type.Literal('suspended')])) }),
    response: Page(PrincipalSchema), mcp: 'full',
    async handler({ caller, params, query, deps }) {
      await workspaceInBoundary(caller, params.workspace_id, deps);
      const want = query.status;
      return json(200, await deps.docs.list<{ status: string } & import('@agentplane/store').StoredDoc>(
        tags.workspace(params.workspace_id), 'principals', { limit: query.limit ?? 20, page: query.page, order: 'asc' },
        (p) => p.status !== 'deleted' && (want === undefined || p.status === want),
      ));
    },
  }),
  defineOperation({
    operationId: 'principals.getPrincipal', method: 'GET', path: '/v1/principals/{principal_id}', summary: 'Read a Principal',
    auth: { kind: 'bearer', roles: READERS }, params: PrincipalPath, response: PrincipalSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, await deps.identity.getPrincipal(caller.workspaceId ?? '', params.principal_id));
    },
  }),
  defineOperation({
    operationId: 'principals.suspendPrincipal', method: 'POST', path: '/v1/principals/{principal_id}/suspend',
    audit: { target: 'principal_id' },
    summary: 'Suspend a Principal: its credentials are denied from the next request', auth: { kind: 'bearer', roles: ADMINS },
    params: PrincipalPath, body: VersionFenceBody, response: PrincipalSchema, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      return json(200, await deps.identity.setPrincipalStatus(caller.workspaceId ?? '', params.principal_id, 'suspended', body.expected_version));
    },
  }),
  defineOperation({
    operationId: 'principals.resumePrincipal', method: 'POST', path: '/v1/principals/{principal_id}/resume',
    audit: { target: 'principal_id' },
    summary: 'Lift a suspension', auth: { kind: 'bearer', roles: ADMINS },
    params: PrincipalPath, body: VersionFenceBody, response: PrincipalSchema, idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      return json(200, await deps.identity.setPrincipalStatus(caller.workspaceId ?? '', params.principal_id, 'active', body.expected_version));
    },
  }),
  defineOperation({
    operationId: 'principals.deletePrincipal', method: 'DELETE', path: '/v1/principals/{principal_id}',
    audit: { target: 'principal_id' },
    summary: 'Delete a Principal (its credentials and runner sockets die with it)', auth: { kind: 'bearer', roles: ADMINS },
    params: PrincipalPath, response: Obj({ id: Id('principal'), type: Type.Literal('principal_deleted') }), mcp: 'full',
    async handler({ caller, params, deps }) {
      await deps.identity.setPrincipalStatus(caller.workspaceId ?? '', params.principal_id, 'deleted');
      return json(200, { id: params.principal_id, type: 'principal_deleted' });
    },
  }),

  // ---- Principal access credentials ----
  defineOperation({
    operationId: 'principals.createAccessCredential', method: 'POST', path: '/v1/principals/{principal_id}/access-credentials',
    audit: { target: 'response' },
    summary: 'Issue an audience-bound bearer for a Principal; the secret is returned once', auth: { kind: 'bearer', roles: ADMINS },
    params: PrincipalPath, body: Obj({ audience: Type.Optional(Audience) }), response: PrincipalCredentialSchema, successStatus: 201,
    idempotency: 'required', sensitive: true, mcp: 'never', replayable: credentialReplayable,
    async handler({ caller, params, body, deps, keyed }) {
      // Made once per request under its (required) key, as an API key is (crash point
      // `principal-credential-created`): the retry answers it with a new first secret.
      const ws = caller.workspaceId ?? '';
      const { id, earlier } = await priorAttempt('principalCredential', keyed, (id) => deps.identity.findPrincipalCredential(ws, id));
      const { credential, secret } = earlier
        ? await deps.identity.reissueFirstCredentialSecret(caller.organizationId, earlier)
        : await deps.identity.createPrincipalCredential(caller.organizationId, ws, params.principal_id, body.audience ?? 'api_mcp', id, 'principal-credential-created');
      return json(201, { ...credential, secret });
    },
  }),
  defineOperation({
    operationId: 'principals.listAccessCredentials', method: 'GET', path: '/v1/principals/{principal_id}/access-credentials',
    summary: "List a Principal's access credentials (never secrets)", auth: { kind: 'bearer', roles: ADMINS },
    params: PrincipalPath, query: PageQuery({}), response: Page(PrincipalCredentialSchema), mcp: 'never',
    async handler({ caller, params, query, deps }) {
      const ws = caller.workspaceId ?? '';
      await deps.identity.getPrincipal(ws, params.principal_id);
      return json(200, await deps.docs.list(tags.workspace(ws), `principal_credentials:${params.principal_id}`, { limit: query.limit ?? 20, page: query.page, order: 'asc' }));
    },
  }),
  defineOperation({
    operationId: 'principals.getAccessCredential', method: 'GET', path: '/v1/principal-access-credentials/{credential_id}',
    summary: 'Read access credential metadata', auth: { kind: 'bearer', roles: ADMINS }, params: CredPath,
    response: PrincipalCredentialSchema, mcp: 'never',
    async handler({ caller, params, deps }) {
      return json(200, await deps.identity.getPrincipalCredential(caller.workspaceId ?? '', params.credential_id));
    },
  }),
  defineOperation({
    operationId: 'principals.rotateAccessCredential', method: 'POST', path: '/v1/principal-access-credentials/{credential_id}/rotate',
    audit: { target: 'credential_id' },
    summary: 'Rotate: the old bearer dies at once, the replacement is returned once', auth: { kind: 'bearer', roles: ADMINS },
    params: CredPath, body: GenerationFenceBody, response: PrincipalCredentialSchema, idempotency: 'required', sensitive: true,
    mcp: 'never', replayable: credentialReplayable,
    async handler({ caller, params, body, deps }) {
      const { credential, secret } = await deps.identity.rotatePrincipalCredential(
        caller.organizationId, caller.workspaceId ?? '', params.credential_id, body.expected_generation_number);
      return json(200, { ...credential, secret });
    },
  }),
  defineOperation({
    operationId: 'principals.revokeAccessCredential', method: 'POST', path: '/v1/principal-access-credentials/{credential_id}/revoke',
    audit: { target: 'credential_id' },
    summary: 'Revoke an access credential (irreversible)', auth: { kind: 'bearer', roles: ADMINS }, params: CredPath,
    body: GenerationFenceBody, response: PrincipalCredentialSchema, idempotency: 'required', mcp: 'never',
    async handler({ caller, params, body, deps }) {
      return json(200, await deps.identity.revokePrincipalCredential(caller.workspaceId ?? '', params.credential_id, body.expected_generation_number));
    },
  }),
];
