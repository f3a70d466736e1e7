import { ApiError, Id, Nullable, Obj, Page, PageQuery, Timestamp, Type } from '@agentplane/core';
import { tags } from '@agentplane/store';
import { ADMINS, READERS } from '../http/caller.js';
import { createOnce } from '../http/keyed-create.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { listWorkspaceDocs, workspaceRead, workspaceWrite } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import type { ApiDeps } from '../deps.js';
import type { Principal } from '@agentplane/domain';
import { FILE_TOOL_NAMES, namesFileTool, POLICY_EFFECTS, TOOL_KINDS } from './policy-eval.js';
import { POLICIES, type ActionPolicy, type ActionPolicyInput } from './policies.js';
import { MAX_APPROVAL_EXPIRY_SECONDS } from '../approvals/limits.js';

const Effect = Type.Union(POLICY_EFFECTS.map((e) => Type.Literal(e)));
const Kind = Type.Union(TOOL_KINDS.map((k) => Type.Literal(k)));
const Pattern = (max: number) => Type.String({ minLength: 1, maxLength: max });
const ToolSchema = Obj({
  kind: Type.Union([Kind, Type.Literal('any')]),
  name: Pattern(256),
  // A Connection, a synced A2A tool source (its skills are MCP-kind tools of the Run), or a
  // MemoryStore (its memory tools are MCP-kind tools named by the store: docs/GOVERNANCE.md).
  connection_id: Type.Optional(Nullable(Type.Union([Id('connection'), Id('toolSource'), Id('memoryStore')]))),
});
const ArgumentsSchema = Obj({
  command_prefix: Type.Optional(Nullable(Pattern(1024))),
  path_glob: Type.Optional(Nullable(Pattern(1024))),
});
const PolicyBody = {
  effect: Effect,
  tool: ToolSchema,
  arguments: Type.Optional(ArgumentsSchema),
  principal_id: Type.Optional(Nullable(Id('principal'))),
  description: Type.Optional(Nullable(Type.String({ maxLength: 1000 }))),
  approval_expires_in_seconds: Type.Optional(Nullable(Type.Integer({ minimum: 1, maximum: MAX_APPROVAL_EXPIRY_SECONDS }))),
};
export const ActionPolicySchema = Obj({
  id: Id('actionPolicy'), type: Type.Literal('action_policy'), workspace_id: Id('workspace'), description: Nullable(Type.String()),
  effect: Effect,
  tool: Obj({ kind: Type.Union([Kind, Type.Literal('any')]), name: Type.String(), connection_id: Nullable(Type.String()) }),
  arguments: Obj({ command_prefix: Nullable(Type.String()), path_glob: Nullable(Type.String()) }),
  principal_id: Nullable(Type.String()),
  approval_expires_in_seconds: Type.Optional(Nullable(Type.Integer())),
  version: Type.Integer(), created_at: Timestamp(), updated_at: Timestamp(),
});
const PolicyPath = Obj({ action_policy_id: Id('actionPolicy') });

type BodyIn = {
  effect: ActionPolicyInput['effect'];
  tool: { kind: ActionPolicyInput['tool']['kind']; name: string; connection_id?: string | null | undefined };
  arguments?: { command_prefix?: string | null | undefined; path_glob?: string | null | undefined } | undefined;
  principal_id?: string | null | undefined;
  description?: string | null | undefined;
  approval_expires_in_seconds?: number | null | undefined;
};

/** Normalise and check a rule: its Principal and Connection must be this Workspace's; argument patterns only where they mean something. */
async function input(deps: ApiDeps, ws: string, b: BodyIn): Promise<ActionPolicyInput> {
  const out: ActionPolicyInput = {
    effect: b.effect,
    tool: { kind: b.tool.kind, name: b.tool.name, connection_id: b.tool.connection_id ?? null },
    arguments: { command_prefix: b.arguments?.command_prefix ?? null, path_glob: b.arguments?.path_glob ?? null },
    principal_id: b.principal_id ?? null,
    description: b.description ?? null,
    approval_expires_in_seconds: b.approval_expires_in_seconds ?? null,
  };
  if (out.approval_expires_in_seconds !== null && out.effect !== 'require_approval') {
    throw new ApiError('validation.malformed', "body.approval_expires_in_seconds: only for effect 'require_approval'");
  }
  if (out.arguments.command_prefix && !(out.tool.kind === 'builtin' && out.tool.name === 'bash')) {
    throw new ApiError('validation.malformed', "body.arguments.command_prefix: only for the builtin tool 'bash'");
  }
  if (out.arguments.path_glob && (out.tool.kind !== 'builtin' || !namesFileTool(out.tool.name))) {
    throw new ApiError('validation.malformed', `body.arguments.path_glob: only for builtin file tools (${FILE_TOOL_NAMES.join(', ')})`);
  }
  if (out.tool.connection_id && out.tool.kind !== 'mcp') throw new ApiError('validation.malformed', "body.tool.connection_id: only for kind 'mcp'");
  if (out.principal_id) {
    const p = await deps.docs.get<Principal>(tags.workspace(ws), out.principal_id);
    if (!p || p.status === 'deleted') throw new ApiError('validation.not_found', `principal ${out.principal_id} not found`);
  }
  if (out.tool.connection_id) {
    const c = await deps.docs.get<{ workspace_id?: string } & import('@agentplane/store').StoredDoc>(tags.workspace(ws), out.tool.connection_id);
    if (!c || c.workspace_id !== ws) throw new ApiError('validation.not_found', `connection ${out.tool.connection_id} not found`);
  }
  return out;
}

const DecisionSchema = Obj({
  decision: Effect,
  rule_id: Nullable(Type.String()),
  explanation: Type.String(),
  matched: Type.Array(Obj({ rule_id: Type.String(), effect: Effect, specificity: Type.Integer() })),
});

export const policyOperations: Operation[] = [
  // Before `/{action_policy_id}`: the router matches in order.
  defineOperation({
    operationId: 'actionPolicies.evaluateActionPolicies', method: 'POST', path: '/v1/action-policies/evaluate',
    audit: false,
    summary: 'Dry run: which decision the current ActionPolicies give one call, and which rule decided',
    auth: { kind: 'bearer', roles: READERS },
    body: Obj({
      tool: Obj({ kind: Kind, name: Pattern(256), connection_id: Type.Optional(Type.Union([Id('connection'), Id('toolSource'), Id('memoryStore')])) }),
      input: Type.Optional(Type.Unknown()),
      principal_id: Type.Optional(Id('principal')),
    }),
    response: DecisionSchema, mcp: 'full',
    async handler({ caller, body, deps }) {
      return json(200, await deps.policies.explain(requireWorkspace(caller), {
        kind: body.tool.kind, name: body.tool.name, connection_id: body.tool.connection_id, input: body.input, principal_id: body.principal_id,
      }));
    },
  }),
  workspaceWrite('POST', {
    operationId: 'actionPolicies.createActionPolicy', path: '/v1/action-policies',
    audit: { target: 'response' },
    summary: 'Add an ActionPolicy rule (allow, deny or require_approval a tool, optionally by argument pattern and Principal)',
    auth: { kind: 'bearer', roles: ADMINS }, body: Obj(PolicyBody), response: ActionPolicySchema, successStatus: 201, idempotency: 'optional', mcp: 'full',
  }, async (ws, { body, deps, keyed }) => {
    const rule = await input(deps, ws, body);
    // Made once per keyed request: a duplicate rule would go on deciding after the other is deleted.
    return createOnce('actionPolicy', keyed, (id) => deps.policies.find(ws, id), (id) => deps.policies.create(ws, rule, id));
  }),
  workspaceRead({
    operationId: 'actionPolicies.listActionPolicies', path: '/v1/action-policies',
    summary: 'List the ActionPolicies of the Workspace, oldest first', auth: { kind: 'bearer', roles: READERS },
    query: PageQuery({}, 1000), response: Page(ActionPolicySchema), mcp: 'full',
  }, (ws, { query, deps }) => listWorkspaceDocs<ActionPolicy>(deps, ws, POLICIES, query)),
  workspaceRead({
    operationId: 'actionPolicies.getActionPolicy', path: '/v1/action-policies/{action_policy_id}',
    summary: 'Read an ActionPolicy', auth: { kind: 'bearer', roles: READERS }, params: PolicyPath, response: ActionPolicySchema, mcp: 'full',
  }, (ws, { params, deps }) => deps.policies.get(ws, params.action_policy_id)),
  workspaceWrite('POST', {
    operationId: 'actionPolicies.updateActionPolicy', path: '/v1/action-policies/{action_policy_id}',
    audit: { target: 'action_policy_id' },
    summary: 'Replace an ActionPolicy rule (compare-and-swap on expected_version); governs from the next call',
    auth: { kind: 'bearer', roles: ADMINS }, params: PolicyPath,
    body: Obj({ ...PolicyBody, expected_version: Type.Optional(Type.Integer({ minimum: 1 })) }), response: ActionPolicySchema,
    idempotency: 'optional', mcp: 'full',
  }, async (ws, { params, body, deps }) => {
    const { expected_version, ...rest } = body;
    return deps.policies.update(ws, params.action_policy_id, await input(deps, ws, rest), expected_version);
  }),
  workspaceWrite('DELETE', {
    operationId: 'actionPolicies.deleteActionPolicy', path: '/v1/action-policies/{action_policy_id}',
    audit: { target: 'action_policy_id' },
    summary: 'Remove an ActionPolicy rule', auth: { kind: 'bearer', roles: ADMINS }, params: PolicyPath,
    query: Obj({ expected_version: Type.Optional(Type.Integer({ minimum: 1 })) }),
    response: Obj({ id: Id('actionPolicy'), type: Type.Literal('action_policy_deleted') }), mcp: 'full',
  }, async (ws, { params, query, deps }) => {
    await deps.policies.remove(ws, params.action_policy_id, query.expected_version);
    return { id: params.action_policy_id, type: 'action_policy_deleted' };
  }),
];
