import { randomBytes } from 'node:crypto';
import { ApiError, scrubSecrets } from '@agentplane/core';
import { keys, LuaScript, tags, type Redis } from '@agentplane/store';
import { checkEndpointUrl, type EgressPolicy } from '@agentplane/core';
import { egressFetch } from '../webhooks/egress-fetch.js';
import { capResponseBody } from '../mcp/egress.js';
import { parseMtlsCredential, parseOAuth2Credential, type OAuth2PeerCredential } from '../vaults/peer-credentials.js';
import type { ResolvedSecret, VaultService } from '../vaults/service.js';
import type { Discovery } from './card.js';

type OAuth2Security = Extract<Discovery['security'], { kind: 'oauth2_authorization_code' }>;

/**
 * What one call presents to the peer: headers (Bearer, OAuth2 access token) and, for mTLS, the
 * client certificate and key for the TLS connection. Built in the API process for one call and
 * never stored, logged, sent to a runner or put in an event.
 */
export interface PeerCustody {
  headers: Record<string, string>;
  tls?: { cert: string; key: string } | undefined;
  /**
   * OAuth2: the peer refused this access token (401) before its expiry (revoked, rotated): the
   * credential that replaces it (refreshed once across every process, as an expired one is),
   * or null when the stored token is still the refused one and cannot be refreshed.
   */
  renew?: () => Promise<PeerCustody | null>;
}

export interface CustodySettings {
  egress?: EgressPolicy | undefined;
  /** An access token this close to `expires_at` is refreshed first. */
  refreshSkewMs: number;
  /** Time limit of the token endpoint POST. */
  refreshTimeoutMs: number;
  /**
   * How long a call waits for another process's refresh of the same credential (a holder that
   * died leaves its lock until it expires, `refreshTimeoutMs` plus a margin: the wait outlasts it).
   */
  refreshWaitMs: number;
}

const EXPIRED_SKEW_MS = 30_000;
/** How soon after renewing a secret's token for a peer's refusal a process renews it for one again. */
const RENEW_AFTER_REFUSAL_MS = 60_000;
/** Secret generations whose first-seen token life a process keeps (the oldest go first). */
const FIRST_SIGHTS_KEPT = 10_000;
/** The most of a token endpoint's answer read (a token response is a few hundred bytes). */
const MAX_TOKEN_RESPONSE_BYTES = 64 * 1024;
/**
 * The longest access token lifetime taken from a token response's `expires_in` (a year): a longer
 * one is cut to it, so the expiry written back is always a valid time.
 */
const MAX_EXPIRES_IN_S = 365 * 86_400;

/**
 * A token response's `expires_in` in seconds (RFC 6749 §5.1: a number; some servers send it as a
 * string of digits), at most MAX_EXPIRES_IN_S; null when absent or not a positive number.
 */
function expiresInSeconds(value: unknown): number | null {
  const n = typeof value === 'number' ? value : typeof value === 'string' && /^\s*\d{1,15}\s*$/.test(value) ? Number(value) : Number.NaN;
  return Number.isFinite(n) && n > 0 ? Math.min(n, MAX_EXPIRES_IN_S) : null;
}

/** What the refresh lock outlives the token endpoint POST by: the re-read before it and the write-back after it. */
const LOCK_MARGIN_MS = 5_000;
/** How often a call waiting for another process's refresh looks again. */
const WAIT_POLL_MS = 50;

/**
 * The lock of one credential's refresh, shared by every process: in the Workspace's slot, one
 * per vault secret (docs/A2A_TOOLS.md, "Peer credential custody").
 */
export const oauth2RefreshLockKey = (ws: string, vaultId: string, name: string): string =>
  keys.scoped(tags.workspace(ws), `oauth2-refresh:${vaultId}:${name}`);

/** Deletes the lock only while it still names its owner: a holder whose lock expired cannot free the next holder's. */
const releaseLock = new LuaScript('oauth2-refresh-release', `
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`);

/** A refresh's outcome: the access token it stored, or the secret another writer stored first (to be looked at again). */
type RefreshOutcome = { access_token: string } | { secret: ResolvedSecret | null };

/**
 * Peer credential custody adapters (docs/A2A_TOOLS.md, "Peer credential custody"): the card's
 * one security alternative decides which vault secret kinds count and how they are presented.
 * OAuth2 access tokens past (or near) their expiry are refreshed with the standard
 * `grant_type=refresh_token` POST to the card's signed token endpoint, asking for exactly the
 * scopes the card requires, and the rotated token is written back with a compare-and-swap on
 * the secret's generation.
 *
 * A refresh token is used once across every process: an authorization server that rotates
 * refresh tokens with reuse detection revokes the whole grant when one is presented twice. The
 * calls of one process share one refresh per secret; across processes the refresh is done under
 * a Redis lock (owner-checked, expiring: a holder that died frees it), its holder re-reads the
 * secret under the lock and sends the POST only if it is still the expired generation, bounded
 * to end before the lock does; the other processes wait, bounded, for the secret's generation to
 * move (or the lock to be free) and use what the holder stored.
 */
export class PeerCustodian {
  constructor(
    private readonly vaults: VaultService,
    private readonly redis: Redis,
    private readonly settings: Partial<CustodySettings> = {},
  ) {}

  async resolve(ws: string, vaultIds: readonly string[], discovery: Pick<Discovery, 'interface' | 'security'>, refused?: string): Promise<PeerCustody> {
    const url = discovery.interface.url;
    const security = discovery.security;
    if (security.kind === 'bearer') {
      const secret = await this.vaults.resolve(ws, vaultIds, ['mcp_bearer', 'mcp_header'], url);
      if (!secret) return { headers: {} };
      return { headers: secret.kind === 'mcp_header' && secret.header_name ? { [secret.header_name]: secret.value } : { Authorization: `Bearer ${secret.value}` } };
    }
    if (security.kind === 'mtls') {
      const secret = await this.vaults.resolve(ws, vaultIds, ['a2a_mtls'], url);
      if (!secret) return { headers: {} };
      const c = parseMtlsCredential(secret.value, `vault ${secret.vault_id} secret ${secret.name}`);
      return { headers: {}, tls: { cert: c.certificate, key: c.private_key } };
    }
    let secret = await this.vaults.resolve(ws, vaultIds, ['a2a_oauth2'], url);
    if (!secret) return { headers: {} };
    const renewKey = `${ws}/${secret.vault_id}/${secret.name}`;
    const custody = (token: string): PeerCustody => ({
      headers: { Authorization: `Bearer ${token}` },
      renew: async () => {
        // A peer that refuses every token (a scope it will never grant, a misconfigured peer)
        // gets one refresh a minute from this process, not one per call.
        if (token === refused || Date.now() - (this.renewedAt.get(renewKey) ?? 0) < RENEW_AFTER_REFUSAL_MS) return null;
        this.renewedAt.set(renewKey, Date.now());
        if (this.renewedAt.size > FIRST_SIGHTS_KEPT) this.renewedAt.delete(this.renewedAt.keys().next().value as string);
        return this.resolve(ws, vaultIds, discovery, token);
      },
    });
    for (let attempt = 0; ; attempt++) {
      const cred = parseOAuth2Credential(secret.value, `vault ${secret.vault_id} secret ${secret.name}`);
      // A token the peer refused is refreshed like an expired one (unless another call did already).
      const stale = cred.access_token === refused;
      if (!stale && !this.expired(cred, secret)) return custody(cred.access_token);
      if (!cred.refresh_token) {
        throw new ApiError('validation.conflict', `the OAuth2 access token in vault ${secret.vault_id} secret ${secret.name} ${stale ? 'was refused by the peer' : 'expired'} and no refresh token is held`);
      }
      if (attempt >= 3) throw new ApiError('validation.conflict', 'the OAuth2 token was rotated concurrently; try again');
      const out = await this.refreshShared(ws, secret, url, security);
      if ('access_token' in out) return custody(out.access_token);
      if (!out.secret) throw new ApiError('validation.conflict', `the OAuth2 credential in vault ${secret.vault_id} was removed`);
      secret = out.secret;
    }
  }

  /** The refreshes under way in this process, one per secret: every call of the process that finds the token expired joins it. */
  private readonly inflight = new Map<string, Promise<RefreshOutcome>>();
  /** Per secret generation: how long its access token had left when this process first read it. */
  private readonly lifeAtFirstSight = new Map<string, number>();
  /** Per secret: when this process last renewed its token for a peer's refusal (`PeerCustody.renew`). */
  private readonly renewedAt = new Map<string, number>();

  private refreshShared(ws: string, read: ResolvedSecret, url: string, security: OAuth2Security): Promise<RefreshOutcome> {
    const key = `${ws}/${read.vault_id}/${read.name}`;
    let p = this.inflight.get(key);
    if (!p) {
      p = this.refreshLocked(ws, read, url, security).finally(() => this.inflight.delete(key));
      this.inflight.set(key, p);
    }
    return p;
  }

  /** The secret `read` names, read again from Redis (null when it is gone or no longer the one for `url`). */
  private async reread(ws: string, read: ResolvedSecret, url: string): Promise<ResolvedSecret | null> {
    const again = await this.vaults.resolve(ws, [read.vault_id], ['a2a_oauth2'], url);
    return again && again.name === read.name ? again : null;
  }

  /** One refresh of `read` across every process: under the secret's lock, or waiting for the process that holds it. */
  private async refreshLocked(ws: string, read: ResolvedSecret, url: string, security: OAuth2Security): Promise<RefreshOutcome> {
    const timeoutMs = this.settings.refreshTimeoutMs ?? 10_000;
    const lockMs = timeoutMs + LOCK_MARGIN_MS;
    const deadline = Date.now() + (this.settings.refreshWaitMs ?? lockMs + LOCK_MARGIN_MS);
    const lock = oauth2RefreshLockKey(ws, read.vault_id, read.name);
    const owner = randomBytes(16).toString('hex');
    for (;;) {
      const lockedAt = Date.now();
      if ((await this.redis.set(lock, owner, 'PX', lockMs, 'NX')) === 'OK') {
        try {
          // Under the lock: another process may have stored a rotated token since `read`.
          const current = await this.reread(ws, read, url);
          if (!current || current.generation !== read.generation) return { secret: current };
          const cred = parseOAuth2Credential(current.value, `vault ${current.vault_id} secret ${current.name}`);
          // The POST ends (or is aborted) before the lock expires, so no other process can
          // take the lock and send the same refresh token while this one is still in flight.
          const bound = Math.min(timeoutMs, lockedAt + lockMs - LOCK_MARGIN_MS - Date.now());
          // The owner check just before the POST: a lock lost meanwhile (expired, a failover) sends nothing.
          if (bound <= 0 || (await this.redis.get(lock)) !== owner) throw new ApiError('validation.conflict', 'the OAuth2 token refresh ran out of time; try again');
          const { next, unusable, quote } = await this.refresh(cred, security, bound);
          let refused = unusable;
          if (refused === null) {
            try {
              if (await this.writeBack(ws, current, next)) return { access_token: next.access_token };
              // Another write came first (a rotation by hand, a removal): what is stored now counts.
              return { secret: await this.reread(ws, read, url) };
            } catch (err) {
              if (!(err instanceof ApiError) || err.type !== 'validation.malformed') throw err;
              refused = quote(`the OAuth2 token endpoint's answer cannot be stored in vault ${current.vault_id} secret ${current.name}: ${err.message}`);
            }
          }
          // The access token cannot be used, but the endpoint may have rotated the refresh token,
          // spending the old one: the new one is kept, or the next refresh would present a spent
          // token (which an endpoint with reuse detection answers by revoking the grant).
          if (next.refresh_token !== cred.refresh_token) await this.writeBack(ws, current, { ...cred, refresh_token: next.refresh_token, token_url: next.token_url }).catch(() => false);
          throw new ApiError('validation.conflict', refused);
        } finally {
          await releaseLock.run(this.redis, [lock], [owner]).catch(() => undefined);
        }
      }
      // Another process holds the lock: wait for its write-back (or for the lock to be free).
      await new Promise((r) => setTimeout(r, WAIT_POLL_MS));
      const current = await this.reread(ws, read, url);
      if (!current || current.generation !== read.generation) return { secret: current };
      if (Date.now() >= deadline) throw new ApiError('validation.conflict', 'another refresh of the OAuth2 token did not finish in time; try again');
    }
  }

  /**
   * Whether a stored access token is to be refreshed before use: past its expiry, or within the
   * refresh margin of it. The margin is at most half the life the token had when this process
   * first saw it (its secret's generation): a token issued for less than the margin is used
   * while it lasts, not refreshed on every call.
   */
  private expired(cred: OAuth2PeerCredential, secret: ResolvedSecret): boolean {
    if (cred.expires_at === null) return false;
    const left = Date.parse(cred.expires_at) - Date.now();
    if (!(left > 0)) return true;
    const key = `${secret.vault_id}/${secret.name}@${secret.generation}`;
    let life = this.lifeAtFirstSight.get(key);
    if (life === undefined) {
      life = left;
      this.lifeAtFirstSight.set(key, life);
      if (this.lifeAtFirstSight.size > FIRST_SIGHTS_KEPT) this.lifeAtFirstSight.delete(this.lifeAtFirstSight.keys().next().value as string);
    }
    return left <= Math.min(this.settings.refreshSkewMs ?? EXPIRED_SKEW_MS, life / 2);
  }

  /**
   * The standard refresh (RFC 6749 §6) at the card's token endpoint, for exactly the card's
   * scopes: the credential the answer makes (`next`), and why its access token cannot be used
   * when it cannot (`unusable`; the refresh token it rotated still counts). `quote` scrubs a
   * text of every token sent or received.
   */
  private async refresh(cred: OAuth2PeerCredential, security: OAuth2Security, timeoutMs: number): Promise<{ next: OAuth2PeerCredential; unusable: string | null; quote: (text: string) => string }> {
    const tokenUrl = security.token_url;
    if (cred.token_url !== null && new URL(cred.token_url).href !== new URL(tokenUrl).href) {
      throw new ApiError('validation.conflict', `the credential's token endpoint is not the card's signed token endpoint ${tokenUrl}`);
    }
    const url = this.settings.egress ? checkEndpointUrl(tokenUrl, this.settings.egress) : new URL(tokenUrl);
    // Inside the outbound address guard, connecting to the very address that was checked.
    const send = this.settings.egress ? egressFetch({ policy: this.settings.egress }) : fetch;
    const form = new URLSearchParams({ grant_type: 'refresh_token', refresh_token: cred.refresh_token ?? '' });
    if (security.scopes.length > 0) form.set('scope', security.scopes.join(' '));
    const headers: Record<string, string> = { 'content-type': 'application/x-www-form-urlencoded', accept: 'application/json' };
    if (cred.client_id !== null && cred.client_secret !== null) {
      headers.authorization = `Basic ${Buffer.from(`${encodeURIComponent(cred.client_id)}:${encodeURIComponent(cred.client_secret)}`).toString('base64')}`;
    } else if (cred.client_id !== null) form.set('client_id', cred.client_id);
    // What the endpoint answers is quoted in errors (a tool result the event log keeps) without
    // anything of the credential: an endpoint may echo the refresh token or client secret it got.
    const sent: unknown[] = [cred.refresh_token, cred.client_secret, cred.access_token, headers.authorization?.replace(/^Basic /, '')];
    const quote = (text: string) => scrubSecrets(text, sent.filter((v): v is string => typeof v === 'string' && v.length > 0));
    let res: Response;
    try {
      res = await send(url, { method: 'POST', headers, body: form.toString(), redirect: 'error', signal: AbortSignal.timeout(timeoutMs) });
    } catch (err) {
      throw new ApiError('validation.conflict', quote(`the OAuth2 token endpoint could not be reached: ${(err as Error).message}`));
    }
    // Read up to MAX_TOKEN_RESPONSE_BYTES: an endpoint that answers more is cut off there.
    let text: string;
    try {
      text = await capResponseBody(res, MAX_TOKEN_RESPONSE_BYTES).text();
    } catch (err) {
      throw new ApiError('validation.conflict', quote(`the OAuth2 token refresh failed: ${(err as Error).message}`));
    }
    let body: Record<string, unknown> | null = null;
    try {
      const parsed: unknown = JSON.parse(text);
      if (typeof parsed === 'object' && parsed !== null && !Array.isArray(parsed)) body = parsed as Record<string, unknown>;
    } catch {
      body = null;
    }
    if (!res.ok || !body || typeof body.access_token !== 'string' || body.access_token === '') {
      const reason = body && typeof body.error === 'string' ? body.error : `status ${res.status}`;
      throw new ApiError('validation.conflict', quote(`the OAuth2 token refresh was refused (${reason})`));
    }
    const expiresIn = expiresInSeconds(body.expires_in);
    const next: OAuth2PeerCredential = {
      ...cred,
      // The endpoint the first refresh went to is kept: a card naming another one later (another
      // tool source matching the secret) is refused above, not sent the refresh token.
      token_url: cred.token_url ?? tokenUrl,
      access_token: body.access_token,
      // A rotated refresh token replaces the old one; otherwise the old one stays.
      refresh_token: typeof body.refresh_token === 'string' && body.refresh_token !== '' ? body.refresh_token : cred.refresh_token,
      expires_at: expiresIn === null ? null : new Date(Date.now() + expiresIn * 1000).toISOString(),
    };
    // Nor of the tokens it issued, should they not be used.
    sent.push(body.access_token, body.refresh_token);
    if (typeof body.token_type === 'string' && body.token_type.toLowerCase() !== 'bearer') {
      return { next, unusable: quote(`the OAuth2 token endpoint issued a ${body.token_type} token, not Bearer`), quote };
    }
    return { next, unusable: null, quote };
  }

  /** Stores the rotated credential if the secret is still at the generation read (CAS); false when another write came first. */
  private async writeBack(ws: string, secret: ResolvedSecret, next: OAuth2PeerCredential): Promise<boolean> {
    try {
      await this.vaults.putSecret(ws, secret.vault_id, secret.name, {
        kind: 'a2a_oauth2', match: secret.match, value: JSON.stringify(next), expected_generation: secret.generation,
      });
      return true;
    } catch (err) {
      if (err instanceof ApiError && err.type === 'validation.conflict') return false;
      throw err;
    }
  }
}
