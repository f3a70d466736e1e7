import { randomBytes } from 'node:crypto';
import { ApiError, crashPoint, LIST_CURSOR_MAX, newId, nowIso, sha256Hex } from '@agentplane/core';
import { InFlightWrites, keys, LuaScript, tags, type DocumentStore, type ListPage, type Redis } from '@agentplane/store';
import {
  checkContent, checkMetadata, checkPath, checkWellFormed, type MemoryAuthor, type MemoryDocument, type MemoryDocumentEntry, type MemoryStoreDoc, type MemoryVersion,
} from './model.js';

const INDEX = 'memory_stores';
/** Entries of a store's change log kept for search indexes to catch up from (older: full rebuild). */
export const CHANGE_LOG_LENGTH = 10_000;
/**
 * How long a new store's `alive` marker lives unless its creation confirms it (PERSIST) once the
 * head exists: far longer than a creation takes.
 */
export const MARKER_GRACE_MS = 10 * 60_000;
/**
 * Store deletions in flight: `<workspace_id> <memstore_id>` scored by the time after which one
 * that has not finished is taken for dead (its process crashed after removing the head but before
 * clearing the store's keys). Far longer than a deletion takes.
 */
const DELETIONS = keys.global('memory_store_deletions');
const DELETION_GRACE_MS = 10 * 60_000;
/**
 * How often an api process sweeps dead deletions on its own (`startSweeping`), besides the sweep
 * after each finished deletion: once per grace period, so what a dead deletion left is reclaimed
 * within about two grace periods even if no store is ever deleted again.
 */
const DELETION_SWEEP_MS = DELETION_GRACE_MS;

/**
 * One document write (or delete) of one store, all in the store's slot: the store must still
 * exist (its `alive` marker, which its deletion removes before clearing its keys: -1 otherwise),
 * then compare-and-swap on the path's version counter (the version the caller read), then the
 * current document and its listing entry, the path listing, the version history and the change
 * log, and the write's own id as the path's last writer. The same write run again (the client
 * sends a command again when its connection dropped before the reply) finds the path at its
 * version with its own id as the last writer, and answers 1 without writing again. The id, not
 * the history entry, tells it apart: another request writing the same content in the same
 * millisecond builds the same entry, and must lose the compare-and-swap.
 *
 * KEYS: docs, ver, paths, hist, changes, alive, entries, writers. ARGV: path, seen version, doc
 * JSON ('' = delete), new version, history entry JSON, change-log length, listing entry JSON,
 * write id.
 */
const WRITE = new LuaScript('memory_write', `
if redis.call('EXISTS', KEYS[6]) == 0 then return -1 end
local seen = redis.call('HGET', KEYS[2], ARGV[1]) or '0'
if seen ~= ARGV[2] then
  if seen == ARGV[4] and redis.call('HGET', KEYS[8], ARGV[1]) == ARGV[8] then return 1 end
  return 0
end
if ARGV[3] == '' then
  redis.call('HDEL', KEYS[1], ARGV[1])
  redis.call('HDEL', KEYS[7], ARGV[1])
  redis.call('ZREM', KEYS[3], ARGV[1])
else
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[3])
  redis.call('HSET', KEYS[7], ARGV[1], ARGV[7])
  redis.call('ZADD', KEYS[3], 0, ARGV[1])
end
redis.call('HSET', KEYS[2], ARGV[1], ARGV[4])
redis.call('HSET', KEYS[8], ARGV[1], ARGV[8])
redis.call('RPUSH', KEYS[4], ARGV[5])
redis.call('XADD', KEYS[5], 'MAXLEN', '~', ARGV[6], '*', 'p', ARGV[1])
return 1`);

export interface WriteInput {
  path: string;
  content: string;
  metadata?: Record<string, string> | undefined;
  /** 0: the document must not exist; n: it must be at version n; absent: any (last writer wins). */
  expectedVersion?: number | undefined;
}

/** Keys of one store (all under `{m:<memstore_id>}`). */
export function memoryKeys(storeId: string) {
  const tag = tags.memoryStore(storeId);
  return {
    /** Set while the store exists: document writes check it in their script. */
    alive: keys.scoped(tag, 'alive'),
    docs: keys.scoped(tag, 'docs'),
    /** Path → the current document's listing entry (no content): what a listing reads. */
    entries: keys.scoped(tag, 'entries'),
    ver: keys.scoped(tag, 'ver'),
    /** Path → the id of the write that made its current version (what tells a resent write from another). */
    writers: keys.scoped(tag, 'writers'),
    paths: keys.scoped(tag, 'paths'),
    changes: keys.scoped(tag, 'changes'),
    hist: (path: string) => keys.scoped(tag, `hist:${pathDigest(path)}`),
    /** The same key, by the digest of its path. */
    histOf: (digest: string) => keys.scoped(tag, `hist:${digest}`),
  };
}

/** What names a path's history key: 32 hex of the SHA-256 of the path's UTF-8. */
export function pathDigest(path: string): string {
  return sha256Hex(path).slice(0, 32);
}

/** A document's listing entry: what a listing shows of it (no content). */
export function entryOf(d: MemoryDocument): MemoryDocumentEntry {
  return { path: d.path, version: d.version, size_bytes: d.size_bytes, metadata: d.metadata, updated_at: d.updated_at };
}

function sameMetadata(a: Record<string, string>, b: Record<string, string>): boolean {
  const ka = Object.keys(a);
  return ka.length === Object.keys(b).length && ka.every((k) => Object.hasOwn(b, k) && a[k] === b[k]);
}

/** `c1_` + hex of `<kind>:<value>`: opaque cursors for lexical listings and search offsets. */
export function encodeMemoryCursor(kind: string, value: string): string {
  return `c1_${Buffer.from(`${kind}:${value}`, 'utf8').toString('hex')}`;
}

/** The text a `c1_` cursor holds, or '' when it holds none. */
function cursorText(cursor: string): string {
  const m = /^c1_([0-9a-f]+)$/.exec(cursor);
  return m?.[1] && m[1].length % 2 === 0 ? Buffer.from(m[1], 'hex').toString('utf8') : '';
}

export function decodeMemoryCursor(kind: string, cursor: string, field: string): string {
  const text = cursorText(cursor);
  if (!text.startsWith(`${kind}:`)) throw new ApiError('validation.malformed', `${field}: not a cursor issued by this operation`);
  return text.slice(kind.length + 1);
}

/** What binds a cursor to the request that issued it: 16 hex of the SHA-256 of its parameters. */
export function cursorBinding(...parts: readonly string[]): string {
  return sha256Hex(parts.join('\0')).slice(0, 16);
}

/** `c1_` + hex of `<kind>:<binding>:<value>`: a cursor that continues only the listing it came from. */
export function encodeBoundCursor(kind: string, binding: string, value: string): string {
  return encodeMemoryCursor(kind, `${binding}:${value}`);
}

/** The value of a bound cursor; 400 for a cursor of another kind or of another listing (path, prefix, query). */
export function decodeBoundCursor(kind: string, cursor: string, field: string, binding: string, what: string): string {
  const text = decodeMemoryCursor(kind, cursor, field);
  const at = text.indexOf(':');
  if (at < 0 || text.slice(0, at) !== binding) throw new ApiError('validation.malformed', `${field}: not a cursor of this ${what}`);
  return text.slice(at + 1);
}

/** The longest cursor the API takes back: the `Cursor` schema of every `page` and `next_page`. */
/** A listing's own cursor leaves room for the tag the API binds it with. */
export const MAX_CURSOR_CHARS = LIST_CURSOR_MAX;

/** Where a document listing continues: after `path`, or after the path whose history key `digest` names. */
export type ListingPosition = { path: string } | { digest: string };

/** Kinds of document listing cursors: the last path itself, or its digest. */
const AFTER_PATH = 'path';
const AFTER_DIGEST = 'path_sha';

/**
 * The `next_page` of a document listing whose page ended on `lastPath`: that path while the
 * cursor fits `MAX_CURSOR_CHARS` (paths of up to 232 bytes of UTF-8), else the path's
 * digest, which names its history key (119 characters whatever the path). A path's history
 * outlives the document, so the position stays exact even when that document is deleted before
 * the next page is asked for.
 */
export function encodeListingCursor(binding: string, lastPath: string): string {
  const inline = encodeBoundCursor(AFTER_PATH, binding, lastPath);
  return inline.length <= MAX_CURSOR_CHARS ? inline : encodeBoundCursor(AFTER_DIGEST, binding, pathDigest(lastPath));
}

/** The position a document listing cursor names; 400 for a cursor of another kind or listing, or a malformed digest. */
export function decodeListingCursor(cursor: string, field: string, binding: string, what: string): ListingPosition {
  if (!cursorText(cursor).startsWith(`${AFTER_DIGEST}:`)) return { path: decodeBoundCursor(AFTER_PATH, cursor, field, binding, what) };
  const digest = decodeBoundCursor(AFTER_DIGEST, cursor, field, binding, what);
  if (!/^[0-9a-f]{32}$/.test(digest)) throw new ApiError('validation.malformed', `${field}: not a cursor of this ${what}`);
  return { digest };
}

/**
 * MemoryStores in Redis: heads are Workspace documents listed in `{w:<ws>}:idx:memory_stores`;
 * everything of one store's documents lives under its own tag `{m:<memstore_id>}` (docs/MEMORY.md).
 */
export class MemoryStores {
  private readonly deletions: InFlightWrites;

  constructor(
    private readonly redis: Redis,
    private readonly docs: DocumentStore,
  ) {
    this.deletions = new InFlightWrites(redis, DELETIONS, DELETION_GRACE_MS);
  }

  async createStore(workspaceId: string, input: { name: string; description?: string | null | undefined; metadata?: Record<string, string> | undefined }, id = newId('memoryStore')): Promise<MemoryStoreDoc> {
    checkHead(input, 'body');
    const now = nowIso();
    const doc: MemoryStoreDoc = {
      id, type: 'memory_store', workspace_id: workspaceId, name: input.name,
      description: input.description ?? null, metadata: input.metadata ?? {}, version: 1, created_at: now, updated_at: now,
    };
    // The marker first, so a store is writable as soon as its head can be read. It lives only
    // until its grace ends unless confirmed once the head exists: a process that dies before the
    // head leaves nothing for good, and a store whose marker lapsed because its process died
    // after the head gets one from its next write (`adopt`). The two keys are in different
    // slots, so one script cannot write both.
    const alive = memoryKeys(doc.id).alive;
    await this.redis.set(alive, '1', 'PX', MARKER_GRACE_MS);
    crashPoint('memory-store-marker-set');
    try {
      await this.docs.create(tags.workspace(workspaceId), doc, [INDEX]);
    } catch (err) {
      await this.redis.unlink(alive);
      throw err;
    }
    crashPoint('memory-store-created');
    // A store deleted meanwhile has lost its marker: PERSIST then finds no key and sets none.
    await this.redis.persist(alive);
    return doc;
  }

  /** The store whose head is stored under `storeId` in the Workspace; null when there is none. */
  findStore(workspaceId: string, storeId: string): Promise<MemoryStoreDoc | null> {
    return this.docs.get<MemoryStoreDoc>(tags.workspace(workspaceId), storeId);
  }

  async getStore(workspaceId: string, storeId: string): Promise<MemoryStoreDoc> {
    const doc = await this.findStore(workspaceId, storeId);
    if (!doc || doc.type !== 'memory_store' || doc.workspace_id !== workspaceId) throw new ApiError('validation.not_found', `memory store ${storeId} not found`);
    return doc;
  }

  listStores(workspaceId: string, options: { limit: number; page?: string | undefined }): Promise<ListPage<MemoryStoreDoc>> {
    return this.docs.list<MemoryStoreDoc>(tags.workspace(workspaceId), INDEX, { ...options, order: 'asc' });
  }

  async updateStore(workspaceId: string, storeId: string, patch: { name?: string | undefined; description?: string | null | undefined; metadata?: Record<string, string> | undefined }, expectedVersion?: number): Promise<MemoryStoreDoc> {
    checkHead(patch, 'body');
    const current = await this.getStore(workspaceId, storeId);
    // A patch that changes nothing writes nothing: the store keeps its version and updated_at.
    return this.docs.update<MemoryStoreDoc>(tags.workspace(workspaceId), storeId, (s) => {
      const next = {
        ...s,
        ...(patch.name !== undefined ? { name: patch.name } : {}),
        ...(patch.description !== undefined ? { description: patch.description } : {}),
        ...(patch.metadata !== undefined ? { metadata: patch.metadata } : {}),
      };
      return next.name === s.name && next.description === s.description && sameMetadata(next.metadata, s.metadata) ? null : next;
    }, { expectedVersion, notFound: 'memory store', current });
  }

  /**
   * The head goes first (the store is gone for readers at once), then its keys (`clear`). The
   * deletion is on record before the head goes: a crash before the keys are cleared leaves the
   * entry, and a later sweep clears them. Of concurrent deletions only the one that removed the
   * head goes on; the others are 404 `validation.not_found`, as a deletion after it is.
   */
  async removeStore(workspaceId: string, storeId: string): Promise<void> {
    await this.getStore(workspaceId, storeId);
    await this.deletions.begin(workspaceId, storeId);
    const removed = await this.docs.removeIfVersion(tags.workspace(workspaceId), storeId, undefined, [INDEX]);
    if (removed.kind !== 'removed') {
      // The entry is left as it is: the deletion that removed the head ends it once the keys are
      // gone, and ending it here could drop it while that one still clears. Begun again after
      // that ended, it stays until a sweep, which finds no head and clears keys already gone.
      throw new ApiError('validation.not_found', `memory store ${storeId} not found`);
    }
    crashPoint('memory-store-head-removed');
    await this.clear(storeId);
    await this.deletions.end(workspaceId, storeId);
    await this.sweep().catch(() => undefined);
  }

  /**
   * Every key of a store: its `alive` marker first (from then on the write script refuses every
   * write, including one whose existence check passed before), then every key of its tag: the
   * paths of `:ver` are complete once no write can land.
   */
  private async clear(storeId: string): Promise<void> {
    const k = memoryKeys(storeId);
    await this.redis.del(k.alive);
    const paths = await this.redis.hkeys(k.ver);
    for (let i = 0; i < paths.length; i += 500) await this.redis.unlink(...paths.slice(i, i + 500).map((p) => k.hist(p)));
    await this.redis.unlink(k.docs, k.entries, k.ver, k.writers, k.paths, k.changes);
  }

  /**
   * Reclaims deletions that never finished (their process died after removing the head but
   * before clearing the keys): past their grace, a store whose head does not exist loses every
   * key. A head that exists keeps them; either way the entry goes.
   */
  sweep(now = Date.now()): Promise<number> {
    return this.deletions.sweep(async (ws, id) => (await this.docs.get<MemoryStoreDoc>(tags.workspace(ws), id)) !== null, (id) => this.clear(id), now);
  }

  /**
   * Sweeps now and every `intervalMs` (DELETION_SWEEP_MS; a test passes a shorter one) until
   * `stopSweeping`, so dead deletions are reclaimed with no later deletion; a failure goes to
   * `onError`. The timer does not hold the process open.
   */
  startSweeping(onError: (err: unknown) => void, intervalMs = DELETION_SWEEP_MS): void {
    this.deletions.startSweeping(() => this.sweep(), onError, intervalMs);
  }

  stopSweeping(): void {
    this.deletions.stopSweeping();
  }

  documentCount(storeId: string): Promise<number> {
    return this.redis.hlen(memoryKeys(storeId).docs);
  }

  /** The current version of a document, or null. */
  async read(storeId: string, path: string): Promise<MemoryDocument | null> {
    const raw = await this.redis.hget(memoryKeys(storeId).docs, path);
    return raw === null ? null : (JSON.parse(raw) as MemoryDocument);
  }

  async readMany(storeId: string, paths: readonly string[]): Promise<(MemoryDocument | null)[]> {
    if (paths.length === 0) return [];
    const raws = await this.redis.hmget(memoryKeys(storeId).docs, ...paths);
    return raws.map((r) => (r === null ? null : (JSON.parse(r) as MemoryDocument)));
  }

  /** Version `n` of a path (a document or its deletion marker), or null. Versions are 1, 2, … per path. */
  async readVersion(storeId: string, path: string, version: number): Promise<MemoryVersion | null> {
    const raw = await this.redis.lindex(memoryKeys(storeId).hist(path), version - 1);
    return raw === null ? null : (JSON.parse(raw) as MemoryVersion);
  }

  /**
   * The path whose history key `digest` names (its first version says which), or null when no
   * path of this store was ever written with that digest.
   */
  async pathOf(storeId: string, digest: string): Promise<string | null> {
    const raw = await this.redis.lindex(memoryKeys(storeId).histOf(digest), 0);
    if (raw === null) return null;
    const path = (JSON.parse(raw) as Partial<MemoryVersion>).path;
    return typeof path === 'string' && pathDigest(path) === digest ? path : null;
  }

  /** History of a path, newest first, paged by version. */
  async history(storeId: string, path: string, limit: number, before?: number): Promise<{ data: MemoryVersion[]; next_version: number | null }> {
    const k = memoryKeys(storeId);
    const total = await this.redis.llen(k.hist(path));
    const top = Math.min(before !== undefined ? before - 1 : total, total);
    if (top <= 0) return { data: [], next_version: null };
    const low = Math.max(top - limit, 0);
    const raws = await this.redis.lrange(k.hist(path), low, top - 1);
    return { data: raws.map((r) => JSON.parse(r) as MemoryVersion).reverse(), next_version: low > 0 ? low + 1 : null };
  }

  /**
   * Current documents' listing entries by path in lexical order, optionally under a prefix. `after`
   * (the last path of the previous page) never reaches below the prefix: the range starts at the
   * later of the two. Redis orders members by their UTF-8 bytes, and no UTF-8 string holds the
   * byte 0xFF, so `prefix` + 0xFF bounds every path under the prefix. Entries are read from
   * `:entries`, never with the documents' content (up to 100 kB each); a document written before
   * stores kept entries is read whole once and its entry taken from it.
   */
  async list(storeId: string, options: { prefix?: string | undefined; limit: number; after?: string | undefined }): Promise<{ data: MemoryDocumentEntry[]; next: string | null }> {
    const k = memoryKeys(storeId);
    const prefix = options.prefix ?? '';
    const after = options.after !== undefined && Buffer.compare(Buffer.from(options.after, 'utf8'), Buffer.from(prefix, 'utf8')) >= 0 ? options.after : undefined;
    const min = after !== undefined ? `(${after}` : prefix === '' ? '-' : `[${prefix}`;
    const max = prefix === '' ? '+' : Buffer.concat([Buffer.from(`(${prefix}`, 'utf8'), Buffer.from([0xff])]);
    const paths = await this.redis.zrangebylex(k.paths, min, max, 'LIMIT', 0, options.limit + 1);
    const page = paths.slice(0, options.limit);
    const entries: (MemoryDocumentEntry | null)[] = page.length === 0 ? [] : (await this.redis.hmget(k.entries, ...page)).map((r) => (r === null ? null : (JSON.parse(r) as MemoryDocumentEntry)));
    const older = page.filter((_, i) => entries[i] === null);
    if (older.length > 0) {
      const docs = new Map((await this.readMany(storeId, older)).flatMap((d) => (d ? [[d.path, entryOf(d)] as const] : [])));
      page.forEach((path, i) => {
        if (entries[i] === null) entries[i] = docs.get(path) ?? null;
      });
    }
    return { data: entries.filter((e): e is MemoryDocumentEntry => e !== null), next: paths.length > options.limit ? (page.at(-1) ?? null) : null };
  }

  /**
   * Creates or replaces a document under compare-and-swap. A stale `expectedVersion` (or 0 for
   * an existing document) is 409 `validation.conflict`; without one, a lost race is retried. A
   * store deleted meanwhile is 404 `validation.not_found` (nothing written). `workspaceId` lets a
   * store whose head exists without its `alive` marker be given one (adopt).
   */
  async write(storeId: string, input: WriteInput, author: MemoryAuthor, workspaceId?: string): Promise<{ document: MemoryDocument; created: boolean }> {
    checkPath(input.path, 'body.path');
    const size = checkContent(input.content, 'body.content');
    checkMetadata(input.metadata, 'body.metadata');
    for (let attempt = 0; attempt < 16; attempt++) {
      const { seen, current } = await this.snapshot(storeId, input.path);
      this.expect(input.expectedVersion, current, input.path);
      const now = nowIso();
      const doc: MemoryDocument = {
        type: 'memory_document', memory_store_id: storeId, path: input.path, content: input.content,
        metadata: input.metadata ?? current?.metadata ?? {}, size_bytes: size, version: seen + 1,
        created_at: current?.created_at ?? now, updated_at: now, updated_by: author,
      };
      const json = JSON.stringify(doc);
      if (await this.apply(storeId, input.path, seen, json, doc.version, json, JSON.stringify(entryOf(doc)), workspaceId)) return { document: doc, created: current === null };
    }
    throw new ApiError('validation.conflict', `too many concurrent writers on ${input.path}; retry`);
  }

  /** Deletes a document (its history stays readable, ending in a deletion marker). 404 when absent or when the store is gone. */
  async remove(storeId: string, path: string, expectedVersion: number | undefined, author: MemoryAuthor, workspaceId?: string): Promise<MemoryVersion> {
    for (let attempt = 0; attempt < 16; attempt++) {
      const { seen, current } = await this.snapshot(storeId, path);
      if (!current) throw new ApiError('validation.not_found', `no document at ${path}`);
      this.expect(expectedVersion, current, path);
      const now = nowIso();
      const marker: MemoryVersion = {
        type: 'memory_document_deleted', memory_store_id: storeId, path, version: seen + 1, created_at: current.created_at, updated_at: now, updated_by: author,
      };
      if (await this.apply(storeId, path, seen, '', marker.version, JSON.stringify(marker), '', workspaceId)) return marker;
    }
    throw new ApiError('validation.conflict', `too many concurrent writers on ${path}; retry`);
  }

  private expect(expected: number | undefined, current: MemoryDocument | null, path: string): void {
    if (expected === undefined) return;
    if (expected === 0 && current) throw new ApiError('validation.conflict', `a document exists at ${path} (version ${current.version}); expected_version 0 creates only`);
    if (expected > 0 && current?.version !== expected) {
      throw new ApiError('validation.conflict', `expected_version ${expected} is stale; ${current ? `the document is at version ${current.version}` : `there is no document at ${path}`}`);
    }
  }

  private async snapshot(storeId: string, path: string): Promise<{ seen: number; current: MemoryDocument | null }> {
    const k = memoryKeys(storeId);
    const [[, ver], [, raw]] = (await this.redis.multi().hget(k.ver, path).hget(k.docs, path).exec()) as [[null, string | null], [null, string | null]];
    return { seen: Number(ver ?? 0), current: raw === null ? null : (JSON.parse(raw) as MemoryDocument) };
  }

  /** One run of the write script: true when written, false when the path moved on (retry); 404 when the store is gone. */
  private async apply(storeId: string, path: string, seen: number, json: string, version: number, history: string, entry: string, workspaceId: string | undefined): Promise<boolean> {
    const k = memoryKeys(storeId);
    // This attempt's own id: only a resend of this very script run may pass for it.
    const writeId = randomBytes(12).toString('hex');
    const run = () => WRITE.run(this.redis, [k.docs, k.ver, k.paths, k.hist(path), k.changes, k.alive, k.entries, k.writers], [
      path, String(seen), json, String(version), history, String(CHANGE_LOG_LENGTH), entry, writeId,
    ]);
    let r = await run();
    if (r === -1 && workspaceId !== undefined && (await this.adopt(workspaceId, storeId))) r = await run();
    if (r === -1) throw new ApiError('validation.not_found', `memory store ${storeId} not found`);
    return r === 1;
  }

  /**
   * A store without its `alive` marker whose head still exists was created before stores carried
   * one, or its creation died after writing the head and before confirming the marker, which then
   * lapsed: it gets it now. A store being deleted has lost its head before its marker, so it is not
   * given one again.
   */
  private async adopt(workspaceId: string, storeId: string): Promise<boolean> {
    const head = await this.docs.get<MemoryStoreDoc>(tags.workspace(workspaceId), storeId);
    if (!head || head.type !== 'memory_store' || head.workspace_id !== workspaceId) return false;
    await this.redis.set(memoryKeys(storeId).alive, '1', 'NX');
    return true;
  }
}

/** A store's name, description and metadata: well-formed strings. */
function checkHead(input: { name?: string | undefined; description?: string | null | undefined; metadata?: Record<string, string> | undefined }, field: string): void {
  if (input.name !== undefined) checkWellFormed(input.name, `${field}.name`);
  if (typeof input.description === 'string') checkWellFormed(input.description, `${field}.description`);
  checkMetadata(input.metadata, `${field}.metadata`);
}
