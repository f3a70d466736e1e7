import type Koa from 'koa';
import { createMcpHandler, type AuthInfo, type Server } from '@modelcontextprotocol/server';
import { toNodeHandler } from '@modelcontextprotocol/node';
import { ApiError, reportIncident, type Logger } from '@agentplane/core';
import type { RuntimeBearerVerifier, RuntimeGrant } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import { bearerToken } from '../http/authenticate.js';
import { readJsonBody } from '../http/body.js';
import { requestIdOf } from '../http/router.js';
import { ErrorCode, isPlainObject, MAX_MESSAGE_BYTES, rpcError } from './protocol.js';

/**
 * A refusal of a runtime MCP request: the JSON-RPC code, and the catalog error whose status
 * frames the answer and whose wire error body is the JSON-RPC error's `data` (as on `/v1/mcp`).
 */
export interface RuntimeRefusal {
  code: number;
  error: ApiError;
}

/** Answer a refused runtime MCP request (no JSON-RPC id: the request was not read); a 401 carries the bearer challenge. */
export function refuseRuntimeRequest(ctx: Koa.Context, docsUrl: string, r: RuntimeRefusal): void {
  if (r.error.status === 401) ctx.set('WWW-Authenticate', 'Bearer error="invalid_token"');
  ctx.status = r.error.status;
  ctx.type = 'application/json';
  ctx.body = JSON.stringify(rpcError(null, { code: r.code, message: r.error.message, data: r.error.toWire(docsUrl) }));
}

/** A method other than POST: 405 with `Allow` (no catalog type has that status). */
export function runtimeMethodNotAllowed(ctx: Koa.Context): void {
  ctx.set('Allow', 'POST');
  ctx.status = 405;
  ctx.type = 'application/json';
  ctx.body = JSON.stringify(rpcError(null, { code: ErrorCode.InvalidRequest, message: `${ctx.method} is not served here; use POST` }));
}

/** Refusals every runtime endpoint shares (Connections, memory stores, tool sources). */
export const runtimeRefusals = {
  origin: (): RuntimeRefusal => ({ code: ErrorCode.InvalidRequest, error: new ApiError('policy.denied', 'requests carrying an Origin header are refused') }),
  bearer: (): RuntimeRefusal => ({ code: ErrorCode.Unauthorized, error: new ApiError('auth.invalid_key', 'missing, unknown or expired runtime bearer') }),
  /** The grant does not reach the resource. */
  denied: (message: string): RuntimeRefusal => ({ code: ErrorCode.Unauthorized, error: new ApiError('policy.denied', message) }),
  notFound: (what: string): RuntimeRefusal => ({ code: ErrorCode.InvalidRequest, error: new ApiError('validation.not_found', `${what} not found`) }),
  internal: (message: string): RuntimeRefusal => ({ code: ErrorCode.InternalError, error: new ApiError('runtime.internal', message) }),
};

/**
 * The tool a refused runtime request calls, when it is a JSON-RPC `tools/call` naming one; null
 * for anything else (another method, a body that is not one). Read only for the refusal's audit
 * record: a request that is served is read by the SDK.
 */
export async function refusedToolCall(ctx: Koa.Context): Promise<string | null> {
  let body: unknown;
  try {
    body = await readJsonBody(ctx.req, MAX_MESSAGE_BYTES);
  } catch {
    return null;
  }
  if (!isPlainObject(body) || body.method !== 'tools/call' || !isPlainObject(body.params)) return null;
  const name = body.params.name;
  return typeof name === 'string' && name.length > 0 ? name : null;
}

/**
 * The audit record of a runtime tool call refused before it reached anything (the Run's grant does
 * not reach the resource, or the resource is gone): as the Run, `action` with the call's target
 * (the path's id, when it is an id of the resource's kind), denied (401, 403) or failed.
 */
export async function recordRefusedCall(
  deps: ApiDeps, grant: RuntimeGrant, action: string, target: string | null, refusal: ApiError, requestId: string,
): Promise<void> {
  await deps.audit.append(grant.workspace_id, {
    actor: { id: grant.run_id, credential_id: null }, action, target,
    outcome: refusal.status === 401 || refusal.status === 403 ? 'denied' : 'failed', status: refusal.status, detail: refusal.type, request_id: requestId,
  }).catch((err: unknown) => deps.log.error({ err, action, run: grant.run_id }, 'audit append failed'));
}

export interface RuntimeMcpEdge<C> {
  /** `POST <path>`: the first capture group is the resource id. */
  path: RegExp;
  /** For logs: "runtime memory", "runtime tool source", … */
  name: string;
  /**
   * The grant's access to the resource `id`: the server context, or a refusal. `requestId` is the
   * request's id (its `Request-Id` header), for the audit records its tool calls write.
   */
  authorize(grant: RuntimeGrant, id: string, requestId: string): Promise<C | RuntimeRefusal>;
  /** A stateless MCP server for one request. */
  buildServer(context: C): Server;
  /**
   * A `tools/call` that `authorize` refused: its audit record, for an endpoint whose tool calls
   * are recorded (`id` the path's resource id, `tool` the name the call gives).
   */
  recordRefused?(grant: RuntimeGrant, id: string, tool: string, refusal: ApiError, requestId: string): Promise<void>;
}

const isRefusal = (v: unknown): v is RuntimeRefusal => typeof v === 'object' && v !== null && 'code' in v && 'error' in v && v.error instanceof ApiError;

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

  const fail = (ctx: Koa.Context, r: RuntimeRefusal) => refuseRuntimeRequest(ctx, deps.config.docsUrl, r);

  return async (ctx, next) => {
    const m = edge.path.exec(ctx.path);
    if (!m) return next();
    try {
      if (ctx.method !== 'POST') return runtimeMethodNotAllowed(ctx);
      if (ctx.headers.origin !== undefined) return fail(ctx, runtimeRefusals.origin());
      const token = bearerToken(ctx.headers.authorization);
      const grant = token ? await verifier.verify(token) : null;
      if (!grant) return fail(ctx, runtimeRefusals.bearer());
      const context = await edge.authorize(grant, m[1] ?? '', requestIdOf(ctx));
      if (isRefusal(context)) {
        const tool = edge.recordRefused ? await refusedToolCall(ctx) : null;
        if (tool !== null) await edge.recordRefused?.(grant, m[1] ?? '', tool, context.error, requestIdOf(ctx));
        return fail(ctx, context);
      }
      const req = ctx.req as typeof ctx.req & { auth?: AuthInfo };
      req.auth = { token: token ?? '', clientId: grant.run_id, scopes: [], expiresAt: Math.floor(Date.parse(grant.expires_at) / 1000), extra: { context } };
      ctx.respond = false;
      await serve(req, ctx.res);
    } catch (err) {
      if (ctx.headerSent || ctx.respond === false) throw err;
      const inc = reportIncident(deps.log, err, `unhandled error on the ${edge.name} endpoint`, requestIdOf(ctx), { path: ctx.path });
      fail(ctx, runtimeRefusals.internal(inc.message));
    }
  };
}

/**
 * Run a synchronous SDK call with `console.warn`/`console.log` routed to the structured log at
 * debug level, so that nothing unstructured reaches stdout or stderr.
 */
export function sdkConsoleToLog<T>(log: Logger, fn: () => T): T {
  const { warn, log: info } = console;
  const route = (...args: unknown[]): void => log.debug({ sdk: '@modelcontextprotocol/server', notice: args.map(String).join(' ') }, 'MCP SDK notice');
  console.warn = route;
  console.log = route;
  try {
    return fn();
  } finally {
    console.warn = warn;
    console.log = info;
  }
}
