import { createPrivateKey, X509Certificate } from 'node:crypto';
import { ApiError } from '@agentplane/core';

/**
 * Credentials for an external A2A peer, held as vault secrets whose value is one line of JSON
 * (docs/A2A_TOOLS.md, "Peer credential custody"). They are opened only in the API process.
 */
export interface OAuth2PeerCredential {
  access_token: string;
  /** When the access token stops working (RFC 3339); null when unknown (treated as valid). */
  expires_at: string | null;
  refresh_token: string | null;
  /** The authorization server's token endpoint; must be the card's signed `tokenUrl` when set. */
  token_url: string | null;
  client_id: string | null;
  client_secret: string | null;
}

export interface MtlsPeerCredential {
  /** PEM: the client certificate (and any intermediates). */
  certificate: string;
  /** PEM: its private key. */
  private_key: string;
}

const str = (v: unknown): v is string => typeof v === 'string' && v.length > 0;
const optStr = (o: Record<string, unknown>, k: string, at: string): string | null => {
  const v = o[k];
  if (v === undefined || v === null) return null;
  if (!str(v)) throw new ApiError('validation.malformed', `${at}.${k}: must be a non-empty string`);
  return v;
};

function parseObject(value: string, at: string): Record<string, unknown> {
  let raw: unknown;
  try {
    raw = JSON.parse(value);
  } catch {
    throw new ApiError('validation.malformed', `${at}: must be one line of JSON`);
  }
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) throw new ApiError('validation.malformed', `${at}: must be a JSON object`);
  return raw as Record<string, unknown>;
}

export function parseOAuth2Credential(value: string, at = 'body.value'): OAuth2PeerCredential {
  const o = parseObject(value, at);
  const known = ['access_token', 'expires_at', 'refresh_token', 'token_url', 'client_id', 'client_secret'];
  const extra = Object.keys(o).filter((k) => !known.includes(k));
  if (extra.length > 0) throw new ApiError('validation.malformed', `${at}: unknown member ${extra[0]}`);
  if (!str(o.access_token)) throw new ApiError('validation.malformed', `${at}.access_token: required`);
  const expiresAt = optStr(o, 'expires_at', at);
  if (expiresAt !== null && !Number.isFinite(Date.parse(expiresAt))) throw new ApiError('validation.malformed', `${at}.expires_at: not an RFC 3339 timestamp`);
  const tokenUrl = optStr(o, 'token_url', at);
  if (tokenUrl !== null) {
    let u: URL;
    try {
      u = new URL(tokenUrl);
    } catch {
      throw new ApiError('validation.malformed', `${at}.token_url: not a URL`);
    }
    if (u.protocol !== 'https:' && u.protocol !== 'http:') throw new ApiError('validation.malformed', `${at}.token_url: must be http or https`);
  }
  return {
    access_token: o.access_token, expires_at: expiresAt, refresh_token: optStr(o, 'refresh_token', at), token_url: tokenUrl,
    client_id: optStr(o, 'client_id', at), client_secret: optStr(o, 'client_secret', at),
  };
}

export function parseMtlsCredential(value: string, at = 'body.value'): MtlsPeerCredential {
  const o = parseObject(value, at);
  if (!str(o.certificate) || !str(o.private_key)) throw new ApiError('validation.malformed', `${at}: certificate and private_key (PEM) are required`);
  const extra = Object.keys(o).filter((k) => k !== 'certificate' && k !== 'private_key');
  if (extra.length > 0) throw new ApiError('validation.malformed', `${at}: unknown member ${extra[0]}`);
  let cert: X509Certificate;
  try {
    cert = new X509Certificate(o.certificate);
    createPrivateKey(o.private_key);
  } catch {
    throw new ApiError('validation.malformed', `${at}: certificate or private_key is not valid PEM`);
  }
  if (!cert.checkPrivateKey(createPrivateKey(o.private_key))) throw new ApiError('validation.malformed', `${at}: private_key does not belong to the certificate`);
  return { certificate: o.certificate, private_key: o.private_key };
}

/** Write-time check of a peer credential's value (the value itself is never echoed). */
export function checkPeerCredential(kind: 'a2a_oauth2' | 'a2a_mtls', value: string): void {
  if (kind === 'a2a_oauth2') parseOAuth2Credential(value);
  else parseMtlsCredential(value);
}
