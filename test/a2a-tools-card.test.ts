import { beforeAll, describe, expect, it } from 'vitest';
import { cardJson, signCard, signingKey, type SigningKey } from './harness/a2a-peer.js';
import { CardRejected, verifyCard } from '@agentplane/api';

const RPC = 'https://peer.example/a2a';
let key: SigningKey;
let other: SigningKey;

beforeAll(async () => {
  key = await signingKey('k1');
  other = await signingKey('k2');
});

async function verdict(overrides: Record<string, unknown>, k: SigningKey = key): Promise<string> {
  try {
    await verifyCard(await signCard(cardJson(RPC, overrides), k), { keys: [key.jwk], rpcUrl: RPC, sourceName: 'peer' });
    return 'accepted';
  } catch (e) {
    if (e instanceof CardRejected) return e.reason;
    throw e;
  }
}

const bearer = { securitySchemes: { b: { httpAuthSecurityScheme: { scheme: 'Bearer' } } }, securityRequirements: [{ schemes: { b: { list: [] } } }] };
const oauth = (flows: Record<string, unknown>, scopes: string[]) => ({
  securitySchemes: { o: { oauth2SecurityScheme: { flows } } },
  securityRequirements: [{ schemes: { o: { list: scopes } } }],
});
const authCode = { authorizationCode: { authorizationUrl: 'https://idp.example/authorize', tokenUrl: 'https://idp.example/token', scopes: { read: 'r', write: 'w' } } };

describe('agent card verification', () => {
  it('accepts a signed card and fixes its discovery: one JSON-RPC interface, the security alternative, always-ask tools', async () => {
    const d = await verifyCard(await signCard(cardJson(RPC), key), { keys: [other.jwk, key.jwk], rpcUrl: RPC, sourceName: 'peer' });
    expect(d.key_id).toBe('k1');
    expect(d.interface).toEqual({ url: RPC, protocol_binding: 'JSONRPC', protocol_version: '1.0' });
    expect(d.security).toEqual({ kind: 'bearer', scheme_name: 'bearer' });
    expect(d.tools.map((t) => [t.name, t.approval])).toEqual([['a2a_peer_summarize', 'always_ask'], ['a2a_peer_translate', 'always_ask']]);
    expect(d.card_digest).toMatch(/^sha256:[0-9a-f]{64}$/);
  });

  it('rejects unsigned, tampered and foreign-key cards', async () => {
    const signed = await signCard(cardJson(RPC), key);
    const opts = { keys: [key.jwk], rpcUrl: RPC, sourceName: 'peer' };
    const reason = async (card: Record<string, unknown>) => verifyCard(card, opts).then(() => 'accepted', (e: CardRejected) => e.reason);
    expect(await reason({ ...signed, signatures: [] })).toBe('unsigned_card');
    expect(await reason({ ...signed, description: 'tampered' })).toBe('bad_signature');
    expect(await reason(await signCard(cardJson(RPC), other))).toBe('bad_signature');
    // Key order and whitespace are not part of what is signed: a re-serialised card still verifies.
    const reordered = JSON.parse(JSON.stringify(Object.fromEntries(Object.entries(signed).reverse()), null, 2)) as Record<string, unknown>;
    expect(await reason(reordered)).toBe('accepted');
  });

  it('accepts exactly the three supported security alternatives', async () => {
    expect(await verdict(bearer)).toBe('accepted');
    expect(await verdict(oauth(authCode, ['read', 'write']))).toBe('accepted');
    expect(await verdict({ securitySchemes: { m: { mtlsSecurityScheme: {} } }, securityRequirements: [{ schemes: { m: { list: [] } } }] })).toBe('accepted');
  });

  it('rejects every other security alternative', async () => {
    const cases: Record<string, Record<string, unknown>> = {
      api_key: { securitySchemes: { k: { apiKeySecurityScheme: { name: 'X-Key', location: 'header' } } }, securityRequirements: [{ schemes: { k: { list: [] } } }] },
      oidc: { securitySchemes: { i: { openIdConnectSecurityScheme: { openIdConnectUrl: 'https://idp.example/.well-known/openid-configuration' } } }, securityRequirements: [{ schemes: { i: { list: [] } } }] },
      basic: { securitySchemes: { h: { httpAuthSecurityScheme: { scheme: 'Basic' } } }, securityRequirements: [{ schemes: { h: { list: [] } } }] },
      bearer_with_scopes: { ...bearer, securityRequirements: [{ schemes: { b: { list: ['read'] } } }] },
      mtls_with_scopes: { securitySchemes: { m: { mtlsSecurityScheme: {} } }, securityRequirements: [{ schemes: { m: { list: ['x'] } } }] },
      client_credentials: oauth({ clientCredentials: { tokenUrl: 'https://idp.example/token', scopes: { read: 'r' } } }, ['read']),
      oauth_two_flows: oauth({ ...authCode, clientCredentials: { tokenUrl: 'https://idp.example/token', scopes: {} } }, ['read']),
      oauth_duplicate_scopes: oauth(authCode, ['read', 'read']),
      oauth_undeclared_scope: oauth(authCode, ['admin']),
      two_alternatives: { ...bearer, securityRequirements: [{ schemes: { b: { list: [] } } }, { schemes: { b: { list: [] } } }] },
      two_schemes_in_one: { securitySchemes: { b: { httpAuthSecurityScheme: { scheme: 'Bearer' } }, m: { mtlsSecurityScheme: {} } }, securityRequirements: [{ schemes: { b: { list: [] }, m: { list: [] } } }] },
      none: { securitySchemes: {}, securityRequirements: [] },
      undeclared: { securitySchemes: {}, securityRequirements: [{ schemes: { b: { list: [] } } }] },
    };
    for (const [name, overrides] of Object.entries(cases)) expect([name, await verdict(overrides)]).toEqual([name, 'unsupported_security']);
  });

  it('rejects required extensions, non-text modes and interfaces other than the one admitted JSON-RPC POST', async () => {
    expect(await verdict({ capabilities: { extensions: [{ uri: 'https://ext.example/x', required: true }] } })).toBe('unsupported_required_extension');
    expect(await verdict({ capabilities: { extensions: [{ uri: 'https://ext.example/x', required: false }] } })).toBe('accepted');
    expect(await verdict({ defaultInputModes: ['text/plain', 'image/png'] })).toBe('non_text_modes');
    expect(await verdict({ defaultOutputModes: ['application/json'] })).toBe('non_text_modes');
    expect(await verdict({ skills: [{ id: 's', name: 's', description: 'd', outputModes: ['image/png'] }] })).toBe('non_text_modes');
    expect(await verdict({ supportedInterfaces: [{ url: RPC, protocolBinding: 'GRPC', protocolVersion: '1.0' }] })).toBe('no_jsonrpc_interface');
    expect(await verdict({ supportedInterfaces: [{ url: RPC, protocolBinding: 'JSONRPC', protocolVersion: '0.3' }] })).toBe('no_jsonrpc_interface');
    expect(await verdict({
      supportedInterfaces: [{ url: RPC, protocolBinding: 'JSONRPC', protocolVersion: '1.0' }, { url: `${RPC}2`, protocolBinding: 'JSONRPC', protocolVersion: '1.0' }],
    })).toBe('no_jsonrpc_interface');
    expect(await verdict({ supportedInterfaces: [{ url: 'https://elsewhere.example/a2a', protocolBinding: 'JSONRPC', protocolVersion: '1.0' }] })).toBe('interface_outside_egress');
  });
});
