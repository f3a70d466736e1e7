import { ApiError, sha256Hex } from '@agentplane/core';
import { KEYED_WRITES_LUA, KeyedWrites, keys, LuaScript, tags, type DocumentStore, type KeyedWrite, type ListPage, type Redis, type StoredDoc } from '@agentplane/store';
import { headRevisionKey } from '@agentplane/domain';

/**
 * Storage of AgentDeployments, their revisions, their connection bindings (heads and revisions)
 * and ConnectedHarnesses. Everything lives in the Workspace's slot (`{w:<ws>}`):
 *
 *   doc:<adep_|adcb_|chrn_>                    heads (JSON; `version` is the `resource_version`)
 *   idx:agent_deployments                      deployment heads (score = created ms)
 *   idx:agent_deployment_connection_bindings:<adep>   bindings of one deployment
 *   idx:connected_harnesses                    ConnectedHarness heads
 *   uniq:agent_deployment_keys                 deployment key → id (Workspace-unique)
 *   uniq:agent_deployment_connection_binding_keys:<adep>   binding key → id
 *   uniq:connected_harness_keys                ConnectedHarness key → id
 *   rev:<head id>:<n>                          revision n of a deployment or binding (immutable)
 *   idx:revisions:<head id>                    revision numbers (score = n)
 *   rev_base:<head id>                         hash: resource_version a publish started from → n (replay)
 *   rev_req:<token>                            a keyed publish's revision number (`KeyedWrites`, expiring)
 */

export interface HeadDoc extends StoredDoc {
  status: 'active' | 'archived';
  current_revision_number: number;
}

/*
 * KEYS: head, uniqueness hash, index
 * ARGV: head JSON, key, id, score
 * -3: the head exists; -5: the key is taken by another head.
 */
const CREATE = new LuaScript(
  'adep_create',
  `
if redis.call('EXISTS', KEYS[1]) == 1 then return -3 end
local owner = redis.call('HGET', KEYS[2], ARGV[2])
if owner and owner ~= ARGV[3] then return -5 end
redis.call('HSET', KEYS[2], ARGV[2], ARGV[3])
redis.call('SET', KEYS[1], ARGV[1])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[3])
return 1`,
);

/*
 * Publish revision n and advance the head in one step, only from the expected resource_version.
 * KEYS: head, revision, revisions index, base hash[, keyed request's record]
 * ARGV: expected version, n, revision JSON, next head JSON[, how long the record is kept in ms]
 * -1 head missing; -2 stale (or the number is taken); -4 archived. A keyed request's revision is
 * recorded for it (`KeyedWrites`) in the same step; one already recorded answers that revision's
 * number (a string), nothing written.
 */
const PUBLISH = new LuaScript(
  'adep_publish',
  `${KEYED_WRITES_LUA}
if KEYS[5] then
  local had = recorded_keyed(KEYS[5])
  if had then return had end
end
local cur = redis.call('GET', KEYS[1])
if not cur then return -1 end
local d = cjson.decode(cur)
if d['status'] == 'archived' then return -4 end
if tostring(d['version']) ~= ARGV[1] then return -2 end
if redis.call('SET', KEYS[2], ARGV[3], 'NX') == false then return -2 end
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[2])
redis.call('SET', KEYS[1], ARGV[4])
if KEYS[5] then record_keyed(KEYS[5], ARGV[2], ARGV[5]) end
return 1`,
);

/** The deployment id is deterministic over (Workspace, Agent). */
export function deploymentId(workspaceId: string, agentId: string): string {
  return `adep_${sha256Hex(`agentplane.agent_deployment.v1\0${workspaceId}\0${agentId}`).slice(0, 32)}`;
}
/** Revision ids are deterministic over (deployment, number), so a replay names the same revision. */
export function revisionId(deploymentIdValue: string, n: number): string {
  return `adrev_${sha256Hex(`agentplane.agent_deployment_revision.v1\0${deploymentIdValue}\0${n}`).slice(0, 32)}`;
}

export class HeadStore {
  /** Keyed publishes, each with the revision number it wrote (`publish`). */
  private readonly requests: KeyedWrites;

  constructor(
    private readonly redis: Redis,
    private readonly docs: DocumentStore,
  ) {
    this.requests = new KeyedWrites(redis, 'rev_req');
  }

  /** Shared with the scheduler, which reads pinned binding revisions when it offers a Run. */
  private revKey = (ws: string, id: string, n: number) => headRevisionKey(ws, id, n);
  private revIndex = (ws: string, id: string) => keys.index(tags.workspace(ws), `revisions:${id}`);
  private baseKey = (ws: string, id: string) => keys.scoped(tags.workspace(ws), `rev_base:${id}`);

  /**
   * Create a head under a unique key (unique in `uniq.collection`, which `uniq.within` names for
   * the caller: default the workspace). Conflicts are 409 `validation.conflict`.
   */
  async create(ws: string, doc: StoredDoc, uniq: { collection: string; key: string; within?: string }, index: string, what: string): Promise<void> {
    const tag = tags.workspace(ws);
    const r = await CREATE.run(this.redis, [keys.doc(tag, doc.id), keys.unique(tag, uniq.collection), keys.index(tag, index)],
      [JSON.stringify(doc), uniq.key, doc.id, Date.parse(doc.created_at)]);
    if (r === -3) throw new ApiError('validation.conflict', `${what} ${doc.id} already exists`);
    if (r === -5) throw new ApiError('validation.conflict', `the key '${uniq.key}' is taken by another ${what} of ${uniq.within ?? 'this workspace'}`);
  }

  async get<T extends StoredDoc>(ws: string, id: string, what: string): Promise<T> {
    const d = await this.docs.get<T>(tags.workspace(ws), id);
    if (!d) throw new ApiError('validation.not_found', `${what} not found`);
    return d;
  }

  async find<T extends StoredDoc>(ws: string, id: string): Promise<T | null> {
    return this.docs.get<T>(tags.workspace(ws), id);
  }

  async idByKey(ws: string, collection: string, key: string): Promise<string | null> {
    return this.redis.hget(keys.unique(tags.workspace(ws), collection), key);
  }

  async list<T extends StoredDoc>(ws: string, index: string, opts: { limit: number; page?: string | undefined }, filter?: (d: T) => boolean): Promise<ListPage<T>> {
    return this.docs.list<T>(tags.workspace(ws), index, { limit: opts.limit, page: opts.page, order: 'asc' }, filter);
  }

  /** Read-modify-write of a head, fenced on its resource_version (409 `validation.conflict` when stale). */
  /** Compare-and-swap on the head; `mutate` returning null (nothing changes) writes nothing and answers the head as it is. */
  async update<T extends StoredDoc>(ws: string, id: string, expected: number, mutate: (cur: T) => T | null, what: string): Promise<T> {
    return this.docs.update<T>(tags.workspace(ws), id, mutate, { expectedVersion: expected, notFound: what });
  }

  async revision<R>(ws: string, id: string, n: number): Promise<R | null> {
    const raw = await this.redis.get(this.revKey(ws, id, n));
    return raw === null ? null : (JSON.parse(raw) as R);
  }

  /** The revision number a publish starting from resource_version `base` produced, if any. */
  async revisionFromBase(ws: string, id: string, base: number): Promise<number | null> {
    const n = await this.redis.hget(this.baseKey(ws, id), String(base));
    return n === null ? null : Number(n);
  }

  async listRevisions<R>(ws: string, id: string, opts: { limit: number; after: number }): Promise<{ data: R[]; last: number | null; more: boolean }> {
    const ns = await this.redis.zrangebyscore(this.revIndex(ws, id), `(${opts.after}`, '+inf', 'LIMIT', 0, opts.limit + 1);
    const page = ns.slice(0, opts.limit).map(Number);
    const raws = page.length ? await this.redis.mget(page.map((n) => this.revKey(ws, id, n))) : [];
    const data = raws.filter((r): r is string => r !== null).map((r) => JSON.parse(r) as R);
    return { data, last: page[page.length - 1] ?? null, more: ns.length > opts.limit };
  }

  /** The revision number an attempt of this keyed publish wrote, if any (`publish`). */
  async published(ws: string, keyed: KeyedWrite): Promise<number | null> {
    const n = await this.requests.find(tags.workspace(ws), keyed);
    return n === null ? null : Number(n);
  }

  /**
   * Publish revision `n` from `head` (at resource_version `head.version`); `next` is the head
   * afterwards. `keyed`: recorded for the request in the same step; when an attempt of the same
   * request published meanwhile, its revision number answers (`{ earlier }`), nothing written.
   */
  async publish(ws: string, head: HeadDoc, n: number, revision: unknown, next: HeadDoc, keyed?: KeyedWrite): Promise<'written' | 'stale' | 'archived' | 'missing' | { earlier: number }> {
    const tag = tags.workspace(ws);
    const r = await PUBLISH.run(this.redis,
      [keys.doc(tag, head.id), this.revKey(ws, head.id, n), this.revIndex(ws, head.id), this.baseKey(ws, head.id), ...(keyed ? [this.requests.key(tag, keyed)] : [])],
      [String(head.version), n, JSON.stringify(revision), JSON.stringify(next), ...(keyed ? [keyed.keptMs] : [])]);
    if (typeof r === 'string') return { earlier: Number(r) };
    return r === 1 ? 'written' : r === -1 ? 'missing' : r === -4 ? 'archived' : 'stale';
  }
}
