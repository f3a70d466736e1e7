import type Koa from 'koa';
import { Server, type CallToolResult } from '@modelcontextprotocol/server';
import { ApiError, Counter, isId } from '@agentplane/core';
import type { RuntimeBearerVerifier, RuntimeGrant } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import { runtimeMcpEdge, runtimeRefusals } from '../mcp/runtime-edge.js';
import { PeerCustodian, type PeerCustody } from './custody.js';
import type { ToolSourceDoc } from './service.js';

export const RUNTIME_TOOL_SOURCE_PATH = /^\/v1\/runtime\/toolsource\/([^/]+)$/;
/** `_meta` key carrying the harness's tool use id on `tools/call`: the call's identity across retries. */
export const TOOL_USE_META = 'dev.agentplane/tool_use_id';
const TOOL_USE_ID = /^toolu_[A-Za-z0-9_-]{1,96}$/;

interface Context {
  grant: RuntimeGrant;
  source: ToolSourceDoc;
}

const text = (t: string, isError = false): CallToolResult => ({ content: [{ type: 'text', text: t }], ...(isError ? { isError: true } : {}) });

/**
 * `POST /v1/runtime/toolsource/{tool_source_id}`: a synced A2A tool source's skills as MCP tools
 * for one Run (each `always_ask`: the harness asks through `user.tool_confirmation`, and the
 * ActionPolicy gate decides, before it calls). Authenticated by the lease's runtime bearer only,
 * for the tool sources the agent version attached. A call is one `A2aToolCalls.invoke` under the
 * harness's tool use id, so a retried call is the same call (one `exec.tool_invocation`). Peer
 * credentials come from the Session's vaults (a secret matching the peer's JSON-RPC URL) and stay
 * in this process.
 */
export function runtimeToolSource(deps: ApiDeps, verifier: RuntimeBearerVerifier): Koa.Middleware {
  const calls = new Counter({ name: 'agentplane_runtime_a2a_tool_calls_total', help: 'A2A tool calls through the runtime endpoint by outcome (completed, failed, indeterminate, error, ...)', labelNames: ['outcome'] as const, registers: [deps.metrics] });

  const custodian = new PeerCustodian(deps.vaults, { egress: deps.config.webhooks.egress });
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
    /** Every call the Run makes to the peer is recorded in the Workspace's audit log, as the Run. */
    const record = (toolUseId: string, outcome: 'succeeded' | 'failed', detail: string | null) => deps.audit.append(ctx.grant.workspace_id, {
      actor: { id: ctx.grant.run_id, credential_id: null }, action: 'toolSources.callA2aTool', target: toolUseId,
      outcome, status: 200, detail, request_id: null,
    }).catch((err: unknown) => deps.log.error({ err, tool_use_id: toolUseId }, 'audit append failed'));
    server.setRequestHandler('tools/call', async (request): Promise<CallToolResult> => {
      const toolUseId = request.params._meta?.[TOOL_USE_META];
      if (typeof toolUseId !== 'string' || !TOOL_USE_ID.test(toolUseId)) {
        return text(JSON.stringify(new ApiError('validation.malformed', `_meta.${TOOL_USE_META}: the tool use id is required`).toWire(deps.config.docsUrl)), true);
      }
      const input = request.params.arguments ?? {};
      const message = typeof input['text'] === 'string' ? input['text'] : JSON.stringify(input);
      const discovery = ctx.source.discovery;
      if (!discovery) return text(JSON.stringify(new ApiError('validation.conflict', `tool source ${ctx.source.id} is not synced`).toWire(deps.config.docsUrl)), true);
      try {
        const custody = await peerCustody(ctx.grant, discovery);
        const r = await deps.a2aCalls.invoke({
          workspace_id: ctx.grant.workspace_id, session_id: ctx.grant.session_id, session_thread_id: ctx.grant.session_thread_id ?? null, call_id: toolUseId,
          source: ctx.source, tool: request.params.name, text: message, headers: custody.headers, tls: custody.tls,
        });
        calls.inc({ outcome: r.outcome.status });
        await record(toolUseId, r.outcome.status === 'completed' ? 'succeeded' : 'failed', r.outcome.status === 'completed' ? null : r.outcome.status);
        return r.outcome.status === 'completed' ? text(r.outcome.text) : text(`${r.outcome.status}${r.outcome.text ? `: ${r.outcome.text}` : ''}`, true);
      } catch (err) {
        if (!(err instanceof ApiError)) throw err;
        calls.inc({ outcome: 'error' });
        await record(toolUseId, 'failed', err.type);
        return text(JSON.stringify(err.toWire(deps.config.docsUrl)), true);
      }
    });
    return server;
  }

  return runtimeMcpEdge<Context>(deps, verifier, {
    path: RUNTIME_TOOL_SOURCE_PATH,
    name: 'runtime tool source',
    async authorize(grant, id) {
      if (!isId('toolSource', id) || !(grant.tool_sources ?? []).includes(id)) return runtimeRefusals.denied(`run ${grant.run_id} has no tool source ${id}`);
      const source = await deps.toolSources.getSource(grant.workspace_id, id).catch(() => null);
      if (!source) return runtimeRefusals.notFound(`tool source ${id}`);
      return { grant, source };
    },
    buildServer,
  });
}
