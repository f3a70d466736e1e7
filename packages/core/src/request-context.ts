/**
 * Request ids. The API gives every request an id (the `Request-Id` it answers with) and hands
 * it, as a value, to what names the request: its own log lines (the pipeline's, its handler's
 * `req.log`, the edges', incidents), the audit records and incident messages.
 *
 * Nothing keeps a request in an async-local store: on Node 20 an AsyncLocalStorage, once entered,
 * hooks every promise the process makes (an async id and the store copied onto each), measured
 * at 16% of the API's CPU per cached GET and 10-16% of its CPU per Run. The API's trace context
 * travels the same way, as a value (tracing.ts).
 */
import { randomBytes, randomUUID } from 'node:crypto';

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
  // W3C Trace Context: lowercase hex only (an uppercase id is invalid, not another spelling).
  const m = TRACEPARENT.exec((traceparent ?? '').trim());
  if (!m || m[1] === 'ff' || /^0+$/.test(m[2] as string) || /^0+$/.test(m[3] as string)) return undefined;
  return m[2];
}

/**
 * The request id of an incoming request: the caller's `X-Request-Id` when it is well formed,
 * else `traceId` (the trace of the request's own span, with tracing on: it continues a valid
 * `traceparent`'s), else the trace id of a valid `traceparent`, else a new `req_` id. Anything
 * else the caller sent is ignored (never echoed), so the id is always safe to log and to put in
 * a header.
 */
export function requestIdFrom(headers: Readonly<Record<string, string | string[] | undefined>>, traceId?: string): string {
  const first = (v: string | string[] | undefined) => (Array.isArray(v) ? v[0] : v);
  const given = first(headers['x-request-id'])?.trim();
  if (given && CALLER_REQUEST_ID.test(given)) return given;
  return traceId ?? traceIdOf(first(headers.traceparent)) ?? newRequestId();
}

/** An opaque incident reference for a 500, and the message that names it and the request. */
export function incident(what: string, requestId?: string): { incident: string; message: string } {
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
