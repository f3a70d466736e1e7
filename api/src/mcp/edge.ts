import type Koa from 'koa';
import { ApiError, BUCKETS, closedLabel, Counter, Histogram, reportIncident, type Context } from '@agentplane/core';
import type { ApiDeps } from '../deps.js';
import { authenticate, DisabledWorkspaceError } from '../http/authenticate.js';
import { readJsonBody } from '../http/body.js';
import type { Caller } from '../http/caller.js';
import type { Operation } from '../http/operation.js';
import type { PreparedOperation } from '../http/pipeline.js';
import { ToolCatalog } from './catalog.js';
import { apiErrorResult, ToolDispatcher } from './dispatch.js';
import { enforceRateLimit } from '../http/rate-limit.js';
import { requestIdOf, traceOf } from '../http/router.js';
import {
  decodeHeaderValue, ErrorCode, HEADER_METHOD, HEADER_NAME, HEADER_PROTOCOL_VERSION, isPlainObject,
  LEGACY_FALLBACK_VERSION, LEGACY_VERSIONS, MAX_MESSAGE_BYTES, McpProtocolError, META_CLIENT_CAPABILITIES,
  META_CLIENT_INFO, META_PROTOCOL_VERSION, META_SERVER_INFO, MODERN_VERSION, parseMessage, checkParams, rpcError, rpcResult,
  SUPPORTED_VERSIONS, type JsonRpcId, type JsonRpcRequest, type JsonRpcResponse,
} from './protocol.js';

export const MCP_PATH = '/v1/mcp';
export const PROTECTED_RESOURCE_PATH = '/.well-known/oauth-protected-resource/v1/mcp';
export const AUTHORIZATION_SERVER_PATH = '/.well-known/oauth-authorization-server';

const SERVER_INFO = { name: 'agentplane', title: 'agentplane API', version: '0.1.0' };
const INSTRUCTIONS =
  'Tools are the agentplane REST operations: arguments {path, query, body}; mutations that take an Idempotency-Key ' +
  'require idempotency_key. tools/list shows a compact catalog; agentplane_search_operations finds every other callable ' +
  'operation (POST /v1/mcp?catalog=full lists them all). REST failures come back as isError results carrying the wire error body.';

type Headers = Readonly<Record<string, string | undefined>>;

function flatten(headers: Koa.Context['headers']): Record<string, string | undefined> {
  const out: Record<string, string | undefined> = {};
  for (const [k, v] of Object.entries(headers)) out[k] = Array.isArray(v) ? v.join(', ') : v;
  return out;
}

/** Which shape a message came in, after its headers were checked against it. */
type Era = { kind: 'legacy'; version: string | null } | { kind: 'modern' };

/**
 * Classify one message and enforce the header rules of its shape.
 * Modern (2026-07-28): the `_meta` protocol version and the MCP-Protocol-Version, Mcp-Method and
 * Mcp-Name headers must all agree with the body (-32020); an unserved `_meta` version is -32022.
 * Legacy (2025-06-18, 2025-11-25): after `initialize`, every request names a served legacy
 * version in MCP-Protocol-Version (-32600 otherwise).
 */
export function classify(msg: JsonRpcRequest, headers: Headers): Era {
  const meta = isPlainObject(msg.params?._meta) ? msg.params._meta : undefined;
  const metaVersion = meta?.[META_PROTOCOL_VERSION];
  const headerVersion = headers[HEADER_PROTOCOL_VERSION]?.trim();
  const isRequest = msg.id !== undefined;

  if (metaVersion !== undefined || headerVersion === MODERN_VERSION) {
    const mismatch = (what: string, header: string, body: string) =>
      new McpProtocolError(ErrorCode.HeaderMismatch, `the request headers and body disagree: ${what}`, 400, { mismatch: { header, body } });
    if (typeof metaVersion !== 'string') {
      throw mismatch(`MCP-Protocol-Version is ${MODERN_VERSION} but _meta carries no ${META_PROTOCOL_VERSION}`, headerVersion ?? '(missing)', '(missing)');
    }
    if (headerVersion !== metaVersion) {
      throw mismatch(`MCP-Protocol-Version must equal _meta ${META_PROTOCOL_VERSION} (${metaVersion})`, headerVersion ?? '(missing)', metaVersion);
    }
    if (metaVersion !== MODERN_VERSION) {
      // A version this edge speaks in the legacy shape (no per-request _meta) is told so, not called unsupported.
      const legacy = (SUPPORTED_VERSIONS as readonly string[]).includes(metaVersion);
      throw new McpProtocolError(ErrorCode.UnsupportedProtocolVersion, legacy
        ? `protocol version ${metaVersion} is served without a per-request _meta ${META_PROTOCOL_VERSION} (only ${MODERN_VERSION} carries one): send it in the MCP-Protocol-Version header alone`
        : `unsupported protocol version ${metaVersion}`, 400, {
        supported: [...SUPPORTED_VERSIONS], requested: metaVersion,
      });
    }
    const methodHeader = headers[HEADER_METHOD]?.trim();
    if (methodHeader !== msg.method) throw mismatch(`Mcp-Method must equal the method ${msg.method}`, methodHeader ?? '(missing)', msg.method);
    if (msg.method === 'tools/call') {
      const bodyName = typeof msg.params?.name === 'string' ? msg.params.name : '(missing)';
      const raw = headers[HEADER_NAME];
      const nameHeader = raw === undefined ? '(missing)' : decodeHeaderValue(raw);
      if (nameHeader !== bodyName) throw mismatch(`Mcp-Name must equal params.name ${bodyName}`, nameHeader, bodyName);
    }
    if (isRequest && !isPlainObject(meta?.[META_CLIENT_CAPABILITIES])) {
      throw new McpProtocolError(ErrorCode.InvalidParams, `_meta ${META_CLIENT_CAPABILITIES} must be an object`, 400);
    }
    const info = meta?.[META_CLIENT_INFO];
    if (info !== undefined && !isPlainObject(info)) {
      throw new McpProtocolError(ErrorCode.InvalidParams, `_meta ${META_CLIENT_INFO} must be an object`, 400);
    }
    return { kind: 'modern' };
  }

  if (msg.method === 'initialize') return { kind: 'legacy', version: null };
  const served = (LEGACY_VERSIONS as readonly string[]).includes(headerVersion ?? '');
  if (headerVersion === undefined) {
    if (!isRequest) return { kind: 'legacy', version: null };
    throw new McpProtocolError(ErrorCode.InvalidRequest, `the MCP-Protocol-Version header is required after initialize (served: ${SUPPORTED_VERSIONS.join(', ')})`, 400);
  }
  if (!served) {
    throw new McpProtocolError(ErrorCode.InvalidRequest, `MCP-Protocol-Version '${headerVersion}' is not served (served: ${SUPPORTED_VERSIONS.join(', ')})`, 400);
  }
  return { kind: 'legacy', version: headerVersion };
}

export interface McpEdge {
  catalog: ToolCatalog;
  middleware: Koa.Middleware;
}

/** JSON-RPC methods counted by name; any other method a client sends is counted as `other`. */
const MCP_METHODS: ReadonlySet<string> = new Set(['initialize', 'ping', 'server/discover', 'tools/list', 'tools/call']);
const MCP_ERROR_OUTCOMES: ReadonlySet<string> = new Set(Object.values(ErrorCode).map((c) => `error_${String(c)}`));

/**
 * `POST /v1/mcp` and its discovery documents. Mounted before the REST router: this edge needs
 * no Service-Version header and speaks JSON-RPC errors, never REST wire bodies at top level.
 */
export function mcpEdge(operations: readonly Operation[], prepared: ReadonlyMap<string, PreparedOperation>, deps: ApiDeps): McpEdge {
  const catalog = new ToolCatalog(operations);
  const dispatcher = new ToolDispatcher(catalog, prepared, deps);
  const base = deps.config.publicBaseUrl.replace(/\/+$/, '');
  const resourceMetadataUrl = `${base}${PROTECTED_RESOURCE_PATH}`;
  const requests = new Counter({
    name: 'agentplane_mcp_requests_total', help: 'POST /v1/mcp messages by JSON-RPC method (unknown methods count as other) and outcome',
    labelNames: ['method', 'outcome'] as const, registers: [deps.metrics],
  });
  const latency = new Histogram({
    name: 'agentplane_mcp_request_duration_seconds', help: 'POST /v1/mcp handling time by JSON-RPC method (unknown methods count as other)',
    labelNames: ['method'] as const, buckets: [...BUCKETS.http], registers: [deps.metrics],
  });

  const send = (ctx: Koa.Context, status: number, body: JsonRpcResponse | null, extra: Record<string, string> = {}) => {
    for (const [k, v] of Object.entries(extra)) ctx.set(k, v);
    if (body === null) {
      // Koa turns a null body into 204; set the status after it (202 Accepted, empty).
      ctx.body = null;
      ctx.status = status;
      return;
    }
    ctx.status = status;
    let text = JSON.stringify(body);
    if (Buffer.byteLength(text) > MAX_MESSAGE_BYTES) {
      text = JSON.stringify(rpcError(body.id, { code: ErrorCode.InternalError, message: `the response exceeds the ${MAX_MESSAGE_BYTES}-byte limit` }));
    }
    ctx.type = 'application/json';
    ctx.body = text;
  };

  const challenge = (error?: string) =>
    `Bearer resource_metadata="${resourceMetadataUrl}", resource_metadata_url="${resourceMetadataUrl}"${error ? `, error="${error}"` : ''}`;

  /** Authentication failures at the edge: HTTP status of the ApiError, JSON-RPC body carrying the wire error. */
  const authFailure = (ctx: Koa.Context, err: ApiError, invalidToken = false) => {
    const extra: Record<string, string> = { ...err.headers };
    if (err.status === 401) extra['WWW-Authenticate'] = challenge(invalidToken ? 'invalid_token' : undefined);
    send(ctx, err.status, rpcError(null, { code: ErrorCode.Unauthorized, message: err.message, data: err.toWire(deps.config.docsUrl) }), extra);
  };

  async function handleMessage(
    msg: JsonRpcRequest, era: Era, caller: Caller, headers: Headers, catalogChoice: 'compact' | 'full', requestId: string, trace: Context | undefined,
    disabled: DisabledWorkspaceError | undefined,
  ): Promise<Record<string, unknown>> {
    const params = msg.params ?? {};
    const modern = era.kind === 'modern';
    const stamp = (r: Record<string, unknown>) => (modern ? { ...r, resultType: 'complete' } : r);
    switch (msg.method) {
      case 'initialize': {
        if (modern) break;
        const requested = params.protocolVersion;
        if (typeof requested !== 'string') throw new McpProtocolError(ErrorCode.InvalidParams, 'initialize: protocolVersion must be a string');
        const protocolVersion = (LEGACY_VERSIONS as readonly string[]).includes(requested) ? requested : LEGACY_FALLBACK_VERSION;
        return { protocolVersion, capabilities: { tools: { listChanged: false } }, serverInfo: SERVER_INFO, instructions: INSTRUCTIONS };
      }
      case 'ping':
        if (modern) break;
        return {};
      case 'server/discover':
        if (!modern) break;
        return stamp({
          supportedVersions: [...SUPPORTED_VERSIONS],
          capabilities: { tools: { listChanged: false } },
          instructions: INSTRUCTIONS,
          ttlMs: 0,
          cacheScope: 'private',
          _meta: { [META_SERVER_INFO]: SERVER_INFO },
        });
      case 'tools/list': {
        const held = caller.kind === 'principal_credential' && caller.workspaceId && caller.principalId
          ? new Set((await deps.permissions.ofPrincipal(caller.workspaceId, caller.principalId))
            .flatMap((a) => a.actions.map((action) => (a.target.type === 'workspace' ? action : `${action}@${a.target.type}`))))
          : undefined;
        const tools = catalog.list(caller, catalogChoice, held);
        // 2026-07-28 list results are cacheable results: the catalog depends on the bearer.
        return modern ? stamp({ tools, ttlMs: 0, cacheScope: 'private' }) : { tools };
      }
      case 'tools/call': {
        if (typeof params.name !== 'string' || params.name.length === 0) throw new McpProtocolError(ErrorCode.InvalidParams, 'tools/call: name must be a string');
        const result = await dispatcher.call(params.name, params.arguments, { caller, headers, requestId, trace, disabled });
        return stamp({ ...result });
      }
      default:
        break;
    }
    throw new McpProtocolError(ErrorCode.MethodNotFound, `method '${msg.method}' is not served on the ${modern ? MODERN_VERSION : 'legacy'} shape`);
  }

  async function handlePost(ctx: Koa.Context): Promise<void> {
    const headers = flatten(ctx.headers);
    // 1. Browsers never reach this endpoint: any Origin is refused before authentication.
    if (headers.origin !== undefined) {
      send(ctx, 403, rpcError(null, { code: ErrorCode.InvalidRequest, message: 'requests carrying an Origin header are refused' }));
      return;
    }
    // 2. The only query parameter is catalog=compact|full.
    let catalogChoice: 'compact' | 'full' = 'compact';
    for (const [k, v] of Object.entries(ctx.query)) {
      if (k !== 'catalog' || (v !== 'compact' && v !== 'full')) {
        send(ctx, 400, rpcError(null, { code: ErrorCode.InvalidRequest, message: `unknown query parameter or value '${k}' (only catalog=compact|full)` }));
        return;
      }
      catalogChoice = v;
    }
    // 3. Bearer: API keys with their full role, api_mcp Principal credentials; nothing else.
    let caller: Caller;
    // A caller whose Workspace is disabled is known (named in the refusal): its `tools/call` goes
    // to the pipeline, which refuses and records it as the REST request (or lets through the
    // organization-level operations that still reach a disabled Workspace); any other method is
    // refused here.
    let disabled: DisabledWorkspaceError | undefined;
    try {
      caller = await authenticate(headers, deps, ctx.req.socket);
    } catch (err) {
      if (err instanceof DisabledWorkspaceError) {
        caller = err.caller;
        disabled = err;
      } else if (err instanceof ApiError) return authFailure(ctx, err);
      else throw err;
    }
    if (caller.kind === 'principal_credential' && caller.audience !== 'api_mcp') {
      return authFailure(ctx, new ApiError('auth.invalid_key', `a credential with audience '${caller.audience ?? 'none'}' is not accepted by ${MCP_PATH}`), true);
    }
    if (caller.kind !== 'api_key' && caller.kind !== 'principal_credential') {
      return authFailure(ctx, new ApiError('auth.invalid_key', `a ${caller.kind.replace('_', ' ')} is not accepted by ${MCP_PATH}`), true);
    }
    // 4. One JSON-RPC message, at most 4 MiB.
    let body: unknown;
    try {
      body = await readJsonBody(ctx.req, MAX_MESSAGE_BYTES);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      const code = err.type === 'validation.malformed' && /JSON/.test(err.message) ? ErrorCode.ParseError : ErrorCode.InvalidRequest;
      send(ctx, err.status, rpcError(null, { code, message: err.message, data: err.toWire(deps.config.docsUrl) }));
      return;
    }
    const started = process.hrtime.bigint();
    let id: JsonRpcId = null;
    // The metric label: a method this edge serves, `invalid` for an unparseable message, else `other`.
    let method: string = 'invalid';
    try {
      const msg = parseMessage(body);
      id = msg.id ?? null;
      method = closedLabel(msg.method, MCP_METHODS);
      checkParams(msg);
      const era = classify(msg, headers);
      if (disabled && msg.method !== 'tools/call') {
        authFailure(ctx, disabled);
        return;
      }
      if (msg.id === undefined) {
        // Notifications (notifications/initialized, cancellations) are acknowledged and dropped.
        requests.inc({ method: 'notification', outcome: 'accepted' });
        send(ctx, 202, null);
        return;
      }
      // One POST is one request against the key's rate limit, whatever it dispatches; the
      // dispatched REST call is not counted again. A limited tools/call is a REST failure
      // (isError with budget.exceeded); anything else is an HTTP 429.
      try {
        await enforceRateLimit(deps.redis, caller.credentialId, caller.rateLimitPerMinute);
      } catch (err) {
        if (!(err instanceof ApiError)) throw err;
        requests.inc({ method, outcome: 'rate_limited' });
        if (msg.method === 'tools/call') {
          // Refused by the pipeline, as a REST request over its limit is: a limited mutation is
          // its audit record (a call naming no tool has no operation to record).
          const name = msg.params?.name;
          const limited = typeof name === 'string' && name.length > 0
            ? await dispatcher.call(name, undefined, { caller, headers, requestId: requestIdOf(ctx), trace: traceOf(ctx), disabled }, err)
            : apiErrorResult(err, deps);
          send(ctx, 200, rpcResult(id, era.kind === 'modern' ? { ...limited, resultType: 'complete' } : { ...limited }));
          return;
        }
        send(ctx, err.status, rpcError(id, { code: ErrorCode.RateLimited, message: err.message, data: err.toWire(deps.config.docsUrl) }), err.headers);
        return;
      }
      const result = await handleMessage(msg, era, caller, headers, catalogChoice, requestIdOf(ctx), traceOf(ctx), disabled);
      requests.inc({ method, outcome: result.isError === true ? 'tool_error' : 'ok' });
      send(ctx, 200, rpcResult(id, result), caller.workspaceId ? { 'Service-Workspace-Id': caller.workspaceId } : {});
    } catch (err) {
      if (!(err instanceof McpProtocolError)) throw err;
      requests.inc({ method, outcome: closedLabel(`error_${err.code}`, MCP_ERROR_OUTCOMES) });
      send(ctx, err.httpStatus, rpcError(id, err.toObject()));
    } finally {
      latency.observe({ method }, Number(process.hrtime.bigint() - started) / 1e9);
    }
  }

  const middleware: Koa.Middleware = async (ctx, next) => {
    if (ctx.path === MCP_PATH) {
      if (ctx.method !== 'POST') {
        // Stateless: no GET stream, no DELETE of a session.
        ctx.set('Allow', 'POST');
        send(ctx, 405, rpcError(null, { code: ErrorCode.InvalidRequest, message: `${ctx.method} is not served on ${MCP_PATH}; use POST` }));
        return;
      }
      try {
        await handlePost(ctx);
      } catch (err) {
        // Unexpected failures (Redis unreachable, a bug): a JSON-RPC internal error with an
        // opaque incident reference; the stack goes to the log only.
        if (ctx.headerSent || ctx.respond === false) throw err;
        const inc = reportIncident(deps.log, err, 'unhandled error on the MCP edge', requestIdOf(ctx), { path: ctx.path });
        const wire = new ApiError('runtime.internal', inc.message).toWire(deps.config.docsUrl);
        send(ctx, 500, rpcError(null, { code: ErrorCode.InternalError, message: wire.error.message, data: wire }));
      }
      return;
    }
    if (ctx.method === 'GET' && ctx.path === PROTECTED_RESOURCE_PATH) {
      // RFC 9728 protected-resource metadata.
      ctx.set('Cache-Control', 'public, max-age=3600');
      ctx.body = {
        resource: `${base}${MCP_PATH}`,
        authorization_servers: [base],
        bearer_methods_supported: ['header'],
        scopes_supported: [],
        resource_name: 'agentplane MCP server',
        resource_documentation: `${deps.config.docsUrl.replace(/\/+$/, '')}/mcp`,
      };
      return;
    }
    if (ctx.method === 'GET' && ctx.path === AUTHORIZATION_SERVER_PATH) {
      // RFC 8414 metadata. No OAuth grant is offered: bearers are API keys or Principal
      // credentials issued over REST, so grant_types_supported is empty.
      ctx.set('Cache-Control', 'public, max-age=3600');
      ctx.body = {
        issuer: base,
        response_types_supported: [],
        grant_types_supported: [],
        token_endpoint_auth_methods_supported: [],
        scopes_supported: [],
        service_documentation: `${deps.config.docsUrl.replace(/\/+$/, '')}/mcp`,
      };
      return;
    }
    await next();
  };

  return { catalog, middleware };
}
