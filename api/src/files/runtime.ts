import type Koa from 'koa';
import { ApiError, Counter, isId } from '@agentplane/core';
import type { ApiDeps } from '../deps.js';
import { bearerToken } from '../http/authenticate.js';
import type { RuntimeBearerVerifier } from '@agentplane/domain';
import { sendFileContent } from './operations.js';

export const RUNTIME_FILE_PATH = /^\/v1\/runtime\/files\/([^/]+)$/;

/**
 * `GET /v1/runtime/files/{file_id}`: the runner fetches a Session's `file` resources here to
 * materialise them in the sandbox. The bearer is the lease's runtime bearer: it works only
 * while its lease holds the Session fence, and only for the Files named by the Session's
 * resources when the lease was granted. An API key is never accepted here, nor this bearer
 * anywhere else. Errors are the API's usual `{error}` bodies.
 */
export function runtimeFiles(deps: ApiDeps, verifier: RuntimeBearerVerifier): Koa.Middleware {
  const downloads = new Counter({ name: 'agentplane_runtime_file_downloads_total', help: 'Files fetched by runners for materialisation, by outcome (ok, unauthorized, not_granted)', labelNames: ['outcome'] as const, registers: [deps.metrics] });
  return async (ctx, next) => {
    const m = RUNTIME_FILE_PATH.exec(ctx.path);
    if (!m) return next();
    if (ctx.method !== 'GET') {
      ctx.set('Allow', 'GET');
      throw new ApiError('validation.not_found', `no operation at ${ctx.method} ${ctx.path}; use GET`);
    }
    const token = bearerToken(ctx.headers.authorization);
    const grant = token ? await verifier.verify(token) : null;
    if (!grant) {
      downloads.inc({ outcome: 'unauthorized' });
      throw new ApiError('auth.invalid_key', 'missing, unknown or expired runtime bearer (it lives only while its lease holds the Session)', {
        headers: { 'WWW-Authenticate': 'Bearer error="invalid_token"' },
      });
    }
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
