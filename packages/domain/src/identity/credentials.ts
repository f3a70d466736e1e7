import { ApiError, newSecret, secretDigest } from '@agentplane/core';
import { cachedGet, cachedPeekShared, forgetWritten, keys, LuaScript, type Redis } from '@agentplane/store';
import type { AuthRecord } from './model.js';

/** Bearer secret prefixes; a leaked secret says what it is. */
export const SECRET_PREFIX = {
  api_key: 'ap_key',
  principal_credential: 'ap_pcred',
  runner_credential: 'ap_runner',
} as const;

export interface IssuedSecret {
  secret: string;
  digest: string;
  hint: string;
}

export function issueSecret(kind: keyof typeof SECRET_PREFIX): IssuedSecret {
  const secret = newSecret(SECRET_PREFIX[kind]);
  return { secret, digest: secretDigest(secret), hint: secret.slice(-4) };
}

/**
 * A credential's pointer (`digestKey`) names its live secret as `<generation> <digest>`; a
 * revoked credential's pointer is the tombstone `revoked`. The pointer and a digest's auth
 * record live in different slots (one is found by credential id, the other by bearer digest), so
 * no script can change both: the pointer decides instead. Only the writer whose compare-and-set
 * moves the pointer off a digest deletes that digest's record, a writer whose generation lost
 * deletes the record it wrote, and a record is only ever rewritten while it still exists.
 */
const REVOKED = 'revoked';
/** How long a revoked credential's tombstone outlives the revocation (a racing rotation lasts milliseconds). */
const TOMBSTONE_SECONDS = 86_400;

const POINTER_PARSE = `
local function parse(v)
  if not v then return -1, '' end
  if v == '${REVOKED}' then return nil, '' end
  local sp = string.find(v, ' ', 1, true)
  if not sp then return 0, v end
  return tonumber(string.sub(v, 1, sp - 1)), string.sub(v, sp + 1)
end
`;

/**
 * KEYS[1] the pointer; ARGV[1] generation, ARGV[2] digest, ARGV[3] 'same' to also replace a live
 * secret of the same generation. Moves the pointer to the digest when the generation is newer
 * than the live one (or, with 'same', as new): returns {1, displaced digest or ''}; else
 * {0, 'revoked' | 'superseded'} and nothing changes.
 */
const INSTALL = new LuaScript('credential-install', `${POINTER_PARSE}
local gen, digest = parse(redis.call('GET', KEYS[1]))
if gen == nil then return {0, 'revoked'} end
local g = tonumber(ARGV[1])
if digest ~= '' and (gen > g or (gen == g and ARGV[3] ~= 'same')) then return {0, 'superseded'} end
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. ARGV[2])
return {1, digest}
`);

/** KEYS[1] the pointer; ARGV[1] tombstone TTL seconds. Sets the tombstone; returns the digest it displaced, or ''. */
const TOMBSTONE = new LuaScript('credential-tombstone', `${POINTER_PARSE}
local gen, digest = parse(redis.call('GET', KEYS[1]))
redis.call('SET', KEYS[1], '${REVOKED}', 'EX', tonumber(ARGV[1]))
return digest
`);

/**
 * KEYS[1] a digest's auth record; ARGV[1] the new record, ARGV[2] its credential id, ARGV[3] its
 * generation, ARGV[4] its document version. Rewrites the record only while it exists (a deleted
 * secret stays deleted), belongs to that credential and generation, and was written from an
 * older document version. Returns 1 when written.
 */
const REWRITE = new LuaScript('credential-rewrite', `
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local ok, rec = pcall(cjson.decode, cur)
if not ok or type(rec) ~= 'table' then return 0 end
if rec.credential_id ~= ARGV[2] or tonumber(rec.generation_number) ~= tonumber(ARGV[3]) then return 0 end
local v = tonumber(rec.document_version) or 0
if v >= tonumber(ARGV[4]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1])
return 1
`);

function parsePointer(v: string | null): { generation: number; digest: string } | null {
  if (!v || v === REVOKED) return null;
  const sp = v.indexOf(' ');
  return sp < 0 ? { generation: 0, digest: v } : { generation: Number(v.slice(0, sp)), digest: v.slice(sp + 1) };
}

/** Bearer digests live in their own keys; revoking a bearer deletes its digest key. */
export class CredentialIndex {
  constructor(private readonly redis: Redis) {}

  private async put(digest: string, record: AuthRecord): Promise<void> {
    await this.redis.set(keys.auth(digest), JSON.stringify(record));
    forgetWritten(this.redis, [keys.auth(digest)]);
  }

  /**
   * The auth record of a bearer, by its `secretDigest`, from the read cache without waiting (one
   * parsed copy shared by every request: read it, never change it); undefined when the cache
   * cannot answer now (use resolve).
   */
  peek(digest: string): Readonly<AuthRecord> | null | undefined {
    return cachedPeekShared<AuthRecord>(this.redis, keys.auth(digest));
  }

  /** The auth record of a bearer, by its `secretDigest`. */
  async resolve(digest: string): Promise<AuthRecord | null> {
    // Through the process's read cache: Redis invalidates it on every change of the key, so a
    // revoked bearer is refused on the next request (docs/ARCHITECTURE.md, "The read cache").
    const raw = await cachedGet(this.redis, keys.auth(digest));
    return raw ? (JSON.parse(raw) as AuthRecord) : null;
  }

  private async forget(digest: string): Promise<void> {
    await this.redis.del(keys.auth(digest));
    forgetWritten(this.redis, [keys.auth(digest)]);
  }

  /** The pointer to a credential's live secret, kept per credential so it can be revoked by id. */
  static digestKey(credentialId: string): string {
    return keys.global(`digest:${credentialId}`);
  }

  /** The digest of a credential's live secret; null when it has none (revoked). */
  async liveDigest(credentialId: string): Promise<string | null> {
    return parsePointer(await this.redis.get(CredentialIndex.digestKey(credentialId)))?.digest ?? null;
  }

  /**
   * Make `next` the credential's only live secret (its record's `generation_number` orders
   * concurrent swaps: an older generation than the live one loses), or with null revoke whatever
   * secret is live, for good. A losing swap leaves nothing of its secret and throws 409: a
   * revoked credential `runtime.invalid_transition`, a newer rotation `validation.conflict`.
   * `sameGeneration`: a live secret of the record's own generation is replaced too (a first
   * secret re-issued in place of one never shown), where a rotation of that generation loses.
   */
  async swap(credentialId: string, next: { digest: string; record: AuthRecord } | null, options: { sameGeneration?: boolean } = {}): Promise<void> {
    const pointer = CredentialIndex.digestKey(credentialId);
    if (!next) {
      const old = String(await TOMBSTONE.run(this.redis, [pointer], [TOMBSTONE_SECONDS]));
      if (old) await this.forget(old);
      return;
    }
    await this.put(next.digest, next.record);
    const [won, other] = (await INSTALL.run(this.redis, [pointer], [next.record.generation_number, next.digest, options.sameGeneration ? 'same' : ''])) as [number, string];
    if (Number(won) !== 1) {
      await this.forget(next.digest);
      if (other === REVOKED) throw new ApiError('runtime.invalid_transition', `${credentialId} was revoked; the new secret was not issued`);
      throw new ApiError('validation.conflict', `a concurrent rotation of ${credentialId} won; re-read it and rotate again if needed`);
    }
    if (other && other !== next.digest) await this.forget(other);
  }

  /**
   * Rewrite the live secret's record after a change of its credential (role, rate limit):
   * written only while that secret is still live and of this generation, and only over a record
   * from an older document version, so a change racing a rotation or revocation never brings a
   * dead secret back nor puts an older record over a newer one.
   */
  async refresh(record: AuthRecord & { document_version: number }): Promise<void> {
    const live = parsePointer(await this.redis.get(CredentialIndex.digestKey(record.credential_id)));
    if (!live) return;
    await REWRITE.run(this.redis, [keys.auth(live.digest)], [JSON.stringify(record), record.credential_id, record.generation_number, record.document_version]);
  }
}
