/**
 * Serves the built web console (console/dist) at /console from the API process: same origin as
 * the API, so the console needs no CORS and the Content-Security-Policy can forbid everything
 * but this origin. The assets are public (they hold no data; the app authenticates its API
 * calls), read into memory once at start. Hashed assets are cached for a year; index.html is
 * revalidated on every load (ETag), so a new build is picked up at once.
 */
import { createHash } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { extname, join, relative, resolve, sep } from 'node:path';
import type { Middleware } from 'koa';
import type { Logger } from '@agentplane/core';
import { ifNoneMatchHits } from '../http/conditional.js';

export const CONSOLE_PREFIX = '/console';

/** No inline script or style, nothing from another origin, no framing, no plugins. */
export const CONSOLE_CSP = [
  "default-src 'self'",
  "script-src 'self'",
  "style-src 'self'",
  "img-src 'self' data:",
  "connect-src 'self'",
  "font-src 'self'",
  "object-src 'none'",
  "base-uri 'none'",
  "form-action 'self'",
  "frame-ancestors 'none'",
].join('; ');

const TYPES: Record<string, string> = {
  '.html': 'text/html; charset=utf-8',
  '.js': 'text/javascript; charset=utf-8',
  '.css': 'text/css; charset=utf-8',
  '.svg': 'image/svg+xml',
  '.png': 'image/png',
  '.woff2': 'font/woff2',
  '.json': 'application/json',
};

interface Asset {
  body: Buffer;
  type: string;
  etag: string;
  immutable: boolean;
}

/** The repository's console/dist, seen from api/dist/console/. */
export function defaultConsoleDir(): string {
  return resolve(import.meta.dirname, '..', '..', '..', 'console', 'dist');
}

function load(dir: string): Map<string, Asset> {
  const assets = new Map<string, Asset>();
  const walk = (d: string) => {
    for (const name of readdirSync(d)) {
      const full = join(d, name);
      if (statSync(full).isDirectory()) { walk(full); continue; }
      const rel = relative(dir, full).split(sep).join('/');
      const body = readFileSync(full);
      assets.set(`/${rel}`, {
        body,
        type: TYPES[extname(name)] ?? 'application/octet-stream',
        etag: `"${createHash('sha256').update(body).digest('base64url').slice(0, 27)}"`,
        immutable: rel.startsWith('assets/'),
      });
    }
  };
  walk(dir);
  return assets;
}

export function consoleStatic(options: { dir: string | undefined; log: Logger }): Middleware {
  const dir = options.dir ?? defaultConsoleDir();
  const assets = existsSync(join(dir, 'index.html')) ? load(dir) : null;
  if (!assets) options.log.warn({ dir }, 'web console not built; /console answers 404 (npm run build builds it)');
  else options.log.info({ path: `${CONSOLE_PREFIX}/`, files: assets.size }, 'web console served');

  return async (ctx, next) => {
    if (ctx.path !== CONSOLE_PREFIX && !ctx.path.startsWith(`${CONSOLE_PREFIX}/`)) return next();
    ctx.set('Content-Security-Policy', CONSOLE_CSP);
    ctx.set('X-Content-Type-Options', 'nosniff');
    ctx.set('Referrer-Policy', 'no-referrer');
    ctx.set('X-Frame-Options', 'DENY');
    ctx.set('Cross-Origin-Opener-Policy', 'same-origin');
    ctx.set('Cross-Origin-Resource-Policy', 'same-origin');
    if (ctx.method !== 'GET' && ctx.method !== 'HEAD') {
      ctx.status = 405;
      ctx.set('Allow', 'GET, HEAD');
      ctx.type = 'text/plain';
      ctx.body = 'method not allowed';
      return;
    }
    if (ctx.path === CONSOLE_PREFIX) {
      ctx.status = 308;
      ctx.redirect(`${CONSOLE_PREFIX}/`);
      return;
    }
    const rel = ctx.path.slice(CONSOLE_PREFIX.length);
    const asset = assets?.get(rel === '/' ? '/index.html' : rel);
    if (!asset) {
      ctx.status = 404;
      ctx.type = 'text/plain';
      ctx.set('Cache-Control', 'no-store');
      ctx.body = assets ? 'not found' : 'the web console is not built (npm run build)';
      return;
    }
    ctx.set('Cache-Control', asset.immutable ? 'public, max-age=31536000, immutable' : 'no-cache');
    ctx.set('ETag', asset.etag);
    ctx.type = asset.type;
    if (ifNoneMatchHits(ctx.get('If-None-Match'), asset.etag)) {
      ctx.status = 304;
      return;
    }
    ctx.status = 200;
    ctx.body = asset.body;
  };
}
