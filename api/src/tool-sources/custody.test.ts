import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { ApiError } from '@agentplane/core';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import type { ResolvedSecret, VaultService } from '../vaults/service.js';
import type { Discovery } from './card.js';
import { PeerCustodian } from './custody.js';

/**
 * OAuth2 refresh under concurrency: the token endpoint takes each refresh token once (rotating
 * it, as authorization servers with refresh-token rotation do). Calls of one process share one
 * refresh; two processes share one refresh through the Redis lock, and both end up with the
 * token it stored.
 */
const testRedis = useEmbeddedRedis('custody');
let server: Server;
let tokenUrl: string;
let issued = 0;
let used = new Set<string>();
let requests: URLSearchParams[] = [];

beforeAll(async () => {
  server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const form = new URLSearchParams(Buffer.concat(chunks).toString('utf8'));
      requests.push(form);
      const rt = form.get('refresh_token') ?? '';
      if (used.has(rt)) {
        res.writeHead(400, { 'content-type': 'application/json' }).end(JSON.stringify({ error: 'invalid_grant' }));
        return;
      }
      used.add(rt);
      issued += 1;
      // Slow enough that a second process's refresh is refused before the first one's write-back.
      setTimeout(() => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({
        access_token: `access-${issued}`, token_type: 'Bearer', refresh_token: `refresh-${issued + 1}`, expires_in: 3600,
      })), rt === 'refresh-1' && issued === 1 ? 50 : 0);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  tokenUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}/token`;
});
afterAll(() => new Promise<void>((r) => server.close(() => r())));

/** One vault secret with a generation and a compare-and-swap write, like VaultService. */
class FakeVault {
  generation = 1;
  value: string;
  writes = 0;

  constructor(value: object) {
    this.value = JSON.stringify(value);
  }

  resolve(): Promise<ResolvedSecret> {
    return Promise.resolve({ vault_id: 'vlt_1', name: 'peer', kind: 'a2a_oauth2', header_name: null, username: null, match: 'http://peer', generation: this.generation, value: this.value });
  }

  putSecret(_ws: string, _v: string, _n: string, input: { value: string; expected_generation?: number }): Promise<void> {
    if (input.expected_generation !== this.generation) return Promise.reject(new ApiError('validation.conflict', 'stale'));
    this.generation += 1;
    this.value = input.value;
    this.writes += 1;
    return Promise.resolve();
  }
}

const discovery = (): Pick<Discovery, 'interface' | 'security'> => ({
  interface: { url: 'http://peer/a2a', protocol_binding: 'JSONRPC', protocol_version: '1.0' },
  security: { kind: 'oauth2_authorization_code', scheme_name: 'o', scopes: ['b', 'a'], authorization_url: 'http://idp/authorize', token_url: tokenUrl },
});
const expired = () => ({ access_token: 'old', expires_at: new Date(Date.now() - 1000).toISOString(), refresh_token: 'refresh-1', client_id: 'c' });

beforeEach(() => {
  issued = 0;
  used = new Set();
  requests = [];
});

describe('OAuth2 custody', () => {
  it('a valid token is used as it is; no refresh', async () => {
    const vault = new FakeVault({ access_token: 'good', expires_at: new Date(Date.now() + 3_600_000).toISOString(), refresh_token: 'refresh-1' });
    const c = new PeerCustodian(vault as unknown as VaultService, testRedis());
    expect((await c.resolve('ws', ['vlt_1'], discovery())).headers).toEqual({ Authorization: 'Bearer good' });
    expect(requests).toHaveLength(0);
  });

  it('concurrent calls of one process share one refresh (exact card scopes, client_id) and one write-back', async () => {
    const vault = new FakeVault(expired());
    const c = new PeerCustodian(vault as unknown as VaultService, testRedis());
    const got = await Promise.all([1, 2, 3].map(() => c.resolve('ws', ['vlt_1'], discovery())));
    expect(got.map((g) => g.headers.Authorization)).toEqual(['Bearer access-1', 'Bearer access-1', 'Bearer access-1']);
    expect(requests).toHaveLength(1);
    expect([requests[0]!.get('grant_type'), requests[0]!.get('scope'), requests[0]!.get('client_id')]).toEqual(['refresh_token', 'b a', 'c']);
    expect([vault.writes, vault.generation]).toEqual([1, 2]);
    expect(JSON.parse(vault.value)).toMatchObject({ access_token: 'access-1', refresh_token: 'refresh-2' });
  });

  it('two processes (own Redis connections): one refresh under the shared lock; the other waits and uses the token it stored', async () => {
    const vault = new FakeVault(expired());
    const [a, b] = [new PeerCustodian(vault as unknown as VaultService, testRedis.connect('custody-a')), new PeerCustodian(vault as unknown as VaultService, testRedis.connect('custody-b'))];
    const got = await Promise.all([a.resolve('ws', ['vlt_1'], discovery()), b.resolve('ws', ['vlt_1'], discovery())]);
    expect(got.map((g) => g.headers.Authorization)).toEqual(['Bearer access-1', 'Bearer access-1']);
    expect(requests).toHaveLength(1);
    expect(vault.writes).toBe(1);
  });

  it('expires_in as a string of digits, or past any valid time, still gives the stored token an expiry (and the rotated refresh token is kept)', async () => {
    let expiresIn: unknown = null;
    const idp = createServer((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' })
        .end(JSON.stringify({ access_token: 'access-x', token_type: 'Bearer', refresh_token: 'refresh-x', expires_in: expiresIn })));
    });
    await new Promise<void>((r) => idp.listen(0, '127.0.0.1', r));
    try {
      const d = discovery();
      const at = { ...d, security: { ...d.security, token_url: `http://127.0.0.1:${(idp.address() as AddressInfo).port}/token` } as Discovery['security'] };
      const stored = async (value: unknown) => {
        expiresIn = value;
        const vault = new FakeVault(expired());
        const before = Date.now();
        expect((await new PeerCustodian(vault as unknown as VaultService, testRedis()).resolve('ws', ['vlt_1'], at)).headers).toEqual({ Authorization: 'Bearer access-x' });
        const cred = JSON.parse(vault.value) as { expires_at: string | null; refresh_token: string };
        expect([vault.writes, cred.refresh_token]).toEqual([1, 'refresh-x']);
        expect(cred.expires_at).not.toBeNull();
        return Date.parse(cred.expires_at!) - before;
      };
      // A string: an hour, not "never expires" (which would never be refreshed again).
      expect(await stored('3600')).toBeGreaterThanOrEqual(3_600_000);
      expect(await stored('3600')).toBeLessThan(3_700_000);
      // Past any valid time: cut to a year, not a failure after the endpoint already rotated the refresh token.
      expect(await stored(1e300)).toBeLessThanOrEqual(366 * 86_400_000);
    } finally {
      await new Promise<void>((r) => idp.close(() => r()));
    }
  });

  it('an expired token without a refresh token, or a token endpoint other than the card\'s, is refused', async () => {
    const none = new FakeVault({ access_token: 'old', expires_at: new Date(Date.now() - 1000).toISOString() });
    await expect(new PeerCustodian(none as unknown as VaultService, testRedis()).resolve('ws', ['vlt_1'], discovery())).rejects.toThrow(/no refresh token/);
    const elsewhere = new FakeVault({ ...expired(), token_url: 'http://127.0.0.1:1/token' });
    await expect(new PeerCustodian(elsewhere as unknown as VaultService, testRedis()).resolve('ws', ['vlt_1'], discovery())).rejects.toThrow(/signed token endpoint/);
    expect(requests).toHaveLength(0);
  });

  it('a token endpoint answer past 64 KiB is not read on: the refresh fails at once and the connection is closed', async () => {
    let wroteAll: Promise<boolean> | undefined;
    const flood = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        wroteAll = new Promise((resolve) => {
          let written = 0;
          let all = false;
          res.on('close', () => resolve(all));
          res.writeHead(200, { 'content-type': 'application/json' });
          res.write('{"access_token":"');
          const chunk = Buffer.alloc(64 * 1024, 'a');
          const pump = () => {
            while (written < 32 * 1024 * 1024 && !res.destroyed) {
              written += chunk.length;
              if (!res.write(chunk)) {
                res.once('drain', pump);
                return;
              }
            }
            if (written >= 32 * 1024 * 1024) all = true;
          };
          pump();
        });
      });
    });
    await new Promise<void>((r) => flood.listen(0, '127.0.0.1', r));
    try {
      const floodUrl = `http://127.0.0.1:${(flood.address() as AddressInfo).port}/token`;
      const vault = new FakeVault(expired());
      const c = new PeerCustodian(vault as unknown as VaultService, testRedis(), { refreshTimeoutMs: 20_000 });
      const d = discovery();
      const started = Date.now();
      await expect(c.resolve('ws', ['vlt_1'], { ...d, security: { ...d.security, token_url: floodUrl } as Discovery['security'] }))
        .rejects.toThrow(/OAuth2 token refresh failed: the response exceeds the 65536-byte limit/);
      expect(Date.now() - started).toBeLessThan(10_000);
      expect(await wroteAll).toBe(false);
      expect(vault.writes).toBe(0);
    } finally {
      flood.closeAllConnections();
      await new Promise<void>((r) => flood.close(() => r()));
    }
  });

  it('a credential without token_url keeps the endpoint of its first refresh: a card naming another one later is refused, not sent the refresh token', async () => {
    const vault = new FakeVault(expired());
    const c = new PeerCustodian(vault as unknown as VaultService, testRedis());
    expect((await c.resolve('ws', ['vlt_1'], discovery())).headers).toEqual({ Authorization: 'Bearer access-1' });
    expect((JSON.parse(vault.value) as { token_url: string }).token_url).toBe(tokenUrl);
    // The token expires; another tool source's card matching the same peer names its own endpoint.
    vault.value = JSON.stringify({ ...(JSON.parse(vault.value) as object), expires_at: new Date(Date.now() - 1000).toISOString() });
    const other = discovery();
    other.security = { ...(other.security as Extract<Discovery['security'], { kind: 'oauth2_authorization_code' }>), token_url: 'http://127.0.0.1:9/elsewhere' };
    await expect(c.resolve('ws', ['vlt_1'], other)).rejects.toSatisfy((e: unknown) => e instanceof ApiError && /not the card's signed token endpoint/.test(e.message));
    expect(requests).toHaveLength(1);
  });

  it('a token the peer refused is renewed once; a peer that refuses the new one too gets no second refresh from this process within a minute', async () => {
    const vault = new FakeVault({ access_token: 'good', expires_at: new Date(Date.now() + 3_600_000).toISOString(), refresh_token: 'refresh-1' });
    const c = new PeerCustodian(vault as unknown as VaultService, testRedis());
    const first = await c.resolve('ws', ['vlt_1'], discovery());
    const renewed = await first.renew?.();
    expect(renewed?.headers).toEqual({ Authorization: 'Bearer access-1' });
    expect(requests).toHaveLength(1);
    // Refused again: nothing more to try for now.
    expect(await renewed?.renew?.()).toBeNull();
    expect(await (await c.resolve('ws', ['vlt_1'], discovery())).renew?.()).toBeNull();
    expect(requests).toHaveLength(1);
  });
});
