import { ApiError, canonicalJson } from '@agentplane/core';
import type { RuntimeGrant } from '@agentplane/domain';
import { keys, tags } from '@agentplane/store';
import type { ApiDeps } from '../deps.js';
import { bySession, type ActionApproval } from '../approvals/service.js';
import type { PolicyDecision } from './policy-eval.js';

/**
 * `_meta` key of a runtime `tools/call` naming the tool use the runner checked (`tool.check`)
 * before calling; on the tool-source endpoint it is also the call's identity across retries.
 */
export const TOOL_USE_META = 'dev.agentplane/tool_use_id';

/** The tool use id a runtime `tools/call` names in its `_meta`, if it names a plausible one. */
export function toolUseIdOf(meta: Record<string, unknown> | undefined): string | undefined {
  const v = meta?.[TOOL_USE_META];
  return typeof v === 'string' && v.length > 0 && v.length <= 128 ? v : undefined;
}

/** One tool call a Run makes on a runtime endpoint with its runtime bearer. */
export interface RuntimeToolCall {
  /** The Connection (`conn_`), MemoryStore (`memstore_`) or A2A tool source (`tsrc_`) whose tool it is. */
  connection_id: string;
  /** The tool's own name (a Connection's upstream name, also under a deployment alias). */
  name: string;
  input: unknown;
  /** The tool use the call is for, when the caller names it (`_meta["dev.agentplane/tool_use_id"]`). */
  tool_use_id: string | undefined;
}

/** Approvals of a Session looked at for a call that names no tool use (its most recent ones). */
const RECENT_APPROVALS = 100;

/**
 * The ActionPolicy gate of the runtime endpoints (a Connection's tools, the memory tools, an A2A
 * tool source's tools): the check the runner's `tool.check` asks for before each tool use, made
 * again by the control plane when the call arrives, so that a runtime bearer used without that
 * check (a leaked one, a harness that does not ask) gets no more than the Workspace's
 * ActionPolicies allow. The call is of kind `mcp`, decided for the Run's author Principals through
 * the same `PolicyStore` decisions as every other boundary (each decision a rule makes is an audit
 * record, actor the Run, target the Session); the strictest stands. A `require_approval` passes
 * only when an approved ActionApproval covers this very call (same tool, Connection and input):
 * the one of the tool use the call names, or, when it names none, one of this Run's. Nothing is
 * opened here: a call that needs an approval and has none is refused, as at every boundary that
 * cannot wait. Throws 403 `policy.denied`.
 */
export async function requireRuntimeToolCall(
  deps: Pick<ApiDeps, 'policies' | 'approvals' | 'docs' | 'redis' | 'log'>, grant: RuntimeGrant, call: RuntimeToolCall, requestId: string | null,
): Promise<void> {
  let d: PolicyDecision;
  try {
    d = await deps.policies.decideForPrincipals(
      grant.workspace_id, { kind: 'mcp', name: call.name, connection_id: call.connection_id, input: call.input },
      () => deps.approvals.authors.of(grant.session_id, grant.run_id),
      { actor: { id: grant.run_id, credential_id: null }, target: grant.session_id, request_id: requestId },
    );
  } catch (err) {
    // Without its authors the Principal-scoped rules cannot be applied: fail closed, as `tool.check` does.
    deps.log.error({ err, run: grant.run_id }, 'could not read the Run author Principals; denying the runtime tool call');
    throw new ApiError('policy.denied', "the Run's author Principals could not be determined, so its ActionPolicies cannot be applied; denied (fail closed)");
  }
  if (d.decision === 'deny') throw new ApiError('policy.denied', d.explanation);
  if (d.decision === 'require_approval' && !(await approvedCall(deps, grant, call))) {
    throw new ApiError('policy.denied', `${d.explanation}; no approved ActionApproval covers this call, and none can be waited for here, so it is refused`);
  }
}

/** Whether an approved ActionApproval of the grant's Session covers exactly this call. */
async function approvedCall(deps: Pick<ApiDeps, 'approvals' | 'docs' | 'redis'>, grant: RuntimeGrant, call: RuntimeToolCall): Promise<boolean> {
  const input = canonicalJson(call.input ?? {});
  const covers = (a: ActionApproval | null | undefined): boolean => !!a && a.status === 'approved' && a.session_id === grant.session_id
    && a.tool.kind === 'mcp' && a.tool.name === call.name && a.tool.connection_id === call.connection_id && canonicalJson(a.input ?? {}) === input;
  if (call.tool_use_id !== undefined) return covers(await deps.approvals.forToolUse(grant.workspace_id, grant.session_id, call.tool_use_id));
  // No tool use named (an agent inside the sandbox calls through the runner's proxy, which checked
  // the call under an id of its own): an approval this Run obtained for this very call.
  const tag = tags.workspace(grant.workspace_id);
  const ids = await deps.redis.zrevrange(keys.index(tag, bySession(grant.session_id)), 0, RECENT_APPROVALS - 1);
  if (ids.length === 0) return false;
  const approvals = await deps.docs.getMany<ActionApproval>(tag, ids);
  return approvals.some((a) => a.run_id === grant.run_id && covers(a));
}
