import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { errType } from './harness/governance.js';
import { mcpCall, toolBody } from './harness/mcp-call.js';

/**
 * MemoryStore document listings whose pages end on long paths (up to the 512-character limit,
 * up to 1,536 bytes of UTF-8): every `next_page` is a cursor the API accepts back, so a client
 * pages to the end and sees every document exactly once, in path order, also while documents are
 * written and deleted between its pages. Cursors stay bound to their listing, and a damaged one
 * is a typed 400.
 */
let p: Platform;
let api: HttpClient;

beforeAll(async () => {
  p = await startPlatform();
  api = p.root;
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

/** The path limit of the contract, in UTF-16 code units (JavaScript string length). */
const MAX_PATH = 512;
/** The input limit of every cursor (`page`, `next_page`): a listing's own 512 and the API's 8-character binding. */
const MAX_CURSOR = 520;
const CURSOR = /^c1_[0-9a-z]+$/;

/** `head` + `fill` repeated + `tail`, exactly `MAX_PATH` code units long (`fill` is one or two units). */
function longPath(head: string, fill: string, tail: string): string {
  const room = MAX_PATH - head.length - tail.length;
  const path = head + fill.repeat(Math.floor(room / fill.length)) + tail;
  return path.length === MAX_PATH ? path : `${path.slice(0, head.length)}x${path.slice(head.length)}`;
}

const bytes = (s: string) => Buffer.from(s, 'utf8');
/** The path with its last character (a BMP one) moved by `delta` code points: just before or just after it, as long. */
const bump = (path: string, delta: number) => `${path.slice(0, -1)}${String.fromCharCode(path.charCodeAt(path.length - 1) + delta)}`;
/** Redis's order of paths: their UTF-8 bytes. */
const byteOrder = (a: string, b: string) => Buffer.compare(bytes(a), bytes(b));

type Listing = { data: { path: string; version: number }[]; next_page: string | null };

const newStore = async (name: string) => (await api.post<{ id: string }>('/v1/memory-stores', { name })).id;

async function put(store: string, path: string): Promise<void> {
  const r = await api.request('PUT', `/v1/memory-stores/${store}/document`, { body: { path, content: `content of ${path.length} units` } });
  expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBeLessThan(300);
}

async function remove(store: string, path: string): Promise<void> {
  const r = await api.request('DELETE', `/v1/memory-stores/${store}/document`, { query: { path } });
  expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
}

const list = (store: string, query: Record<string, string | number>) => api.request<Listing>('GET', `/v1/memory-stores/${store}/documents`, { query });

/** Every `next_page` the listings answered. */
const issued: string[] = [];

/** One page: 200, and its `next_page` (kept in `issued`) has the cursor's pattern. */
async function page(store: string, query: Record<string, string | number>): Promise<Listing> {
  const r = await list(store, query);
  expect(r.status, JSON.stringify(r.body).slice(0, 300)).toBe(200);
  const next = r.body.next_page;
  if (next !== null) {
    expect(next).toMatch(CURSOR);
    issued.push(next);
  }
  return r.body;
}

/** Every cursor a listing gave out is one the API takes back: within the schema's length. */
function expectAcceptableCursors(): void {
  expect(issued.length).toBeGreaterThan(0);
  for (const c of issued) expect(c.length).toBeLessThanOrEqual(MAX_CURSOR);
}

/** Follows `next_page` to the end; the paths seen, page after page. */
async function walk(store: string, query: Record<string, string | number>): Promise<string[]> {
  const seen: string[] = [];
  let cursor: string | null | undefined;
  for (let pages = 0; cursor !== null; pages++) {
    expect(pages).toBeLessThan(200);
    const body = await page(store, cursor === undefined ? query : { ...query, page: cursor });
    seen.push(...body.data.map((d) => d.path));
    cursor = body.next_page;
  }
  return seen;
}

// Long paths of every width: ASCII (1 byte a unit), CJK (3 bytes a unit, the most UTF-8 a
// path can hold: 1,536 bytes), astral (4 bytes a pair), sharing long prefixes with each other.
const wide = '\u8a9e';
const astral = '\u{1F600}';
const deepHead = `deep/${wide.repeat(300)}/`;
const PATHS = [
  'a.md',
  longPath('ascii/', 'a', '/1.md'),
  longPath('ascii/', 'a', '/2.md'),
  longPath('ascii/', 'b', '.md'),
  longPath(deepHead, wide, '/1.md'),
  longPath(deepHead, wide, '/2.md'),
  longPath(deepHead, wide, '/3.md'),
  longPath(deepHead, 'z', '.md'),
  `${deepHead}short.md`,
  longPath('emoji/', astral, '.md'),
  longPath('emoji/', astral, 'x.md'),
  longPath(wide, wide, ''),
  'm.md',
  'z.md',
  // Around the longest path a cursor holds inline (232 bytes): the cursor's widest forms.
  ...Array.from({ length: 13 }, (_, i) => `edge/${'e'.repeat(223 + i)}`),
].sort(byteOrder);

describe('MemoryStore listings ending on long paths', () => {
  it('pages through documents with paths up to the limit, each seen once, at every page size', async () => {
    for (const path of PATHS) expect(path.length).toBeLessThanOrEqual(MAX_PATH);
    expect(Math.max(...PATHS.map((s) => bytes(s).length))).toBe(3 * MAX_PATH);
    const store = await newStore('long-paths');
    for (const path of PATHS) await put(store, path);

    for (const limit of [1, 2, 3, 5]) {
      expect(await walk(store, { limit }), `limit ${limit}`).toEqual(PATHS);
    }
    // Under a long prefix, too: only the paths that start with it.
    const under = PATHS.filter((s) => s.startsWith(deepHead));
    expect(under.length).toBe(5);
    for (const limit of [1, 2]) {
      expect(await walk(store, { path_prefix: deepHead, limit }), `prefix, limit ${limit}`).toEqual(under);
    }
    expectAcceptableCursors();
  });

  it('a listing keeps its place while documents are written and deleted between pages, the page\'s last path included', async () => {
    const store = await newStore('long-paths-concurrent');
    for (const path of PATHS) await put(store, path);
    const limit = 2;
    const seen: string[] = [];
    const deleted = new Set<string>();
    const added: string[] = [];
    let cursor: string | null | undefined;
    for (let n = 0; cursor !== null; n++) {
      expect(n).toBeLessThan(100);
      const body = await page(store, cursor === undefined ? { limit } : { limit, page: cursor });
      seen.push(...body.data.map((d) => d.path));
      cursor = body.next_page;
      const last = body.data.at(-1)?.path;
      if (cursor === null || last === undefined) break;
      // The path the cursor continues after goes away, and new paths land on both sides of it:
      // just before it, just after it (seen later) and far before it (never seen).
      await remove(store, last);
      deleted.add(last);
      for (const path of [bump(last, -1), bump(last, 1), `0-${n}.md`]) {
        if (PATHS.includes(path) || added.includes(path)) continue;
        await put(store, path);
        added.push(path);
      }
    }
    // Every document present throughout was seen exactly once, each deleted one once before it
    // went; the order is the path order; nothing was seen twice.
    expect(new Set(seen).size).toBe(seen.length);
    expect([...seen].sort(byteOrder)).toEqual(seen);
    for (const path of PATHS) expect(seen.filter((s) => s === path).length, path.slice(0, 40)).toBe(1);
    for (const path of deleted) expect(seen).toContain(path);
    // A path written after the page that ended on its predecessor is seen.
    for (const path of [...deleted].map((d) => bump(d, 1)).filter((s) => added.includes(s))) expect(seen).toContain(path);
    expect(deleted.size).toBeGreaterThan(2);
    expect([...deleted].filter((d) => bytes(d).length > 3 * MAX_CURSOR / 4).length).toBeGreaterThan(1);
    expectAcceptableCursors();
  });

  it('a long path\'s cursor continues only its own listing; a damaged one is a typed 400, over REST and MCP', async () => {
    const store = await newStore('long-path-cursors');
    for (const path of PATHS) await put(store, path);
    const under = PATHS.filter((s) => s.startsWith(deepHead));
    const first = await page(store, { path_prefix: deepHead, limit: 1 });
    const cursor = first.next_page ?? '';
    expect(first.data.map((d) => d.path)).toEqual(under.slice(0, 1));
    expect((await page(store, { path_prefix: deepHead, limit: 10, page: cursor })).data.map((d) => d.path)).toEqual(under.slice(1));

    const other = await newStore('long-path-cursors-other');
    await put(other, 'a.md');
    const flipped = `${cursor.slice(0, -1)}${cursor.endsWith('0') ? '1' : '0'}`;
    const refusals: [string, Record<string, string | number>][] = [
      [store, { path_prefix: 'deep/', page: cursor }], // another prefix
      [store, { page: cursor }], // no prefix
      [other, { path_prefix: deepHead, page: cursor }], // another store, where that path never was
      [store, { path_prefix: deepHead, page: flipped }], // damaged
      [store, { path_prefix: deepHead, page: cursor.slice(0, -2) }], // cut short
    ];
    for (const [id, query] of refusals) {
      const r = await list(id, query);
      expect(r.status, JSON.stringify({ id, query }).slice(0, 200)).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
    const viaMcp = await mcpCall(p.baseUrl, p.bootstrap.root_key, 'memoryStores_listDocuments', {
      path: { memory_store_id: store }, query: { path_prefix: deepHead, page: flipped },
    });
    expect(viaMcp.result?.isError).toBe(true);
    expect((toolBody(viaMcp.result).error as Record<string, unknown>).type).toBe('validation.malformed');
    // The MCP projection pages the same listing with the same cursors.
    const next = await mcpCall(p.baseUrl, p.bootstrap.root_key, 'memoryStores_listDocuments', {
      path: { memory_store_id: store }, query: { path_prefix: deepHead, limit: 10, page: cursor },
    });
    expect(next.result?.isError ?? false).toBe(false);
    expect((toolBody(next.result).data as { path: string }[]).map((d) => d.path)).toEqual(under.slice(1));
  });
});
