import type Koa from 'koa';
import { ApiError, ERROR_STATUS, type ErrorType } from '@agentplane/core';
import type { ApiDeps } from '../deps.js';

const PATH = /^\/v1\/a2a-tool-callbacks\/(sess_[0-9a-f]{32})\/(toolu_[0-9a-f]{32})$/;
const MAX_BODY = 64 * 1024;

/**
 * `POST /v1/a2a-tool-callbacks/{session_id}/{tool_use_id}`: the task-scoped push callback an
 * external A2A peer notifies (`application/a2a+json`). Authenticated only by the call's
 * generated Bearer value (its digest is stored with the call). A notification only wakes the
 * call's observer, which re-reads the task with GetTask; its body is read and discarded.
 */
export function a2aToolCallbacks(deps: ApiDeps): Koa.Middleware {
  const fail = (ctx: Koa.Context, type: ErrorType, message: string) => {
    ctx.status = ERROR_STATUS[type];
    ctx.type = 'application/json';
    ctx.body = new ApiError(type, message).toWire(deps.config.docsUrl);
  };
  return async (ctx, next) => {
    const m = PATH.exec(ctx.path);
    if (!m) return next();
    if (ctx.method !== 'POST') {
      ctx.set('Allow', 'POST');
      return fail(ctx, 'validation.malformed', `${ctx.method} is not served here; use POST`);
    }
    const type = (ctx.get('content-type') || '').split(';')[0]!.trim().toLowerCase();
    if (type !== 'application/a2a+json' && type !== 'application/json') return fail(ctx, 'validation.malformed', 'a notification is application/a2a+json');
    let size = 0;
    for await (const chunk of ctx.req) {
      size += (chunk as Buffer).length;
      if (size > MAX_BODY) return fail(ctx, 'validation.payload_too_large', `a notification is at most ${MAX_BODY} bytes`);
    }
    const auth = /^Bearer ([A-Za-z0-9_-]{20,200})$/.exec(ctx.get('authorization'));
    if (!auth || !(await deps.a2aCalls.notify(m[1]!, m[2]!, auth[1]!))) {
      ctx.set('WWW-Authenticate', 'Bearer');
      return fail(ctx, 'auth.invalid_key', 'unknown call or callback credential');
    }
    ctx.status = 204;
  };
}
