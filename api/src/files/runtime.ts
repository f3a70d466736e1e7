import type Koa from 'koa';
import { ApiError, Counter, isId, newId, nowIso, sha256Hex } from '@agentplane/core';
import { ContentTooLarge, StorageError, type FileDoc } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import { runtimeGrant } from '../http/runtime-route.js';
import type { RuntimeBearerVerifier, RuntimeGrant } from '@agentplane/domain';
import { IDEMPOTENCY_KEY_RE } from '../http/idempotency.js';
import { requestIdOf } from '../http/router.js';
import { sendFileContent } from './operations.js';

export const RUNTIME_FILE_PATH = /^\/v1\/runtime\/files\/([^/]+)$/;
export const RUNTIME_FILES_PATH = '/v1/runtime/files';
/** Largest File a Session's tool may store through the runtime route (a screenshot is far smaller). */
export const RUNTIME_OUTPUT_MAX_BYTES = 16 * 1024 * 1024;
/** Content types a tool may store (screenshots). */
const OUTPUT_TYPES = new Set(['image/png', 'image/jpeg']);

/**
 * `GET /v1/runtime/files/{file_id}`: the runner fetches a Session's `file` resources here to
 * materialise them in the sandbox. The bearer is the lease's runtime bearer: it works only
 * while its lease holds the Session fence, and only for the Files named by the Session's
 * resources when the lease was granted. An API key is never accepted here, nor this bearer
 * anywhere else. Errors are the API's usual `{error}` bodies.
 */
export function runtimeFiles(deps: ApiDeps, verifier: RuntimeBearerVerifier): Koa.Middleware {
  const downloads = new Counter({ name: 'agentplane_runtime_file_downloads_total', help: 'Files fetched by runners for materialisation, by outcome (ok, unauthorized, not_granted)', labelNames: ['outcome'] as const, registers: [deps.metrics] });
  const outputs = new Counter({ name: 'agentplane_runtime_file_outputs_total', help: 'Files stored by runners for a Session\'s tools (browser screenshots), by outcome (ok, unauthorized, not_granted, invalid)', labelNames: ['outcome'] as const, registers: [deps.metrics] });
  return async (ctx, next) => {
    if (ctx.path === RUNTIME_FILES_PATH) return storeOutput(ctx, deps, verifier, outputs);
    const m = RUNTIME_FILE_PATH.exec(ctx.path);
    if (!m) return next();
    const grant = await runtimeGrant(ctx, 'GET', verifier, () => downloads.inc({ outcome: 'unauthorized' }));
    const fileId = m[1] ?? '';
    if (!isId('file', fileId)) throw new ApiError('validation.malformed', 'path.file_id: expected a file_ id');
    if (!(grant.files ?? []).includes(fileId)) {
      downloads.inc({ outcome: 'not_granted' });
      throw new ApiError('validation.not_found', `file ${fileId} is not a resource of session ${grant.session_id}`);
    }
    const file = await deps.files.get(grant.workspace_id, fileId);
    ctx.respond = false;
    const ac = new AbortController();
    ctx.res.on('close', () => ac.abort());
    downloads.inc({ outcome: 'ok' });
    await sendFileContent(ctx.res, file, deps.files.read(file), ac.signal);
  };
}

/**
 * `POST /v1/runtime/files?filename=…`: the runner stores a File a Session's tool produced (a
 * browser screenshot). The body is the content, its `Content-Type` one of `image/png` or
 * `image/jpeg`; the File records the Session (`session_id`) and is answered 201 with the File.
 * An `Idempotency-Key` makes the store once per key and Run (the runner sends one and retries
 * under it when the control plane did not answer): an attempt whose earlier one committed is
 * answered that File (201), its own bytes dropped; the same key with another content, name or
 * type is 409 `idempotency.conflict`.
 * The lease's runtime bearer must carry the `outputs` grant (given to Runs whose Environment has
 * the browser) and its lease must still hold the Session. Every attempt past the bearer is
 * audited as `files.storeSessionOutput` (actor the Run, `request_id` the request's): succeeded
 * (target the File), or denied, failed or error (target the Session) with its status and type.
 */
async function storeOutput(ctx: Koa.Context, deps: ApiDeps, verifier: RuntimeBearerVerifier, outputs: Counter<'outcome'>): Promise<void> {
  const grant = await runtimeGrant(ctx, 'POST', verifier, () => outputs.inc({ outcome: 'unauthorized' }));
  const record = (target: string, outcome: 'succeeded' | 'failed' | 'denied' | 'error', status: number, detail: string | null) => deps.audit.append(grant.workspace_id, {
    actor: { id: grant.run_id, credential_id: null }, action: 'files.storeSessionOutput', target, outcome, status, detail, request_id: requestIdOf(ctx),
  }).catch((err: unknown) => deps.log.error({ err, run: grant.run_id }, 'audit append failed'));
  let stored: FileDoc;
  try {
    stored = await storeGranted(ctx, deps, grant, outputs);
  } catch (err) {
    const status = err instanceof ApiError ? err.status : 500;
    await record(grant.session_id, status === 401 || status === 403 ? 'denied' : status >= 500 ? 'error' : 'failed', status, err instanceof ApiError ? err.type : 'runtime.internal');
    throw err;
  }
  await record(stored.id, 'succeeded', 201, null);
  ctx.status = 201;
  ctx.body = stored;
}

/** The checks and the store of `storeOutput`, once the bearer is known. */
async function storeGranted(ctx: Koa.Context, deps: ApiDeps, grant: RuntimeGrant, outputs: Counter<'outcome'>): Promise<FileDoc> {
  if (!grant.outputs) {
    outputs.inc({ outcome: 'not_granted' });
    throw new ApiError('policy.denied', `the runtime bearer of run ${grant.run_id} may not store Files (its Environment has no browser)`);
  }
  const type = String(ctx.get('content-type') ?? '').split(';')[0]?.trim().toLowerCase() ?? '';
  const rawName = typeof ctx.query.filename === 'string' ? ctx.query.filename : '';
  if (!OUTPUT_TYPES.has(type) || !/^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$/.test(rawName)) {
    outputs.inc({ outcome: 'invalid' });
    throw new ApiError('validation.malformed', 'POST /v1/runtime/files takes an image/png or image/jpeg body and a ?filename= of letters, digits, ".", "_" and "-"');
  }
  const idemKey = ctx.get('idempotency-key') || undefined;
  if (idemKey !== undefined && !IDEMPOTENCY_KEY_RE.test(idemKey)) {
    outputs.inc({ outcome: 'invalid' });
    throw new ApiError('validation.malformed', 'Idempotency-Key must be 1 to 255 printable non-space ASCII characters');
  }
  const declared = Number(ctx.get('content-length') || 0);
  if (declared > RUNTIME_OUTPUT_MAX_BYTES) throw new ApiError('validation.payload_too_large', `a stored output is at most ${RUNTIME_OUTPUT_MAX_BYTES} bytes`);
  const id = newId('file');
  // Too large is the runner's mistake (413); a request cut short is a malformed one (400); a
  // storage failure is ours and goes on to the error boundary (500 `runtime.internal`).
  const staged = await deps.files.stage(id, ctx.req as AsyncIterable<Buffer>, RUNTIME_OUTPUT_MAX_BYTES).catch((err: unknown) => {
    if (err instanceof ApiError || err instanceof StorageError) throw err;
    if (err instanceof ContentTooLarge) throw new ApiError('validation.payload_too_large', `a stored output is at most ${RUNTIME_OUTPUT_MAX_BYTES} bytes`);
    throw new ApiError('validation.malformed', 'the output could not be read (the request was cut short)');
  });
  const now = nowIso();
  const file: FileDoc = {
    id, type: 'file', workspace_id: grant.workspace_id, filename: rawName, content_type: type, size_bytes: staged.size_bytes, sha256: staged.sha256,
    session_id: grant.session_id, version: 1, created_at: now, updated_at: now,
  };
  // The key's record is the Run's own (its id in the token), so no other Run can reach it.
  const keyed = idemKey === undefined ? undefined : { token: sha256Hex(`runtime-output\0${grant.run_id}\0${idemKey}`), keptMs: deps.config.idempotencyTtlSeconds * 1000 };
  const stored = await deps.files.commit(file, keyed);
  if (stored.id !== file.id && (stored.sha256 !== file.sha256 || stored.filename !== file.filename || stored.content_type !== file.content_type || stored.session_id !== file.session_id)) {
    throw new ApiError('idempotency.conflict', 'this Idempotency-Key already stored another output of this Run; use a new key');
  }
  outputs.inc({ outcome: 'ok' });
  return stored;
}
