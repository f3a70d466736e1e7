import { ApiError, staleOrAhead } from '@agentplane/core';
import type { Redis } from 'ioredis';
import { keys, type Tag } from './keys.js';
import { decodeCursor, encodeCursor } from './cursor.js';
import { LuaScript } from './script.js';
import { KEYED_WRITES_LUA, KeyedWrites, type KeyedWrite } from './keyed-writes.js';
import { cachedGet, cachedPeek, cachedPeekShared, forgetWritten } from './read-cache.js';

/** Fields every stored resource has. `version` is the compare-and-swap counter. */
export interface StoredDoc {
  id: string;
  version: number;
  created_at: string;
  updated_at: string;
}

const CREATE_LUA = `
if redis.call('SET', KEYS[1], ARGV[1], 'NX') then
  for i = 2, #KEYS do redis.call('ZADD', KEYS[i], ARGV[2], ARGV[3]) end
  return 1
end
return 0`;

/**
 * Lua: `doc_swap(key, expected, json, also_key, also_expected, also_json)`, the compare-and-swap
 * of `swapWith` for other scripts of the document's slot: `key` written if its stored version is
 * still `expected`, then, once it is, the second document (`also_key`, same slot; nil for none)
 * written only if its stored version is still `also_expected`. Returns {1, 1} both written, {1, 0}
 * the first alone, {0, current JSON} stale, {-1} missing.
 */
export const DOC_SWAP_LUA = `
local function doc_swap(key, expected, json, also_key, also_expected, also_json)
  local cur = redis.call('GET', key)
  if not cur then return {-1} end
  if tostring(cjson.decode(cur)['version']) ~= expected then return {0, cur} end
  redis.call('SET', key, json, 'KEEPTTL')
  if not also_key then return {1, 0} end
  local other = redis.call('GET', also_key)
  if other and tostring(cjson.decode(other)['version']) == also_expected then
    redis.call('SET', also_key, also_json, 'KEEPTTL')
    return {1, 1}
  end
  return {1, 0}
end`;

/** What `doc_swap` (DOC_SWAP_LUA) answered, as an outcome and whether the second document was written. */
export function docSwapResult(r: readonly unknown[]): { outcome: SwapOutcome; alsoWritten: boolean } {
  if (r[0] === 1) return { outcome: { kind: 'written' }, alsoWritten: r[1] === 1 };
  if (r[0] === 0 && typeof r[1] === 'string') return { outcome: { kind: 'stale', current: r[1] }, alsoWritten: false };
  return { outcome: { kind: 'missing' }, alsoWritten: false };
}

/*
 * DOC_SWAP_LUA on KEYS[1], and on KEYS[2] when given. ARGV: expected | JSON, then the second's
 * expected | JSON. A stale version answers the current document, so the caller's next attempt
 * needs no read.
 */
const CAS_LUA = `${DOC_SWAP_LUA}
return doc_swap(KEYS[1], ARGV[1], ARGV[2], KEYS[2], ARGV[3], ARGV[4])`;

/**
 * Lua: `doc_remove(key, expected)`, the compare-and-delete of `removeIfVersion` (its index updates
 * left to the caller) for other scripts of the document's slot: `key` deleted only if its stored
 * version is still `expected` ('' = any version). Returns {1} deleted, {0, current JSON} stale,
 * {-1} missing (`docRemoveResult`).
 */
export const DOC_REMOVE_LUA = `
local function doc_remove(key, expected)
  local cur = redis.call('GET', key)
  if not cur then return {-1} end
  if expected ~= '' and tostring(cjson.decode(cur)['version']) ~= expected then return {0, cur} end
  redis.call('DEL', key)
  return {1}
end`;

/** What `doc_remove` (DOC_REMOVE_LUA) answered. */
export function docRemoveResult(r: readonly unknown[]): RemoveOutcome {
  if (r[0] === 1) return { kind: 'removed' };
  if (r[0] === 0 && typeof r[1] === 'string') return { kind: 'stale', current: r[1] };
  return { kind: 'missing' };
}

/*
 * Compare-and-delete: KEYS[1] deleted, and ARGV[2] removed from the indexes KEYS[2..], only if the
 * stored version is still ARGV[1] ('' = any version). Returns {1} deleted, {0, current JSON}
 * stale, {-1} missing.
 */
const CAS_DELETE_LUA = `
local cur = redis.call('GET', KEYS[1])
if not cur then return {-1} end
if ARGV[1] ~= '' and tostring(cjson.decode(cur)['version']) ~= ARGV[1] then return {0, cur} end
redis.call('DEL', KEYS[1])
for i = 2, #KEYS do redis.call('ZREM', KEYS[i], ARGV[2]) end
return {1}`;

const createScript = new LuaScript('doc_create', CREATE_LUA);
const casScript = new LuaScript('doc_cas_v2', CAS_LUA);
/**
 * DOC_SWAP_LUA on KEYS[1] and, once written, a keyed request's record (KEYS[2], `KeyedWrites`:
 * ARGV[3] kept ARGV[4] ms). ARGV: expected | JSON | record value | kept ms.
 */
const casRecordScript = new LuaScript('doc_cas_record', `${DOC_SWAP_LUA}${KEYED_WRITES_LUA}
local r = doc_swap(KEYS[1], ARGV[1], ARGV[2])
if r[1] == 1 then record_keyed(KEYS[2], ARGV[3], ARGV[4]) end
return r`);
const casDeleteScript = new LuaScript('doc_cas_delete', CAS_DELETE_LUA);

/**
 * Outcome of one compare-and-swap attempt: written, the document is gone, or the version was
 * stale (with the document's current JSON).
 */
export type SwapOutcome = { kind: 'written' } | { kind: 'missing' } | { kind: 'stale'; current: string };

/** Outcome of one compare-and-delete (`DocumentStore.removeIfVersion`): deleted, already gone, or stale (with the current JSON). */
export type RemoveOutcome = { kind: 'removed' } | { kind: 'missing' } | { kind: 'stale'; current: string };

export interface UpdateOptions<T> {
  /** A stale version is a 409 `validation.conflict` instead of a retry. */
  expectedVersion?: number;
  /** What the 404 calls the resource. */
  notFound?: string;
  /**
   * The document as the caller last saw it (e.g. just written or just read): the first attempt
   * works on it without a read. The compare-and-swap still checks its version; when `mutate`
   * returns null or throws on it, the document is read and `mutate` runs again on that.
   */
  current?: T;
  /**
   * Writes `next` if the stored version is still `expected` (default: the plain CAS script).
   * A custom write may add writes of its own to the same script, all in the document's slot.
   */
  write?: (next: T, expected: number) => Promise<SwapOutcome>;
  /**
   * A `next` that equals the current document but for `version` and `updated_at` writes nothing
   * and answers the current document: an update that changes nothing keeps the version (a client's
   * retry, or a PATCH repeating what is there, does not move it).
   */
  unchangedKeepsVersion?: boolean;
}

/** Every field but `version` and `updated_at`, keys sorted at every depth: equal for equal documents. */
function contentOf(doc: StoredDoc): string {
  const canonical = (v: unknown): unknown => {
    if (Array.isArray(v)) return v.map(canonical);
    if (typeof v !== 'object' || v === null) return v;
    const out: Record<string, unknown> = {};
    for (const k of Object.keys(v).sort()) if ((v as Record<string, unknown>)[k] !== undefined) out[k] = canonical((v as Record<string, unknown>)[k]);
    return out;
  };
  const { version: _v, updated_at: _u, ...rest } = doc as StoredDoc & Record<string, unknown>;
  return JSON.stringify(canonical(rest));
}

export interface ListOptions {
  limit: number;
  page?: string | undefined;
  order: 'asc' | 'desc';
}

export interface ListPage<T> {
  data: T[];
  next_page: string | null;
}

/**
 * JSON documents in Redis strings, listed through per-tag sorted-set indexes.
 * Writes are atomic Lua scripts; updates are compare-and-swap on `version`.
 */
export class DocumentStore {
  constructor(private readonly redis: Redis) {}

  async get<T extends StoredDoc>(tag: Tag, id: string): Promise<T | null> {
    const raw = await this.redis.get(keys.doc(tag, id));
    return raw === null ? null : (JSON.parse(raw) as T);
  }

  /**
   * Like get, through the process's read cache when one is started on this connection
   * (`ReadCache`): for hot documents read on every request (tenancy, Principals, Sessions).
   */
  /**
   * A document from the read cache without waiting, as one parsed copy shared by every reader
   * (read it, never change it); undefined when the cache cannot answer now (use getCached).
   */
  peekShared<T extends StoredDoc>(tag: Tag, id: string): Readonly<T> | null | undefined {
    return cachedPeekShared<T>(this.redis, keys.doc(tag, id));
  }

  /**
   * A document to answer as it is (read-only): the cache's shared parsed copy when it holds the
   * key now (no parse, and `storedJsonOf` gives its stored text), else as `getCached`.
   */
  getShared<T extends StoredDoc>(tag: Tag, id: string): Promise<Readonly<T> | null> {
    const shared = this.peekShared<T>(tag, id);
    return shared !== undefined ? Promise.resolve(shared) : this.getCached<T>(tag, id);
  }

  getCached<T extends StoredDoc>(tag: Tag, id: string): Promise<T | null> {
    const key = keys.doc(tag, id);
    // A hit settles in one promise (an async function would add two more per read).
    const hit = cachedPeek(this.redis, key);
    if (hit !== undefined) {
      try {
        return Promise.resolve(hit === null ? null : (JSON.parse(hit) as T));
      } catch (err) {
        return Promise.reject(err as Error);
      }
    }
    return cachedGet(this.redis, key).then((raw) => (raw === null ? null : (JSON.parse(raw) as T)));
  }

  async getMany<T extends StoredDoc>(tag: Tag, ids: readonly string[]): Promise<T[]> {
    if (ids.length === 0) return [];
    const raws = await this.redis.mget(ids.map((id) => keys.doc(tag, id)));
    return raws.filter((r): r is string => r !== null).map((r) => JSON.parse(r) as T);
  }

  /** Store a new document and add it to `indexes` (scored by creation time). False if the id exists. */
  async create(tag: Tag, doc: StoredDoc, indexes: readonly string[] = []): Promise<boolean> {
    const score = Date.parse(doc.created_at);
    const keyList = [keys.doc(tag, doc.id), ...indexes.map((c) => keys.index(tag, c))];
    const ok = await createScript.run(this.redis, keyList, [JSON.stringify(doc), score, doc.id]);
    return ok === 1;
  }

  /** One compare-and-swap attempt: store `next` if the stored version is `expected`. */
  async swap(tag: Tag, id: string, next: StoredDoc, expected: number): Promise<SwapOutcome> {
    return docSwapResult((await casScript.run(this.redis, [keys.doc(tag, id)], [String(expected), JSON.stringify(next)])) as unknown[]).outcome;
  }

  /** Records of keyed writes of `kind` (`KeyedWrites`) on this store's connection. */
  keyedWrites(kind: string): KeyedWrites {
    return new KeyedWrites(this.redis, kind);
  }

  /**
   * `swap`, and in the same script, once `next` is written, `keyed`'s record in `records`
   * (`value`: what the request wrote, say a revision number), so a later attempt of the same keyed
   * request finds it (`KeyedWrites.find`) instead of writing again.
   */
  async swapRecorded(tag: Tag, id: string, next: StoredDoc, expected: number, records: KeyedWrites, keyed: KeyedWrite, value: string): Promise<SwapOutcome> {
    return docSwapResult((await casRecordScript.run(this.redis, [keys.doc(tag, id), records.key(tag, keyed)], [
      String(expected), JSON.stringify(next), value, String(keyed.keptMs),
    ])) as unknown[]).outcome;
  }

  /**
   * `swap`, and in the same script, once `next` is written, a second document of the same tag
   * written only if its stored version is still `also.expected` (a write that may ride along:
   * `alsoWritten` says whether it did; it never stops the first).
   */
  async swapWith(tag: Tag, id: string, next: StoredDoc, expected: number, also: { id: string; next: StoredDoc; expected: number }): Promise<{ outcome: SwapOutcome; alsoWritten: boolean }> {
    return docSwapResult((await casScript.run(this.redis, [keys.doc(tag, id), keys.doc(tag, also.id)], [
      String(expected), JSON.stringify(next), String(also.expected), JSON.stringify(also.next),
    ])) as unknown[]);
  }

  /**
   * Read-modify-write under compare-and-swap. With `expectedVersion`, a stale version is a
   * 409 `validation.conflict`; without it, lost races are retried (a lost race returns the
   * current document, so a retry costs no extra read). `mutate` may run more than once.
   */
  async update<T extends StoredDoc>(
    tag: Tag,
    id: string,
    mutate: (current: T) => T | null,
    options: UpdateOptions<T> = {},
  ): Promise<T> {
    const notFound = () => new ApiError('validation.not_found', `${options.notFound ?? 'resource'} not found`);
    let current: T | null = options.current ?? null;
    let guessed = current !== null;
    for (let attempt = 0; attempt < 16; attempt++) {
      if (current === null) {
        current = await this.get<T>(tag, id);
        guessed = false;
        if (!current) throw notFound();
      }
      if (options.expectedVersion !== undefined && current.version !== options.expectedVersion) {
        if (guessed) {
          current = null;
          continue;
        }
        throw new ApiError(
          'validation.conflict',
          `expected version ${options.expectedVersion} ${staleOrAhead(options.expectedVersion, current.version)}; the current version is ${current.version}`,
        );
      }
      let next: T | null;
      try {
        next = mutate(current);
      } catch (err) {
        // A guess may be out of date: only the stored document may refuse the change.
        if (!guessed) throw err;
        current = null;
        continue;
      }
      if (next === null) {
        if (!guessed) return current;
        current = null;
        continue;
      }
      if (options.unchangedKeepsVersion && contentOf(next) === contentOf(current)) {
        if (!guessed) return current;
        current = null;
        continue;
      }
      next.version = current.version + 1;
      next.updated_at = new Date().toISOString();
      const r = options.write ? await options.write(next, current.version) : await this.swap(tag, id, next, current.version);
      if (r.kind === 'written') return next;
      if (r.kind === 'missing') throw notFound();
      if (options.expectedVersion !== undefined) {
        throw new ApiError('validation.conflict', `expected version ${options.expectedVersion} is stale: another write landed first`);
      }
      current = JSON.parse(r.current) as T;
      guessed = false;
    }
    throw new ApiError('validation.conflict', 'too much contention on this resource; nothing was written, retry');
  }

  async remove(tag: Tag, id: string, indexes: readonly string[] = []): Promise<void> {
    const multi = this.redis.multi().del(keys.doc(tag, id));
    for (const c of indexes) multi.zrem(keys.index(tag, c), id);
    await multi.exec();
    forgetWritten(this.redis, [keys.doc(tag, id)]);
  }

  /**
   * Compare-and-delete in one script: the document is deleted, and taken out of `indexes`, only
   * if its stored version is still `expected` (undefined: whatever its version). A write that
   * lands between the caller's read and the delete makes it stale instead of being erased.
   */
  async removeIfVersion(tag: Tag, id: string, expected: number | undefined, indexes: readonly string[] = []): Promise<RemoveOutcome> {
    const r = (await casDeleteScript.run(this.redis, [keys.doc(tag, id), ...indexes.map((c) => keys.index(tag, c))],
      [expected === undefined ? '' : String(expected), id])) as unknown[];
    if (r[0] === 1) {
      forgetWritten(this.redis, [keys.doc(tag, id)]);
      return { kind: 'removed' };
    }
    if (r[0] === 0 && typeof r[1] === 'string') return { kind: 'stale', current: r[1] };
    return { kind: 'missing' };
  }

  /** Keyset pagination over an index; cursors are stable under concurrent inserts. */
  async listIds(tag: Tag, collection: string, options: ListOptions): Promise<{ ids: string[]; next_page: string | null }> {
    const key = keys.index(tag, collection);
    const after = options.page ? decodeCursor(options.page) : null;
    const want = options.limit + 1;
    let fetch = want + 16;
    for (;;) {
      const min = after ? String(after.score) : '-inf';
      const max = '+inf';
      const raw =
        options.order === 'asc'
          ? await this.redis.zrangebyscore(key, min, max, 'WITHSCORES', 'LIMIT', 0, fetch)
          : await this.redis.zrevrangebyscore(key, after ? String(after.score) : '+inf', '-inf', 'WITHSCORES', 'LIMIT', 0, fetch);
      const rows: { member: string; score: number }[] = [];
      for (let i = 0; i + 1 < raw.length; i += 2) rows.push({ member: raw[i] as string, score: Number(raw[i + 1]) });
      // Within one score, zrangebyscore orders members lexically asc; zrevrangebyscore desc.
      const fresh = after
        ? rows.filter((r) =>
            r.score !== after.score ? true : options.order === 'asc' ? r.member > after.member : r.member < after.member,
          )
        : rows;
      if (fresh.length >= want || raw.length / 2 < fetch) {
        const page = fresh.slice(0, options.limit);
        const last = page[page.length - 1];
        const more = fresh.length > options.limit;
        return { ids: page.map((r) => r.member), next_page: more && last ? encodeCursor(last) : null };
      }
      fetch *= 4;
    }
  }

  async list<T extends StoredDoc>(tag: Tag, collection: string, options: ListOptions, filter?: (doc: T) => boolean): Promise<ListPage<T>> {
    if (!filter) {
      const { ids, next_page } = await this.listIds(tag, collection, options);
      return { data: await this.getMany<T>(tag, ids), next_page };
    }
    // Filtered listing: walk pages until `limit` matches are found or the index ends.
    const data: T[] = [];
    let page = options.page;
    for (;;) {
      const { ids, next_page } = await this.listIds(tag, collection, { ...options, page, limit: Math.max(options.limit, 50) });
      const docs = await this.getMany<T>(tag, ids);
      for (let i = 0; i < docs.length; i++) {
        const doc = docs[i] as T;
        if (!filter(doc)) continue;
        data.push(doc);
        if (data.length === options.limit) {
          const hasMore = i < docs.length - 1 || next_page !== null;
          return { data, next_page: hasMore ? encodeCursor({ score: Date.parse(doc.created_at), member: doc.id }) : null };
        }
      }
      if (!next_page) return { data, next_page: null };
      page = next_page;
    }
  }
}
