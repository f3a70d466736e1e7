import { ApiError, Id, Obj, PageQuery, Page, Timestamp, Type } from '@agentplane/core';
import { tags } from '@agentplane/store';
import { ADMINS, READERS } from '../http/caller.js';
import { createOnce } from '../http/keyed-create.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import type { ApiDeps } from '../deps.js';
import type { Principal } from '@agentplane/domain';
import { ASSIGNMENTS, byPrincipal, PERMISSION_ACTIONS, type PermissionAssignment, type PermissionTarget } from './permissions.js';

const ActionSchema = Type.Union(PERMISSION_ACTIONS.map((a) => Type.Literal(a)));
const Actions = Type.Array(ActionSchema, { minItems: 1, maxItems: PERMISSION_ACTIONS.length, uniqueItems: true });
const TargetSchema = Type.Union([
  Obj({ type: Type.Literal('workspace'), id: Id('workspace') }),
  Obj({ type: Type.Literal('agent'), id: Id('agent') }),
  Obj({ type: Type.Literal('session'), id: Id('session') }),
  Obj({ type: Type.Literal('memory_store'), id: Id('memoryStore') }),
  Obj({ type: Type.Literal('surface_scope'), id: Id('surfaceScope') }),
]);
export const PermissionAssignmentSchema = Obj({
  id: Id('permissionAssignment'), type: Type.Literal('permission_assignment'), workspace_id: Id('workspace'),
  principal_id: Id('principal'), target: TargetSchema, actions: Actions,
  version: Type.Integer(), created_at: Timestamp(), updated_at: Timestamp(),
});
const AssignmentPath = Obj({ permission_assignment_id: Id('permissionAssignment') });

/** The target must be in the caller's Workspace; another Workspace's target is simply not found. */
async function checkTarget(deps: ApiDeps, ws: string, target: PermissionTarget): Promise<void> {
  if (target.type === 'workspace') {
    if (target.id !== ws) throw new ApiError('validation.not_found', `workspace ${target.id} not found`);
  } else if (target.type === 'agent') {
    await deps.agents.get(ws, target.id);
  } else if (target.type === 'memory_store') {
    await deps.memory.getStore(ws, target.id);
  } else if (target.type === 'surface_scope') {
    await deps.surfaceScopes.get(ws, target.id);
  } else {
    await deps.sessions.store.get(ws, target.id);
  }
}

export const governanceOperations: Operation[] = [
  workspaceWrite('POST', {
    operationId: 'permissionAssignments.createPermissionAssignment', path: '/v1/permission-assignments',
    audit: { target: 'response' },
    summary: 'Grant a Principal actions on a target (an Agent, a Session or the Workspace)', auth: { kind: 'bearer', roles: ADMINS },
    body: Obj({ principal_id: Id('principal'), target: TargetSchema, actions: Actions }),
    response: PermissionAssignmentSchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, async (ws, { body, deps, keyed }) => {
    const p = await deps.docs.get<Principal>(tags.workspace(ws), body.principal_id);
    if (!p || p.status === 'deleted') throw new ApiError('validation.not_found', `principal ${body.principal_id} not found`);
    await checkTarget(deps, ws, body.target);
    // Made once per keyed request: a duplicate grant would outlive the revocation of the other.
    return createOnce('permissionAssignment', keyed, (id) => deps.permissions.find(ws, id), (id) => deps.permissions.create(ws, body, id), 'permission-assignment-created');
  }),
  defineOperation({
    operationId: 'permissionAssignments.listPermissionAssignments', method: 'GET', path: '/v1/permission-assignments',
    summary: 'List PermissionAssignments, oldest first; optionally of one Principal or on one target', auth: { kind: 'bearer', roles: READERS },
    query: PageQuery({ principal_id: Type.Optional(Id('principal')), target_id: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })) }),
    response: Page(PermissionAssignmentSchema), mcp: 'full',
    async handler({ caller, query, deps }) {
      const ws = requireWorkspace(caller);
      const collection = query.principal_id ? byPrincipal(query.principal_id) : ASSIGNMENTS;
      const target = query.target_id;
      return json(200, await deps.docs.list<PermissionAssignment>(tags.workspace(ws), collection,
        { limit: query.limit ?? 20, page: query.page, order: 'asc' },
        target === undefined ? undefined : (a) => a.target.id === target));
    },
  }),
  workspaceRead({
    operationId: 'permissionAssignments.getPermissionAssignment', path: '/v1/permission-assignments/{permission_assignment_id}',
    summary: 'Read a PermissionAssignment', auth: { kind: 'bearer', roles: READERS }, params: AssignmentPath,
    response: PermissionAssignmentSchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.permissions.get(ws, params.permission_assignment_id)),
  workspaceWrite('POST', {
    operationId: 'permissionAssignments.updatePermissionAssignment', path: '/v1/permission-assignments/{permission_assignment_id}',
    audit: { target: 'permission_assignment_id' },
    summary: 'Replace the actions of a PermissionAssignment (compare-and-swap on expected_version); takes effect from the next request',
    auth: { kind: 'bearer', roles: ADMINS }, params: AssignmentPath,
    body: Obj({ actions: Actions, expected_version: Type.Optional(Type.Integer({ minimum: 1 })) }),
    response: PermissionAssignmentSchema, idempotency: 'optional', mcp: 'full',
  }, (ws, { params, body, deps }) => deps.permissions.update(ws, params.permission_assignment_id, body.actions, body.expected_version)),
  workspaceWrite('DELETE', {
    operationId: 'permissionAssignments.deletePermissionAssignment', path: '/v1/permission-assignments/{permission_assignment_id}',
    audit: { target: 'permission_assignment_id' },
    summary: 'Revoke a PermissionAssignment: the very next request that needed it is denied', auth: { kind: 'bearer', roles: ADMINS },
    params: AssignmentPath, query: Obj({ expected_version: Type.Optional(Type.Integer({ minimum: 1 })) }),
    response: Obj({ id: Id('permissionAssignment'), type: Type.Literal('permission_assignment_deleted') }), mcp: 'full',
  }, async (ws, { params, query, deps }) => {
    await deps.permissions.remove(ws, params.permission_assignment_id, query.expected_version);
    return { id: params.permission_assignment_id, type: 'permission_assignment_deleted' };
  }),
];
