import { ApiError, nowIso } from '@agentplane/core';
import { BoundedCache, cachedGet, decodeCursor, encodeCursor, keys, LuaScript, tags, type Redis, type StoredDoc } from '@agentplane/store';

/**
 * Workspace-owned resources with immutable versions (Agents, Environments).
 *
 *   ap:{w:<ws>}:doc:<id>             head: the latest version plus `archived_at`
 *   ap:{w:<ws>}:doc:<id>:v<n>        version n, written once and never changed
 *   ap:{w:<ws>}:idx:<collection>     listing of heads (score = created ms)
 *   ap:{w:<ws>}:idx:<collection>:versions:<id>   versions (score = n)
 *
 * `version` is both the version number and the compare-and-swap counter of the head: a new
 * version is written with the head in one script, so a version exists iff the head reached it.
 */
export interface VersionedDoc extends StoredDoc {
  archived_at: string | null;
}

/*
 * KEYS: head, version doc ('' marker handled by ARGV), heads index, versions index
 * ARGV: expected version ('' = create), head JSON, version JSON ('' = head-only change), n, created ms, id
 */
const WRITE = new LuaScript(
  'versioned_write',
  `
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == '' then
  if cur then return -3 end
else
  if not cur then return -1 end
  if tostring(cjson.decode(cur)['version']) ~= ARGV[1] then return -2 end
end
if ARGV[3] ~= '' then
  if redis.call('SET', KEYS[2], ARGV[3], 'NX') == false then return -2 end
  redis.call('ZADD', KEYS[4], ARGV[4], ARGV[4])
end
redis.call('SET', KEYS[1], ARGV[2])
if ARGV[1] == '' then redis.call('ZADD', KEYS[3], ARGV[5], ARGV[6]) end
return 1`,
);

export class VersionedStore<T extends VersionedDoc> {
  /** Version texts read before (versions never change once written); only when asked for. */
  private readonly versions: BoundedCache<string, string> | undefined;

  constructor(
    private readonly redis: Redis,
    private readonly collection: string,
    private readonly what: string,
    options: { cacheVersions?: boolean } = {},
  ) {
    this.versions = options.cacheVersions ? new BoundedCache<string, string>(2_000, { maxWeight: 8 * 1024 * 1024, weigh: (t) => t.length }) : undefined;
  }

  private headKey = (ws: string, id: string) => keys.doc(tags.workspace(ws), id);
  private versionKey = (ws: string, id: string, n: number) => keys.doc(tags.workspace(ws), `${id}:v${n}`);
  private versionsIndex = (ws: string, id: string) => keys.index(tags.workspace(ws), `${this.collection}:versions:${id}`);

  private async write(ws: string, doc: T, expected: number | null, withVersion: boolean): Promise<void> {
    const r = await WRITE.run(
      this.redis,
      [this.headKey(ws, doc.id), this.versionKey(ws, doc.id, doc.version), keys.index(tags.workspace(ws), this.collection), this.versionsIndex(ws, doc.id)],
      [expected === null ? '' : String(expected), JSON.stringify(doc), withVersion ? JSON.stringify({ ...doc, archived_at: null }) : '', doc.version, Date.parse(doc.created_at), doc.id],
    );
    if (r === -1) throw new ApiError('validation.not_found', `${this.what} not found`);
    if (r === -2) throw new ApiError('validation.conflict', `${this.what} version ${expected ?? 0} is stale`);
    if (r === -3) throw new ApiError('validation.conflict', `${this.what} already exists`);
  }

  async create(ws: string, doc: T): Promise<T> {
    await this.write(ws, doc, null, true);
    return doc;
  }

  /**
   * The head, through the process's read cache (a Session's creation and a read of the resource
   * read it). The write script drops the head from this process's cache when Redis answers it
   * (`LuaScript`), so this process reads its own writes.
   */
  async get(ws: string, id: string): Promise<T> {
    return this.parseHead(await cachedGet(this.redis, this.headKey(ws, id)));
  }

  /**
   * The head as Redis has it now, for a read-modify-write: a head held by the read cache may be
   * a write behind for the moment its invalidation takes, and a compare-and-swap or an
   * `expectedVersion` check on it would fail for nothing.
   */
  private async current(ws: string, id: string): Promise<T> {
    return this.parseHead(await this.redis.get(this.headKey(ws, id)));
  }

  private parseHead(raw: string | null): T {
    if (!raw) throw new ApiError('validation.not_found', `${this.what} not found`);
    return JSON.parse(raw) as T;
  }

  async getVersion(ws: string, id: string, n: number): Promise<T> {
    const key = this.versionKey(ws, id, n);
    let raw = this.versions?.get(key);
    if (raw === undefined) {
      raw = (await this.redis.get(key)) ?? undefined;
      if (raw !== undefined) this.versions?.set(key, raw);
    }
    if (raw === undefined) throw new ApiError('validation.not_found', `${this.what} version ${n} not found`);
    return JSON.parse(raw) as T;
  }

  /** A new immutable version from the head. `expectedVersion` fences against concurrent writers. */
  async newVersion(ws: string, id: string, expectedVersion: number | undefined, mutate: (cur: T) => T): Promise<T> {
    for (let attempt = 0; attempt < 8; attempt++) {
      const cur = await this.current(ws, id);
      if (cur.archived_at !== null) throw new ApiError('runtime.invalid_transition', `an archived ${this.what} takes no new versions`);
      if (expectedVersion !== undefined && cur.version !== expectedVersion) {
        throw new ApiError('validation.conflict', `version ${expectedVersion} is stale; the current version is ${cur.version}`);
      }
      const next = { ...mutate(cur), id: cur.id, created_at: cur.created_at, version: cur.version + 1, updated_at: nowIso(), archived_at: null };
      try {
        await this.write(ws, next, cur.version, true);
        return next;
      } catch (err) {
        if (expectedVersion !== undefined || !(err instanceof ApiError) || err.type !== 'validation.conflict') throw err;
      }
    }
    throw new ApiError('validation.conflict', 'too much contention on this resource; nothing was written, retry');
  }

  /** One-way and retry-safe: archiving an archived head returns it unchanged. */
  async archive(ws: string, id: string): Promise<T> {
    for (let attempt = 0; attempt < 8; attempt++) {
      const cur = await this.current(ws, id);
      if (cur.archived_at !== null) return cur;
      const next = { ...cur, archived_at: nowIso(), updated_at: nowIso() };
      try {
        await this.write(ws, next, cur.version, false);
        return next;
      } catch (err) {
        if (!(err instanceof ApiError) || err.type !== 'validation.conflict') throw err;
      }
    }
    throw new ApiError('validation.conflict', 'too much contention on this resource; nothing was written, retry');
  }

  async list(ws: string, opts: { limit: number; page?: string | undefined; includeArchived: boolean }): Promise<{ data: T[]; next_page: string | null }> {
    const key = keys.index(tags.workspace(ws), this.collection);
    const data: T[] = [];
    let after = opts.page ? decodeCursor(opts.page) : null;
    for (;;) {
      const raw = await this.redis.zrangebyscore(key, after ? after.score : '-inf', '+inf', 'WITHSCORES', 'LIMIT', 0, 200);
      const rows: { member: string; score: number }[] = [];
      for (let i = 0; i + 1 < raw.length; i += 2) rows.push({ member: raw[i] as string, score: Number(raw[i + 1]) });
      const fresh = after ? rows.filter((r) => r.score > (after?.score ?? 0) || r.member > (after?.member ?? '')) : rows;
      if (fresh.length === 0) return { data, next_page: null };
      const docs = await this.redis.mget(fresh.map((r) => this.headKey(ws, r.member)));
      for (let i = 0; i < fresh.length; i++) {
        const row = fresh[i] as { member: string; score: number };
        after = row;
        const text = docs[i];
        if (!text) continue;
        const doc = JSON.parse(text) as T;
        if (!opts.includeArchived && doc.archived_at !== null) continue;
        if (data.length === opts.limit) return { data, next_page: encodeCursor(data.length > 0 ? { score: Date.parse((data[data.length - 1] as T).created_at), member: (data[data.length - 1] as T).id } : row) };
        data.push(doc);
      }
      if (raw.length / 2 < 200) return { data, next_page: null };
    }
  }

  async listVersions(ws: string, id: string, opts: { limit: number; page?: string | undefined }): Promise<{ data: T[]; next_page: string | null }> {
    await this.get(ws, id);
    const after = opts.page ? decodeCursor(opts.page).score : 0;
    const ns = await this.redis.zrangebyscore(this.versionsIndex(ws, id), `(${after}`, '+inf', 'LIMIT', 0, opts.limit + 1);
    const page = ns.slice(0, opts.limit).map(Number);
    const docs = page.length ? await this.redis.mget(page.map((n) => this.versionKey(ws, id, n))) : [];
    const data = docs.filter((d): d is string => d !== null).map((d) => JSON.parse(d) as T);
    const last = page[page.length - 1];
    return { data, next_page: ns.length > opts.limit && last !== undefined ? encodeCursor({ score: last, member: 'v' }) : null };
  }
}
