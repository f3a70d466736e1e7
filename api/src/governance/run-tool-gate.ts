import { ApiError, canonicalJson } from '@agentplane/core';
import { normalizeUrl, type RunDoc, type RuntimeGrant, type ToolPermission } from '@agentplane/domain';
import { keys, tags, type LogEvent } from '@agentplane/store';
import type { ApiDeps } from '../deps.js';
import { bySession, type ActionApproval } from '../approvals/service.js';
import { answeredWait, notCovered, sameCall } from '../approvals/coverage.js';
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

/**
 * What serves a runtime tool, as far as the Agent's permission policy (`always_allow` /
 * `always_ask`) is concerned.
 */
export type RuntimeToolServer =
  /**
   * A Connection's MCP server. Its tools are `always_ask` when the Run's grant says `ask`, or when
   * an `mcp_servers` entry of the Run's agent with the Connection's URL says `always_ask` (the
   * default), or when none of them names the Connection any more (its URL changed meanwhile).
   */
  | {
    kind: 'connection'; url: string; grant: ToolPermission;
    /**
     * The server's tools as the endpoint lists them (`name` the upstream's, `offered_name` the one
     * the endpoint offers it under): read once, only to check a confirmed use's name is this
     * tool's alone. Throws when the server cannot list them.
     */
    tools: () => Promise<Array<{ name: string; offered_name: string }>>;
  }
  /** An A2A tool source: every tool of it is `always_ask`. */
  | { kind: 'tool_source' }
  /** The memory tools: the platform's own, offered `always_allow` (no Agent permission names them). */
  | { kind: 'memory' };

/** One tool call a Run makes on a runtime endpoint with its runtime bearer. */
export interface RuntimeToolCall {
  /** The Connection (`conn_`), MemoryStore (`memstore_`) or A2A tool source (`tsrc_`) whose tool it is. */
  connection_id: string;
  /** The tool's own name (a Connection's upstream name, also under a deployment alias). */
  name: string;
  /** The name the endpoint offers the tool under (a deployment alias), when it is not `name`. */
  offered_name?: string;
  input: unknown;
  /** The tool use the call is for, when the caller names it (`_meta["dev.agentplane/tool_use_id"]`). */
  tool_use_id: string | undefined;
  server: RuntimeToolServer;
}

/** Approvals of a Session looked at for a call that names no tool use (its most recent ones). */
const RECENT_APPROVALS = 100;

type GateDeps = Pick<ApiDeps, 'policies' | 'approvals' | 'docs' | 'redis' | 'log' | 'sessions' | 'toolSources'>;

/**
 * The gate of the runtime endpoints (a Connection's tools, the memory tools, an A2A tool source's
 * tools), one for all three. First the ActionPolicies: the check the runner's `tool.check` asks for before each tool use, made
 * again by the control plane when the call arrives, so that a runtime bearer used without that
 * check (a leaked one, a harness that does not ask) gets no more than the Workspace's
 * ActionPolicies allow. The call is of kind `mcp`, decided for the Run's author Principals through
 * the same `PolicyStore` decisions as every other boundary (each decision a rule makes is an audit
 * record, actor the Run, target the Session); the strictest stands. A `require_approval` passes
 * only when an approved ActionApproval covers this very call (same tool, Connection and input):
 * the one of the tool use the call names (for the Run that obtained it or continues after its
 * wait, never a later Run), or, when it names none, one of this Run's. Nothing is
 * opened here: a call that needs an approval and has none is refused, as at every boundary that
 * cannot wait. Then the Agent's own permission policy: a tool that is `always_ask` runs only for
 * a tool use the Session confirmed (`requireConfirmedUse`). Throws 403 `policy.denied`.
 */
export async function requireRuntimeToolCall(
  deps: GateDeps, grant: RuntimeGrant, call: RuntimeToolCall, requestId: string | null,
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
  if (d.decision === 'require_approval') {
    let approved: boolean;
    try {
      approved = await approvedCall(deps, grant, call);
    } catch (err) {
      // The approvals, the Run or its thread could not be read: fail closed, as for the authors.
      deps.log.error({ err, run: grant.run_id }, 'could not read the ActionApproval of a runtime tool call; denying it');
      throw new ApiError('policy.denied', `${d.explanation}; the ActionApproval covering this call could not be read, so it is refused (fail closed)`);
    }
    if (!approved) {
      throw new ApiError('policy.denied', `${d.explanation}; no approved ActionApproval of this Run's turn covers this call, and none can be waited for here, so it is refused`);
    }
  }
  try {
    const asked = await askedTool(deps, grant, call);
    if (asked) await requireConfirmedUse(deps, grant, call, asked);
  } catch (err) {
    if (err instanceof ApiError) throw err;
    // The Run, its thread or the log could not be read: fail closed, as for the authors.
    deps.log.error({ err, run: grant.run_id }, "could not check the agent's permission policy; denying the runtime tool call");
    throw unconfirmedRefusal(call, "the Run's permission policy or the confirmation could not be read; denied (fail closed)");
  }
}

/**
 * Whether an approved ActionApproval of the grant's Session covers exactly this call. The approval
 * of a named tool use counts for the Run that obtained it, or for the Run that continues after
 * the use's wait (`notCovered`, docs in approvals/coverage.ts); a later Run of the Session (one a message started, or one
 * past an interrupt or a later wait) cannot replay it.
 */
async function approvedCall(deps: GateDeps, grant: RuntimeGrant, call: RuntimeToolCall): Promise<boolean> {
  const tool = { kind: 'mcp' as const, name: call.name, connection_id: call.connection_id };
  const coverage = { docs: deps.docs, sessions: deps.sessions.store };
  const approved = (a: ActionApproval | null | undefined): a is ActionApproval => !!a && a.status === 'approved' && a.session_id === grant.session_id;
  if (call.tool_use_id !== undefined) {
    const a = await deps.approvals.forToolUse(grant.workspace_id, grant.session_id, call.tool_use_id);
    return approved(a) && (await notCovered(coverage, a, grant.run_id, tool, call.input)) === null;
  }
  // No tool use named (an agent inside the sandbox calls through the runner's proxy, which checked
  // the call under an id of its own): an approval this Run obtained for this very call.
  const tag = tags.workspace(grant.workspace_id);
  const ids = await deps.redis.zrevrange(keys.index(tag, bySession(grant.session_id)), 0, RECENT_APPROVALS - 1);
  if (ids.length === 0) return false;
  const approvals = await deps.docs.getMany<ActionApproval>(tag, ids);
  return approvals.some((a) => approved(a) && a.run_id === grant.run_id && sameCall(a, tool, call.input));
}

/** Events read back from a confirmation, at most, for the tool use it answers. */
const USE_SCAN_EVENTS = 1000;
const USE_SCAN_PAGE = 250;

/** Calls refused because their `always_ask` tool use was not confirmed (an endpoint may count them apart). */
const unconfirmed = new WeakSet<ApiError>();

/** Whether `err` refused an `always_ask` tool for want of a confirmation of its use. */
export function refusedUnconfirmed(err: ApiError): boolean {
  return unconfirmed.has(err);
}

/** The refusal of a call of an `always_ask` tool whose use is not confirmed: 403 `policy.denied`, saying why. */
function unconfirmedRefusal(call: RuntimeToolCall, why: string): ApiError {
  const err = new ApiError('policy.denied', `tool '${call.name}' of ${call.connection_id} is always_ask in the agent's permission policy: it runs only for a tool use confirmed by a user.tool_confirmation with result allow, named in _meta["${TOOL_USE_META}"]; ${why}`);
  unconfirmed.add(err);
  return err;
}

/**
 * The name the harness offers a runtime tool to the model under: `<server>__<tool>` (the agent's
 * `mcp_servers` entry name, the tool's name at the endpoint), other characters than
 * `[A-Za-z0-9_-]` as `_`, at most 64 characters. A tool use's `agent.tool_use` carries it.
 */
function offeredName(server: string, tool: string): string {
  return `${server}__${tool}`.replace(/[^a-zA-Z0-9_-]/g, '_').slice(0, 64);
}

/** An `always_ask` tool's Run and the servers the Run's harness may offer tools under. */
interface AskedTool {
  /** The Run as recorded, null when it is not. */
  run: RunDoc | null;
  /** The names of the agent's `mcp_servers` entries this tool may have been offered under. */
  servers: string[];
  /**
   * The names of the Run's other tool servers: the agent's other `mcp_servers` entries, and the
   * memory servers the harness adds for the Session's MemoryStores (`memory`, `memory_2`, …).
   */
  others: string[];
}

/**
 * Whether the Agent's permission policy makes the called tool `always_ask`; if so, the Run (as
 * recorded, null when it is not), the names of the agent's `mcp_servers` entries the tool may
 * have been offered under, and the Run's other servers. The Run's agent is the version the Run
 * executes, so a Connection's permission is read from it (a grant says `allow` for an
 * `always_ask` server: the harness asks).
 */
async function askedTool(deps: GateDeps, grant: RuntimeGrant, call: RuntimeToolCall): Promise<AskedTool | null> {
  const server = call.server;
  if (server.kind === 'memory') return null;
  const run = await deps.sessions.store.run(grant.session_id, grant.run_id);
  const entries = run?.agent.mcp_servers ?? [];
  // As the scheduler names them for the harness: `memory`, then `memory_2`, `memory_3`, …
  const memory = Object.keys(grant.memory ?? {}).map((_, i) => (i === 0 ? 'memory' : `memory_${i + 1}`));
  const asked = (serves: (s: (typeof entries)[number]) => boolean): AskedTool => ({
    run, servers: entries.flatMap((s) => (serves(s) ? [s.name] : [])), others: [...entries.flatMap((s) => (serves(s) ? [] : [s.name])), ...memory],
  });
  if (server.kind === 'tool_source') return asked((s) => s.type === 'a2a_tool_source' && s.tool_source_id === call.connection_id);
  const url = normalizeUrl(server.url);
  const serves = (s: (typeof entries)[number]): boolean => s.type !== 'a2a_tool_source' && normalizeUrl(s.url) === url;
  const same = entries.filter(serves);
  if (server.grant === 'ask') return asked(serves);
  // A bearer for a Run with no record (only ever minted outside the lease work) has its grant to go by.
  if (!run) return null;
  if (same.length === 0 || same.some((s) => (s.permission ?? 'always_ask') === 'always_ask')) return asked(serves);
  return null;
}

/**
 * An `always_ask` tool runs only for a tool use the Session confirmed, as the harness runs it:
 * the call names the use (`_meta["dev.agentplane/tool_use_id"]`); the calling Run continues after
 * answered waits (a Run started by a message never runs a confirmed use); on the Run's thread, the
 * use is a wait of the current generation answered by a `user.tool_confirmation` with `allow`
 * (the thread's `_waits` index names the answering event: one read of the log); and the use's
 * `agent.tool_use`, found at most USE_SCAN_EVENTS events before that answer, is a use of this
 * tool (under a name the agent's servers offer it by) with these arguments. Anything else is
 * refused (403 `policy.denied`), before the call goes anywhere.
 */
async function requireConfirmedUse(deps: GateDeps, grant: RuntimeGrant, call: RuntimeToolCall, asked: AskedTool): Promise<void> {
  const { run, servers } = asked;
  const toolUseId = call.tool_use_id;
  const refuse = (why: string): never => {
    throw unconfirmedRefusal(call, why);
  };
  if (toolUseId === undefined) return refuse('this call names no tool use');
  if (!run) return refuse(`run ${grant.run_id} has no record to check the confirmation against`);
  if (!run.continues_run_id) return refuse(`run ${grant.run_id} does not continue after answered waits, so no confirmed use is its to run`);
  const sessionId = grant.session_id;
  const { wait, stale } = await answeredWait(deps.docs, sessionId, run.session_thread_id, toolUseId);
  if (stale) return refuse(`the confirmation of ${toolUseId} answered an earlier wait of the thread, not the one this Run continues`);
  if (!wait || wait.kind !== 'confirmation' || wait.answered_seq === undefined) {
    return refuse(`no user.tool_confirmation answered ${toolUseId} on the Run's thread`);
  }
  const seq = wait.answered_seq;
  const [answer] = await deps.sessions.store.log.range(sessionId, seq - 1, 1, seq);
  const confirmation = answer?.payload as { tool_use_id?: unknown; result?: unknown } | undefined;
  if (!answer || answer.id !== wait.answered_event_id || answer.type !== 'user.tool_confirmation' || confirmation?.tool_use_id !== toolUseId) {
    return refuse(`the confirmation of ${toolUseId} is no longer in the Session's log`);
  }
  if (confirmation.result !== 'allow') return refuse(`${toolUseId} was denied by its user.tool_confirmation`);
  const use = await toolUseBefore(deps, sessionId, run.session_thread_id, toolUseId, seq);
  if (!use) return refuse(`the agent.tool_use of ${toolUseId} is not among the ${USE_SCAN_EVENTS} events before its confirmation`);
  const offered = call.offered_name ?? call.name;
  const names = new Set(servers.map((s) => offeredName(s, offered)));
  if (!names.has(String(use.name)) || canonicalJson(use.input ?? {}) !== canonicalJson(call.input ?? {})) {
    return refuse(`${toolUseId} is a use of ${String(use.name)} with other arguments or of another tool, so its confirmation does not cover this call`);
  }
  await requireOnlyToolNamed(deps, grant, call, asked, String(use.name));
}

/**
 * A confirmed use names its tool by the name the harness offered it under, which distinct tools
 * may share (`offeredName`). The confirmation covers this call only when no other tool the Run
 * may be offered has that name: none of this server's other tools (read once, from the endpoint's
 * own list) under any of the agent's entries for it, and no other server of the Run whose
 * offered names begin as this one does (`<other server>__…`; their tools are not listed here, so
 * such a server refuses the call whether or not it lists a tool of that name). The built-in
 * harness offers no name two tools share, so it never meets this refusal. Throws 403
 * `policy.denied` naming the collision.
 */
async function requireOnlyToolNamed(deps: GateDeps, grant: RuntimeGrant, call: RuntimeToolCall, asked: AskedTool, name: string): Promise<void> {
  const collision = (what: string): ApiError => new ApiError('policy.denied', `tool '${call.name}' of ${call.connection_id} is offered to the model as '${name}', and so ${what}: a confirmation of a use of '${name}' cannot tell them apart, so it covers neither (the built-in harness offers neither)`);
  const server = call.server;
  let tools: Array<{ name: string; offered_name: string }>;
  try {
    if (server.kind === 'connection') tools = await server.tools();
    else if (server.kind === 'tool_source') tools = (await deps.toolSources.getSource(grant.workspace_id, call.connection_id)).tools.map((t) => ({ name: t.name, offered_name: t.name }));
    else tools = [];
  } catch (err) {
    deps.log.warn({ err: err instanceof Error ? err.message : String(err), run: grant.run_id, connection_id: call.connection_id }, 'could not list the tools of a runtime server to rule out a name collision; denying the call');
    throw new ApiError('policy.denied', `the tools of ${call.connection_id} could not be listed to make sure '${name}' names tool '${call.name}' alone; denied (fail closed)`);
  }
  const twin = tools.find((t) => t.name !== call.name && asked.servers.some((s) => offeredName(s, t.offered_name) === name));
  if (twin) throw collision(`is its tool '${twin.name}'`);
  const other = asked.others.find((s) => name.startsWith(offeredName(s, '')));
  if (other !== undefined) throw collision(`may be a tool of the Run's server '${other}'`);
}

/** The payload of the `agent.tool_use` of `toolUseId` on the thread, read back from `beforeSeq` (bounded), or null. */
async function toolUseBefore(deps: GateDeps, sessionId: string, threadId: string, toolUseId: string, beforeSeq: number): Promise<{ name?: unknown; input?: unknown } | null> {
  let before = beforeSeq;
  for (let scanned = 0; scanned < USE_SCAN_EVENTS;) {
    const page: LogEvent[] = await deps.sessions.store.log.rangeBackward(sessionId, before, Math.min(USE_SCAN_PAGE, USE_SCAN_EVENTS - scanned));
    if (page.length === 0) return null;
    for (const e of page) {
      const p = e.payload as { id?: unknown; name?: unknown; input?: unknown } | null;
      if (e.type === 'agent.tool_use' && e.session_thread_id === threadId && p?.id === toolUseId) return p;
    }
    scanned += page.length;
    before = (page[page.length - 1] as LogEvent).seq;
  }
  return null;
}
