import { ApiError } from '@agentplane/core';
import type { DocumentStore, Redis } from '@agentplane/store';
import { MEMORY_LIMITS, type MemoryDocument, type MemoryStoreDoc } from './model.js';
import { MemorySearch } from './search.js';
import { cursorBinding, decodeBoundCursor, encodeBoundCursor, MemoryStores } from './store.js';

export interface MemorySearchPage {
  results: { path: string; score: number; version: number; metadata: Record<string, string>; updated_at: string; snippet: string }[];
  next_cursor: string | null;
}

const SNIPPET_CHARS = 240;

const isLowSurrogate = (unit: number) => unit >= 0xdc00 && unit <= 0xdfff;

/**
 * `content` in lower case, and where in `content` each of its code units comes from: lower case
 * can be longer than the text (a dotted capital I becomes two code units), so an index into it
 * is mapped back before it is used on `content`. Null for the map when the lengths agree.
 */
function lowered(content: string): { lower: string; origin: number[] | null } {
  const lower = content.toLowerCase();
  if (lower.length === content.length) return { lower, origin: null };
  let text = '';
  const origin: number[] = [];
  for (let i = 0; i < content.length;) {
    const ch = String.fromCodePoint(content.codePointAt(i) as number);
    const low = ch.toLowerCase();
    for (let j = 0; j < low.length; j++) origin.push(i);
    text += low;
    i += ch.length;
  }
  return { lower: text, origin };
}

/**
 * Up to 240 characters of `content` around the first occurrence of a matched term (found in
 * lower case). Neither end cuts a character outside the Basic Multilingual Plane in half (the
 * content is well-formed, and so is every snippet of it).
 */
export function snippetOf(content: string, terms: readonly string[]): string {
  const { lower, origin } = lowered(content);
  let at = -1;
  for (const t of terms) {
    const i = lower.indexOf(t.toLowerCase());
    if (i >= 0 && (at < 0 || i < at)) at = i;
  }
  if (at >= 0 && origin) at = origin[at] ?? at;
  let start = Math.max(0, Math.min(at < 0 ? 0 : at - 60, content.length - SNIPPET_CHARS));
  if (start > 0 && isLowSurrogate(content.charCodeAt(start))) start += 1;
  let end = Math.min(content.length, start + SNIPPET_CHARS);
  if (end < content.length && isLowSurrogate(content.charCodeAt(end))) end -= 1;
  return content.slice(start, end);
}

/** MemoryStores (heads and documents) and their full-text search; what operations and the runtime memory tools use. */
export class MemoryService {
  readonly stores: MemoryStores;
  readonly index: MemorySearch;

  constructor(redis: Redis, docs: DocumentStore, options: { maxIndexedStores?: number } = {}) {
    this.stores = new MemoryStores(redis, docs);
    this.index = new MemorySearch(redis, options.maxIndexedStores);
  }

  getStore(workspaceId: string, storeId: string): Promise<MemoryStoreDoc> {
    return this.stores.getStore(workspaceId, storeId);
  }

  async view(store: MemoryStoreDoc): Promise<MemoryStoreDoc & { document_count: number }> {
    return { ...store, document_count: await this.stores.documentCount(store.id) };
  }

  /**
   * Ranked results, `limit` per page. `next_cursor` holds the offset of the next page bound to the
   * store, query and prefix (a cursor of another store or query is refused); ranks are recomputed
   * per page, so writes between pages can shift results across the boundary.
   */
  async search(storeId: string, input: { query: string; limit: number; cursor?: string | undefined; path_prefix?: string | undefined }, field = 'query'): Promise<MemorySearchPage> {
    const query = input.query.trim();
    if (query === '') throw new ApiError('validation.malformed', `${field}.query: empty`);
    if (query.length > MEMORY_LIMITS.maxQueryChars) throw new ApiError('validation.malformed', `${field}.query: at most ${MEMORY_LIMITS.maxQueryChars} characters`);
    const binding = cursorBinding(storeId, query, input.path_prefix ?? '');
    let offset = 0;
    if (input.cursor !== undefined) {
      const at = decodeBoundCursor('search', input.cursor, `${field}.cursor`, binding, 'query');
      offset = /^(0|[1-9][0-9]*)$/.test(at) ? Number(at) : NaN;
      if (!Number.isSafeInteger(offset)) throw new ApiError('validation.malformed', `${field}.cursor: not a cursor of this query`);
    }
    let hits = await this.index.search(storeId, query);
    if (input.path_prefix) hits = hits.filter((h) => h.path.startsWith(input.path_prefix as string));
    const page = hits.slice(offset, offset + input.limit);
    const docs = await this.stores.readMany(storeId, page.map((h) => h.path));
    const results = page.flatMap((h, i) => {
      const d = docs[i] as MemoryDocument | null;
      return d ? [{ path: d.path, score: Number(h.score.toFixed(4)), version: d.version, metadata: d.metadata, updated_at: d.updated_at, snippet: snippetOf(d.content, h.terms) }] : [];
    });
    const next = offset + input.limit;
    return { results, next_cursor: next < hits.length ? encodeBoundCursor('search', binding, String(next)) : null };
  }
}
