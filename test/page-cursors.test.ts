/**
 * A list's cursor continues that list only: the list, its path and its filters. Black-box against
 * a real platform (no runner): a page walked to the end returns every item once; another list's
 * cursor, this list's under another filter, path or Workspace, a cursor with its tag altered, or
 * one whose position was altered under its tag, is 400 `validation.malformed` naming `query.page`.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPlatform, type Platform } from './harness/platform.js';
import { createPrincipal } from './harness/governance.js';

interface Page { data: { id: string }[]; next_page: string | null }

let p: Platform;
let ws: string;
let other: string;
const made: string[] = [];

beforeAll(async () => {
  p = await startPlatform({ runner: false, scheduler: false });
  ws = p.bootstrap.workspace_id;
  for (const name of ['ann', 'bob', 'cy', 'dee']) made.push(await createPrincipal(p.root, ws, name));
  other = (await p.root.post<{ id: string }>(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'second' }, { idempotencyKey: `ws-${Math.random()}` })).id;
  await createPrincipal(p.root, other, 'eve');
  await createPrincipal(p.root, other, 'fay');
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

const principals = (w: string) => `/v1/organizations/workspaces/${w}/principals`;

describe('list cursors are bound to their list', () => {
  it('walks a list to its end, each item once, with its filter resent', async () => {
    const seen: string[] = [];
    let page: string | undefined;
    for (let i = 0; i < 20; i++) {
      const r = await p.root.get<Page>(principals(ws), { limit: 1, status: 'active', ...(page ? { page } : {}) });
      seen.push(...r.data.map((d) => d.id));
      if (r.next_page === null) break;
      expect(r.next_page).toMatch(/^c1_[0-9a-z]+$/);
      page = r.next_page;
    }
    expect(new Set(seen).size).toBe(seen.length);
    expect(seen).toEqual(expect.arrayContaining(made));
  });

  it('refuses a cursor under another filter, path, Workspace or list, and an altered one', async () => {
    const first = await p.root.get<Page>(principals(ws), { limit: 1 });
    const cursor = first.next_page;
    expect(cursor).not.toBeNull();
    const next = await p.root.request('GET', principals(ws), { query: { limit: '1', page: String(cursor) } });
    expect(next.status).toBe(200);

    const refusals = [
      await p.root.request('GET', principals(ws), { query: { limit: '1', status: 'active', page: String(cursor) } }),
      await p.root.request('GET', principals(other), { query: { limit: '1', page: String(cursor) } }),
      await p.root.request('GET', '/v1/environments', { query: { limit: '1', page: String(cursor) } }),
      await p.root.request('GET', `/v1/organizations/${p.bootstrap.organization_id}/api-keys`, { query: { limit: '1', page: String(cursor) } }),
      await p.root.request('GET', principals(ws), { query: { limit: '1', page: `${String(cursor).slice(0, -1)}${String(cursor).endsWith('0') ? '1' : '0'}` } }),
      // A position written by hand under the list's own tag: the tag covers the position too.
      await p.root.request('GET', principals(ws), { query: { limit: '1', page: `${String(cursor).slice(0, -9)}${String(cursor).at(-9) === '0' ? '1' : '0'}${String(cursor).slice(-8)}` } }),
    ];
    for (const r of refusals) {
      expect(r.status, JSON.stringify(r.body)).toBe(400);
      expect(r.body).toMatchObject({ error: { type: 'validation.malformed' } });
      expect(JSON.stringify(r.body)).toContain('query.page');
    }
  });
});
