import { Id, Obj, Page, PageQuery, Type } from '@agentplane/core';
import { ADMINS, READERS } from '../http/caller.js';
import { CURRENT_VERSION, defineOperation, json, type Operation } from '../http/operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import type { ApiDeps } from '../deps.js';
import { INSTALLATIONS, effectiveAmbientPolicy, type ExternalInstallation } from './store.js';
import {
  CreateExternalInstallationBody, CreateSurfaceScopeBody, EffectivePolicySchema, ExternalId, ExternalInstallationSchema,
  SurfaceScopeSchema, UpdateSurfaceScopeBody,
} from './schemas.js';
import { tags } from '@agentplane/store';

const ScopePath = Obj({ surface_scope_id: Id('surfaceScope') });
const InstallationPath = Obj({ external_installation_id: Id('externalInstallation') });
/** `GET /v1/surface-scopes` lists `2026-08-24` in its reference; the current version is accepted too. */
const LIST_VERSIONS = ['2026-08-24', CURRENT_VERSION] as const;
const activePrincipal = (deps: ApiDeps, ws: string) => async (id: string): Promise<void> => {
  await deps.identity.activePrincipal(ws, id, 'verified_member.principal_id');
};

export const surfaceScopeOperations: Operation[] = [
  defineOperation({
    operationId: 'externalInstallations.createExternalInstallation', method: 'POST', path: '/v1/external-installations',
    audit: { target: 'response' },
    summary: 'Record an external installation (a chat workspace or similar) that SurfaceScopes are created under',
    auth: { kind: 'bearer', roles: ADMINS }, body: CreateExternalInstallationBody, response: ExternalInstallationSchema,
    successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, body, deps }) {
      return json(201, await deps.surfaceScopes.createInstallation(requireWorkspace(caller), body));
    },
  }),
  defineOperation({
    operationId: 'externalInstallations.listExternalInstallations', method: 'GET', path: '/v1/external-installations',
    summary: 'List external installations, oldest first', auth: { kind: 'bearer', roles: READERS },
    query: PageQuery({}), response: Page(ExternalInstallationSchema), mcp: 'full',
    async handler({ caller, query, deps }) {
      return json(200, await deps.docs.list<ExternalInstallation>(tags.workspace(requireWorkspace(caller)), INSTALLATIONS, { limit: query.limit ?? 20, page: query.page, order: 'asc' }));
    },
  }),
  defineOperation({
    operationId: 'externalInstallations.getExternalInstallation', method: 'GET', path: '/v1/external-installations/{external_installation_id}',
    summary: 'Read an external installation', auth: { kind: 'bearer', roles: READERS }, params: InstallationPath,
    response: ExternalInstallationSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, await deps.surfaceScopes.getInstallation(requireWorkspace(caller), params.external_installation_id));
    },
  }),
  defineOperation({
    operationId: 'externalInstallations.archiveExternalInstallation', method: 'POST', path: '/v1/external-installations/{external_installation_id}/archive',
    audit: { target: 'external_installation_id' },
    summary: 'Archive an external installation (one-way, retry-safe): no new SurfaceScopes under it', auth: { kind: 'bearer', roles: ADMINS },
    params: InstallationPath, response: ExternalInstallationSchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      return json(200, await deps.surfaceScopes.archiveInstallation(requireWorkspace(caller), params.external_installation_id));
    },
  }),

  defineOperation({
    operationId: 'surfaceScopes.createSurfaceScope', method: 'POST', path: '/v1/surface-scopes',
    audit: { target: 'response' },
    summary: 'Create a SurfaceScope (root, team, channel or personal), natively or under an external installation',
    auth: { kind: 'bearer', roles: ADMINS }, body: CreateSurfaceScopeBody, response: SurfaceScopeSchema,
    successStatus: 201, idempotency: 'optional', mcp: 'full',
    async handler({ caller, body, deps }) {
      const ws = requireWorkspace(caller);
      return json(201, await deps.surfaceScopes.create(ws, body, activePrincipal(deps, ws)));
    },
  }),
  defineOperation({
    operationId: 'surfaceScopes.listSurfaceScopes', method: 'GET', path: '/v1/surface-scopes', versions: LIST_VERSIONS,
    summary: 'List SurfaceScopes, oldest first; filters: external_installation_id, external_id (exact, 1 to 512 characters)',
    auth: { kind: 'bearer', roles: READERS },
    query: PageQuery({ external_installation_id: Type.Optional(Id('externalInstallation')), external_id: Type.Optional(ExternalId()) }),
    response: Page(SurfaceScopeSchema), mcp: 'compact',
    async handler({ caller, query, deps }) {
      return json(200, await deps.surfaceScopes.list(requireWorkspace(caller), { ...query, limit: query.limit ?? 20 }));
    },
  }),
  defineOperation({
    operationId: 'surfaceScopes.getSurfaceScope', method: 'GET', path: '/v1/surface-scopes/{surface_scope_id}',
    summary: 'Read a SurfaceScope', auth: { kind: 'bearer', roles: READERS, principal: true },
    permission: { action: 'read', target: 'surface_scope_id' }, mcpPrincipal: true,
    params: ScopePath, response: SurfaceScopeSchema, mcp: 'compact',
    async handler({ caller, params, deps }) {
      return json(200, await deps.surfaceScopes.get(requireWorkspace(caller), params.surface_scope_id));
    },
  }),
  defineOperation({
    operationId: 'surfaceScopes.getEffectivePolicy', method: 'GET', path: '/v1/surface-scopes/{surface_scope_id}/effective-policy',
    summary: 'The ambient policy in force on a SurfaceScope: its own, tightened by every ancestor it inherits from',
    auth: { kind: 'bearer', roles: READERS }, params: ScopePath, response: EffectivePolicySchema, mcp: 'full',
    async handler({ caller, params, deps }) {
      const chain = await deps.surfaceScopes.inheritanceChain(requireWorkspace(caller), params.surface_scope_id);
      return json(200, { surface_scope_id: params.surface_scope_id, inherits_from: chain.slice(1).map((s) => s.id), ambient_policy: effectiveAmbientPolicy(chain) });
    },
  }),
  defineOperation({
    operationId: 'surfaceScopes.updateSurfaceScope', method: 'POST', path: '/v1/surface-scopes/{surface_scope_id}',
    audit: { target: 'surface_scope_id' },
    summary: 'Update a SurfaceScope (compare-and-swap on expected_version); kind, parent and external ids are fixed',
    auth: { kind: 'bearer', roles: ADMINS }, params: ScopePath, body: UpdateSurfaceScopeBody, response: SurfaceScopeSchema,
    idempotency: 'optional', mcp: 'full',
    async handler({ caller, params, body, deps }) {
      const ws = requireWorkspace(caller);
      return json(200, await deps.surfaceScopes.update(ws, params.surface_scope_id, body, activePrincipal(deps, ws)));
    },
  }),
  defineOperation({
    operationId: 'surfaceScopes.archiveSurfaceScope', method: 'POST', path: '/v1/surface-scopes/{surface_scope_id}/archive',
    audit: { target: 'surface_scope_id' },
    summary: 'Archive a SurfaceScope (one-way, retry-safe); its active children are archived first',
    auth: { kind: 'bearer', roles: ADMINS }, params: ScopePath,
    body: Obj({ expected_version: Type.Optional(Type.Integer({ minimum: 1 })) }), response: SurfaceScopeSchema, mcp: 'full',
    async handler({ caller, params, body, deps }) {
      return json(200, await deps.surfaceScopes.archive(requireWorkspace(caller), params.surface_scope_id, body.expected_version));
    },
  }),
];
