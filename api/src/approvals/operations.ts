import { Id, Nullable, Obj, Page, PageQuery, Timestamp, Type } from '@agentplane/core';
import { tags } from '@agentplane/store';
import { ADMINS, READERS } from '../http/caller.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { workspaceRead } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import type { Caller } from '../http/caller.js';
import { APPROVAL_STATUSES, APPROVALS, bySession, type ActionApproval } from './service.js';

const Status = Type.Union(APPROVAL_STATUSES.map((s) => Type.Literal(s)));
const Actor = Obj({ id: Type.String(), credential_id: Nullable(Type.String()) });
export const ActionApprovalSchema = Obj({
  id: Id('approval'), type: Type.Literal('action_approval'), workspace_id: Id('workspace'),
  session_id: Id('session'), session_thread_id: Id('thread'), run_id: Id('run'), tool_use_id: Type.String(),
  tool: Obj({ kind: Type.String(), name: Type.String(), connection_id: Nullable(Type.String()) }),
  input: Type.Unknown(), principal_ids: Type.Array(Id('principal')), rule_id: Nullable(Type.String()),
  status: Status, expires_at: Timestamp(), resolved_at: Nullable(Timestamp()), resolved_by: Nullable(Actor), reason: Nullable(Type.String()),
  version: Type.Integer(), created_at: Timestamp(), updated_at: Timestamp(),
});
const ApprovalPath = Obj({ approval_id: Id('approval') });
const ListQuery = PageQuery({ status: Type.Optional(Status) });
const ResolveBody = Obj({
  expected_version: Type.Optional(Type.Integer({ minimum: 1 })),
  reason: Type.Optional(Nullable(Type.String({ maxLength: 1000 }))),
});

const actorOf = (caller: Caller) => ({ id: caller.principalId ?? caller.credentialId, credential_id: caller.credentialId });

/**
 * ActionApprovals (docs/GOVERNANCE.md, "ActionApprovals"): the approvals queue per Workspace and
 * per Session, and their resolution. API keys: readers list, admins resolve. Principal
 * credentials need `approve` on the Session (or its Agent, or the Workspace).
 */
export const approvalOperations: Operation[] = [
  defineOperation({
    operationId: 'approvals.listActionApprovals', method: 'GET', path: '/v1/action-approvals',
    summary: 'The approvals queue of the Workspace, oldest first; `status=pending` for what waits',
    auth: { kind: 'bearer', roles: READERS, principal: true }, permission: { action: 'approve', target: 'workspace' }, mcpPrincipal: true,
    query: ListQuery, response: Page(ActionApprovalSchema),
    async handler({ caller, query, deps }) {
      const ws = requireWorkspace(caller);
      const status = query.status;
      return json(200, await deps.docs.list<ActionApproval>(tags.workspace(ws), APPROVALS, { limit: query.limit ?? 20, page: query.page, order: 'asc' },
        status === undefined ? undefined : (a) => a.status === status));
    },
  }),
  defineOperation({
    operationId: 'approvals.listSessionActionApprovals', method: 'GET', path: '/v1/sessions/{session_id}/action-approvals',
    summary: "The approvals queue of one Session, oldest first",
    auth: { kind: 'bearer', roles: READERS, principal: true }, permission: { action: 'approve', target: 'session_id' }, mcpPrincipal: true,
    params: Obj({ session_id: Id('session') }), query: ListQuery, response: Page(ActionApprovalSchema),
    async handler({ caller, params, query, deps }) {
      const ws = requireWorkspace(caller);
      await deps.sessions.store.get(ws, params.session_id);
      const status = query.status;
      return json(200, await deps.docs.list<ActionApproval>(tags.workspace(ws), bySession(params.session_id), { limit: query.limit ?? 20, page: query.page, order: 'asc' },
        status === undefined ? undefined : (a) => a.status === status));
    },
  }),
  workspaceRead({
    operationId: 'approvals.getActionApproval', path: '/v1/action-approvals/{approval_id}',
    summary: 'Read an ActionApproval: the tool use, its input, the rule that asked, its status',
    auth: { kind: 'bearer', roles: READERS, principal: true }, permission: { action: 'approve', target: 'approval_id' }, mcpPrincipal: true,
    params: ApprovalPath, response: ActionApprovalSchema,
  }, (ws, { params, deps }) => deps.approvals.get(ws, params.approval_id)),
  resolveOperation('approve', 'Approve a pending ActionApproval: the waiting tool use runs once and the turn continues'),
  resolveOperation('deny', 'Deny a pending ActionApproval: the tool use is refused (the model gets a refusal naming the approval) and the turn continues'),
];

/** `POST /v1/action-approvals/{approval_id}/approve|deny`: one resolution, the same checks either way. */
function resolveOperation(decision: 'approve' | 'deny', summary: string): Operation {
  return defineOperation({
    operationId: `approvals.${decision}ActionApproval`, method: 'POST', path: `/v1/action-approvals/{approval_id}/${decision}`,
    audit: { target: 'approval_id' }, summary,
    auth: { kind: 'bearer', roles: ADMINS, principal: true }, permission: { action: 'approve', target: 'approval_id' },
    params: ApprovalPath, body: ResolveBody, response: ActionApprovalSchema, idempotency: 'optional',
    async handler({ caller, params, body, deps, trace }) {
      return json(200, await deps.approvals.resolve(requireWorkspace(caller), params.approval_id, decision,
        { expectedVersion: body.expected_version, reason: body.reason, trace }, actorOf(caller)));
    },
  });
}
