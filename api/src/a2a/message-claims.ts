import type { Redis } from '@agentplane/store';
import { LuaScript } from '@agentplane/store';

/**
 * Claims a messageId in the messages hash (KEYS[1]), field ARGV[1], for the send holding token
 * ARGV[2]: `{1, claim}` when this send now holds it (the field was free, held by a claim older
 * than ARGV[3] ms by the server's clock, or already held by this very token: the same claim sent
 * again by the Redis client after a dropped connection cut its answer off); else `{0, value}`,
 * the task id it maps to or `pending` while another send holds it. A claim is
 * `pending:<ms>:<token>`; an undated `pending` (written before claims were dated) is dated now,
 * so it expires too.
 */
const CLAIM = new LuaScript('a2a_claim_message_v2', `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local v = redis.call('HGET', KEYS[1], ARGV[1])
local mine = 'pending:' .. now .. ':' .. ARGV[2]
if not v then
  redis.call('HSET', KEYS[1], ARGV[1], mine)
  return {1, mine}
end
if v == 'pending' then
  redis.call('HSET', KEYS[1], ARGV[1], 'pending:' .. now .. ':')
  return {0, 'pending'}
end
if string.sub(v, 1, 8) == 'pending:' then
  local at, holder = string.match(v, '^pending:(%d+):(.*)$')
  if holder == ARGV[2] and holder ~= '' then return {1, v} end
  at = tonumber(at)
  if at == nil or now - at >= tonumber(ARGV[3]) then
    redis.call('HSET', KEYS[1], ARGV[1], mine)
    return {1, mine}
  end
  return {0, 'pending'}
end
return {0, v}
`);

/** Releases a claim (KEYS[1], field ARGV[1]) if it is still ARGV[2]: a send that failed leaves the messageId free. */
const RELEASE = new LuaScript('a2a_release_message', `
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then return redis.call('HDEL', KEYS[1], ARGV[1]) end
return 0
`);

/** One attempt at a messageId's claim: this send's claim, or what holds the messageId (a task id, or `pending`). */
export async function claimMessage(redis: Redis, key: string, messageId: string, token: string, staleMs: number): Promise<{ won: true; claim: string } | { won: false; value: string }> {
  const [won, value] = (await CLAIM.run(redis, [key], [messageId, token, staleMs])) as [number, string];
  return won === 1 ? { won: true, claim: value } : { won: false, value };
}

/** Frees a messageId if `claim` still holds it. */
export async function releaseMessage(redis: Redis, key: string, messageId: string, claim: string): Promise<void> {
  await RELEASE.run(redis, [key], [messageId, claim]);
}
