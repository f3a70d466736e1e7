import type Koa from 'koa';
import { Server, type CallToolResult } from '@modelcontextprotocol/server';
import { ApiError, Counter, isId } from '@agentplane/core';
import type { RuntimeBearerVerifier, RuntimeGrant } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import { recordRefusedCall, runtimeMcpEdge, runtimeRefusals } from '../mcp/runtime-edge.js';
import { requireRuntimeToolCall, TOOL_USE_META } from '../governance/run-tool-gate.js';
import { PeerCustodian, type PeerCustody } from './custody.js';
import type { ToolSourceDoc } from './service.js';

export const RUNTIME_TOOL_SOURCE_PATH = /^\/v1\/runtime\/toolsource\/([^/]+)$/;
/** The harness's tool use id on `tools/call` (`_meta[TOOL_USE_META]`): the call's identity across retries. */
const TOOL_USE_ID = /^toolu_[A-Za-z0-9_-]{1,96}$/;

interface Context {
  grant: RuntimeGrant;
  source: ToolSourceDoc;
  /** The request's id: its audit records carry it. */
  requestId: string;
}

const text = (t: string, isError = false): CallToolResult => ({ content: [{ type: 'text', text: t }], ...(isError ? { isError: true } : {}) });

/**
 * `POST /v1/runtime/toolsource/{tool_source_id}`: a synced A2A tool source's skills as MCP tools
 * for one Run (each `always_ask`: the harness asks through `user.tool_confirmation`, and the
 * runner's `tool.check`, before it calls). Authenticated by the lease's runtime bearer only, for
 * the tool sources the agent version attached. Every call passes the Workspace's ActionPolicies
 * here too, whatever the runner decided, and runs only for a tool use the Session confirmed; each
 * is one audit record. A call is one
 * `A2aToolCalls.invoke` under the harness's tool use id, so a retried call is the same call (one
 * `exec.tool_invocation`). Peer credentials come from the Session's vaults (a secret matching the
 * peer's JSON-RPC URL) and stay in this process.
 */
export function runtimeToolSource(deps: ApiDeps, verifier: RuntimeBearerVerifier): Koa.Middleware {
  const calls = new Counter({ name: 'agentplane_runtime_a2a_tool_calls_total', help: 'A2A tool calls through the runtime endpoint by outcome (the task status: completed, failed, indeterminate, ...; denied, rejected, error)', labelNames: ['outcome'] as const, registers: [deps.metrics] });

  const custodian = new PeerCustodian(deps.vaults, deps.redis, { egress: deps.config.webhooks.egress });
  /** The peer credential from the Session's vaults, by the card's security alternative; it stays in this process. */
  async function peerCustody(grant: RuntimeGrant, discovery: NonNullable<ToolSourceDoc['discovery']>): Promise<PeerCustody> {
    const session = await deps.sessions.store.get(grant.workspace_id, grant.session_id).catch(() => null);
    return session ? custodian.resolve(grant.workspace_id, session.vault_ids, discovery) : { headers: {} };
  }

  function buildServer(ctx: Context): Server {
    const server = new Server({ name: 'agentplane-a2a-tools', version: '0.1.0' }, { capabilities: { tools: { listChanged: false } } });
    server.setRequestHandler('tools/list', () => ({
      tools: ctx.source.tools.map((t) => ({
        name: t.name, description: t.description || t.name,
        inputSchema: { type: 'object' as const, properties: { text: { type: 'string', description: 'The message sent to the agent' } }, required: ['text'] },
        _meta: { 'dev.agentplane/permission': 'ask' },
      })),
    }));
    /**
     * Every tool call the Run makes here is one audit record of the Workspace, as the Run
     * (`toolSources.runtimeCallTool:<tool>`, target the tool source), as on the Connection
     * endpoint: succeeded (the task completed), failed (the call refused for its arguments, an
     * unknown tool, an unsynced source, a credential that cannot be presented; or the peer's
     * task did not complete: 502, detail its status), denied (an ActionPolicy, or a use not
     * confirmed) or error (this process failed), with its status and error type.
     */
    const record = (tool: string, outcome: 'succeeded' | 'failed' | 'denied' | 'error', status: number, detail: string | null) => deps.audit.append(ctx.grant.workspace_id, {
      actor: { id: ctx.grant.run_id, credential_id: null }, action: `toolSources.runtimeCallTool:${tool}`, target: ctx.source.id,
      outcome, status, detail, request_id: ctx.requestId,
    }).catch((err: unknown) => deps.log.error({ err, tool_source_id: ctx.source.id, tool }, 'audit append failed'));
    /** A call refused (before the peer, for all but a Session erased meanwhile): recorded, and answered with the error's wire body. */
    const refuse = async (tool: string, err: ApiError): Promise<CallToolResult> => {
      calls.inc({ outcome: err.type === 'policy.denied' ? 'denied' : 'rejected' });
      await record(tool, err.status === 401 || err.status === 403 ? 'denied' : 'failed', err.status, err.type);
      return text(JSON.stringify(err.toWire(deps.config.docsUrl)), true);
    };
    server.setRequestHandler('tools/call', async (request): Promise<CallToolResult> => {
      const tool = request.params.name;
      const toolUseId = request.params._meta?.[TOOL_USE_META];
      if (typeof toolUseId !== 'string' || !TOOL_USE_ID.test(toolUseId)) {
        return refuse(tool, new ApiError('validation.malformed', `_meta.${TOOL_USE_META}: the tool use id is required`));
      }
      if (!ctx.source.tools.some((t) => t.name === tool)) return refuse(tool, new ApiError('validation.not_found', `tool source ${ctx.source.id} has no tool ${tool}`));
      const discovery = ctx.source.discovery;
      if (!discovery) return refuse(tool, new ApiError('validation.conflict', `tool source ${ctx.source.id} is not synced`));
      const input = request.params.arguments ?? {};
      const message = typeof input['text'] === 'string' ? input['text'] : JSON.stringify(input);
      try {
        // The Workspace's ActionPolicies, decided here as well as by the runner before it called
        // (an `mcp` tool whose connection_id is the tool source), then the confirmation every tool
        // of a source needs (always_ask): a refused call never reaches the peer, nor its
        // credential the token endpoint, whoever holds the bearer.
        await requireRuntimeToolCall(deps, ctx.grant, { connection_id: ctx.source.id, name: tool, input, tool_use_id: toolUseId, server: { kind: 'tool_source' } }, ctx.requestId);
        const custody = await peerCustody(ctx.grant, discovery);
        const r = await deps.a2aCalls.invoke({
          workspace_id: ctx.grant.workspace_id, session_id: ctx.grant.session_id, session_thread_id: ctx.grant.session_thread_id ?? null, call_id: toolUseId,
          source: ctx.source, tool, text: message, headers: custody.headers, tls: custody.tls,
          ...(custody.renew ? { reauthorize: custody.renew } : {}),
        });
        calls.inc({ outcome: r.outcome.status });
        const completed = r.outcome.status === 'completed';
        // A task that did not complete is the peer's failure: a bad gateway, as an upstream's on the Connection endpoint.
        await record(tool, completed ? 'succeeded' : 'failed', completed ? 200 : 502, completed ? null : r.outcome.status);
        return completed ? text(r.outcome.text) : text(`${r.outcome.status}${r.outcome.text ? `: ${r.outcome.text}` : ''}`, true);
      } catch (err) {
        if (err instanceof ApiError) return refuse(tool, err);
        calls.inc({ outcome: 'error' });
        await record(tool, 'error', 500, 'runtime.internal');
        throw err;
      }
    });
    return server;
  }

  return runtimeMcpEdge<Context>(deps, verifier, {
    path: RUNTIME_TOOL_SOURCE_PATH,
    name: 'runtime tool source',
    async authorize(grant, id, requestId) {
      if (!isId('toolSource', id) || !(grant.tool_sources ?? []).includes(id)) return runtimeRefusals.denied(`run ${grant.run_id} has no tool source ${id}`);
      const source = await deps.toolSources.getSource(grant.workspace_id, id).catch(() => null);
      if (!source) return runtimeRefusals.notFound(`tool source ${id}`);
      return { grant, source, requestId };
    },
    buildServer,
    recordRefused: (grant, id, tool, refusal, requestId) =>
      recordRefusedCall(deps, grant, `toolSources.runtimeCallTool:${tool}`, isId('toolSource', id) ? id : null, refusal, requestId),
  });
}
