import { newSecret, secretDigest } from '@agentplane/core';
import { cachedGet, cachedPeekShared, forgetWritten, keys, type Redis } from '@agentplane/store';
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

/** Bearer digests live in their own keys; revoking a bearer deletes its digest key. */
export class CredentialIndex {
  constructor(private readonly redis: Redis) {}

  async put(digest: string, record: AuthRecord): Promise<void> {
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

  async revoke(digest: string): Promise<void> {
    await this.redis.del(keys.auth(digest));
    forgetWritten(this.redis, [keys.auth(digest)]);
  }

  /** The digest of a credential's live secret, kept per credential so it can be revoked by id. */
  static digestKey(credentialId: string): string {
    return keys.global(`digest:${credentialId}`);
  }

  async rememberDigest(credentialId: string, digest: string): Promise<void> {
    await this.redis.set(CredentialIndex.digestKey(credentialId), digest);
  }

  async liveDigest(credentialId: string): Promise<string | null> {
    return this.redis.get(CredentialIndex.digestKey(credentialId));
  }

  /** Replace a credential's live secret atomically enough: new digest first, then the old one goes. */
  async swap(credentialId: string, next: { digest: string; record: AuthRecord } | null): Promise<void> {
    const old = await this.liveDigest(credentialId);
    if (next) {
      await this.put(next.digest, next.record);
      await this.rememberDigest(credentialId, next.digest);
    } else {
      await this.redis.del(CredentialIndex.digestKey(credentialId));
    }
    if (old && old !== next?.digest) await this.revoke(old);
  }
}
