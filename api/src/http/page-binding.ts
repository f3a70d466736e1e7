import { ApiError, CURSOR_TAG_LENGTH, sha256Hex } from '@agentplane/core';

/**
 * Every list's cursors are bound to the list that issued them. A list's own cursor (`c1_…`, in
 * whatever form its store writes) leaves the pipeline with a tag appended: eight hex characters
 * of a digest of the operation, the caller's Workspace, the path and the query's filters. A page
 * request must come back with the same: another list's cursor, or this list's under other
 * filters, is refused (400 `validation.malformed`) instead of read as a position in a list it
 * never came from. The tag is taken off before the handler sees the cursor.
 */
const TAG_LENGTH = CURSOR_TAG_LENGTH;

/** Query parameters that move through a list rather than choose one (left out of the binding). */
const POSITIONAL = new Set(['page', 'limit', 'after']);

export function pageBinding(operationId: string, workspaceId: string | null, params: unknown, query: Record<string, unknown>): string {
  const filters = Object.keys(query).filter((k) => !POSITIONAL.has(k)).sort().map((k) => [k, query[k]]);
  const path = Object.entries((params ?? {}) as Record<string, unknown>).sort(([a], [b]) => (a < b ? -1 : a > b ? 1 : 0));
  return sha256Hex(JSON.stringify([operationId, workspaceId, path, filters])).slice(0, TAG_LENGTH);
}

/** A cursor as sent to the client: the list's own, tagged with its binding. */
export function bindCursor(cursor: string, binding: string): string {
  return cursor + binding;
}

/** The list's own cursor inside one the client sent back; 400 when it was not issued by this list. */
export function unbindCursor(cursor: string, binding: string): string {
  if (cursor.length > 3 + TAG_LENGTH && cursor.endsWith(binding)) return cursor.slice(0, -TAG_LENGTH);
  throw new ApiError('validation.malformed', 'query.page: not a cursor issued by this list (a page continues the list, path and filters of the first)');
}

/** The same response with its `next_page` and `prev_page` cursors bound. */
export function bindPage(body: unknown, binding: string): unknown {
  if (typeof body !== 'object' || body === null || Array.isArray(body)) return body;
  const page = body as { next_page?: unknown; prev_page?: unknown };
  const next = typeof page.next_page === 'string' ? bindCursor(page.next_page, binding) : undefined;
  const prev = typeof page.prev_page === 'string' ? bindCursor(page.prev_page, binding) : undefined;
  if (next === undefined && prev === undefined) return body;
  return { ...body, ...(next !== undefined ? { next_page: next } : {}), ...(prev !== undefined ? { prev_page: prev } : {}) };
}
