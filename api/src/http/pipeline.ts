import type { IncomingMessage } from 'node:http';
import { ApiError, validator, type TSchema } from '@agentplane/core';
import { tags } from '@agentplane/store';
import type { ApiDeps } from '../deps.js';
import { ANONYMOUS, type Caller } from './caller.js';
import { authenticate, authorize } from './authenticate.js';
import { enforceRateLimit } from './rate-limit.js';
import { fingerprint, IDEMPOTENCY_KEY_RE } from './idempotency.js';
import { CURRENT_VERSION, type HttpMethod, type JsonResult, type Operation, type OperationResult } from './operation.js';

/** One request as the pipeline sees it, whichever edge it came in on (REST or MCP). */
export interface RawRequest {
  method: HttpMethod;
  /** Lower-cased header names. */
  headers: Readonly<Record<string, string | undefined>>;
  params: Record<string, string>;
  query: Record<string, unknown>;
  /** Parsed JSON body, or undefined when none was sent. */
  body: unknown;
  /** The unread request body, for operations with an `upload` body (REST edge only). */
  stream?: IncomingMessage;
  /**
   * Set only by an edge that has already authenticated this same HTTP request with these same
   * headers and counted it against the caller's rate limit (the MCP edge: one POST /v1/mcp is
   * one request, whatever it dispatches). The bearer is not resolved twice and the request is
   * not counted twice; authorisation, version, validation and idempotency still run.
   */
  admitted?: Caller;
}

export const VERSION_HEADER = 'service-version';

const EMPTY = Object.freeze({}) as Record<string, never>;

function compiled(schema: TSchema | undefined, part: 'path' | 'query' | 'body') {
  return schema ? validator(schema, part) : undefined;
}

/** Operation plus its compiled validators; built once at start-up. */
export interface PreparedOperation {
  op: Operation;
  validatePath?: ((v: unknown) => unknown) | undefined;
  validateQuery?: ((v: unknown) => unknown) | undefined;
  validateBody?: ((v: unknown) => unknown) | undefined;
}

export function prepare(op: Operation): PreparedOperation {
  return {
    op,
    validatePath: compiled(op.params, 'path'),
    validateQuery: compiled(op.query, 'query'),
    validateBody: compiled(op.body, 'body'),
  };
}

function checkVersion(op: Operation, headers: RawRequest['headers']): void {
  if (op.versions === null) return;
  const accepted = op.versions ?? [CURRENT_VERSION];
  const got = headers[VERSION_HEADER];
  if (!got) throw new ApiError('validation.malformed', `the Service-Version header is required (accepted: ${accepted.join(', ')})`);
  if (!accepted.includes(got)) {
    throw new ApiError('validation.malformed', `Service-Version '${got}' is not supported here (accepted: ${accepted.join(', ')})`);
  }
}

/**
 * The shared middleware of every /v1 operation, in order: authenticate and authorise,
 * version header, rate limit, schema validation of path, query and body, Idempotency-Key,
 * then the handler. Returns the response to send; throws ApiError for the client's mistakes.
 */
export async function execute(prepared: PreparedOperation, raw: RawRequest, deps: ApiDeps): Promise<{ caller: Caller; result: OperationResult }> {
  const { op } = prepared;
  let caller: Caller = ANONYMOUS;
  if (op.auth.kind === 'bearer') {
    caller = raw.admitted ?? (await authenticate(raw.headers, deps));
    authorize(caller, op.auth);
  }
  checkVersion(op, raw.headers);
  if (caller.kind !== 'anonymous' && !raw.admitted) await enforceRateLimit(deps.redis, caller.credentialId, caller.rateLimitPerMinute);

  const params = prepared.validatePath ? prepared.validatePath({ ...raw.params }) : EMPTY;
  const query = prepared.validateQuery ? prepared.validateQuery({ ...raw.query }) : rejectUnexpectedQuery(raw.query);
  let body: unknown = EMPTY;
  if (op.upload) {
    if (!raw.stream) throw new ApiError('validation.malformed', `${op.operationId} takes a ${op.upload.contentType} body, on the REST API only`);
  } else if (prepared.validateBody) {
    body = prepared.validateBody(raw.body === undefined ? {} : raw.body);
  } else if (raw.body !== undefined && !(typeof raw.body === 'object' && raw.body !== null && Object.keys(raw.body).length === 0)) {
    throw new ApiError('validation.malformed', 'this operation takes no request body');
  }

  const mode = op.idempotency ?? 'none';
  const idemKey = raw.headers['idempotency-key'];
  if (idemKey !== undefined && !IDEMPOTENCY_KEY_RE.test(idemKey)) {
    throw new ApiError('validation.malformed', 'Idempotency-Key must be 1 to 255 printable non-space ASCII characters');
  }
  if (mode === 'required' && idemKey === undefined) {
    throw new ApiError('validation.malformed', 'this operation requires an Idempotency-Key header');
  }

  if (op.upload && raw.stream) body = await op.upload.receive(raw.stream, deps);
  const upload = op.upload;
  const discard = async () => {
    if (upload) await upload.discard(body as Record<string, unknown>, deps).catch(() => undefined);
  };

  const req = {
    caller,
    params,
    query,
    body,
    headers: raw.headers,
    idempotencyKey: mode === 'none' ? undefined : idemKey,
    deps,
    log: deps.log,
  };

  if (mode === 'none' || idemKey === undefined) {
    try {
      return { caller, result: await op.handler(req as never) };
    } catch (err) {
      await discard();
      throw err;
    }
  }

  const tag = caller.workspaceId ? tags.workspace(caller.workspaceId) : tags.org(caller.organizationId);
  const fpBody = upload ? upload.fingerprint(body as Record<string, unknown>) : body;
  const fp = fingerprint(op.operationId, { params, query, body: fpBody, credential: caller.credentialId });
  let begun;
  try {
    begun = await deps.idempotency.begin(tag, idemKey, fp);
  } catch (err) {
    await discard();
    throw err;
  }
  if (begun.kind === 'replay') {
    await discard();
    if (op.replayable && begun.result.status < 300 && !(await op.replayable(begun.result.body, deps))) {
      throw new ApiError('idempotency.conflict', 'the original response holds a secret that is no longer live; it is not replayed');
    }
    return { caller, result: begun.result };
  }
  let result: OperationResult;
  try {
    result = await op.handler(req as never);
  } catch (err) {
    await discard();
    if (err instanceof ApiError && err.status < 500) {
      await deps.idempotency.complete(begun, { status: err.status, body: err.toWire(deps.config.docsUrl), headers: err.headers }, false);
    } else {
      await deps.idempotency.abandon(begun);
    }
    throw err;
  }
  if (result.kind === 'stream') {
    await deps.idempotency.abandon(begun);
    return { caller, result };
  }
  await deps.idempotency.complete(begun, result as JsonResult, op.sensitive ?? false);
  return { caller, result };
}

function rejectUnexpectedQuery(query: Record<string, unknown>): Record<string, never> {
  const names = Object.keys(query);
  if (names.length > 0) throw new ApiError('validation.malformed', `query: unknown parameter '${names[0] as string}'`);
  return EMPTY;
}
