import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { SecretBox } from '@agentplane/core';
import { connectRedis, DocumentStore, type Redis } from '@agentplane/store';
import { oauth2RefreshLockKey, PeerCustodian, VaultService, type CustodySettings, type Discovery } from '@agentplane/api';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';

/**
 * OAuth2 refresh of a peer credential shared by several API processes: each process here is a
 * `PeerCustodian` over a `VaultService` of its own, on a Redis connection of its own, against the
 * platform's Redis and the vault written through its REST API. The token endpoint rotates refresh
 * tokens with reuse detection (OAuth 2.0 Security BCP): a refresh token presented a second time
 * revokes the whole grant. However many processes and calls find the token expired at once, the
 * endpoint sees one refresh.
 */
let p: Platform;
let server: Server;
let tokenUrl: string;
let watcher: Redis;
const connections: Redis[] = [];

/** What the token endpoint saw: each refresh token presented, and the refresh lock's holder then. */
let requests: { refresh_token: string; lock: string | null }[] = [];
let used = new Set<string>();
let revoked = false;
let issued = 0;
/** Answers held until the test lets them go (`release`). */
let held: (() => void)[] = [];
let holding = false;
/** The lock key of the secret under test (the endpoint records who held it). */
let lockKey = '';
/** Members of the n-th token response that differ from a usable Bearer token's. */
let answerAs: (n: number) => Record<string, unknown> = () => ({});

beforeAll(async () => {
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const rt = new URLSearchParams(Buffer.concat(chunks).toString('utf8')).get('refresh_token') ?? '';
      void watcher.get(lockKey).then((lock) => {
        requests.push({ refresh_token: rt, lock });
        if (revoked || used.has(rt)) {
          // Reuse detected: the whole grant is revoked, the latest refresh token included.
          revoked = true;
          res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ error: 'invalid_grant' }));
          return;
        }
        used.add(rt);
        issued += 1;
        const n = issued;
        const answer = () => res.writeHead(200, { 'content-type': 'application/json' })
          .end(JSON.stringify({ access_token: `issued-access-${n}`, token_type: 'Bearer', refresh_token: `refresh-${n + 1}`, expires_in: 3600, ...answerAs(n) }));
        if (holding) held.push(answer);
        else answer();
      });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  tokenUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/token`;
  p = await startPlatform();
  watcher = connectRedis(p.redisUrl(), { name: 'oauth-refresh-watcher' });
  connections.push(watcher);
}, 120_000);
afterAll(async () => {
  for (const c of connections) c.disconnect();
  await Promise.all([p?.stop(), new Promise<void>((r) => (server ? server.close(() => r()) : r()))]);
});

beforeEach(() => {
  requests = [];
  used = new Set();
  revoked = false;
  issued = 0;
  held = [];
  holding = false;
  answerAs = () => ({});
});

const PEER = 'http://peer.example';
const discovery = (): Pick<Discovery, 'interface' | 'security'> => ({
  interface: { url: `${PEER}/a2a`, protocol_binding: 'JSONRPC', protocol_version: '1.0' },
  security: { kind: 'oauth2_authorization_code', scheme_name: 'o', scopes: ['read'], authorization_url: 'http://idp.example/authorize', token_url: tokenUrl },
});

/** A vault holding an expired access token and refresh token `refresh-1`; its id. */
async function expiredVault(name: string): Promise<string> {
  const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name })).id;
  const value = JSON.stringify({ access_token: 'stale', expires_at: new Date(Date.now() - 60_000).toISOString(), refresh_token: 'refresh-1', client_id: 'agentplane' });
  const put = await p.root.request('PUT', `/v1/vaults/${vault}/secrets/peer`, { body: { kind: 'a2a_oauth2', match: PEER, value } });
  expect(put.status).toBe(200);
  lockKey = oauth2RefreshLockKey(p.bootstrap.workspace_id, vault, 'peer');
  return vault;
}

/** One API process's custody: its own Redis connection and vault service; `reads` counts its secret reads. */
function apiProcess(name: string, settings: Partial<CustodySettings> = {}): { custodian: PeerCustodian; reads: () => number } {
  const redis = connectRedis(p.redisUrl(), { name });
  connections.push(redis);
  const key = readFileSync(join(p.dataDir, 'master.key'), 'utf8').trim();
  const vaults = new VaultService(new DocumentStore(redis), new SecretBox(Buffer.from(key, 'hex')));
  let reads = 0;
  const resolve = vaults.resolve.bind(vaults);
  vaults.resolve = (...args) => {
    reads += 1;
    return resolve(...args);
  };
  return { custodian: new PeerCustodian(vaults, redis, settings), reads: () => reads };
}

const secretGeneration = async (vault: string) =>
  (await p.root.get<{ secrets: { name: string; generation: number }[] }>(`/v1/vaults/${vault}`)).secrets.find((s) => s.name === 'peer')?.generation;

describe('OAuth2 refresh across API processes', () => {
  it('two processes (three calls each) that find the same token expired send one refresh; every call uses the one token it stored', async () => {
    const vault = await expiredVault('two-processes');
    const ws = p.bootstrap.workspace_id;
    const [a, b] = [apiProcess('api-a'), apiProcess('api-b')];
    holding = true;
    const calls = Promise.allSettled([a, b, a, b, a, b].map((x) => x.custodian.resolve(ws, [vault], discovery())));
    // The first refresh is held until the other process has either sent its own (the defect) or
    // read the secret again while waiting for it (each process reads once per call first).
    await waitFor('the other process to refresh or wait', () =>
      (requests.length >= 2 || (requests.length === 1 && a.reads() > 3 && b.reads() > 3) ? true : undefined));
    holding = false;
    for (const answer of held.splice(0)) answer();
    const got = await calls;
    expect(requests.map((r) => r.refresh_token)).toEqual(['refresh-1']);
    expect(revoked).toBe(false);
    // The POST was sent under the refresh lock, which is free again.
    expect(requests[0]!.lock).not.toBeNull();
    expect(await watcher.exists(lockKey)).toBe(0);
    expect(got.map((g) => (g.status === 'fulfilled' ? g.value.headers.Authorization : String(g.reason)))).toEqual(Array(6).fill('Bearer issued-access-1'));
    expect(await secretGeneration(vault)).toBe(2);
    // The rotated refresh token is what the next refresh presents (the stored token is valid now, so none is sent).
    expect((await a.custodian.resolve(ws, [vault], discovery())).headers.Authorization).toBe('Bearer issued-access-1');
    expect(requests).toHaveLength(1);
  });

  it('a token issued for less than the refresh margin is used while it lasts, not refreshed on every call (in any process)', async () => {
    const vault = await expiredVault('short-lived');
    const ws = p.bootstrap.workspace_id;
    // 20 s of life: under the 30 s margin from the moment it is issued.
    answerAs = () => ({ expires_in: 20 });
    const [a, b] = [apiProcess('api-short-a'), apiProcess('api-short-b')];
    expect((await a.custodian.resolve(ws, [vault], discovery())).headers.Authorization).toBe('Bearer issued-access-1');
    for (const x of [a, b, a, b]) expect((await x.custodian.resolve(ws, [vault], discovery())).headers.Authorization).toBe('Bearer issued-access-1');
    expect(requests.map((r) => r.refresh_token)).toEqual(['refresh-1']);
  });

  it('a lock left by a process that died expires: a waiting call then refreshes once, under a lock of its own', async () => {
    const vault = await expiredVault('dead-holder');
    // What a holder killed between taking the lock and writing back leaves behind.
    await watcher.set(lockKey, 'dead-holder', 'PX', 300);
    const c = apiProcess('api-c');
    const got = await c.custodian.resolve(p.bootstrap.workspace_id, [vault], discovery());
    expect(got.headers.Authorization).toBe('Bearer issued-access-1');
    expect(requests).toHaveLength(1);
    expect(requests[0]!.lock).not.toBeNull();
    expect(requests[0]!.lock).not.toBe('dead-holder');
    expect(await secretGeneration(vault)).toBe(2);
  });

  it('a peer credential\'s hint is its access token\'s (after a refresh, the new one\'s), never the tail of its JSON (a client secret\'s)', async () => {
    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'hint' })).id;
    const value = JSON.stringify({
      access_token: 'stale-access-AAAA', expires_at: new Date(Date.now() - 60_000).toISOString(), refresh_token: 'refresh-1', client_id: 'agentplane', client_secret: 'client-secret-SS99',
    });
    expect((await p.root.request('PUT', `/v1/vaults/${vault}/secrets/peer`, { body: { kind: 'a2a_oauth2', match: PEER, value } })).status).toBe(200);
    lockKey = oauth2RefreshLockKey(p.bootstrap.workspace_id, vault, 'peer');
    const hintNow = async () => (await p.root.get<{ secrets: { name: string; secret_hint: string }[] }>(`/v1/vaults/${vault}`)).secrets.find((s) => s.name === 'peer')?.secret_hint;
    expect(await hintNow()).toBe('…AAAA');
    // The write-back puts the client secret last in the JSON it stores.
    expect((await apiProcess('api-e').custodian.resolve(p.bootstrap.workspace_id, [vault], discovery())).headers.Authorization).toBe('Bearer issued-access-1');
    expect(await secretGeneration(vault)).toBe(2);
    expect(await hintNow()).toBe('…ss-1');
  });

  for (const [what, unusable] of [
    ['a token type other than Bearer (a DPoP-bound token)', { token_type: 'DPoP' }],
    ['an access token too long to store (past the 16 KiB of a vault value)', { access_token: 'x'.repeat(20_000) }],
  ] as const) {
    it(`a refresh answered with ${what} still keeps the rotated refresh token: the next refresh presents it, not the spent one`, async () => {
      const vault = await expiredVault(`unusable-${what.length}`);
      const ws = p.bootstrap.workspace_id;
      const c = apiProcess(`api-${what.length}`);
      answerAs = (n) => (n === 1 ? unusable : {});
      const first = await c.custodian.resolve(ws, [vault], discovery()).then(() => null, (e: unknown) => e);
      expect(first).toMatchObject({ type: 'validation.conflict' });
      // Nothing of the unusable answer is quoted back.
      expect(String((first as Error).message)).not.toContain('xxxxxxxx');
      expect((await c.custodian.resolve(ws, [vault], discovery())).headers.Authorization).toBe('Bearer issued-access-2');
      expect(requests.map((r) => r.refresh_token)).toEqual(['refresh-1', 'refresh-2']);
      expect(revoked).toBe(false);
    });
  }

  it('a call waiting for another process\'s refresh gives up after its bound: 409, and nothing is sent', async () => {
    const vault = await expiredVault('live-holder');
    await watcher.set(lockKey, 'live-holder', 'PX', 60_000);
    try {
      const c = apiProcess('api-d', { refreshWaitMs: 200 });
      const err = await c.custodian.resolve(p.bootstrap.workspace_id, [vault], discovery()).then(() => null, (e: unknown) => e);
      expect(err).toMatchObject({ type: 'validation.conflict', message: expect.stringMatching(/did not finish in time/) as unknown });
      expect(requests).toHaveLength(0);
      expect(await secretGeneration(vault)).toBe(1);
      // The lock of the other holder is left alone.
      expect(await watcher.get(lockKey)).toBe('live-holder');
    } finally {
      await watcher.del(lockKey);
    }
  });
});
