import { DOC_SWAP_LUA, docSwapResult, keys, tags, LuaScript, type Redis, type SwapOutcome } from '@agentplane/store';
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
 * The runners whose offer of one lease was withdrawn (a set, in the Session's slot beside the
 * fence): the offering scheduler gave up on them (`LeaseFence.withdrawOffer`), and a claim of
 * this token by any of them is refused. Only timed-out offers write one.
 */
export const withdrawnOffersKey = (sessionId: string, token: string): string => keys.scoped(tags.session(sessionId), `offer_withdrawn:${token}`);

/**
 * Lua: `claim(fence, mark, withdrawn, token, runner, attempt, run, ttl_ms)` ('ok', 'taken' or
 * 'canceled'; `now` computed). The fence key, the Run's cancel mark (`CancelMarks`) and the
 * token's withdrawn offers (`withdrawnOffersKey`), all in the Session's slot. A Run with a cancel
 * mark (interrupted while a scheduler held it) is never leased: 'canceled', nothing written. A
 * runner whose offer of this token was withdrawn (it timed out, and the scheduler moved on) is
 * refused as if another runner held it: 'taken', nothing written.
 */
const CLAIM_LUA = `
local function claim(fence, mark, withdrawn, token, runner, attempt, run, ttl_ms)
  if redis.call('EXISTS', mark) == 1 then return 'canceled' end
  if redis.call('SISMEMBER', withdrawn, runner) == 1 then return 'taken' end
  local info = redis.call('HGET', fence, 'i:' .. token)
  if info and string.sub(info, 1, string.len(runner) + 1) ~= runner .. '|' then return 'taken' end
  local old = redis.call('HGET', fence, 'r:' .. run)
  if old and old ~= token then redis.call('HDEL', fence, 't:' .. old, 'i:' .. old) end
  -- Fences that expired long ago (a lost lease never released) are pruned here.
  local all = redis.call('HGETALL', fence)
  for i = 1, #all, 2 do
    local f = all[i]
    if string.sub(f, 1, 2) == 't:' and tonumber(all[i + 1]) < now - 3600000 then
      redis.call('HDEL', fence, f, 'i:' .. string.sub(f, 3))
    end
  end
  redis.call('HSET', fence, 't:' .. token, now + tonumber(ttl_ms), 'r:' .. run, token, 'i:' .. token, runner .. '|' .. attempt .. '|' .. run)
  redis.call('PEXPIRE', fence, tonumber(ttl_ms) + 86400000)
  return 'ok'
end`;

/**
 * KEYS: the fence | the Run's cancel mark | the token's withdrawn offers.
 * ARGV: token | runner | attempt | run | ttl ms.
 */
const CLAIM = new LuaScript('lease_claim_multi_v3', `${NOW}${CLAIM_LUA}
return claim(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])`);

/**
 * The claim, then, only once it is made, a document compare-and-swap in the same slot
 * (`doc_swap`: the Run's move to running, and its thread's startup mark riding along).
 * KEYS: as CLAIM, then the document | the second document (optional).
 * ARGV: as CLAIM, then expected | JSON, then (with the second document) its expected | JSON.
 * Returns {claim} when refused, else {'ok', doc_swap's answer…}.
 */
const CLAIM_AND_SWAP = new LuaScript('lease_claim_swap_v2', `${NOW}${CLAIM_LUA}${DOC_SWAP_LUA}
local c = claim(KEYS[1], KEYS[2], KEYS[3], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5])
if c ~= 'ok' then return {c} end
local r = doc_swap(KEYS[4], ARGV[6], ARGV[7], KEYS[5], ARGV[8], ARGV[9])
return {'ok', r[1], r[2]}`);

/**
 * An offer given up on, in one script with the claims it races: `claimed` when the runner's
 * claim of this token came first (the fence's `i:<token>` names the runner), else the runner is
 * added to the token's withdrawn offers, which refuse its claim from now on (`withdrawn`).
 * KEYS: the fence | the token's withdrawn offers. ARGV: token | runner | ttl ms.
 */
const WITHDRAW_OFFER = new LuaScript(
  'lease_offer_withdraw',
  `local info = redis.call('HGET', KEYS[1], 'i:' .. ARGV[1])
if info and string.sub(info, 1, string.len(ARGV[2]) + 1) == ARGV[2] .. '|' then return 'claimed' end
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[3]))
return 'withdrawn'`,
);

const EXTEND = new LuaScript(
  'lease_extend_multi',
  `${NOW}
local exp = tonumber(redis.call('HGET', KEYS[1], 't:' .. ARGV[1]) or '0')
if exp < now then
  if exp > 0 then return 'expired' end
  return 'lost'
end
redis.call('HSET', KEYS[1], 't:' .. ARGV[1], now + tonumber(ARGV[2]))
local ttl = redis.call('PTTL', KEYS[1])
if ttl >= 0 and ttl < tonumber(ARGV[2]) + 86400000 then redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + 86400000) end
if KEYS[2] and redis.call('EXISTS', KEYS[2]) == 1 then return 'canceled' end
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

/** The keys every claim script starts with (one slot: the Session's). */
const claimKeys = (c: FenceClaim): string[] => [fenceKey(c.sessionId), cancelMarkKey(c.sessionId, c.runId), withdrawnOffersKey(c.sessionId, c.token)];

/** A document written by `LeaseFence.claimAndSwap`: its key, the version it must still be at, its new JSON. */
export interface SwappedDoc {
  key: string;
  expected: number;
  json: string;
}

export class LeaseFence {
  constructor(private readonly redis: Redis) {}

  /**
   * `canceled`: the Run carries a cancel mark (`CancelMarks`), so no lease is claimed for it.
   * `taken`: another runner holds this token, or this runner's offer of it was withdrawn
   * (`withdrawOffer`).
   */
  async claim(c: FenceClaim, ttlMs: number): Promise<'ok' | 'taken' | 'canceled'> {
    return (await CLAIM.run(this.redis, claimKeys(c), [c.token, c.runnerId, c.attempt, c.runId, ttlMs])) as 'ok' | 'taken' | 'canceled';
  }

  /**
   * `claim`, and once it is made, in the same script, a compare-and-swap of a document of the
   * Session's slot (`doc`, and `also` riding along as `DocumentStore.swapWith` does): one round
   * trip for an acceptance's claim and its Run's move. A refused claim writes nothing; a stale
   * or missing document leaves the claim made (a retry claims again, which changes nothing).
   */
  async claimAndSwap(
    c: FenceClaim, ttlMs: number, doc: SwappedDoc, also?: SwappedDoc,
  ): Promise<{ claim: 'taken' | 'canceled' } | { claim: 'ok'; outcome: SwapOutcome; alsoWritten: boolean }> {
    const keyList = [...claimKeys(c), doc.key, ...(also ? [also.key] : [])];
    const args: (string | number)[] = [c.token, c.runnerId, c.attempt, c.runId, ttlMs, String(doc.expected), doc.json, ...(also ? [String(also.expected), also.json] : [])];
    const r = (await CLAIM_AND_SWAP.run(this.redis, keyList, args)) as unknown[];
    if (r[0] !== 'ok') return { claim: r[0] === 'canceled' ? 'canceled' : 'taken' };
    return { claim: 'ok', ...docSwapResult(r.slice(1)) };
  }

  /**
   * The scheduler gives up on its offer of lease `token` to `runnerId` (the offer timed out), in
   * one script with the runner's claim, which may be on its way (the acceptance extends the
   * job's lock, then claims, with the token the scheduler still holds): `claimed` when the claim
   * came first (the offer was accepted after all: the lease is the runner's), else `withdrawn`,
   * and that runner's claim of this token is refused from now on (`taken`). Another runner's
   * claim of the same token (the next offer) is not affected. `ttlMs`: how long the withdrawal
   * is kept, a few lease periods (past any acceptance still under way).
   */
  async withdrawOffer(sessionId: string, token: string, runnerId: string, ttlMs: number): Promise<'claimed' | 'withdrawn'> {
    return (await WITHDRAW_OFFER.run(this.redis, [fenceKey(sessionId), withdrawnOffersKey(sessionId, token)], [token, runnerId, ttlMs])) as 'claimed' | 'withdrawn';
  }

  /**
   * Extend a live fence. Given the Run, a cancel mark on it answers `canceled` (the fence is
   * extended all the same: the runner ends the attempt and reports it under this lease), so a
   * heartbeat repairs a `lease.cancel` that never reached the runner. A fence not live is
   * `expired` when this token's claim is still there, run out (nothing renewed it in time), else
   * `lost` (released, dropped by a newer attempt's claim, or never claimed).
   */
  async extend(sessionId: string, token: string, ttlMs: number, runId?: string): Promise<'ok' | 'lost' | 'expired' | 'canceled'> {
    const keyList = runId ? [fenceKey(sessionId), cancelMarkKey(sessionId, runId)] : [fenceKey(sessionId)];
    return (await EXTEND.run(this.redis, keyList, [token, ttlMs])) as 'ok' | 'lost' | 'expired' | 'canceled';
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
