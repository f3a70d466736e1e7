import { keys, tags, LuaScript, type Redis } from '@agentplane/store';

/**
 * The lease fence of one Session, in the Session's own hash slot (`ap:{s:<sess>}:lease`), so
 * that event-log appends can check it in the same Lua script as the XADD. It mirrors the
 * BullMQ job lock of the Run's current attempt and always expires a little before the lock:
 * a runner whose lease was lost cannot write, even before BullMQ notices the stall.
 *
 * Fields: token (the lease id = BullMQ lock token), runner_id, attempt, run_id, expires_at_ms.
 */
export const fenceKey = (sessionId: string): string => keys.scoped(tags.session(sessionId), 'lease');

const NOW = `local t = redis.call('TIME'); local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)`;

const CLAIM = new LuaScript(
  'lease_claim',
  `${NOW}
local cur = redis.call('HGET', KEYS[1], 'token')
if cur == ARGV[1] and redis.call('HGET', KEYS[1], 'runner_id') ~= ARGV[2] then return 'taken' end
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'runner_id', ARGV[2], 'attempt', ARGV[3], 'run_id', ARGV[4], 'expires_at_ms', now + tonumber(ARGV[5]))
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[5]) + 86400000)
return 'ok'`,
);

const EXTEND = new LuaScript(
  'lease_extend',
  `${NOW}
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 'lost' end
local exp = tonumber(redis.call('HGET', KEYS[1], 'expires_at_ms') or '0')
if exp < now then return 'lost' end
redis.call('HSET', KEYS[1], 'expires_at_ms', now + tonumber(ARGV[2]))
return 'ok'`,
);

const RELEASE = new LuaScript(
  'lease_release',
  `if redis.call('HGET', KEYS[1], 'token') == ARGV[1] then redis.call('DEL', KEYS[1]) return 1 end
return 0`,
);

const CHECK = new LuaScript(
  'lease_check',
  `${NOW}
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'expires_at_ms') or '0') < now then return 0 end
return 1`,
);

/**
 * Lua fragment for other scripts in the Session slot (the event-log append): returns true when
 * `token` holds the live lease. Expects the fence key as `fenceKeyExpr` and `now` computed.
 */
export const FENCE_CHECK_LUA = (fenceKeyExpr: string, tokenExpr: string): string =>
  `(redis.call('HGET', ${fenceKeyExpr}, 'token') == ${tokenExpr} and tonumber(redis.call('HGET', ${fenceKeyExpr}, 'expires_at_ms') or '0') >= now)`;

export interface FenceClaim {
  sessionId: string;
  token: string;
  runnerId: string;
  attempt: number;
  runId: string;
}

export class LeaseFence {
  constructor(private readonly redis: Redis) {}

  async claim(c: FenceClaim, ttlMs: number): Promise<'ok' | 'taken'> {
    return (await CLAIM.run(this.redis, [fenceKey(c.sessionId)], [c.token, c.runnerId, c.attempt, c.runId, ttlMs])) as 'ok' | 'taken';
  }

  async extend(sessionId: string, token: string, ttlMs: number): Promise<'ok' | 'lost'> {
    return (await EXTEND.run(this.redis, [fenceKey(sessionId)], [token, ttlMs])) as 'ok' | 'lost';
  }

  async release(sessionId: string, token: string): Promise<boolean> {
    return (await RELEASE.run(this.redis, [fenceKey(sessionId)], [token])) === 1;
  }

  async holds(sessionId: string, token: string): Promise<boolean> {
    return (await CHECK.run(this.redis, [fenceKey(sessionId)], [token])) === 1;
  }

  async current(sessionId: string): Promise<Record<string, string>> {
    return this.redis.hgetall(fenceKey(sessionId));
  }
}
