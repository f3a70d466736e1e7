import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import type { Platform } from './harness/platform.js';
import { cardJson, signCard, signingKey, startSdkPeer, type SdkPeer, type SigningKey } from './harness/a2a-peer.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnEvent, type TurnPlatform } from './harness/turns.js';

/**
 * A peer credential quoted back by the party it was sent to (an A2A peer refusing the vault's
 * Bearer, an OAuth2 token endpoint refusing a refresh) never reaches the Session: not its
 * `exec.tool_invocation`, not the tool result the harness records, not the platform's log.
 */
let p: Platform;
let api: HttpClient;
let principal: string;
let envId: string;
let msg: TurnPlatform['msg'];
let key: SigningKey;
let quotingPeer: SdkPeer;
let oauthPeer: SdkPeer;
let tokenServer: Server;
let tokenBase: string;

const PEER_TOKEN = 'peer-bearer-quoted-back-0123456789';
const STALE = 'stale-access-quoted-4455';
const REFRESH = 'refresh-token-quoted-Zx8811';
const CLIENT_SECRET = 'client-secret-quoted-Hh3022';
const BASIC = Buffer.from(`agentplane:${CLIENT_SECRET}`).toString('base64');

beforeAll(async () => {
  key = await signingKey('k1');
  // A token endpoint that refuses every refresh, quoting the refresh token and client credentials it got.
  tokenServer = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const form = new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
      res.writeHead(400, { 'content-type': 'application/json' })
        .end(JSON.stringify({ error: `invalid_grant: ${form.get('refresh_token') ?? ''} (client ${req.headers.authorization ?? ''})` }));
    });
  });
  await new Promise<void>((r) => tokenServer.listen(0, '127.0.0.1', r));
  tokenBase = `http://127.0.0.1:${(tokenServer.address() as AddressInfo).port}`;
  [{ p, api, principal, envId, msg }, quotingPeer, oauthPeer] = await Promise.all([
    startTurnPlatform({ name: 'a2a-tools-echo', env: { AGENTPLANE_MODE: 'development' } }),
    // Refuses every JSON-RPC request with a 401 whose body quotes the Authorization header.
    startSdkPeer((_method, _n, res, req) => {
      res.writeHead(401, { 'content-type': 'text/plain' }).end(`refused: ${req.headers.authorization ?? 'none'}`);
      return true;
    }, { instant: true }),
    startSdkPeer(undefined, { instant: true }),
  ]);
}, 180_000);
afterAll(async () => {
  await Promise.all([p?.stop(), quotingPeer?.close(), oauthPeer?.close(), new Promise<void>((r) => (tokenServer ? tokenServer.close(() => r()) : r()))]);
});

/** A synced tool source of `peer`, and a vault holding `secret` for its JSON-RPC URL. */
async function sourceAndVault(name: string, peer: SdkPeer, security: Record<string, unknown>, secret: Record<string, unknown>): Promise<{ source: string; vault: string }> {
  peer.card = await signCard(cardJson(peer.rpcUrl, security), key);
  await p.root.post('/v1/provider-packages', { name, package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
  const source = (await p.root.post<{ id: string }>('/v1/tool-sources', { name, provider: name, source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] } })).id;
  expect((await p.root.post<{ sync: { state: string } }>(`/v1/tool-sources/${source}/sync`, {})).sync.state).toBe('synced');
  const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: `${name}-creds` })).id;
  expect((await p.root.request('PUT', `/v1/vaults/${vault}/secrets/peer`, { body: { ...secret, match: peer.rpcUrl } })).status).toBe(200);
  return { source, vault };
}

/** One confirmed call of the source's summarize tool in a new Session naming the vault; the Session's events. */
async function confirmedCall(name: string, ids: { source: string; vault: string }): Promise<TurnEvent[]> {
  const tool = `peer__a2a_${name}_summarize`;
  const session = (await api.post<{ id: string }>('/v1/sessions', {
    agent: {
      name: 'a2a-user', model: 'default', tools: [],
      system: SCRIPT([
        { when: { user_contains: 'summarize' }, then: [{ tool, input: { text: 'the quarterly report' } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'Peer said: {{tool_result}}' }] },
      ]),
      mcp_servers: [{ name: 'peer', type: 'a2a_tool_source', tool_source_id: ids.source }],
    },
    environment_id: envId, vault_ids: [ids.vault],
  })).id;
  await api.post(`/v1/sessions/${session}/events`, msg('summarize please'));
  const use = (await untilEvents(api, session, (e) => idleCount(e) >= 1)).filter((e) => e.type === 'agent.tool_use').at(-1);
  expect(use?.payload).toMatchObject({ name: tool });
  await api.post(`/v1/sessions/${session}/events`, {
    type: 'user.tool_confirmation', payload: { tool_use_id: String(use?.payload.id), result: 'allow', authored_by: principal, caused_by: { kind: 'api' } },
  });
  return untilEvents(api, session, (e) => idleCount(e) >= 2);
}

const toolResult = (events: TurnEvent[]) => JSON.stringify(events.filter((e) => e.type === 'agent.tool_result').at(-1)?.payload ?? null);

describe('peer credentials quoted back', () => {
  it("a peer's refusal quoting the vault's Bearer is kept without it in exec.tool_invocation and the tool result", async () => {
    const ids = await sourceAndVault('quoting', quotingPeer, {}, { kind: 'mcp_bearer', value: PEER_TOKEN });
    const events = await confirmedCall('quoting', ids);
    const invocation = events.filter((e) => e.type === 'exec.tool_invocation');
    expect(invocation).toHaveLength(1);
    expect(invocation[0]?.payload).toMatchObject({ status: 'error', result: { text: expect.stringContaining('refused: [redacted]') } });
    expect(quotingPeer.calls.some((c) => c.authorization === `Bearer ${PEER_TOKEN}`)).toBe(true);
    expect(toolResult(events)).toContain('refused: [redacted]');
    expect(JSON.stringify(events)).not.toContain(PEER_TOKEN.slice(5, 20));
  });

  it("a token endpoint's refusal quoting the refresh token and client credentials is answered without them", async () => {
    const value = JSON.stringify({
      access_token: STALE, expires_at: new Date(Date.now() - 60_000).toISOString(), refresh_token: REFRESH,
      token_url: `${tokenBase}/token`, client_id: 'agentplane', client_secret: CLIENT_SECRET,
    });
    const ids = await sourceAndVault('oauthquoting', oauthPeer, {
      securitySchemes: { o: { oauth2SecurityScheme: { flows: { authorizationCode: { authorizationUrl: `${tokenBase}/authorize`, tokenUrl: `${tokenBase}/token`, scopes: { read: 'r' } } } } } },
      securityRequirements: [{ schemes: { o: { list: ['read'] } } }],
    }, { kind: 'a2a_oauth2', value });
    const events = await confirmedCall('oauthquoting', ids);
    // The refusal is the tool's error result; the peer was never called.
    expect(toolResult(events)).toContain('the OAuth2 token refresh was refused (invalid_grant: [redacted] (client Basic [redacted]))');
    expect(oauthPeer.calls).toHaveLength(0);
    const all = JSON.stringify(events);
    for (const s of [REFRESH, CLIENT_SECRET, BASIC, STALE]) expect(all).not.toContain(s);
  });

  it('none of them is in the platform log', () => {
    const logs = readFileSync(p.logFile, 'utf8');
    for (const s of [PEER_TOKEN, REFRESH, CLIENT_SECRET, BASIC, STALE]) expect(logs).not.toContain(s);
  });
});
