import type { IncomingMessage } from 'node:http';
import type Koa from 'koa';
import Router, { type RouterMiddleware } from '@koa/router';
import {
  ApiError, BUCKETS, Counter, extractTrace, failSpan, Histogram, newRequestId, reportIncident, requestIdFrom, SpanKind, SpanStatusCode, spanTraceId, startSpanLazily,
  statusLabel, tracingEnabled, type Attributes, type Context, type Span,
} from '@agentplane/core';
import { storedJsonOf } from '@agentplane/store';
import { ATTR_HTTP_REQUEST_METHOD, ATTR_HTTP_RESPONSE_STATUS_CODE, ATTR_HTTP_ROUTE, ATTR_URL_PATH, ATTR_URL_SCHEME } from '@opentelemetry/semantic-conventions';
import type { ApiDeps } from '../deps.js';
import { drainRequest, readJsonBody } from './body.js';
import { execute, prepare, type PreparedOperation, type RawRequest } from './pipeline.js';
import type { HttpMethod, Operation } from './operation.js';
import type { Caller } from './caller.js';

/** A request whose headers announce a body (a length above zero, or a transfer coding). */
const saysItHasBody = (req: IncomingMessage): boolean => {
  const length = req.headers['content-length'];
  return req.headers['transfer-encoding'] !== undefined || (length !== undefined && length !== '0');
};

/** `/v1/sessions/{session_id}` → `/v1/sessions/:session_id` */
export const koaPath = (path: string): string => path.replace(/\{([a-z_]+)\}/g, ':$1');

/**
 * The methods whose body is read (and checked: an operation that takes none refuses any but
 * `{}`). A GET's too: HTTP gives it no meaning, so one sent is a client's mistake, refused rather
 * than ignored. (A request without a body costs a look at its headers.)
 */
const METHODS_WITH_BODY = new Set(['POST', 'PATCH', 'PUT', 'DELETE', 'GET']);

/**
 * The request's headers with one string per name. Node already gives one string per name for a
 * request's headers (a repeated one joined, or only its first kept) but for `set-cookie`, a
 * list; so the object is used as it is unless a list came.
 */
function flattenHeaders(headers: Koa.Context['headers']): Record<string, string | undefined> {
  for (const k in headers) {
    if (Array.isArray(headers[k])) {
      const out: Record<string, string | undefined> = {};
      for (const [name, v] of Object.entries(headers)) out[name] = Array.isArray(v) ? v.join(', ') : v;
      return out;
    }
  }
  return headers as Record<string, string | undefined>;
}

/**
 * A REST request as the pipeline sees it. A class, not an object literal with a `trace` getter:
 * V8 keeps what an accessor made per object reaches alive through young-generation collections
 * until a full one, and that getter's closure reached the whole request (Koa's context, Node's
 * request and response): about a quarter of every request's allocation was promoted to the old
 * generation (docs/RUNS.md, "Garbage: what the young generation kept").
 */
export class RestRequest implements RawRequest {
  readonly headers: Readonly<Record<string, string | undefined>>;
  readonly params: Record<string, string>;
  readonly query: Record<string, unknown>;
  readonly connection: object;
  readonly stream: IncomingMessage | undefined;
  /** A body that could not be read as JSON: refused by the pipeline once the caller is known. */
  refused: ApiError | undefined = undefined;

  constructor(
    private readonly ctx: Koa.Context,
    readonly method: HttpMethod,
    readonly body: unknown,
    readonly requestId: string,
    upload: boolean,
  ) {
    this.headers = flattenHeaders(ctx.headers);
    this.params = { ...(ctx.params as Record<string, string>) };
    this.query = ctx.querystring === '' ? {} : { ...ctx.query };
    this.connection = ctx.req.socket;
    this.stream = upload ? ctx.req : undefined;
  }

  /** Made only if the operation asks (traceOf). */
  get trace(): Context | undefined {
    return traceOf(this.ctx);
  }

  /** Every authenticated response names the resolved Workspace, refusals and errors included. */
  authenticated(caller: Caller): void {
    if (caller.workspaceId) this.ctx.set('Service-Workspace-Id', caller.workspaceId);
  }
}

export function sendError(ctx: Koa.Context, err: ApiError, deps: ApiDeps): void {
  ctx.status = err.status;
  for (const [k, v] of Object.entries(err.headers)) ctx.set(k, v);
  ctx.body = err.toWire(deps.config.docsUrl);
}

/** What the operation router learned about a request, for its span (in `ctx.state.routed`). */
interface Routed {
  name: string;
  route: string;
  operationId: string;
}

/**
 * With tracing on: the request's SERVER span, child of the caller's W3C `traceparent` when it
 * sent one. Its context (`traceOf`, made when first asked for) is handed to the operation (`req.trace`), the
 * parent of the spans made for the request (the API propagates trace context explicitly:
 * tracing.ts). Its attributes (HTTP semantic conventions, and the route and operation once
 * routed) are set in one call when it ends: the SDK checks each attribute once instead of three
 * times, and the samplers the platform offers (always on or off, trace id ratio, parent based)
 * read none at the start. The path carries ids only; no query, header or body goes on the span.
 */
function startRequestSpan(ctx: Koa.Context): Span {
  const { span, context } = startSpanLazily(ctx.method, { kind: SpanKind.SERVER, parent: extractTrace(ctx.headers) });
  ctx.state.trace = context;
  return span;
}

/**
 * The request's trace context (its SERVER span's), when tracing is on: made when first asked for
 * (most requests served from the read cache start nothing under their span).
 */
export const traceOf = (ctx: Koa.Context): Context | undefined => (ctx.state.trace as (() => Context) | undefined)?.();

/** End the request's span with the status answered (a stream, SSE, answers 200 and ends when the client leaves). */
function endRequestSpan(ctx: Koa.Context, span: Span, failure: unknown): void {
  // An unsampled request (the caller's traceparent says so) builds nothing.
  if (!span.isRecording()) return span.end();
  const status = ctx.respond === false ? ctx.res.statusCode : ctx.status;
  const attributes: Attributes = {
    [ATTR_HTTP_REQUEST_METHOD]: ctx.method, [ATTR_URL_PATH]: ctx.path, [ATTR_URL_SCHEME]: 'http', [ATTR_HTTP_RESPONSE_STATUS_CODE]: status,
  };
  // The request id, when the caller chose it: otherwise it is the span's own trace id.
  const id = requestIdOf(ctx);
  if (id !== span.spanContext().traceId) attributes['agentplane.request_id'] = id;
  const routed = ctx.state.routed as Routed | undefined;
  if (routed) {
    span.updateName(routed.name);
    attributes[ATTR_HTTP_ROUTE] = routed.route;
    attributes['agentplane.operation'] = routed.operationId;
  }
  span.setAttributes(attributes);
  if (status >= 500) {
    if (failure === undefined) span.setStatus({ code: SpanStatusCode.ERROR });
    else failSpan(span, failure);
  }
  span.end();
}

/** The id `requestBoundary()` chose for this request. */
export const requestIdOf = (ctx: Koa.Context): string => (typeof ctx.state.requestId === 'string' ? ctx.state.requestId : newRequestId());

/**
 * The request's boundary, first of all and in one async frame (each frame costs every request a
 * promise): with tracing on, its SERVER span; the request's id (the caller's `X-Request-Id`, else
 * the trace id: the request span's with tracing on, else a valid `traceparent`'s; else a new one)
 * on every response, errors included, and in `ctx.state.requestId`, from where it is handed to
 * what names the request; unexpected failures mapped to 500 `runtime.internal` with an opaque
 * incident reference (the stack goes to the log, never to the client; client mistakes are
 * ApiErrors); at debug level, a line per request.
 */
export function requestBoundary(deps: ApiDeps): Koa.Middleware {
  return async (ctx, next) => {
    const started = process.hrtime.bigint();
    const span = tracingEnabled() ? startRequestSpan(ctx) : undefined;
    const id = requestIdFrom(ctx.headers, span && spanTraceId(span));
    ctx.state.requestId = id;
    ctx.set('Request-Id', id);
    let failure: unknown;
    try {
      await next();
    } catch (err) {
      failure = err;
      if (err instanceof ApiError) {
        sendError(ctx, err, deps);
      } else {
        const inc = reportIncident(deps.log, err, 'unhandled error', requestIdOf(ctx), { method: ctx.method, path: ctx.path });
        sendError(ctx, new ApiError('runtime.internal', inc.message), deps);
      }
    } finally {
      if (span) endRequestSpan(ctx, span, failure);
      // A per-request line only at debug: at the default level nothing is built for it.
      if (deps.log.isLevelEnabled('debug')) {
        deps.log.debug({ method: ctx.method, path: ctx.path, status: ctx.res.statusCode, ms: Number(process.hrtime.bigint() - started) / 1e6, request_id: requestIdOf(ctx) }, 'request');
      }
    }
  };
}

/**
 * The operation routes, indexed by the path's first two segments (`/v1/sessions`, `/v1/agents`,
 * …): a request is matched only against the routes of its own area instead of every route in
 * turn (with ~200 routes, matching them all was ~5% of an API process's CPU under load).
 */
export class OperationRoutes {
  /** Per area: its router (for `match`: the methods a path serves) and its routes by method, in registration order. */
  private readonly areas = new Map<string, { router: Router; byMethod: Map<string, RouteLayer[]> }>();

  /** The area key of a path: its first two segments, lower-cased (routes match case-insensitively). */
  static areaOf(path: string): string {
    const i = path.indexOf('/', 1);
    const j = i < 0 ? -1 : path.indexOf('/', i + 1);
    return (j < 0 ? path : path.slice(0, j)).toLowerCase();
  }

  /** Registers `handler` at `method` and `path` (a `:param` path) in the path's area. */
  add(method: 'get' | 'post' | 'patch' | 'put' | 'delete', path: string, handler: RouterMiddleware): void {
    const key = OperationRoutes.areaOf(path);
    let area = this.areas.get(key);
    if (!area) this.areas.set(key, (area = { router: new Router(), byMethod: new Map() }));
    area.router[method](path, handler);
    const layer = area.router.stack[area.router.stack.length - 1];
    if (!layer) throw new Error(`route ${method} ${path} was not registered`);
    // A GET route also serves HEAD (the router lists both).
    for (const m of layer.methods) {
      const list = area.byMethod.get(m);
      if (list) list.push(layer);
      else area.byMethod.set(m, [layer]);
    }
  }

  /**
   * Dispatches to the first route registered for the path and method, as the router's own
   * middleware would (its routes never call `next`), with the router's parameter decoding, but
   * tested only against the area's routes of that method (the router's own matching tests every
   * route of the area and logs each test through its debug hook, which builds arguments even when
   * off), and without the per-request work that middleware adds for features these routes do not
   * use (host matching, nested routers, a composed chain built per request).
   */
  routes(): Koa.Middleware {
    return (ctx, next) => {
      const path = ctx.path;
      const layers = this.areas.get(OperationRoutes.areaOf(path))?.byMethod.get(ctx.method);
      if (!layers) return next();
      for (const layer of layers) {
        if (!layer.match(path)) continue;
        const handler = layer.stack[0];
        if (!handler) return next();
        ctx.params = layer.params(path, layer.captures(path));
        return Promise.resolve(handler(ctx as Parameters<typeof handler>[0], next));
      }
      return next();
    };
  }

  match(path: string, method: string): ReturnType<Router['match']> | null {
    return this.areas.get(OperationRoutes.areaOf(path))?.router.match(path, method) ?? null;
  }
}

type RouteLayer = Router['stack'][number];

export interface OperationRouter {
  router: OperationRoutes;
  prepared: Map<string, PreparedOperation>;
}

export function buildRouter(operations: readonly Operation[], deps: ApiDeps): OperationRouter {
  const router = new OperationRoutes();
  const prepared = new Map<string, PreparedOperation>();
  const byPath = new Map<string, Set<string>>();
  const requests = new Counter({ name: 'agentplane_http_requests_total', help: 'API requests by operation and status', labelNames: ['operation', 'status'] as const, registers: [deps.metrics] });
  const latency = new Histogram({ name: 'agentplane_http_request_duration_seconds', help: 'API request handling time by operation', labelNames: ['operation'] as const, buckets: [...BUCKETS.http], registers: [deps.metrics] });

  for (const op of operations) {
    if (prepared.has(op.operationId)) throw new Error(`duplicate operationId ${op.operationId}`);
    if (op.method !== 'GET' && op.audit === undefined) throw new Error(`${op.operationId} mutates but declares no audit record`);
    // A Principal credential reaches a mutation, or a read of a named resource, only through the
    // PermissionAssignment the operation declares (its grants are per resource, unlike a role).
    if (op.auth.kind === 'bearer' && op.auth.principal && !op.permission && (op.method !== 'GET' || op.path.includes('{'))) {
      throw new Error(`${op.operationId} admits Principal credentials to ${op.method === 'GET' ? 'a read of a named resource' : 'a mutation'} without a PermissionAssignment check`);
    }
    const p = prepare(op);
    prepared.set(op.operationId, p);
    const path = koaPath(op.path);
    if (!byPath.has(path)) byPath.set(path, new Set());
    byPath.get(path)?.add(op.method);
    const method = op.method.toLowerCase() as 'get' | 'post' | 'patch' | 'put' | 'delete';
    // Label children bound once per operation (and status): no label hashing per request.
    const opLatency = latency.labels({ operation: op.operationId });
    const opRequests = new Map<string, ReturnType<typeof requests.labels>>();
    const routed: Routed = { name: `${op.method} ${op.path}`, route: op.path, operationId: op.operationId };
    const countRequest = (status: number): void => {
      const label = statusLabel(status);
      let child = opRequests.get(label);
      if (!child) opRequests.set(label, (child = requests.labels({ operation: op.operationId, status: label })));
      child.inc();
    };
    router.add(method, path, async (ctx) => {
      const started = process.hrtime.bigint();
      let status = 500;
      const requestId = requestIdOf(ctx);
      if (tracingEnabled()) ctx.state.routed = routed;
      try {
        let body: unknown;
        let unreadable: ApiError | undefined;
        // A GET is read only when it says it has a body (no promise on the reads' hot path).
        if (!op.upload && METHODS_WITH_BODY.has(ctx.method) && (ctx.method !== 'GET' || saysItHasBody(ctx.req))) {
          try {
            body = await readJsonBody(ctx.req, op.bodyLimitBytes ?? deps.config.bodyLimitBytes);
          } catch (err) {
            // A body that is not JSON, or too large (left unread), is refused where the pipeline
            // validates, after the caller is known: a bad key with a bad body is a 401, not a
            // lesson in JSON, and a refused mutation of a known caller is its audit record.
            if (!(err instanceof ApiError) || (err.status !== 400 && err.status !== 413)) throw err;
            unreadable = err;
          }
        }
        const raw = new RestRequest(ctx, op.method as HttpMethod, body, requestId, op.upload !== undefined);
        if (unreadable) raw.refused = unreadable;
        const { result } = await execute(p, raw, deps);
        if (result.kind === 'stream') {
          ctx.respond = false;
          const ac = new AbortController();
          const gone = () => {
            if (!ac.signal.aborted) ac.abort(CLIENT_GONE);
          };
          ctx.req.on('close', gone);
          ctx.res.on('close', gone);
          status = 200;
          await result.write(ctx.res, ac.signal);
          return;
        }
        status = result.status;
        if (result.headers) for (const [k, v] of Object.entries(result.headers)) ctx.set(k, v);
        if (result.status !== 204 && isJsonBody(result.body)) {
          sendJson(ctx, result.status, result.body);
          return;
        }
        ctx.status = result.status;
        if (result.status !== 204) ctx.body = result.body ?? null;
      } catch (err) {
        status = err instanceof ApiError ? err.status : 500;
        // A refused upload, or a body too large to read, may still be streaming in: read it off
        // so the client gets the answer.
        if (op.upload || status === 413) drainRequest(ctx.req);
        throw err;
      } finally {
        countRequest(status);
        opLatency.observe(Number(process.hrtime.bigint() - started) / 1e9);
      }
    });
  }

  return { router, prepared };
}

/** A body Koa would serialise as JSON (a plain object or an array; not a string, Buffer or stream). */
function isJsonBody(body: unknown): body is object {
  return typeof body === 'object' && body !== null && !Buffer.isBuffer(body) && typeof (body as { pipe?: unknown }).pipe !== 'function';
}

/**
 * Answer a JSON body as Koa's response would (status, `application/json; charset=utf-8`, its
 * length; no body on HEAD), written at once: Koa's body setter and its `respond` look the type up,
 * guess at streams and buffers and go through its delegates on every request.
 */
function sendJson(ctx: Koa.Context, status: number, body: object): void {
  // A stored document answered as read (a shared read-cache copy) goes out as its stored text.
  const text = storedJsonOf(body) ?? JSON.stringify(body);
  const res = ctx.res;
  ctx.respond = false;
  res.statusCode = status;
  res.setHeader('Content-Type', 'application/json; charset=utf-8');
  res.setHeader('Content-Length', Buffer.byteLength(text));
  if (ctx.method === 'HEAD') res.end();
  else res.end(text);
}

/**
 * Why a stream's signal aborts when its client leaves: one shared reason (a bare `abort()` builds
 * a DOMException, stack trace included, on every call, and both the request and the response
 * report the close).
 */
const CLIENT_GONE = new Error('the client closed the connection');

/**
 * After the router: no operation at this method and path → 404 `validation.not_found` (the
 * contract's catalog has no 405; an unserved method is an absent resource). A known path
 * with another method also lists its methods in `Allow`.
 */
export function unmatchedRoute(router: OperationRoutes): Koa.Middleware {
  return (ctx) => {
    const match = router.match(ctx.path, ctx.method);
    const methods = new Set((match?.path ?? []).flatMap((layer) => layer.methods));
    if (methods.size > 0) {
      ctx.set('Allow', [...methods].join(', '));
      throw new ApiError('validation.not_found', `no operation at ${ctx.method} ${ctx.path} (served: ${[...methods].join(', ')})`);
    }
    throw new ApiError('validation.not_found', `no operation at ${ctx.method} ${ctx.path}`);
  };
}
