import { Id, Obj, Page, PageQuery, Type } from '@agentplane/core';
import { ADMINS, READERS } from '../http/caller.js';
import { createOnce } from '../http/keyed-create.js';
import { CURRENT_VERSION, type Operation } from '../http/operation.js';
import { listWorkspaceDocs, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import type { ApiDeps } from '../deps.js';
import { INSTALLATIONS, effectiveAmbientPolicy, type ExternalInstallation } from './store.js';
import {
  CreateExternalInstallationBody, CreateSurfaceScopeBody, EffectivePolicySchema, ExternalId, ExternalInstallationSchema,
  SurfaceScopeSchema, UpdateSurfaceScopeBody,
} from './schemas.js';

const ScopePath = Obj({ surface_scope_id: Id('surfaceScope') });
const InstallationPath = Obj({ external_installation_id: Id('externalInstallation') });
const readers = { kind: 'bearer', roles: READERS } as const;
const admins = { kind: 'bearer', roles: ADMINS } as const;
/** `GET /v1/surface-scopes` lists `2026-08-24` in its reference; the current version is accepted too. */
const LIST_VERSIONS = ['2026-08-24', CURRENT_VERSION] as const;
const activePrincipal = (deps: ApiDeps, ws: string) => async (id: string): Promise<void> => {
  await deps.identity.activePrincipal(ws, id, 'verified_member.principal_id');
};

export const surfaceScopeOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'externalInstallations.createExternalInstallation', path: '/v1/external-installations',
    audit: { target: 'response' },
    summary: 'Record an external installation (a chat workspace or similar) that SurfaceScopes are created under',
    auth: admins, body: CreateExternalInstallationBody, response: ExternalInstallationSchema,
    successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, (ws, { body, deps, keyed }) => createOnce('externalInstallation', keyed, (id) => deps.surfaceScopes.findInstallation(ws, id),
    (id) => deps.surfaceScopes.createInstallation(ws, body, id), 'external-installation-created')),
  workspaceRead({
    operationId: 'externalInstallations.listExternalInstallations', path: '/v1/external-installations',
    summary: 'List external installations, oldest first', auth: readers,
    query: PageQuery({}), response: Page(ExternalInstallationSchema), mcp: 'full',
  }, (ws, { query, deps }) => listWorkspaceDocs<ExternalInstallation>(deps, ws, INSTALLATIONS, query)),
  workspaceRead({
    operationId: 'externalInstallations.getExternalInstallation', path: '/v1/external-installations/{external_installation_id}',
    summary: 'Read an external installation', auth: readers, params: InstallationPath,
    response: ExternalInstallationSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.surfaceScopes.getInstallation(ws, params.external_installation_id)),
  workspaceWrite('POST', {
    operationId: 'externalInstallations.archiveExternalInstallation', path: '/v1/external-installations/{external_installation_id}/archive',
    audit: { target: 'external_installation_id' },
    summary: 'Archive an external installation (one-way, retry-safe): no new SurfaceScopes under it', auth: admins,
    params: InstallationPath, response: ExternalInstallationSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.surfaceScopes.archiveInstallation(ws, params.external_installation_id)),

  workspaceWrite('POST', {
    operationId: 'surfaceScopes.createSurfaceScope', path: '/v1/surface-scopes',
    audit: { target: 'response' },
    summary: 'Create a SurfaceScope (root, team, channel or personal), natively or under an external installation',
    auth: admins, body: CreateSurfaceScopeBody, response: SurfaceScopeSchema,
    successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, (ws, { body, deps, keyed }) => createOnce('surfaceScope', keyed, (id) => deps.surfaceScopes.find(ws, id),
    (id) => deps.surfaceScopes.create(ws, body, activePrincipal(deps, ws), id), 'surface-scope-created')),
  workspaceRead({
    operationId: 'surfaceScopes.listSurfaceScopes', path: '/v1/surface-scopes', versions: LIST_VERSIONS,
    summary: 'List SurfaceScopes, oldest first; filters: external_installation_id, external_id (exact, 1 to 512 characters)',
    auth: readers,
    query: PageQuery({ external_installation_id: Type.Optional(Id('externalInstallation')), external_id: Type.Optional(ExternalId()) }),
    response: Page(SurfaceScopeSchema), mcp: 'compact',
  }, (ws, { query, deps }) => deps.surfaceScopes.list(ws, { ...query, limit: query.limit ?? 20 })),
  workspaceRead({
    operationId: 'surfaceScopes.getSurfaceScope', path: '/v1/surface-scopes/{surface_scope_id}',
    summary: 'Read a SurfaceScope', auth: { kind: 'bearer', roles: READERS, principal: true },
    permission: { action: 'read', target: 'surface_scope_id' }, mcpPrincipal: true,
    params: ScopePath, response: SurfaceScopeSchema, mcp: 'compact',
  }, (ws, { params, deps }) => deps.surfaceScopes.get(ws, params.surface_scope_id)),
  workspaceRead({
    operationId: 'surfaceScopes.getEffectivePolicy', path: '/v1/surface-scopes/{surface_scope_id}/effective-policy',
    summary: 'The ambient policy in force on a SurfaceScope: its own, tightened by every ancestor it inherits from',
    auth: readers, params: ScopePath, response: EffectivePolicySchema, mcp: 'full',
  }, async (ws, { params, deps }) => {
    const chain = await deps.surfaceScopes.inheritanceChain(ws, params.surface_scope_id);
    return { surface_scope_id: params.surface_scope_id, inherits_from: chain.slice(1).map((s) => s.id), ambient_policy: effectiveAmbientPolicy(chain) };
  }),
  workspaceWrite('POST', {
    operationId: 'surfaceScopes.updateSurfaceScope', path: '/v1/surface-scopes/{surface_scope_id}',
    audit: { target: 'surface_scope_id' },
    summary: 'Update a SurfaceScope (compare-and-swap on expected_version); kind, parent and external ids are fixed',
    auth: admins, params: ScopePath, body: UpdateSurfaceScopeBody, response: SurfaceScopeSchema,
    idempotency: 'optional', mcp: 'full',
  }, (ws, { params, body, deps }) => deps.surfaceScopes.update(ws, params.surface_scope_id, body, activePrincipal(deps, ws))),
  workspaceWrite('POST', {
    operationId: 'surfaceScopes.archiveSurfaceScope', path: '/v1/surface-scopes/{surface_scope_id}/archive',
    audit: { target: 'surface_scope_id' },
    summary: 'Archive a SurfaceScope (one-way, retry-safe); its active children are archived first',
    auth: admins, params: ScopePath,
    body: Obj({ expected_version: Type.Optional(Type.Integer({ minimum: 1 })) }), response: SurfaceScopeSchema, mcp: 'full',
  }, (ws, { params, body, deps }) => deps.surfaceScopes.archive(ws, params.surface_scope_id, body.expected_version)),
];
