import type Koa from 'koa';
import { ApiError } from '@agentplane/core';
import type { RuntimeBearerVerifier, RuntimeGrant } from '@agentplane/domain';
import { bearerToken } from './authenticate.js';

/** A file tree as the runner fetches it to place in a sandbox. */
export interface PlacedFile {
  path: string;
  executable: boolean;
  content: Buffer;
}

/**
 * How every runtime route (the runner's, authenticated by the lease's runtime bearer) starts: a
 * request with another method is 404 with `Allow`; a missing, unknown or dead bearer is 401, after
 * `onUnauthorized` (a route's outcome counter) ran. Returns the bearer's grant.
 */
export async function runtimeGrant(
  ctx: Koa.Context, method: 'GET' | 'POST', verifier: RuntimeBearerVerifier, onUnauthorized?: () => void,
): Promise<RuntimeGrant> {
  if (ctx.method !== method) {
    ctx.set('Allow', method);
    throw new ApiError('validation.not_found', `no operation at ${ctx.method} ${ctx.path}; use ${method}`);
  }
  const token = bearerToken(ctx.headers.authorization);
  const grant = token ? await verifier.verify(token) : null;
  if (!grant) {
    onUnauthorized?.();
    throw new ApiError('auth.invalid_key', 'missing, unknown or expired runtime bearer (it lives only while its lease holds the Session)', {
      headers: { 'WWW-Authenticate': 'Bearer error="invalid_token"' },
    });
  }
  return grant;
}

/**
 * A `GET` the runner makes with the lease's runtime bearer (never an API key) for a file tree its
 * turn spec names: other methods are 404, a missing or dead bearer 401; `read` checks the grant's
 * access to the matched resource and returns the files, sent uncached as
 * `{files: [{path, executable, content_base64}]}`.
 */
export function runtimeFilesRoute(
  path: RegExp,
  verifier: RuntimeBearerVerifier,
  read: (grant: RuntimeGrant, match: RegExpExecArray) => Promise<PlacedFile[]>,
): Koa.Middleware {
  return async (ctx, next) => {
    const m = path.exec(ctx.path);
    if (!m) return next();
    const grant = await runtimeGrant(ctx, 'GET', verifier);
    const files = await read(grant, m);
    ctx.status = 200;
    ctx.set('Cache-Control', 'no-store');
    ctx.body = { files: files.map((f) => ({ path: f.path, executable: f.executable, content_base64: f.content.toString('base64') })) };
  };
}
