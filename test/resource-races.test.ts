import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPlatform, type Platform } from './harness/platform.js';
import { errType } from './harness/governance.js';

/**
 * Concurrent requests on one MemoryStore document, Vault, MemoryStore, Project or vault secret,
 * black-box against a real platform: compare-and-swap writes and deletions have exactly one
 * winner, and revisions without a fence are all appended. A race shows in some rounds only, so
 * each test runs several.
 */
let p: Platform;
beforeAll(async () => {
  p = await startPlatform();
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

const N = 8;
const ROUNDS = 6;
type Reply = { status: number; body: unknown };
const all = (f: (i: number) => Promise<Reply>): Promise<Reply[]> => Promise.all(Array.from({ length: N }, (_, i) => f(i)));
const statuses = (rs: readonly Reply[]) => rs.map((r) => r.status).sort();
const b64 = (text: string) => Buffer.from(text).toString('base64');

/** Exactly one reply is `winner`; every other is `loser` with the error type `type`. */
function oneWinner(rs: readonly Reply[], winner: number, loser: number, type: string): void {
  expect(statuses(rs)).toEqual([winner, ...Array<number>(N - 1).fill(loser)].sort());
  for (const r of rs.filter((x) => x.status === loser)) expect(errType(r)).toBe(type);
}

/** Succeeded audit records of a deletion (`action`) of `target`. */
async function deletionsAudited(target: string, action: string): Promise<number> {
  const records = (await p.root.post<{ data: { action: string; outcome: string }[] }>('/v1/audit/export', { target, limit: 1000 })).data;
  return records.filter((r) => r.action === action && r.outcome === 'succeeded').length;
}

describe('memory document compare-and-swap under identical concurrent writes', () => {
  it('creates, replaces and deletes with one winner each, even when every request builds the same version', async () => {
    const store = (await p.root.post<{ id: string }>('/v1/memory-stores', { name: 'cas races' })).id;
    const doc = `/v1/memory-stores/${store}/document`;
    for (let round = 0; round < ROUNDS; round++) {
      const path = `doc${round}`;
      oneWinner(await all(() => p.root.request('PUT', doc, { body: { path, content: 'same', expected_version: 0 } })), 201, 409, 'validation.conflict');
      oneWinner(await all(() => p.root.request('PUT', doc, { body: { path, content: 'same again', expected_version: 1 } })), 200, 409, 'validation.conflict');
      // A loser finds the document gone: 404, as a deletion sent after the winner's is.
      oneWinner(await all(() => p.root.request('DELETE', doc, { query: { path, expected_version: '2' } })), 200, 404, 'validation.not_found');
      const history = await p.root.request<{ data: { version: number }[] }>('GET', `${doc}/versions`, { query: { path } });
      expect(history.body.data.map((v) => v.version)).toEqual([3, 2, 1]);
    }
  });
});

describe('concurrent deletions', () => {
  const cases: { what: string; action: string; make: () => Promise<string>; path: (id: string) => string }[] = [
    { what: 'a Vault', action: 'vaults.deleteVault', make: async () => (await p.root.post<{ id: string }>('/v1/vaults', { name: 'doomed' })).id, path: (id) => `/v1/vaults/${id}` },
    {
      what: 'a MemoryStore', action: 'memoryStores.deleteMemoryStore',
      make: async () => {
        const id = (await p.root.post<{ id: string }>('/v1/memory-stores', { name: 'doomed' })).id;
        await p.root.request('PUT', `/v1/memory-stores/${id}/document`, { body: { path: 'a.md', content: 'x' } });
        return id;
      },
      path: (id) => `/v1/memory-stores/${id}`,
    },
    {
      what: 'a Project', action: 'projects.deleteProject',
      make: async () => (await p.root.post<{ id: string }>('/v1/projects', { name: 'doomed', files: [{ path: 'a', content_base64: b64('x') }] })).id,
      path: (id) => `/v1/projects/${id}`,
    },
    {
      what: 'a vault secret', action: 'vaults.deleteSecret',
      make: async () => {
        const id = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'holder' })).id;
        const put = await p.root.request('PUT', `/v1/vaults/${id}/secrets/S`, { body: { kind: 'mcp_bearer', match: 'https://m.example.com', value: 'secret-value-0123' } });
        expect(put.status).toBe(200);
        return id;
      },
      path: (id) => `/v1/vaults/${id}/secrets/S`,
    },
  ];
  for (const c of cases) {
    it(`of ${c.what}: one succeeds (one audit record of success), the others are 404 like a later one`, async () => {
      for (let round = 0; round < ROUNDS; round++) {
        const id = await c.make();
        oneWinner(await all(() => p.root.request('DELETE', c.path(id))), 200, 404, 'validation.not_found');
        const again = await p.root.request('DELETE', c.path(id));
        expect([again.status, errType(again)]).toEqual([404, 'validation.not_found']);
        expect(await deletionsAudited(id, c.action)).toBe(1);
      }
    });
  }
});

describe('concurrent project revisions without expected_revision_number', () => {
  it('are each appended, on top of whichever came before: all 201, revisions 2..N+1, each with its own tree', async () => {
    for (let round = 0; round < ROUNDS; round++) {
      const project = (await p.root.post<{ id: string }>('/v1/projects', { name: `revs ${round}`, files: [{ path: 'a', content_base64: b64('v0') }] })).id;
      // Odd rounds send the same tree from every request: still one revision each.
      const content = (i: number) => (round % 2 === 0 ? `v${i + 1}` : 'same');
      const rs = await all((i) => p.root.request('POST', `/v1/projects/${project}/revisions`, { body: { files: [{ path: 'a', content_base64: b64(content(i)) }] } }));
      expect(statuses(rs)).toEqual(Array<number>(N).fill(201));
      const numbers = rs.map((r) => (r.body as { revision_number: number }).revision_number);
      expect([...numbers].sort((a, b) => a - b)).toEqual(Array.from({ length: N }, (_, i) => i + 2));
      const head = await p.root.request<{ latest_revision_number: number; version: number }>('GET', `/v1/projects/${project}`);
      expect([head.body.latest_revision_number, head.body.version]).toEqual([N + 1, N + 1]);
      for (const [i, n] of numbers.entries()) {
        const rev = await p.root.request<{ base_revision_number: number; files: { sha256: string }[] }>('GET', `/v1/projects/${project}/revisions/${n}`);
        const sent = (rs[i]?.body as { files: { sha256: string }[] }).files;
        expect(rev.body.files.map((f) => f.sha256)).toEqual(sent.map((f) => f.sha256));
        expect(rev.body.base_revision_number).toBe(n - 1);
      }
    }
  });
});
