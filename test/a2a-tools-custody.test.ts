import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import type { HttpClient } from '@agentplane/client';
import type { Platform } from './harness/platform.js';
import { cardJson, signCard, signingKey, startSdkPeer, type SdkPeer, type SigningKey } from './harness/a2a-peer.js';
import { makeTestPki, type TestPki } from './harness/tls-certs.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnEvent, type TurnPlatform } from './harness/turns.js';

/**
 * Peer credential custody for OAuth2 authorization-code and mTLS tool sources: the credentials
 * live in the Session's vault, are used (and an expired OAuth2 token refreshed and written back)
 * by the API process only, and appear nowhere else: not in the event log, not in what the
 * runner is given, not in audit records (nothing in Redis holds them in plaintext), not in any
 * process's log.
 */
let p: Platform;
let api: HttpClient;
let principal: string;
let envId: string;
let msg: TurnPlatform['msg'];
let pki: TestPki;
let key: SigningKey;
let oauthPeer: SdkPeer;
let mtlsPeer: SdkPeer;
let tokenServer: Server;
let tokenBase: string;
const tokenRequests: URLSearchParams[] = [];
const mtlsRefused: string[] = [];

const FRESH = 'fresh-access-7Qk2';
const STALE = 'stale-access-9Wm4';
const REFRESH_1 = 'refresh-one-Zx81';
const REFRESH_2 = 'refresh-two-Pq55';
const CLIENT_SECRET = 'client-secret-Hh30';

beforeAll(async () => {
  pki = makeTestPki();
  key = await signingKey('k1');
  tokenServer = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const form = new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
      tokenRequests.push(form);
      const basic = `Basic ${Buffer.from(`agentplane:${CLIENT_SECRET}`).toString('base64')}`;
      if (req.url !== '/token' || form.get('grant_type') !== 'refresh_token' || form.get('refresh_token') !== REFRESH_1 || req.headers.authorization !== basic) {
        res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ error: 'invalid_grant' }));
        return;
      }
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ access_token: FRESH, token_type: 'Bearer', refresh_token: REFRESH_2, expires_in: 3600 }));
    });
  });
  await new Promise<void>((r) => tokenServer.listen(0, '127.0.0.1', r));
  tokenBase = `http://127.0.0.1:${(tokenServer.address() as AddressInfo).port}`;
  [{ p, api, principal, envId, msg }, oauthPeer, mtlsPeer] = await Promise.all([
    startTurnPlatform({ name: 'a2a-tools-custody', env: { AGENTPLANE_MODE: 'development', NODE_EXTRA_CA_CERTS: pki.caFile } }),
    // The OAuth2 peer accepts only the refreshed access token.
    startSdkPeer((_method, _n, res, req) => {
      if (req.headers.authorization === `Bearer ${FRESH}`) return false;
      res.writeHead(401, { 'content-type': 'application/json', 'www-authenticate': 'Bearer error="invalid_token"' }).end('{}');
      return true;
    }, { instant: true }),
    // The mTLS peer serves its card to anyone, and refuses a JSON-RPC connection without a client certificate of its CA.
    startSdkPeer((_method, _n, res, req) => {
      const socket = req.socket as import('node:tls').TLSSocket;
      if (socket.authorized) return false;
      mtlsRefused.push(String(socket.authorizationError ?? 'no certificate'));
      res.socket?.destroy();
      return true;
    }, { instant: true, tls: { cert: pki.server.cert, key: pki.server.key, clientCa: pki.ca } }),
  ]);
}, 180_000);
afterAll(async () => {
  await Promise.all([p?.stop(), oauthPeer?.close(), mtlsPeer?.close(), new Promise<void>((r) => (tokenServer ? tokenServer.close(() => r()) : r()))]);
  pki?.dispose();
});

async function source(name: string, peer: SdkPeer, security: Record<string, unknown>): Promise<string> {
  peer.card = await signCard(cardJson(peer.rpcUrl, security), key);
  await p.root.post('/v1/provider-packages', { name, package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
  const id = (await p.root.post<{ id: string }>('/v1/tool-sources', { name, provider: name, source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] } })).id;
  const synced = await p.root.post<{ sync: { state: string }; discovery: { security: { kind: string } } }>(`/v1/tool-sources/${id}/sync`, {});
  expect(synced.sync.state).toBe('synced');
  return id;
}

/** One allowed call of `<source>`'s summarize tool in a new Session with `vaultIds`; the Session's events. */
async function allowedCall(sourceId: string, name: string, vaultIds: string[]): Promise<{ session: string; events: TurnEvent[] }> {
  const tool = `peer__a2a_${name}_summarize`;
  const session = (await api.post<{ id: string }>('/v1/sessions', {
    agent: {
      name: 'a2a-user', model: 'default', tools: [],
      system: SCRIPT([
        { when: { user_contains: 'summarize' }, then: [{ tool, input: { text: 'the quarterly report' } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'Peer said: {{tool_result}}' }] },
      ]),
      mcp_servers: [{ name: 'peer', type: 'a2a_tool_source', tool_source_id: sourceId }],
    },
    environment_id: envId, ...(vaultIds.length > 0 ? { vault_ids: vaultIds } : {}),
  })).id;
  await api.post(`/v1/sessions/${session}/events`, msg('summarize please'));
  const first = await untilEvents(api, session, (e) => idleCount(e) >= 1);
  const use = first.filter((e) => e.type === 'agent.tool_use').at(-1);
  expect(use?.payload).toMatchObject({ name: tool });
  await api.post(`/v1/sessions/${session}/events`, {
    type: 'user.tool_confirmation', payload: { tool_use_id: String(use?.payload.id), result: 'allow', authored_by: principal, caused_by: { kind: 'api' } },
  });
  return { session, events: await untilEvents(api, session, (e) => idleCount(e) >= 2) };
}

const invocation = (events: TurnEvent[]) => {
  const all = events.filter((e) => e.type === 'exec.tool_invocation');
  expect(all).toHaveLength(1);
  return all[0]!;
};

/** Every value Redis holds, as text (strings, hashes, lists, sets, sorted sets, streams). */
async function everythingInRedis(): Promise<string> {
  const redis = new Redis(p.redisUrl());
  const out: string[] = [];
  try {
    let cursor = '0';
    do {
      const [next, keys] = await redis.scan(cursor, 'COUNT', 500);
      cursor = next;
      for (const k of keys) {
        const type = await redis.type(k);
        if (type === 'string') out.push((await redis.getBuffer(k))?.toString('latin1') ?? '');
        else if (type === 'hash') out.push(JSON.stringify(await redis.hgetall(k)));
        else if (type === 'list') out.push(JSON.stringify(await redis.lrange(k, 0, -1)));
        else if (type === 'set') out.push(JSON.stringify(await redis.smembers(k)));
        else if (type === 'zset') out.push(JSON.stringify(await redis.zrange(k, 0, -1)));
        else if (type === 'stream') out.push(JSON.stringify(await redis.xrange(k, '-', '+')));
        out.push(k);
      }
    } while (cursor !== '0');
  } finally {
    redis.disconnect();
  }
  return out.join('\n');
}

describe('peer credential custody', () => {
  let oauthSource: string;
  let mtlsSource: string;

  it('OAuth2 authorization-code: an expired token is refreshed once for exactly the card scopes, written back (CAS), and only the refreshed token reaches the peer', async () => {
    oauthSource = await source('oauthpeer', oauthPeer, {
      securitySchemes: { o: { oauth2SecurityScheme: { flows: { authorizationCode: { authorizationUrl: `${tokenBase}/authorize`, tokenUrl: `${tokenBase}/token`, scopes: { read: 'r', summarize: 's', write: 'w' } } } } } },
      securityRequirements: [{ schemes: { o: { list: ['summarize', 'read'] } } }],
    });
    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'oauth-creds' })).id;
    const value = JSON.stringify({ access_token: STALE, expires_at: new Date(Date.now() - 60_000).toISOString(), refresh_token: REFRESH_1, token_url: `${tokenBase}/token`, client_id: 'agentplane', client_secret: CLIENT_SECRET });
    await p.root.request('PUT', `/v1/vaults/${vault}/secrets/peer`, { body: { kind: 'a2a_oauth2', match: oauthPeer.rpcUrl, value } });

    const { events } = await allowedCall(oauthSource, 'oauthpeer', [vault]);
    expect(invocation(events).payload).toMatchObject({ status: 'completed', tool_source_id: oauthSource });
    expect(JSON.stringify(events.filter((e) => e.type === 'agent.tool_result').at(-1)?.payload.content)).toContain('done: the quarterly report');
    expect(tokenRequests).toHaveLength(1);
    expect(tokenRequests[0]!.get('scope')).toBe('summarize read');
    expect(oauthPeer.calls.map((c) => c.authorization)).toEqual(oauthPeer.calls.map(() => `Bearer ${FRESH}`));
    // The rotated token was written back: the secret moved to generation 2.
    const stored = await p.root.get<{ secrets: { name: string; generation: number }[] }>(`/v1/vaults/${vault}`);
    expect(stored.secrets.find((s) => s.name === 'peer')?.generation).toBe(2);

    // A second call uses the stored token: no second refresh (the old refresh token would be refused anyway).
    const again = await allowedCall(oauthSource, 'oauthpeer', [vault]);
    expect(invocation(again.events).payload).toMatchObject({ status: 'completed' });
    expect(tokenRequests).toHaveLength(1);
  });

  it('OAuth2: a token the peer refuses before its expiry (revoked) is refreshed once, and the message sent again with the new one', async () => {
    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'oauth-revoked' })).id;
    // Not expired by its own account, but no longer taken by the peer.
    const value = JSON.stringify({ access_token: STALE, expires_at: new Date(Date.now() + 3_600_000).toISOString(), refresh_token: REFRESH_1, token_url: `${tokenBase}/token`, client_id: 'agentplane', client_secret: CLIENT_SECRET });
    await p.root.request('PUT', `/v1/vaults/${vault}/secrets/peer`, { body: { kind: 'a2a_oauth2', match: oauthPeer.rpcUrl, value } });
    const refreshes = tokenRequests.length;
    const calls = oauthPeer.calls.length;

    const { events } = await allowedCall(oauthSource, 'oauthpeer', [vault]);
    expect(invocation(events).payload).toMatchObject({ status: 'completed', tool_source_id: oauthSource });
    expect(tokenRequests.length - refreshes).toBe(1);
    const sent = oauthPeer.calls.slice(calls).map((c) => c.authorization);
    expect(sent[0]).toBe(`Bearer ${STALE}`);
    expect(sent.slice(1)).toEqual(sent.slice(1).map(() => `Bearer ${FRESH}`));
    expect(sent.length).toBeGreaterThan(1);
    const stored = await p.root.get<{ secrets: { name: string; generation: number }[] }>(`/v1/vaults/${vault}`);
    expect(stored.secrets.find((s) => s.name === 'peer')?.generation).toBe(2);
  });

  it('mTLS: the peer refuses a connection without its client certificate; the vault\'s certificate is presented on the TLS connection', async () => {
    mtlsSource = await source('mtlspeer', mtlsPeer, {
      securitySchemes: { m: { mtlsSecurityScheme: {} } }, securityRequirements: [{ schemes: { m: { list: [] } } }],
    });
    // No credential: the connection is refused and nothing is sent.
    const bare = await allowedCall(mtlsSource, 'mtlspeer', []);
    expect(invocation(bare.events).payload).toMatchObject({ status: 'error' });
    expect(mtlsRefused.length).toBeGreaterThan(0);
    const accepted = () => mtlsPeer.calls.length - mtlsRefused.length;
    expect(accepted()).toBe(0);

    // A certificate of another CA is refused too.
    const strangers = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'mtls-stranger' })).id;
    await p.root.request('PUT', `/v1/vaults/${strangers}/secrets/peer`, { body: { kind: 'a2a_mtls', match: mtlsPeer.rpcUrl, value: JSON.stringify({ certificate: pki.stranger.cert, private_key: pki.stranger.key }) } });
    const refusedBefore = mtlsRefused.length;
    expect(invocation((await allowedCall(mtlsSource, 'mtlspeer', [strangers])).events).payload).toMatchObject({ status: 'error' });
    expect(mtlsRefused.length).toBeGreaterThan(refusedBefore);
    expect(accepted()).toBe(0);

    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'mtls-creds' })).id;
    await p.root.request('PUT', `/v1/vaults/${vault}/secrets/peer`, { body: { kind: 'a2a_mtls', match: mtlsPeer.rpcUrl, value: JSON.stringify({ certificate: pki.client.cert, private_key: pki.client.key }) } });
    const { events } = await allowedCall(mtlsSource, 'mtlspeer', [vault]);
    expect(invocation(events).payload).toMatchObject({ status: 'completed', tool_source_id: mtlsSource });
    expect(JSON.stringify(events.filter((e) => e.type === 'agent.tool_result').at(-1)?.payload.content)).toContain('done: the quarterly report');
    expect(accepted()).toBeGreaterThan(0);
  });

  it('a malformed peer credential is refused when written', async () => {
    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'bad-creds' })).id;
    const put = (kind: string, value: string) => p.root.request('PUT', `/v1/vaults/${vault}/secrets/x`, { body: { kind, match: oauthPeer.rpcUrl, value } });
    expect((await put('a2a_oauth2', '{"refresh_token":"r"}')).status).toBe(400);
    expect((await put('a2a_mtls', JSON.stringify({ certificate: pki.client.cert, private_key: pki.stranger.key }))).status).toBe(400);
  });

  it('no peer secret is anywhere but sealed: not in events, runner leases, audit records (nothing in Redis) or any process log', async () => {
    const secrets = [FRESH, STALE, REFRESH_1, REFRESH_2, CLIENT_SECRET, pki.client.key.split('\n')[1]!, pki.stranger.key.split('\n')[1]!];
    const audit = JSON.stringify(await p.root.post('/v1/audit/export', {}));
    const redis = await everythingInRedis();
    const logs = readFileSync(p.logFile, 'utf8');
    for (const s of secrets) {
      expect(audit).not.toContain(s);
      expect(redis).not.toContain(s);
      expect(logs).not.toContain(s);
    }
    // The scan is not vacuous: the calls' events and audit records are in what was read.
    expect(redis).toContain('exec.tool_invocation');
    expect(audit).toContain('toolSources.runtimeCallTool:');
  });
});
