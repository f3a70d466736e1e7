import { createPrivateKey, X509Certificate, type KeyObject } from 'node:crypto';
import { ApiError, Nullable, Obj, Timestamp, Type, validator, type Static, type TSchema } from '@agentplane/core';

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

const Text = () => Type.String({ minLength: 1 });
const OptionalText = () => Type.Optional(Nullable(Text()));

const OAuth2Value = Obj({
  access_token: Text(),
  expires_at: Type.Optional(Nullable(Timestamp())),
  refresh_token: OptionalText(),
  token_url: Type.Optional(Nullable(Type.String({ format: 'uri', pattern: '^https?://' }))),
  client_id: OptionalText(),
  client_secret: OptionalText(),
});

const MtlsValue = Obj({ certificate: Text(), private_key: Text() });

/** A secret's value: one line of JSON checked against `schema`; errors name `at`. */
function parseValue<S extends TSchema>(schema: S, value: string, at: string): Static<S> {
  let raw: unknown;
  try {
    raw = JSON.parse(value);
  } catch {
    throw new ApiError('validation.malformed', `${at}: must be one line of JSON`);
  }
  try {
    return validator(schema, 'body', at)(raw);
  } catch (err) {
    // The value is a secret: an unknown key is not quoted back (it could be a misplaced secret).
    if (err instanceof ApiError && /: unknown field '/.test(err.message)) {
      const fields = Object.keys((schema as TSchema & { properties?: Record<string, unknown> }).properties ?? {});
      throw new ApiError('validation.malformed', `${at}: holds a field this kind does not take (its fields: ${fields.join(', ')})`);
    }
    throw err;
  }
}

export function parseOAuth2Credential(value: string, at = 'body.value'): OAuth2PeerCredential {
  const o = parseValue(OAuth2Value, value, at);
  return {
    access_token: o.access_token, expires_at: o.expires_at ?? null, refresh_token: o.refresh_token ?? null, token_url: o.token_url ?? null,
    client_id: o.client_id ?? null, client_secret: o.client_secret ?? null,
  };
}

export function parseMtlsCredential(value: string, at = 'body.value'): MtlsPeerCredential {
  const o = parseValue(MtlsValue, value, at);
  let cert: X509Certificate;
  let key: KeyObject;
  try {
    cert = new X509Certificate(o.certificate);
    key = createPrivateKey(o.private_key);
  } catch {
    throw new ApiError('validation.malformed', `${at}: certificate or private_key is not valid PEM`);
  }
  if (!cert.checkPrivateKey(key)) throw new ApiError('validation.malformed', `${at}: private_key does not belong to the certificate`);
  return { certificate: o.certificate, private_key: o.private_key };
}

/** Write-time check of a peer credential's value (the value itself is never echoed). */
export function checkPeerCredential(kind: 'a2a_oauth2' | 'a2a_mtls', value: string): void {
  if (kind === 'a2a_oauth2') parseOAuth2Credential(value);
  else parseMtlsCredential(value);
}
