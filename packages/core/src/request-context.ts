/**
 * The request a piece of work is done for. The API opens a scope per HTTP request.
 *
 * The request's id travels explicitly: its own log lines (the pipeline's, its handler's
 * `req.log`, the edges', incidents) name it, it is given to the audit records, and incident
 * messages name it. The scope is also kept in an async-local store, so that every log line
 * written while the request runs carries `request_id` (the logger's mixin reads it), but only
 * when tracing is on (`keepRequestScopes`, called by startTracing): the trace context needs that
 * store anyway. On Node 20 an AsyncLocalStorage, once entered, hooks every promise the process
 * makes (an id and its store copied onto each): measured at 16% of the API's CPU per cached GET
 * and 10-16% of its CPU per Run, for a field on the few lines written deep inside a request,
 * which name their own resources (Run, step, approval) as well.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { randomBytes, randomUUID } from 'node:crypto';

export interface RequestScope {
  requestId: string;
}

/**
 * One async-local store per process for the request scope and, with tracing on, the active
 * OpenTelemetry context (tracing.ts): a second AsyncLocalStorage would add its own copy to
 * every promise the process creates.
 */
interface Scope {
  requestId?: string;
  trace?: unknown;
}

const storage = new AsyncLocalStorage<Scope>();
/** Whether request scopes are kept in the async-local store (only with tracing on; module comment). */
let keepScopes = false;

/** Keep each request's scope in the async-local store from now on (tracing is on). */
export function keepRequestScopes(): void {
  keepScopes = true;
}

/**
 * Run `fn` inside the scope of one request (the active trace context carries on). Without
 * `keepRequestScopes`, `fn` just runs: the id travels explicitly.
 */
export function withRequestScope<T>(scope: RequestScope, fn: () => T): T {
  if (!keepScopes) return fn();
  const trace = storage.getStore()?.trace;
  return storage.run(trace === undefined ? { requestId: scope.requestId } : { requestId: scope.requestId, trace }, fn);
}

/** The trace context of the current scope (tracing.ts's context manager). */
export const scopedTrace = (): unknown => storage.getStore()?.trace;

/** Run `fn` with `trace` as the scope's trace context (the request id carries on). */
export function withScopedTrace<R>(trace: unknown, fn: () => R): R {
  const requestId = storage.getStore()?.requestId;
  return storage.run(requestId === undefined ? { trace } : { requestId, trace }, fn);
}

/**
 * Make `trace` the trace context of the rest of the current scope, in place (no nested scope):
 * for a span that covers the whole scope, such as an API request's SERVER span. False when
 * there is no scope.
 */
export const inScope = (): boolean => storage.getStore() !== undefined;

export function setScopedTrace(trace: unknown): boolean {
  const scope = storage.getStore();
  if (!scope) return false;
  scope.trace = trace;
  return true;
}

/** The id of the request being served, if any. */
export function currentRequestId(): string | undefined {
  return storage.getStore()?.requestId;
}

/**
 * 96 random bits as 24 hex digits. `randomUUID` draws from a cached entropy pool: a fresh
 * `randomBytes` call per request cost ~4% of an API process's CPU under load.
 */
export const newRequestId = (): string => {
  const u = randomUUID();
  // xxxxxxxx-xxxx-4xxx-Vxxx-xxxxxxxxxxxx: the version and variant digits are left out.
  return `req_${u.slice(0, 8)}${u.slice(9, 13)}${u.slice(15, 18)}${u.slice(20, 23)}${u.slice(24, 30)}`;
};

/** What a caller may choose as its request id: 1–128 visible ASCII characters without quotes or separators. */
const CALLER_REQUEST_ID = /^[A-Za-z0-9._:@/+=-]{1,128}$/;
const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$/;

/** The trace id of a W3C `traceparent` header, when it is well formed (all-zero ids are invalid). */
export function traceIdOf(traceparent: string | undefined): string | undefined {
  const m = TRACEPARENT.exec((traceparent ?? '').trim().toLowerCase());
  if (!m || m[1] === 'ff' || /^0+$/.test(m[2] as string) || /^0+$/.test(m[3] as string)) return undefined;
  return m[2];
}

/**
 * The request id of an incoming request: the caller's `X-Request-Id` when it is well formed,
 * else the trace id of a valid `traceparent`, else a new `req_` id. Anything else the caller
 * sent is ignored (never echoed), so the id is always safe to log and to put in a header.
 */
export function requestIdFrom(headers: Readonly<Record<string, string | string[] | undefined>>): string {
  const first = (v: string | string[] | undefined) => (Array.isArray(v) ? v[0] : v);
  const given = first(headers['x-request-id'])?.trim();
  if (given && CALLER_REQUEST_ID.test(given)) return given;
  return traceIdOf(first(headers.traceparent)) ?? newRequestId();
}

/**
 * An opaque incident reference for a 500, and the message that names it and the request
 * (`requestId`, else the current scope's).
 */
export function incident(what: string, requestId: string | undefined = currentRequestId()): { incident: string; message: string } {
  const ref = `inc_${randomBytes(8).toString('hex')}`;
  return { incident: ref, message: `${what}; incident reference ${ref}${requestId ? `, request id ${requestId}` : ''}` };
}

/**
 * An unexpected failure while serving request `requestId`: logged at error with its incident
 * reference, the request id and `fields` (the error's stack goes to the log only), and returned
 * as the incident whose message the client is given.
 */
export function reportIncident(
  log: { error(obj: object, msg: string): void }, err: unknown, msg: string, requestId: string | undefined, fields: Record<string, unknown> = {},
): { incident: string; message: string } {
  const inc = incident('internal error', requestId);
  log.error({ err, incident: inc.incident, ...fields, ...(requestId === undefined ? {} : { request_id: requestId }) }, msg);
  return inc;
}
