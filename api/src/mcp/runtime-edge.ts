import type Koa from 'koa';
import { createMcpHandler, type AuthInfo, type Server } from '@modelcontextprotocol/server';
import { toNodeHandler } from '@modelcontextprotocol/node';
import { reportIncident } from '@agentplane/core';
import type { RuntimeBearerVerifier, RuntimeGrant } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import { bearerToken } from '../http/authenticate.js';
import { requestIdOf } from '../http/router.js';
import { ErrorCode, MAX_MESSAGE_BYTES, rpcError } from './protocol.js';
import { sdkConsoleToLog } from './runtime.js';

/** A refusal of a runtime MCP request: HTTP status, JSON-RPC code and message. */
export interface RuntimeRefusal {
  status: number;
  code: number;
  message: string;
}

export interface RuntimeMcpEdge<C> {
  /** `POST <path>`: the first capture group is the resource id. */
  path: RegExp;
  /** For logs: "runtime memory", "runtime tool source", … */
  name: string;
  /** The grant's access to the resource `id`: the server context, or a refusal. */
  authorize(grant: RuntimeGrant, id: string): Promise<C | RuntimeRefusal>;
  /** A stateless MCP server for one request. */
  buildServer(context: C): Server;
}

const isRefusal = (v: unknown): v is RuntimeRefusal => typeof v === 'object' && v !== null && 'status' in v && 'code' in v && 'message' in v;

/**
 * One Run's MCP endpoint over a resource (a memory store, a tool source), authenticated by the
 * lease's runtime bearer only: POST only, no `Origin`, the bearer verified, the grant's access to
 * the resource checked, then the official SDK's stateless JSON handler serves the request.
 */
export function runtimeMcpEdge<C>(deps: ApiDeps, verifier: RuntimeBearerVerifier, edge: RuntimeMcpEdge<C>): Koa.Middleware {
  const handler = sdkConsoleToLog(deps.log, () => createMcpHandler(
    ({ authInfo }) => {
      const context = (authInfo?.extra as { context?: C } | undefined)?.context;
      if (context === undefined) throw new Error(`${edge.name} request without a verified grant`);
      return edge.buildServer(context);
    },
    { legacy: 'stateless', responseMode: 'json', maxRequestBodySize: MAX_MESSAGE_BYTES, onerror: (err) => deps.log.debug({ err: err.message }, `${edge.name} request rejected`) },
  ));
  const serve = toNodeHandler(handler, { maxRequestBodySize: MAX_MESSAGE_BYTES, onerror: (err) => deps.log.warn({ err: err.message }, `${edge.name} adapter error`) });

  const fail = (ctx: Koa.Context, r: RuntimeRefusal, extra: Record<string, string> = {}) => {
    for (const [k, v] of Object.entries(extra)) ctx.set(k, v);
    ctx.status = r.status;
    ctx.type = 'application/json';
    ctx.body = JSON.stringify(rpcError(null, { code: r.code, message: r.message }));
  };

  return async (ctx, next) => {
    const m = edge.path.exec(ctx.path);
    if (!m) return next();
    try {
      if (ctx.method !== 'POST') {
        ctx.set('Allow', 'POST');
        return fail(ctx, { status: 405, code: ErrorCode.InvalidRequest, message: `${ctx.method} is not served here; use POST` });
      }
      if (ctx.headers.origin !== undefined) return fail(ctx, { status: 403, code: ErrorCode.InvalidRequest, message: 'requests carrying an Origin header are refused' });
      const token = bearerToken(ctx.headers.authorization);
      const grant = token ? await verifier.verify(token) : null;
      if (!grant) {
        return fail(ctx, { status: 401, code: ErrorCode.Unauthorized, message: 'missing, unknown or expired runtime bearer' }, { 'WWW-Authenticate': 'Bearer error="invalid_token"' });
      }
      const context = await edge.authorize(grant, m[1] ?? '');
      if (isRefusal(context)) return fail(ctx, context);
      const req = ctx.req as typeof ctx.req & { auth?: AuthInfo };
      req.auth = { token: token ?? '', clientId: grant.run_id, scopes: [], expiresAt: Math.floor(Date.parse(grant.expires_at) / 1000), extra: { context } };
      ctx.respond = false;
      await serve(req, ctx.res);
    } catch (err) {
      if (ctx.headerSent || ctx.respond === false) throw err;
      const inc = reportIncident(deps.log, err, `unhandled error on the ${edge.name} endpoint`, requestIdOf(ctx), { path: ctx.path });
      fail(ctx, { status: 500, code: ErrorCode.InternalError, message: inc.message });
    }
  };
}
