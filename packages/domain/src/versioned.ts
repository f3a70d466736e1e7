import { ApiError, crashPoint, nowIso, staleOrAhead } from '@agentplane/core';
import { BoundedCache, cachedGet, decodeCursor, encodeCursor, KEYED_WRITES_LUA, KeyedWrites, keys, LuaScript, tags, type KeyedWrite, type Redis, type StoredDoc } from '@agentplane/store';

/**
 * Workspace-owned resources with immutable versions (Agents, Environments, harness and sandbox
 * profiles).
 *
 *   ap:{w:<ws>}:doc:<id>             head: the latest version plus `archived_at`
 *   ap:{w:<ws>}:doc:<id>:v<n>        version n, written once and never changed
 *   ap:{w:<ws>}:idx:<collection>     listing of heads (score = created ms)
 *   ap:{w:<ws>}:idx:<collection>:versions:<id>   versions (score = n)
 *
 * `version` is both the version number and the compare-and-swap counter of the head: a new
 * version is written with the head in one script, so a version exists iff the head reached it.
 * A resource with a Workspace-unique key (harness and sandbox profiles) claims it in the script
 * that creates the head:
 *
 *   ap:{w:<ws>}:uniq:<collection>    key → id
 *
 * so a key is never claimed by a resource that does not exist.
 */
export interface VersionedDoc extends StoredDoc {
  archived_at: string | null;
}

/*
 * KEYS: head, version doc, heads index, versions index[, uniqueness hash][, keyed request's record]
 * ARGV: expected version ('' = create), head JSON, version JSON ('' = head-only change), n, created ms, id,
 *       unique key ('' = none), how long the keyed request's record is kept in ms ('' = not keyed)
 * With a unique key (a create), the key is claimed for the id in the same script: -5 when another
 * id holds it. A new version of an archived head is -4 (an archive keeps the version number, so
 * a version that read the head live must not pass on the number alone). Every check comes before
 * the first write, so a refused write leaves nothing. A keyed request's version is recorded for it
 * (`KeyedWrites`, the last key) in the same step; one already recorded answers that version's
 * number (a string), nothing written: an attempt of the same request wrote it.
 */
const WRITE = new LuaScript(
  'versioned_write',
  `${KEYED_WRITES_LUA}
local rec = (ARGV[8] and ARGV[8] ~= '') and KEYS[#KEYS] or nil
if rec then
  local had = recorded_keyed(rec)
  if had then return had end
end
local unique = ARGV[7] and ARGV[7] ~= '' and ARGV[7] or nil
local cur = redis.call('GET', KEYS[1])
if ARGV[1] == '' then
  if cur then return -3 end
else
  if not cur then return -1 end
  local d = cjson.decode(cur)
  if tostring(d['version']) ~= ARGV[1] then return -2 end
  if ARGV[3] ~= '' and type(d['archived_at']) == 'string' then return -4 end
  -- An archive does not move the version: one that finds the head archived by another since its
  -- read is stale, never a second archived_at over the first.
  if ARGV[3] == '' and type(d['archived_at']) == 'string' then
    local n = cjson.decode(ARGV[2])
    if type(n['archived_at']) == 'string' and n['archived_at'] ~= d['archived_at'] then return -2 end
  end
end
if unique then
  local owner = redis.call('HGET', KEYS[5], unique)
  if owner and owner ~= ARGV[6] then return -5 end
end
if ARGV[3] ~= '' then
  if redis.call('SET', KEYS[2], ARGV[3], 'NX') == false then return -2 end
  redis.call('ZADD', KEYS[4], ARGV[4], ARGV[4])
end
if unique then redis.call('HSET', KEYS[5], unique, ARGV[6]) end
redis.call('SET', KEYS[1], ARGV[2])
if ARGV[1] == '' then redis.call('ZADD', KEYS[3], ARGV[5], ARGV[6]) end
if rec then record_keyed(rec, ARGV[4], ARGV[8]) end
return 1`,
);

/*
 * Releases a unique key (KEYS[1] field ARGV[1]) still claimed for id ARGV[2] whose head (KEYS[2])
 * does not exist: a claim an older version made in a step before the head and never followed by it.
 * 1 released, 0 not (the claim moved, or its head exists).
 */
const RELEASE_ORPHAN_CLAIM = new LuaScript(
  'versioned_release_orphan_claim',
  `
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1`,
);

/**
 * Releases field `field` of the unique-key hash `hashKey` when the resource claiming it does not
 * exist (its document key, `docKey(owner)`, is absent): a claim an older version made in a step
 * before the resource and never followed by it. True when released (a create may claim it now).
 */
export async function releaseOrphanClaim(redis: Redis, hashKey: string, field: string, docKey: (owner: string) => string): Promise<boolean> {
  const owner = await redis.hget(hashKey, field);
  if (owner === null) return false;
  return (await RELEASE_ORPHAN_CLAIM.run(redis, [hashKey, docKey(owner)], [field, owner])) === 1;
}

/**
 * Creates a document and claims its unique key in one script: field ARGV[1] of the unique-key hash
 * KEYS[1] set to the id ARGV[2] (0 when another holds it), the document KEYS[2] (ARGV[3]), its
 * listing entry in KEYS[3] (score ARGV[4]) and, when given, a key written beside it (KEYS[4] =
 * ARGV[5], say a sealed secret), so a key is never claimed by a document that does not exist.
 */
const CLAIMED_CREATE = new LuaScript('claimed_create', `
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[2])
if KEYS[4] then redis.call('SET', KEYS[4], ARGV[5]) end
return 1`);

/** A keyed create for `createClaimed`: the key's hash and field, the document, its listing, and what is written beside it. */
export interface ClaimedCreate {
  unique: string;
  field: string;
  id: string;
  docKey: string;
  json: string;
  index: string;
  score: number;
  extra?: { key: string; value: string };
}

/**
 * Writes `c` with its key claimed (CLAIMED_CREATE): false when the key is held by another. A key
 * held by nothing live (`release` says whether it let such a claim go, e.g. `releaseOrphanClaim`)
 * is released and the create tried once more.
 */
export async function createClaimed(redis: Redis, c: ClaimedCreate, release?: () => Promise<boolean>): Promise<boolean> {
  const run = async () => (await CLAIMED_CREATE.run(redis, [c.unique, c.docKey, c.index, ...(c.extra ? [c.extra.key] : [])], [c.field, c.id, c.json, c.score, ...(c.extra ? [c.extra.value] : [])])) === 1;
  if (await run()) return true;
  return release !== undefined && (await release()) && run();
}

/** A Workspace-unique key: field `key` of the Workspace's `uniq:<collection>` hash. */
export interface UniqueKey {
  collection: string;
  key: string;
}

export class VersionedStore<T extends VersionedDoc> {
  /** Version texts read before (versions never change once written); only when asked for. */
  private readonly versions: BoundedCache<string, string> | undefined;
  /** Keyed new-version requests, each with the version number it wrote (`newVersion`). */
  private readonly requests: KeyedWrites;

  constructor(
    private readonly redis: Redis,
    private readonly collection: string,
    private readonly what: string,
    options: { cacheVersions?: boolean } = {},
  ) {
    this.requests = new KeyedWrites(redis, `${collection}_req`);
    this.versions = options.cacheVersions ? new BoundedCache<string, string>(2_000, { maxWeight: 8 * 1024 * 1024, weigh: (t) => t.length }) : undefined;
  }

  private headKey = (ws: string, id: string) => keys.doc(tags.workspace(ws), id);
  private versionKey = (ws: string, id: string, n: number) => keys.doc(tags.workspace(ws), `${id}:v${n}`);
  private versionsIndex = (ws: string, id: string) => keys.index(tags.workspace(ws), `${this.collection}:versions:${id}`);

  private uniqueKey = (ws: string, collection: string) => keys.unique(tags.workspace(ws), collection);

  private async write(ws: string, doc: T, expected: number | null, withVersion: boolean): Promise<void> {
    this.check(await this.run(ws, doc, expected, withVersion), expected);
  }

  private async run(ws: string, doc: T, expected: number | null, withVersion: boolean, unique?: UniqueKey, keyed?: KeyedWrite): Promise<unknown> {
    const keyList = [this.headKey(ws, doc.id), this.versionKey(ws, doc.id, doc.version), keys.index(tags.workspace(ws), this.collection), this.versionsIndex(ws, doc.id)];
    const args: (string | number)[] = [expected === null ? '' : String(expected), JSON.stringify(doc), withVersion ? JSON.stringify({ ...doc, archived_at: null }) : '', doc.version, Date.parse(doc.created_at), doc.id];
    if (unique) keyList.push(this.uniqueKey(ws, unique.collection));
    args.push(unique ? unique.key : '');
    if (keyed) {
      keyList.push(this.requests.key(tags.workspace(ws), keyed));
      args.push(keyed.keptMs);
    }
    return WRITE.run(this.redis, keyList, args);
  }

  private check(r: unknown, expected: number | null, unique?: UniqueKey): void {
    if (r === -1) throw new ApiError('validation.not_found', `${this.what} not found`);
    if (r === -2) throw new ApiError('validation.conflict', `${this.what} version ${expected ?? 0} is stale`);
    if (r === -3) throw new ApiError('validation.conflict', `${this.what} already exists`);
    if (r === -4) throw new ApiError('runtime.invalid_transition', `an archived ${this.what} takes no new versions`);
    if (r === -5) throw new ApiError('validation.conflict', `the key '${unique?.key ?? ''}' is taken by another ${this.what} of this workspace`);
  }

  /**
   * Version 1 and its head, in one script; with `unique`, the key claimed for the resource in that
   * same script (409 `validation.conflict` when another resource holds it), so no creation, however
   * it ends, leaves the key claimed by a resource that does not exist. A key claimed for a
   * resource whose head does not exist (an older version claimed it in a step of its own, and its
   * process died before the head) is released, and the creation takes it.
   */
  async create(ws: string, doc: T, unique?: UniqueKey): Promise<T> {
    let r = await this.run(ws, doc, null, true, unique);
    if (r === -5 && unique && (await this.releaseOrphanClaim(ws, unique))) r = await this.run(ws, doc, null, true, unique);
    this.check(r, null, unique);
    return doc;
  }

  /** The id holding a unique key, or null. */
  async idByKey(ws: string, unique: UniqueKey): Promise<string | null> {
    return this.redis.hget(this.uniqueKey(ws, unique.collection), unique.key);
  }

  private releaseOrphanClaim(ws: string, unique: UniqueKey): Promise<boolean> {
    return releaseOrphanClaim(this.redis, this.uniqueKey(ws, unique.collection), unique.key, (owner) => this.headKey(ws, owner));
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

  /**
   * A new immutable version from the head. `expectedVersion` fences against concurrent writers.
   *
   * `keyed`: written once per keyed request. The version an earlier attempt of the request wrote
   * (its process died before the answer was kept, and the key's pending record lapsed) answers it,
   * whatever `expectedVersion` now says (the head moved on by that very version), and an attempt
   * racing another of the same request is answered the other's version.
   */
  async newVersion(ws: string, id: string, expectedVersion: number | undefined, mutate: (cur: T) => T, keyed?: KeyedWrite): Promise<T> {
    if (keyed) {
      const earlier = await this.requests.find(tags.workspace(ws), keyed);
      if (earlier !== null) return this.getVersion(ws, id, Number(earlier));
    }
    for (let attempt = 0; attempt < 8; attempt++) {
      const cur = await this.current(ws, id);
      if (cur.archived_at !== null) throw new ApiError('runtime.invalid_transition', `an archived ${this.what} takes no new versions`);
      if (expectedVersion !== undefined && cur.version !== expectedVersion) {
        throw new ApiError('validation.conflict', `version ${expectedVersion} ${staleOrAhead(expectedVersion, cur.version)}; the current version is ${cur.version}`);
      }
      const next = { ...mutate(cur), id: cur.id, created_at: cur.created_at, version: cur.version + 1, updated_at: nowIso(), archived_at: null };
      const r = await this.run(ws, next, cur.version, true, undefined, keyed);
      if (typeof r === 'string') return this.getVersion(ws, id, Number(r));
      if (r === -2 && expectedVersion === undefined) continue; // lost a race: read the head again
      this.check(r, cur.version);
      crashPoint('new-version-written');
      return next;
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
