import { ApiError, scrubSecrets } from '@agentplane/core';
import { checkEndpointUrl, type EgressPolicy } from '../webhooks/ssrf.js';
import { egressFetch } from '../webhooks/egress-fetch.js';
import { capResponseBody } from '../mcp/egress.js';
import { parseMtlsCredential, parseOAuth2Credential, type OAuth2PeerCredential } from '../vaults/peer-credentials.js';
import type { ResolvedSecret, VaultService } from '../vaults/service.js';
import type { Discovery } from './card.js';

/**
 * What one call presents to the peer: headers (Bearer, OAuth2 access token) and, for mTLS, the
 * client certificate and key for the TLS connection. Built in the API process for one call and
 * never stored, logged, sent to a runner or put in an event.
 */
export interface PeerCustody {
  headers: Record<string, string>;
  tls?: { cert: string; key: string } | undefined;
}

export interface CustodySettings {
  egress?: EgressPolicy | undefined;
  /** An access token this close to `expires_at` is refreshed first. */
  refreshSkewMs: number;
  /** Time limit of the token endpoint POST. */
  refreshTimeoutMs: number;
}

const EXPIRED_SKEW_MS = 30_000;
/** The most of a token endpoint's answer read (a token response is a few hundred bytes). */
const MAX_TOKEN_RESPONSE_BYTES = 64 * 1024;

/**
 * Peer credential custody adapters (docs/A2A_TOOLS.md, "Peer credential custody"): the card's
 * one security alternative decides which vault secret kinds count and how they are presented.
 * OAuth2 access tokens past (or near) their expiry are refreshed with the standard
 * `grant_type=refresh_token` POST to the card's signed token endpoint, asking for exactly the
 * scopes the card requires, and the rotated token is written back with a compare-and-swap on
 * the secret's generation.
 */
export class PeerCustodian {
  constructor(private readonly vaults: VaultService, private readonly settings: Partial<CustodySettings> = {}) {}

  async resolve(ws: string, vaultIds: readonly string[], discovery: Pick<Discovery, 'interface' | 'security'>): Promise<PeerCustody> {
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
    for (let attempt = 0; ; attempt++) {
      const cred = parseOAuth2Credential(secret.value, `vault ${secret.vault_id} secret ${secret.name}`);
      if (!this.expired(cred)) return { headers: { Authorization: `Bearer ${cred.access_token}` } };
      if (!cred.refresh_token) throw new ApiError('validation.conflict', `the OAuth2 access token in vault ${secret.vault_id} secret ${secret.name} expired and no refresh token is held`);
      if (attempt >= 3) throw new ApiError('validation.conflict', 'the OAuth2 token was rotated concurrently; try again');
      const read: ResolvedSecret = secret;
      let refreshed: { stored: boolean; access_token: string };
      try {
        refreshed = await this.refreshOnce(ws, read, cred, security);
      } catch (err) {
        // A refresh token is often single-use: a refresh refused because another process
        // rotated the token first is answered by what that process stored.
        // Its write-back may land just after our refusal: look again a few times.
        let again: ResolvedSecret | null = null;
        for (let look = 0; look < 5; look++) {
          again = await this.vaults.resolve(ws, vaultIds, ['a2a_oauth2'], url);
          if (!again || again.generation !== read.generation) break;
          await new Promise((r) => setTimeout(r, 100));
        }
        if (again && again.generation !== read.generation) {
          secret = again;
          continue;
        }
        throw err;
      }
      if (refreshed.stored) return { headers: { Authorization: `Bearer ${refreshed.access_token}` } };
      // The CAS lost: another call stored a rotated token first; use what it stored.
      const again = await this.vaults.resolve(ws, vaultIds, ['a2a_oauth2'], url);
      if (!again) throw new ApiError('validation.conflict', `the OAuth2 credential in vault ${read.vault_id} was removed`);
      secret = again;
    }
  }

  /** Calls of this process refreshing the same secret generation share one refresh. */
  private readonly inflight = new Map<string, Promise<{ stored: boolean; access_token: string }>>();

  private refreshOnce(
    ws: string, secret: ResolvedSecret, cred: OAuth2PeerCredential, security: Extract<Discovery['security'], { kind: 'oauth2_authorization_code' }>,
  ): Promise<{ stored: boolean; access_token: string }> {
    const key = `${ws}/${secret.vault_id}/${secret.name}/${secret.generation}`;
    let p = this.inflight.get(key);
    if (!p) {
      p = (async () => {
        const next = await this.refresh(cred, security);
        return { stored: await this.writeBack(ws, secret, next), access_token: next.access_token };
      })().finally(() => this.inflight.delete(key));
      this.inflight.set(key, p);
    }
    return p;
  }

  private expired(cred: OAuth2PeerCredential): boolean {
    if (cred.expires_at === null) return false;
    return Date.parse(cred.expires_at) - (this.settings.refreshSkewMs ?? EXPIRED_SKEW_MS) <= Date.now();
  }

  /** The standard refresh (RFC 6749 §6) at the card's token endpoint, for exactly the card's scopes. */
  private async refresh(cred: OAuth2PeerCredential, security: Extract<Discovery['security'], { kind: 'oauth2_authorization_code' }>): Promise<OAuth2PeerCredential> {
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
      res = await send(url, { method: 'POST', headers, body: form.toString(), redirect: 'error', signal: AbortSignal.timeout(this.settings.refreshTimeoutMs ?? 10_000) });
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
    if (typeof body.token_type === 'string' && body.token_type.toLowerCase() !== 'bearer') {
      // Nor of the tokens it issued, which are not used.
      sent.push(body.access_token, body.refresh_token);
      throw new ApiError('validation.conflict', quote(`the OAuth2 token endpoint issued a ${body.token_type} token, not Bearer`));
    }
    const expiresIn = typeof body.expires_in === 'number' && body.expires_in > 0 ? body.expires_in : null;
    return {
      ...cred,
      access_token: body.access_token,
      // A rotated refresh token replaces the old one; otherwise the old one stays.
      refresh_token: typeof body.refresh_token === 'string' && body.refresh_token !== '' ? body.refresh_token : cred.refresh_token,
      expires_at: expiresIn === null ? null : new Date(Date.now() + expiresIn * 1000).toISOString(),
    };
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
