import type Koa from 'koa';
import { createMcpHandler, Server, type AuthInfo, type CallToolResult } from '@modelcontextprotocol/server';
import { toNodeHandler } from '@modelcontextprotocol/node';
import { ApiError, Counter, incident, isId } from '@agentplane/core';
import type { RuntimeBearerVerifier, RuntimeGrant } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import { bearerToken } from '../http/authenticate.js';
import { ErrorCode, MAX_MESSAGE_BYTES, rpcError } from '../mcp/protocol.js';
import { sdkConsoleToLog } from '../mcp/runtime.js';
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

  async function peerHeaders(grant: RuntimeGrant, url: string): Promise<Record<string, string>> {
    const session = await deps.sessions.store.get(grant.workspace_id, grant.session_id).catch(() => null);
    const secret = session ? await deps.vaults.resolve(grant.workspace_id, session.vault_ids, ['mcp_bearer', 'mcp_header'], url) : null;
    if (!secret) return {};
    return secret.kind === 'mcp_header' && secret.header_name ? { [secret.header_name]: secret.value } : { Authorization: `Bearer ${secret.value}` };
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
        const r = await deps.a2aCalls.invoke({
          workspace_id: ctx.grant.workspace_id, session_id: ctx.grant.session_id, session_thread_id: null, call_id: toolUseId,
          source: ctx.source, tool: request.params.name, text: message, headers: await peerHeaders(ctx.grant, discovery.interface.url),
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

  const handler = sdkConsoleToLog(deps.log, () => createMcpHandler(
    ({ authInfo }) => {
      const context = (authInfo?.extra as { context?: Context } | undefined)?.context;
      if (!context) throw new Error('runtime tool source request without a verified grant');
      return buildServer(context);
    },
    { legacy: 'stateless', responseMode: 'json', maxRequestBodySize: MAX_MESSAGE_BYTES, onerror: (err) => deps.log.debug({ err: err.message }, 'runtime tool source request rejected') },
  ));
  const serve = toNodeHandler(handler, { maxRequestBodySize: MAX_MESSAGE_BYTES, onerror: (err) => deps.log.warn({ err: err.message }, 'runtime tool source adapter error') });

  const fail = (ctx: Koa.Context, status: number, code: number, message: string, extra: Record<string, string> = {}) => {
    for (const [k, v] of Object.entries(extra)) ctx.set(k, v);
    ctx.status = status;
    ctx.type = 'application/json';
    ctx.body = JSON.stringify(rpcError(null, { code, message }));
  };

  return async (ctx, next) => {
    const m = RUNTIME_TOOL_SOURCE_PATH.exec(ctx.path);
    if (!m) return next();
    try {
      if (ctx.method !== 'POST') {
        ctx.set('Allow', 'POST');
        return fail(ctx, 405, ErrorCode.InvalidRequest, `${ctx.method} is not served here; use POST`);
      }
      if (ctx.headers.origin !== undefined) return fail(ctx, 403, ErrorCode.InvalidRequest, 'requests carrying an Origin header are refused');
      const token = bearerToken(ctx.headers.authorization);
      const grant = token ? await verifier.verify(token) : null;
      if (!grant) return fail(ctx, 401, ErrorCode.Unauthorized, 'missing, unknown or expired runtime bearer', { 'WWW-Authenticate': 'Bearer error="invalid_token"' });
      const id = m[1] ?? '';
      if (!isId('toolSource', id) || !(grant.tool_sources ?? []).includes(id)) return fail(ctx, 403, ErrorCode.Unauthorized, `run ${grant.run_id} has no tool source ${id}`);
      const source = await deps.toolSources.getSource(grant.workspace_id, id).catch(() => null);
      if (!source) return fail(ctx, 404, ErrorCode.InvalidRequest, `tool source ${id} not found`);
      const req = ctx.req as typeof ctx.req & { auth?: AuthInfo };
      req.auth = { token: token ?? '', clientId: grant.run_id, scopes: [], expiresAt: Math.floor(Date.parse(grant.expires_at) / 1000), extra: { context: { grant, source } } };
      ctx.respond = false;
      await serve(req, ctx.res);
    } catch (err) {
      if (ctx.headerSent || ctx.respond === false) throw err;
      const inc = incident('internal error');
      deps.log.error({ err, incident: inc.incident, path: ctx.path }, 'unhandled error on the runtime tool source endpoint');
      fail(ctx, 500, ErrorCode.InternalError, inc.message);
    }
  };
}
