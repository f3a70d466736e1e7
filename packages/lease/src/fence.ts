import { keys, tags, LuaScript, type Redis } from '@agentplane/store';
import { cancelMarkKey } from './cancels.js';

/**
 * The lease fences of one Session, in the Session's own hash slot (`ap:{s:<sess>}:lease`), so
 * that event-log appends can check them in the same Lua script as the XADD. Each fence mirrors
 * the BullMQ job lock of one Run's current attempt and always expires a little before the lock:
 * a runner whose lease was lost cannot write, even before BullMQ notices the stall.
 *
 * A Session holds one fence per leased Run (the threads of a coordinator Session run in
 * parallel): fields `t:<token>` = expires_at_ms, `r:<run>` = the Run's current token (a newer
 * attempt's claim drops the older token at once), `i:<token>` = `runner|attempt|run`.
 */
export const fenceKey = (sessionId: string): string => keys.scoped(tags.session(sessionId), 'lease');

const NOW = `local t = redis.call('TIME'); local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`;

/**
 * KEYS: the fence | the Run's cancel mark (`CancelMarks`, same slot). ARGV: token | runner |
 * attempt | run | ttl ms. A Run with a cancel mark (interrupted while a scheduler held it) is
 * never leased: 'canceled', nothing written.
 */
const CLAIM = new LuaScript(
  'lease_claim_multi_v2',
  `${NOW}
if redis.call('EXISTS', KEYS[2]) == 1 then return 'canceled' end
local info = redis.call('HGET', KEYS[1], 'i:' .. ARGV[1])
if info and string.sub(info, 1, string.len(ARGV[2]) + 1) ~= ARGV[2] .. '|' then return 'taken' end
local old = redis.call('HGET', KEYS[1], 'r:' .. ARGV[4])
if old and old ~= ARGV[1] then redis.call('HDEL', KEYS[1], 't:' .. old, 'i:' .. old) end
-- Fences that expired long ago (a lost lease never released) are pruned here.
local all = redis.call('HGETALL', KEYS[1])
for i = 1, #all, 2 do
  local f = all[i]
  if string.sub(f, 1, 2) == 't:' and tonumber(all[i + 1]) < now - 3600000 then
    redis.call('HDEL', KEYS[1], f, 'i:' .. string.sub(f, 3))
  end
end
redis.call('HSET', KEYS[1], 't:' .. ARGV[1], now + tonumber(ARGV[5]), 'r:' .. ARGV[4], ARGV[1], 'i:' .. ARGV[1], ARGV[2] .. '|' .. ARGV[3] .. '|' .. ARGV[4])
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]) + 86400000)
return 'ok'`,
);

const EXTEND = new LuaScript(
  'lease_extend_multi',
  `${NOW}
local exp = tonumber(redis.call('HGET', KEYS[1], 't:' .. ARGV[1]) or '0')
if exp < now then return 'lost' end
redis.call('HSET', KEYS[1], 't:' .. ARGV[1], now + tonumber(ARGV[2]))
local ttl = redis.call('PTTL', KEYS[1])
if ttl >= 0 and ttl < tonumber(ARGV[2]) + 86400000 then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + 86400000) end
return 'ok'`,
);

/** Drops the fence of token ARGV[1] (its expiry, its info and the Run's pointer to it). */
const DROP = `local info = redis.call('HGET', KEYS[1], 'i:' .. ARGV[1])
redis.call('HDEL', KEYS[1], 't:' .. ARGV[1], 'i:' .. ARGV[1])
if info then
  local run = string.match(info, '^[^|]*|[^|]*|(.*)$')
  if run and redis.call('HGET', KEYS[1], 'r:' .. run) == ARGV[1] then redis.call('HDEL', KEYS[1], 'r:' .. run) end
end
return 1`;

const RELEASE = new LuaScript(
  'lease_release_multi',
  `if not redis.call('HGET', KEYS[1], 't:' .. ARGV[1]) then return 0 end
${DROP}`,
);

/** A fence still live is released: 1; an expired or unknown one is left as it is: 0. */
const RELEASE_LIVE = new LuaScript(
  'lease_release_live',
  `${NOW}
if tonumber(redis.call('HGET', KEYS[1], 't:' .. ARGV[1]) or '0') < now then return 0 end
${DROP}`,
);

const CHECK = new LuaScript(
  'lease_check_multi',
  `${NOW}
if tonumber(redis.call('HGET', KEYS[1], 't:' .. ARGV[1]) or '0') < now then return 0 end
return 1`,
);

/**
 * Lua fragment for other scripts in the Session slot: returns true when `token` holds a live
 * lease. Expects the fence key as `fenceKeyExpr` and `now` computed.
 */
export const FENCE_CHECK_LUA = (fenceKeyExpr: string, tokenExpr: string): string =>
  `(tonumber(redis.call('HGET', ${fenceKeyExpr}, 't:' .. ${tokenExpr}) or '0') >= now)`;

export interface FenceClaim {
  sessionId: string;
  token: string;
  runnerId: string;
  attempt: number;
  runId: string;
}

export class LeaseFence {
  constructor(private readonly redis: Redis) {}

  /** `canceled`: the Run carries a cancel mark (`CancelMarks`), so no lease is claimed for it. */
  async claim(c: FenceClaim, ttlMs: number): Promise<'ok' | 'taken' | 'canceled'> {
    return (await CLAIM.run(this.redis, [fenceKey(c.sessionId), cancelMarkKey(c.sessionId, c.runId)], [c.token, c.runnerId, c.attempt, c.runId, ttlMs])) as 'ok' | 'taken' | 'canceled';
  }

  async extend(sessionId: string, token: string, ttlMs: number): Promise<'ok' | 'lost'> {
    return (await EXTEND.run(this.redis, [fenceKey(sessionId)], [token, ttlMs])) as 'ok' | 'lost';
  }

  async release(sessionId: string, token: string): Promise<boolean> {
    return (await RELEASE.run(this.redis, [fenceKey(sessionId)], [token])) === 1;
  }

  /**
   * Release the fence only while it is live (one round trip for a check and a release): false
   * when it had expired or was never claimed, and then nothing changes.
   */
  async releaseLive(sessionId: string, token: string): Promise<boolean> {
    return (await RELEASE_LIVE.run(this.redis, [fenceKey(sessionId)], [token])) === 1;
  }

  async holds(sessionId: string, token: string): Promise<boolean> {
    return (await CHECK.run(this.redis, [fenceKey(sessionId)], [token])) === 1;
  }

  /** The live lease of one Run: `token`, `runner_id`, `attempt`, `run_id` (empty when none). */
  async current(sessionId: string, runId: string): Promise<Record<string, string>> {
    const token = await this.redis.hget(fenceKey(sessionId), `r:${runId}`);
    if (!token) return {};
    const [exp, info] = await this.redis.hmget(fenceKey(sessionId), `t:${token}`, `i:${token}`);
    if (!exp || !info) return {};
    const [runner_id = '', attempt = '', run_id = ''] = info.split('|');
    return { token, runner_id, attempt, run_id, expires_at_ms: exp };
  }
}
