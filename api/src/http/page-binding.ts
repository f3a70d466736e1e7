import { createHmac, timingSafeEqual } from 'node:crypto';
import { ApiError, CURSOR_TAG_LENGTH } from '@agentplane/core';

/**
 * Every list's cursors are bound to the list that issued them. A list's own cursor (`c1_…`, in
 * whatever form its store writes) leaves the pipeline with a tag appended: eight hex characters
 * of a keyed digest (HMAC, under a secret derived from the platform's master key) of the cursor
 * itself and of its list: the operation, the caller's Workspace, the path and the query's
 * filters. A page request must come back with the same: another list's cursor, this list's
 * under other filters, or a position written by hand (the tag cannot be made without the
 * secret) is refused (400 `validation.malformed`) instead of read as a position. The tag is
 * taken off before the handler sees the cursor.
 */
const TAG_LENGTH = CURSOR_TAG_LENGTH;

/** Query parameters that move through a list rather than choose one (left out of the binding). */
const POSITIONAL = new Set(['page', 'limit', 'after']);

/** The cursor secret of each master key (derived once). */
const secrets = new WeakMap<Buffer, Buffer>();
function cursorSecret(masterKey: Buffer): Buffer {
  let s = secrets.get(masterKey);
  if (!s) secrets.set(masterKey, (s = createHmac('sha256', masterKey).update('agentplane.list-cursors.v1').digest()));
  return s;
}

/** The key a list's cursors are tagged under: its operation, Workspace, path and filters, keyed by the secret. */
export function pageBinding(masterKey: Buffer, operationId: string, workspaceId: string | null, params: unknown, query: Record<string, unknown>): Buffer {
  const filters = Object.keys(query).filter((k) => !POSITIONAL.has(k)).sort().map((k) => [k, query[k]]);
  const path = Object.entries((params ?? {}) as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return createHmac('sha256', cursorSecret(masterKey)).update(JSON.stringify([operationId, workspaceId, path, filters])).digest();
}

const tagOf = (cursor: string, binding: Buffer): string => createHmac('sha256', binding).update(cursor).digest('hex').slice(0, TAG_LENGTH);

/** A cursor as sent to the client: the list's own, tagged with its binding. */
export function bindCursor(cursor: string, binding: Buffer): string {
  return cursor + tagOf(cursor, binding);
}

/** The list's own cursor inside one the client sent back; 400 when it was not issued by this list. */
export function unbindCursor(cursor: string, binding: Buffer): string {
  if (cursor.length > 3 + TAG_LENGTH) {
    const own = cursor.slice(0, -TAG_LENGTH);
    const tag = Buffer.from(cursor.slice(-TAG_LENGTH));
    const want = Buffer.from(tagOf(own, binding));
    if (tag.length === want.length && timingSafeEqual(tag, want)) return own;
  }
  throw new ApiError('validation.malformed', 'query.page: not a cursor issued by this list (a page continues the list, path and filters of the first)');
}

/** The same response with its `next_page` and `prev_page` cursors bound. */
export function bindPage(body: unknown, binding: Buffer): unknown {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return body;
  const page = body as { next_page?: unknown; prev_page?: unknown };
  const next = typeof page.next_page === 'string' ? bindCursor(page.next_page, binding) : undefined;
  const prev = typeof page.prev_page === 'string' ? bindCursor(page.prev_page, binding) : undefined;
  if (next === undefined && prev === undefined) return body;
  return { ...body, ...(next !== undefined ? { next_page: next } : {}), ...(prev !== undefined ? { prev_page: prev } : {}) };
}
