import { decodeCursor, encodeCursor, keys, LuaScript, tags, type Redis } from '@agentplane/store';
import type { RunnerPresence } from '@agentplane/protocol';

/**
 * The presence projection: one short-TTL key per runner inside its Workspace's hash tag, and
 * two indexes (lexical by runner id for listing, by expiry for pruning). Written only from
 * heartbeats; missing heartbeats make it expire. Never lease authority.
 *
 *   ap:{w:<ws>}:presence:<runner_id>   string JSON {presence, route}, PX = TTL
 *   ap:{w:<ws>}:presence_ids           zset, score 0, members runner ids (lexical order)
 *   ap:{w:<ws>}:presence_exp           zset, score = expiry ms
 *   ap:{w:<ws>}:presence_ids:<pool>    zset, score 0: the runners of one pool (pruned lazily)
 *   ap:{w:<ws>}:runner_gen:<runner_id> counter, incremented per connection (generation)
 */
export interface PresenceRoute {
  /** Gateway node holding the socket; lease offers are published on its channel. */
  node_id: string;
  connection_id: string;
  credential_id: string;
}

export interface StoredPresence {
  presence: RunnerPresence;
  route: PresenceRoute;
}

export const presenceKeys = {
  doc: (ws: string, runnerId: string) => keys.scoped(tags.workspace(ws), `presence:${runnerId}`),
  ids: (ws: string) => keys.scoped(tags.workspace(ws), 'presence_ids'),
  poolIds: (ws: string, poolId: string) => keys.scoped(tags.workspace(ws), `presence_ids:${poolId}`),
  exp: (ws: string) => keys.scoped(tags.workspace(ws), 'presence_exp'),
  generation: (ws: string, runnerId: string) => keys.scoped(tags.workspace(ws), `runner_gen:${runnerId}`),
};

/** Channel of one gateway node: frames to deliver to runners connected there. */
export const gatewayNodeChannel = (nodeId: string): string => `ap:gateway:node:${nodeId}`;
/** Broadcast channel every gateway node listens on: revocations, drains, supersedes. */
export const GATEWAY_CONTROL_CHANNEL = 'ap:gateway:control';

// Write only if this connection is the runner's newest (the generation counter is the fence):
// a stale socket on any node cannot overwrite or resurrect a newer connection's presence.
const WRITE_LUA = `
local latest = redis.call('GET', KEYS[4])
if latest and tonumber(latest) > tonumber(ARGV[3]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('ZADD', KEYS[2], 0, ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[4])
redis.call('ZADD', KEYS[5], 0, ARGV[4])
return 1`;

const REMOVE_LUA = `
local cur = redis.call('GET', KEYS[1])
if cur then
  local g = cjson.decode(cur)['presence']['generation']
  if tonumber(g) ~= tonumber(ARGV[1]) then return 0 end
end
redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[2])
redis.call('ZREM', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[4], ARGV[2])
return 1`;

// Prune expired members, then return up to ARGV[3] ids after ARGV[2] (exclusive, lexical).
const PAGE_LUA = `
local dead = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, 1000)
if #dead > 0 then
  redis.call('ZREM', KEYS[2], unpack(dead))
  redis.call('ZREM', KEYS[1], unpack(dead))
end
local from = '-'
if ARGV[2] ~= '' then from = '(' .. ARGV[2] end
return redis.call('ZRANGEBYLEX', KEYS[1], from, '+', 'LIMIT', 0, tonumber(ARGV[3]))`;

const writeScript = new LuaScript('presence_write', WRITE_LUA);
const removeScript = new LuaScript('presence_remove', REMOVE_LUA);
const pageScript = new LuaScript('presence_page', PAGE_LUA);

export class PresenceStore {
  constructor(private readonly redis: Redis) {}

  async nextGeneration(ws: string, runnerId: string): Promise<number> {
    return this.redis.incr(presenceKeys.generation(ws, runnerId));
  }

  /** Write (or refresh) a presence. False when a newer generation owns it. */
  async write(ws: string, stored: StoredPresence, ttlMs: number): Promise<boolean> {
    const p = stored.presence;
    const r = await writeScript.run(
      this.redis,
      [presenceKeys.doc(ws, p.runner), presenceKeys.ids(ws), presenceKeys.exp(ws), presenceKeys.generation(ws, p.runner), presenceKeys.poolIds(ws, p.runner_pool)],
      [JSON.stringify(stored), ttlMs, p.generation, p.runner, Date.parse(p.expires_at)],
    );
    return r === 1;
  }

  /** Remove a presence, only if it is still this generation's. */
  async remove(ws: string, runnerId: string, generation: number, poolId: string): Promise<void> {
    await removeScript.run(this.redis, [presenceKeys.doc(ws, runnerId), presenceKeys.ids(ws), presenceKeys.exp(ws), presenceKeys.poolIds(ws, poolId)], [generation, runnerId]);
  }

  /**
   * One page of the live presences of one pool, ordered by runner id, read from the pool's own
   * index (cost grows with the pool, not the Workspace). Members whose presence expired are
   * pruned from the pool index as they are met.
   */
  async listPool(
    ws: string,
    poolId: string,
    options: { limit: number; page?: string | undefined },
  ): Promise<{ data: RunnerPresence[]; next_page: string | null }> {
    const page = await this.listPoolStored(ws, poolId, options);
    return { data: page.data.map((s) => s.presence), next_page: page.next_page };
  }

  /** Like listPool, with each presence's route (which gateway node holds the socket). */
  async listPoolStored(
    ws: string,
    poolId: string,
    options: { limit: number; page?: string | undefined },
  ): Promise<{ data: StoredPresence[]; next_page: string | null }> {
    const page = await this.listPoolRaw(ws, poolId, options);
    return { data: page.data.map((raw) => JSON.parse(raw) as StoredPresence), next_page: page.next_page };
  }

  /**
   * Like listPoolStored, each presence as its stored JSON text (a `StoredPresence`): a reader
   * that reads the pool again and again can tell an unchanged presence by its text, unparsed.
   */
  async listPoolRaw(
    ws: string,
    poolId: string,
    options: { limit: number; page?: string | undefined },
  ): Promise<{ data: string[]; next_page: string | null }> {
    const key = presenceKeys.poolIds(ws, poolId);
    let after = options.page ? decodeCursor(options.page).member : '';
    const data: string[] = [];
    const batch = Math.max(options.limit + 1, 100);
    for (;;) {
      const ids = await this.redis.zrangebylex(key, after ? `(${after}` : '-', '+', 'LIMIT', 0, batch);
      if (ids.length === 0) return { data, next_page: null };
      const raws = await this.redis.mget(ids.map((id) => presenceKeys.doc(ws, id)));
      const dead: string[] = [];
      for (let i = 0; i < ids.length; i++) {
        const raw = raws[i];
        const id = ids[i] as string;
        if (!raw) {
          dead.push(id);
        } else {
          if (data.length === options.limit) {
            if (dead.length > 0) await this.redis.zrem(key, ...dead);
            return { data, next_page: encodeCursor({ score: 0, member: after }) };
          }
          data.push(raw);
        }
        after = id;
      }
      if (dead.length > 0) await this.redis.zrem(key, ...dead);
      if (ids.length < batch) return { data, next_page: null };
    }
  }

  async get(ws: string, runnerId: string): Promise<StoredPresence | null> {
    const raw = await this.redis.get(presenceKeys.doc(ws, runnerId));
    return raw ? (JSON.parse(raw) as StoredPresence) : null;
  }

  /**
   * One page of live presences ordered by runner id. `filter` drops entries (e.g. the owner
   * filter) without breaking the cursor: the cursor is the last runner id examined.
   */
  async list(
    ws: string,
    options: { limit: number; page?: string | undefined; filter?: (p: RunnerPresence) => boolean },
  ): Promise<{ data: RunnerPresence[]; next_page: string | null }> {
    let after = options.page ? decodeCursor(options.page).member : '';
    const data: RunnerPresence[] = [];
    const batch = Math.max(options.limit + 1, 100);
    for (;;) {
      const ids = (await pageScript.run(this.redis, [presenceKeys.ids(ws), presenceKeys.exp(ws)], [Date.now(), after, batch])) as string[];
      if (ids.length === 0) return { data, next_page: null };
      const raws = await this.redis.mget(ids.map((id) => presenceKeys.doc(ws, id)));
      for (let i = 0; i < ids.length; i++) {
        const raw = raws[i];
        const id = ids[i] as string;
        if (raw) {
          const p = (JSON.parse(raw) as StoredPresence).presence;
          if (!options.filter || options.filter(p)) {
            if (data.length === options.limit) return { data, next_page: encodeCursor({ score: 0, member: after }) };
            data.push(p);
          }
        }
        after = id;
      }
      if (ids.length < batch) return { data, next_page: null };
    }
  }
}
