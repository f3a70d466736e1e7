import { createHash } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { HttpClient } from '@agentplane/client';
import { RedisRuntimeBearers } from '@agentplane/domain';
import { LeaseFence } from '@agentplane/lease';
import { connectRedis, type Redis } from '@agentplane/store';
import type { Platform } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnPlatform } from './harness/turns.js';
import { createCredential, createPrincipal, errMsg, errType } from './harness/governance.js';
import { mcpCall, toolBody } from './harness/mcp-call.js';

/**
 * MemoryStores end to end: documents with compare-and-swap versions and history, the 100 kB
 * limit, full-text search paging, the Principal permission check, and the harness's memory tools
 * in real turns (one Session writes, a later Session reads and searches) through the runtime
 * endpoint with the lease's bearer.
 */
let t: TurnPlatform;
let p: Platform;
let api: HttpClient;
let redis: Redis;

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'memory' });
  ({ p, api } = t);
  redis = connectRedis(p.redisUrl(), { name: 'memory-test' });
}, 180_000);
afterAll(async () => {
  await redis?.quit();
  await p?.stop();
});

interface Doc { path: string; version: number; content: string; updated_by: Json; type: string }
const newStore = async (name: string) => (await api.post<{ id: string; document_count: number }>('/v1/memory-stores', { name })).id;
const put = (store: string, body: Json) => api.request<Doc & { error?: Json }>('PUT', `/v1/memory-stores/${store}/document`, { body });

describe('MemoryStore documents (REST)', () => {
  it('creates, replaces under compare-and-swap, keeps every version and deletes', async () => {
    const store = await newStore('notes');
    expect(store).toMatch(/^memstore_[0-9a-f]{32}$/);

    const created = await put(store, { path: 'team/plan.md', content: 'ship the memory tools', metadata: { owner: 'ops' }, expected_version: 0 });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ type: 'memory_document', path: 'team/plan.md', version: 1, size_bytes: 21, metadata: { owner: 'ops' } });
    expect(created.body.updated_by).toMatchObject({ kind: 'api_key' });

    // Create-only on an existing path, and a stale version: 409, nothing written.
    const again = await put(store, { path: 'team/plan.md', content: 'other', expected_version: 0 });
    expect(again.status).toBe(409);
    expect(errType(again)).toBe('validation.conflict');
    const v2 = await put(store, { path: 'team/plan.md', content: 'ship memory, vaults and projects', expected_version: 1 });
    expect(v2.status).toBe(200);
    expect(v2.body.version).toBe(2);
    const stale = await put(store, { path: 'team/plan.md', content: 'lost update', expected_version: 1 });
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('validation.conflict');

    const current = await api.get<Doc>(`/v1/memory-stores/${store}/document`, { path: 'team/plan.md' });
    expect(current).toMatchObject({ version: 2, content: 'ship memory, vaults and projects', metadata: { owner: 'ops' } });
    const first = await api.get<Doc>(`/v1/memory-stores/${store}/document`, { path: 'team/plan.md', version: 1 });
    expect(first.content).toBe('ship the memory tools');

    const del = await api.request<Doc>('DELETE', `/v1/memory-stores/${store}/document`, { query: { path: 'team/plan.md', expected_version: 2 } });
    expect(del.status).toBe(200);
    expect(del.body).toMatchObject({ type: 'memory_document_deleted', version: 3 });
    expect((await api.request('GET', `/v1/memory-stores/${store}/document`, { query: { path: 'team/plan.md' } })).status).toBe(404);
    const history = await api.get<{ data: Doc[]; next_page: string | null }>(`/v1/memory-stores/${store}/document/versions`, { path: 'team/plan.md', limit: 2 });
    expect(history.data.map((v) => [v.version, v.type])).toEqual([[3, 'memory_document_deleted'], [2, 'memory_document']]);
    const older = await api.get<{ data: Doc[]; next_page: string | null }>(`/v1/memory-stores/${store}/document/versions`, { path: 'team/plan.md', page: history.next_page ?? '' });
    expect(older.data.map((v) => v.version)).toEqual([1]);
    expect(older.next_page).toBeNull();

    const bad = await put(store, { path: 'a/../b', content: 'x' });
    expect(bad.status).toBe(400);
    expect(errType(bad)).toBe('validation.malformed');
    expect((await api.request('GET', `/v1/memory-stores/memstore_${'0'.repeat(32)}`)).status).toBe(404);
  });

  it('a store update that changes nothing keeps its version; an empty body is 400', async () => {
    const store = await newStore('heads');
    interface Head { name: string; description: string | null; metadata: Json; version: number; updated_at: string }
    const update = (body: Json) => api.request<Head>('POST', `/v1/memory-stores/${store}`, { body });
    const head = await api.get<Head>(`/v1/memory-stores/${store}`);
    expect(head.version).toBe(1);

    // Nothing to change, or only the version to compare: 400, naming what may be set.
    for (const body of [{}, { expected_version: 1 }]) {
      const empty = await update(body);
      expect([empty.status, errType(empty)]).toEqual([400, 'validation.malformed']);
      expect(errMsg(empty)).toBe("body: nothing to change: set at least one of 'name', 'description', 'metadata'");
    }
    for (const body of [{ name: 'heads' }, { description: null, metadata: {} }]) {
      const same = await update(body);
      expect(same.status).toBe(200);
      expect(same.body).toMatchObject({ version: 1, updated_at: head.updated_at });
    }
    const renamed = await update({ expected_version: 1, name: 'heads-2', metadata: { team: 'ops' } });
    expect(renamed.body).toMatchObject({ name: 'heads-2', metadata: { team: 'ops' }, version: 2 });
    expect((await update({ metadata: { team: 'ops' } })).body.version).toBe(2);
    const stale = await update({ expected_version: 1, name: 'heads-2' });
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('validation.conflict');
    expect((await api.get<Head>(`/v1/memory-stores/${store}`)).version).toBe(2);
  });

  it('holds documents of up to 100 kB and refuses one byte more', async () => {
    const store = await newStore('limits');
    const ok = await put(store, { path: 'big.txt', content: 'a'.repeat(100_000) });
    expect(ok.status).toBe(201);
    expect(ok.body.version).toBe(1);
    const over = await put(store, { path: 'big.txt', content: 'a'.repeat(100_001) });
    expect(over.status).toBe(400);
    expect(errType(over)).toBe('validation.malformed');
    // Multi-byte characters count as their UTF-8 bytes.
    const wide = await put(store, { path: 'wide.txt', content: 'é'.repeat(50_001) });
    expect(wide.status).toBe(400);
    expect((await api.get<Doc>(`/v1/memory-stores/${store}/document`, { path: 'big.txt' })).version).toBe(1);
  });

  it('lists by path prefix and searches with results + next_cursor', async () => {
    const store = await newStore('search');
    for (let i = 0; i < 7; i++) await put(store, { path: `recipes/soup-${i}.md`, content: `Soup number ${i} needs carrots and ${i % 2 === 0 ? 'leeks' : 'onions'}` });
    await put(store, { path: 'travel/lisbon.md', content: 'Trams, tiles and custard tarts' });

    const listed = await api.get<{ data: { path: string }[]; next_page: string | null }>(`/v1/memory-stores/${store}/documents`, { path_prefix: 'recipes/', limit: 5 });
    expect(listed.data.map((d) => d.path)).toEqual([0, 1, 2, 3, 4].map((i) => `recipes/soup-${i}.md`));
    const rest = await api.get<{ data: { path: string }[]; next_page: string | null }>(`/v1/memory-stores/${store}/documents`, { path_prefix: 'recipes/', limit: 5, page: listed.next_page ?? '' });
    expect(rest.data.map((d) => d.path)).toEqual(['recipes/soup-5.md', 'recipes/soup-6.md']);
    expect(rest.next_page).toBeNull();

    type Page = { results: { path: string; snippet: string; version: number }[]; next_cursor: string | null };
    const one = await api.get<Page>(`/v1/memory-stores/${store}/search`, { query: 'carrots', limit: 4 });
    expect(one.results).toHaveLength(4);
    expect(one.next_cursor).toMatch(/^c1_[0-9a-f]+$/);
    const two = await api.get<Page>(`/v1/memory-stores/${store}/search`, { query: 'carrots', limit: 4, cursor: one.next_cursor ?? '' });
    expect(two.results).toHaveLength(3);
    expect(two.next_cursor).toBeNull();
    expect(new Set([...one.results, ...two.results].map((r) => r.path)).size).toBe(7);
    expect(one.results[0]?.snippet).toContain('carrots');

    const tarts = await api.get<Page>(`/v1/memory-stores/${store}/search`, { query: 'custard' });
    expect(tarts.results.map((r) => r.path)).toEqual(['travel/lisbon.md']);
    // A write is searchable at once, and a deleted document is gone from results.
    await put(store, { path: 'travel/lisbon.md', content: 'Fado at night' });
    expect((await api.get<Page>(`/v1/memory-stores/${store}/search`, { query: 'custard' })).results).toEqual([]);
    expect((await api.get<Page>(`/v1/memory-stores/${store}/search`, { query: 'fado' })).results.map((r) => r.path)).toEqual(['travel/lisbon.md']);
    await api.request('DELETE', `/v1/memory-stores/${store}/document`, { query: { path: 'travel/lisbon.md' } });
    expect((await api.get<Page>(`/v1/memory-stores/${store}/search`, { query: 'fado' })).results).toEqual([]);

    const foreign = await api.request(`GET`, `/v1/memory-stores/${store}/search`, { query: { query: 'leeks', cursor: one.next_cursor ?? '' } });
    expect(foreign.status).toBe(400);
    expect(errType(foreign)).toBe('validation.malformed');
  });

  it('a search index rebuilt from Redis answers like the live one (no process state is needed)', async () => {
    const store = await newStore('rebuild');
    await put(store, { path: 'a.md', content: 'quantum gardening' });
    expect((await api.get<{ results: unknown[] }>(`/v1/memory-stores/${store}/search`, { query: 'quantum' })).results).toHaveLength(1);
    // The change log is truncated behind the index's back: the API must notice and rebuild from the documents.
    await put(store, { path: 'b.md', content: 'quantum cooking' });
    await redis.xtrim(`ap:{m:${store}}:changes`, 'MAXLEN', 0);
    await put(store, { path: 'c.md', content: 'quantum knitting' });
    const r = await api.get<{ results: { path: string }[] }>(`/v1/memory-stores/${store}/search`, { query: 'quantum', limit: 10 });
    expect(r.results.map((x) => x.path).sort()).toEqual(['a.md', 'b.md', 'c.md']);
  });

  it('a Principal credential reads a store only with a live PermissionAssignment on it', async () => {
    const store = await newStore('governed');
    await put(store, { path: 'x.md', content: 'governed text' });
    const ws = p.bootstrap.workspace_id;
    const prin = await createPrincipal(p.root, ws, 'reader');
    const cred = await createCredential(p.root, prin);
    const as = new HttpClient({ baseUrl: p.baseUrl, token: cred.secret });
    const denied = await as.request('GET', `/v1/memory-stores/${store}/search`, { query: { query: 'governed' } });
    expect(denied.status).toBe(403);
    expect(errType(denied)).toBe('policy.denied');
    const grant = await p.root.post<{ id: string }>('/v1/permission-assignments', { principal_id: prin, target: { type: 'memory_store', id: store }, actions: ['read'] });
    const allowed = await as.request<{ results: unknown[] }>('GET', `/v1/memory-stores/${store}/search`, { query: { query: 'governed' } });
    expect(allowed.status).toBe(200);
    expect(allowed.body.results).toHaveLength(1);
    // Writes are never open to Principal credentials.
    const write = await as.request('PUT', `/v1/memory-stores/${store}/document`, { body: { path: 'y.md', content: 'no' } });
    expect(write.status).toBe(403);
    await p.root.request('DELETE', `/v1/permission-assignments/${grant.id}`);
    expect((await as.request('GET', `/v1/memory-stores/${store}/document`, { query: { path: 'x.md' } })).status).toBe(403);
  });
});

describe('MemoryStore cursors and path validation', () => {
  /** A cursor as the API writes them: `c1_` + hex of its text (forged here). */
  const cursor = (text: string) => `c1_${Buffer.from(text, 'utf8').toString('hex')}`;
  const binding = (...parts: string[]) => createHash('sha256').update(parts.join('\0')).digest('hex').slice(0, 16);
  type Listing = { data: { path: string; version: number }[]; next_page: string | null };

  it('a history page cursor is a version of the same path: anything else is 400, never 500 or page 1', async () => {
    const store = await newStore('history-cursors');
    for (let i = 0; i < 3; i++) await put(store, { path: 'h/a.md', content: `a${i}` });
    await put(store, { path: 'h/b.md', content: 'b' });
    const versions = (query: Record<string, string | number>) => api.request<Listing>('GET', `/v1/memory-stores/${store}/document/versions`, { query });

    const first = await versions({ path: 'h/a.md', limit: 2 });
    expect(first.body.data.map((v) => v.version)).toEqual([3, 2]);
    const next = first.body.next_page ?? '';
    expect((await versions({ path: 'h/a.md', limit: 2, page: next })).body.data.map((v) => v.version)).toEqual([1]);

    // Not a number, a number past any version, zero, and another path's cursor.
    const bad = [
      cursor('version:abc'), cursor('version:1e400'), cursor(`version:${binding(store, 'h/a.md')}:abc`), cursor(`version:${binding(store, 'h/a.md')}:1e400`),
      cursor(`version:${binding(store, 'h/a.md')}:0`), cursor(`version:${binding(store, 'h/a.md')}:99999999999999999999`), cursor(`version:${binding(store, 'h/a.md')}:2.5`),
    ];
    for (const page of bad) {
      const r = await versions({ path: 'h/a.md', page });
      expect(r.status, Buffer.from(page.slice(3), 'hex').toString()).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
    const otherPath = await versions({ path: 'h/b.md', page: next });
    expect(otherPath.status).toBe(400);
    expect(errType(otherPath)).toBe('validation.malformed');

    // The same operation through MCP answers the same error, not runtime.internal.
    const viaMcp = await mcpCall(p.baseUrl, p.bootstrap.root_key, 'memoryStores_listDocumentVersions', {
      path: { memory_store_id: store }, query: { path: 'h/a.md', page: cursor('version:abc') },
    });
    expect(viaMcp.result?.isError).toBe(true);
    expect((toolBody(viaMcp.result).error as Json).type).toBe('validation.malformed');
  });

  it('a listing cursor stays under its path_prefix: another prefix\'s cursor is 400, and so is a forged one', async () => {
    const store = await newStore('prefix-cursors');
    for (const path of ['a.md', 'b/c.md', 'idem/1.md', 'idem/2.md', 'idem/\u{10FFFF}.md', 'idemx.md', 'z.md']) await put(store, { path, content: path });
    const list = (query: Record<string, string | number>) => api.request<Listing>('GET', `/v1/memory-stores/${store}/documents`, { query });

    const page1 = await list({ path_prefix: 'idem/', limit: 2 });
    expect(page1.body.data.map((d) => d.path)).toEqual(['idem/1.md', 'idem/2.md']);
    const page2 = await list({ path_prefix: 'idem/', limit: 2, page: page1.body.next_page ?? '' });
    // Every path under the prefix, the highest code point included; nothing past it.
    expect(page2.body.data.map((d) => d.path)).toEqual(['idem/\u{10FFFF}.md']);
    expect(page2.body.next_page).toBeNull();

    // A cursor of another listing (no prefix, another prefix), or of the older unbound form: 400.
    const all = await list({ limit: 1 });
    for (const [query, page] of [[{ path_prefix: 'idem/' }, all.body.next_page ?? ''], [{ path_prefix: 'b/' }, page1.body.next_page ?? ''], [{}, page1.body.next_page ?? ''], [{ path_prefix: 'idem/' }, cursor('path:a')]] as const) {
      const r = await list({ ...query, page });
      expect(r.status, JSON.stringify(query)).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
    // A cursor the listing did not issue, well formed as its own would be, is 400 too.
    for (const page of [cursor(`path:${binding(store, 'idem/')}:a`), cursor(`path:${binding(store, 'idem/')}:zzz`)]) {
      const r = await list({ path_prefix: 'idem/', page });
      expect([r.status, errType(r)]).toEqual([400, 'validation.malformed']);
    }
  });

  it('a cursor continues only the store it was issued for: another store\'s listing, history or search cursor is 400', async () => {
    const stores = [await newStore('cursor-store-a'), await newStore('cursor-store-b')];
    for (const store of stores) {
      for (const path of ['n/1.md', 'n/2.md', 'n/3.md']) await put(store, { path, content: `carrot ${path}` });
      for (let i = 0; i < 2; i++) await put(store, { path: 'n/1.md', content: `carrot again ${i}` });
    }
    const [a, b] = stores as [string, string];
    const listing = (store: string, query: Record<string, string | number>) => api.request<Listing>('GET', `/v1/memory-stores/${store}/documents`, { query });
    const history = (store: string, query: Record<string, string | number>) => api.request<Listing>('GET', `/v1/memory-stores/${store}/document/versions`, { query: { path: 'n/1.md', ...query } });
    const search = (store: string, query: Record<string, string | number>) => api.request<{ next_cursor: string | null }>('GET', `/v1/memory-stores/${store}/search`, { query: { query: 'carrot', ...query } });

    const listed = (await listing(a, { path_prefix: 'n/', limit: 1 })).body.next_page ?? '';
    const versions = (await history(a, { limit: 1 })).body.next_page ?? '';
    const searched = (await search(a, { limit: 1 })).body.next_cursor ?? '';
    // Each continues its own store's listing.
    expect((await listing(a, { path_prefix: 'n/', page: listed })).status).toBe(200);
    expect((await history(a, { page: versions })).status).toBe(200);
    expect((await search(a, { cursor: searched })).status).toBe(200);
    // And none of them another store's, where the same paths and query are.
    for (const r of [await listing(b, { path_prefix: 'n/', page: listed }), await history(b, { page: versions }), await search(b, { cursor: searched })]) {
      expect(r.status).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
  });

  it('refuses paths, contents and names that are not well-formed Unicode (a lone surrogate)', async () => {
    const store = await newStore('surrogates');
    for (const body of [
      { path: 'x\ud800y', content: 'lone high surrogate' },
      { path: 'x\udc00y', content: 'lone low surrogate' },
      { path: 'ok.md', content: 'a\ud800' },
      { path: 'ok.md', content: 'a', metadata: { k: 'v\udfff' } },
    ]) {
      const r = await put(store, body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
    // So the path of U+FFFD, which a lone surrogate would have become in Redis, is a path of its own.
    const replacement = await put(store, { path: 'x\uFFFDy', content: 'replacement character', expected_version: 0 });
    expect(replacement.status).toBe(201);
    expect((await api.get<Doc>(`/v1/memory-stores/${store}/document`, { path: 'x\uFFFDy' })).content).toBe('replacement character');
    // A pair is well-formed.
    expect((await put(store, { path: 'emoji-\ud83d\ude00.md', content: '\ud83d\ude00' })).status).toBe(201);

    const badName = await api.request('POST', '/v1/memory-stores', { body: { name: 'notes \ud800' } });
    expect(badName.status).toBe(400);
    expect(errType(badName)).toBe('validation.malformed');
  });
});

describe('memory tools in real turns', () => {
  const session = async (system: string, store: string, access: 'read_only' | 'read_write') =>
    (await api.post<{ id: string }>('/v1/sessions', {
      agent: { name: `memory-${access}`, model: 'default', system }, environment_id: t.envId,
      resources: [{ type: 'memory', memory_store_id: store, access }],
    })).id;

  it('one Session writes through the harness (attributed to its Run); a later Session reads and searches it', async () => {
    const store = await newStore('agent memory');
    const writer = await session(SCRIPT([
      { when: { user_contains: 'remember' }, then: [{ tool: 'memory__create', input: { path: 'prefs/drinks.md', content: 'The user prefers green tea in the morning.' } }] },
      { when: { after_tool: 'memory__create' }, then: [{ reply: 'Saved: {{tool_result}}' }] },
    ]), store, 'read_write');
    await api.post(`/v1/sessions/${writer}/events`, t.msg('please remember my drink'));
    const w = await untilEvents(api, writer, (e) => idleCount(e) >= 1, 90_000);
    expect(w.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(JSON.stringify(w.filter((e) => e.type === 'agent.message'))).toContain('\\"created\\":true');

    const doc = await api.get<Doc>(`/v1/memory-stores/${store}/document`, { path: 'prefs/drinks.md' });
    expect(doc.content).toBe('The user prefers green tea in the morning.');
    const runs = await api.get<{ data: { id: string }[] }>(`/v1/sessions/${writer}/runs`);
    expect(doc.updated_by).toEqual({ kind: 'run', id: runs.data[0]?.id, session_id: writer });

    const reader = await session(SCRIPT([
      { when: { user_contains: 'drink' }, then: [{ tool: 'memory__search', input: { query: 'tea' } }] },
      { when: { after_tool: 'memory__search' }, then: [{ tool: 'memory__view', input: { path: 'prefs/drinks.md' } }] },
      { when: { after_tool: 'memory__view' }, then: [{ reply: 'Memory says: {{tool_result}}' }] },
    ]), store, 'read_only');
    await api.post(`/v1/sessions/${reader}/events`, t.msg('what drink do I like?'));
    const r = await untilEvents(api, reader, (e) => idleCount(e) >= 1, 90_000);
    expect(r.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    const results = r.filter((e) => e.type === 'agent.tool_result').map((e) => JSON.stringify(e.payload));
    expect(results[0]).toContain('prefs/drinks.md');
    expect(results[0]).toContain('next_cursor');
    expect(JSON.stringify(r.filter((e) => e.type === 'agent.message'))).toContain('green tea');
  }, 240_000);

  it('colocated: the in-sandbox loop uses the same memory tools, relayed by the runner', async () => {
    const env = (await api.post<{ id: string }>('/v1/environments', {
      name: 'colocated-memory', image: 'agentplane/sandbox:latest', harness_topology: 'colocated',
      resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    })).id;
    const store = await newStore('colocated memory');
    await put(store, { path: 'facts/city.md', content: 'The office is in Lisbon.' });
    const s = (await api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'colocated-memory', model: 'default', system: SCRIPT([
          { when: { user_contains: 'office' }, then: [{ tool: 'memory__edit', input: { path: 'facts/city.md', old_text: 'Lisbon', new_text: 'Porto' } }] },
          { when: { after_tool: 'memory__edit' }, then: [{ reply: 'Edited: {{tool_result}}' }] },
        ]),
      },
      environment_id: env, resources: [{ type: 'memory', memory_store_id: store, access: 'read_write' }],
    })).id;
    await api.post(`/v1/sessions/${s}/events`, t.msg('the office moved'));
    const events = await untilEvents(api, s, (e) => idleCount(e) >= 1, 120_000);
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    const doc = await api.get<Doc>(`/v1/memory-stores/${store}/document`, { path: 'facts/city.md' });
    expect(doc).toMatchObject({ content: 'The office is in Porto.', version: 2, updated_by: { kind: 'run', session_id: s } });
  }, 240_000);

  it('the runtime endpoint: a read-only attachment lists and serves no write tool; writes conflict under CAS', async () => {
    const store = await newStore('runtime');
    const fence = new LeaseFence(redis);
    const bearers = new RedisRuntimeBearers(redis);
    const sessionId = `sess_${'e'.repeat(32)}`;
    await fence.claim({ sessionId, token: 'lease-mem', runnerId: 'runner_test', attempt: 1, runId: `run_${'e'.repeat(32)}` }, 60_000);
    const grant = (access: 'read_only' | 'read_write') => bearers.mint({
      run_id: `run_${'e'.repeat(32)}`, session_id: sessionId, workspace_id: p.bootstrap.workspace_id, organization_id: p.bootstrap.organization_id,
      lease_id: 'lease-mem', expires_at: new Date(Date.now() + 120_000).toISOString(), connections: {}, memory: { [store]: access },
    });
    const connect = async (bearer: string, id = store) => {
      const c = new Client({ name: 'harness', version: '1.0.0' });
      await c.connect(new StreamableHTTPClientTransport(new URL(`${p.baseUrl}/v1/runtime/memory/${id}`), { requestInit: { headers: { Authorization: `Bearer ${bearer}` } } }));
      return c;
    };
    const text = (r: { content: unknown }) => (r.content as { text: string }[])[0]?.text ?? '';

    const ro = await connect(await grant('read_only'));
    try {
      expect((await ro.listTools()).tools.map((x) => x.name).sort()).toEqual(['search', 'view']);
      const refused = await ro.callTool({ name: 'create', arguments: { path: 'x.md', content: 'no' } });
      expect(refused.isError).toBe(true);
      expect(JSON.parse(text(refused)).error.type).toBe('policy.denied');
    } finally {
      await ro.close();
    }
    const rw = await connect(await grant('read_write'));
    try {
      expect((await rw.listTools()).tools.map((x) => x.name).sort()).toEqual(['create', 'delete', 'edit', 'search', 'view']);
      expect((await rw.callTool({ name: 'create', arguments: { path: 'n.md', content: 'alpha beta' } })).isError).toBeFalsy();
      const dup = await rw.callTool({ name: 'create', arguments: { path: 'n.md', content: 'again' } });
      expect(JSON.parse(text(dup)).error.type).toBe('validation.conflict');
      const edited = await rw.callTool({ name: 'edit', arguments: { path: 'n.md', old_text: 'beta', new_text: 'gamma', expected_version: 1 } });
      expect(JSON.parse(text(edited))).toEqual({ path: 'n.md', version: 2 });
      const staleEdit = await rw.callTool({ name: 'edit', arguments: { path: 'n.md', content: 'lost', expected_version: 1 } });
      expect(JSON.parse(text(staleEdit)).error.type).toBe('validation.conflict');
      const tooBig = await rw.callTool({ name: 'create', arguments: { path: 'big.md', content: 'x'.repeat(100_001) } });
      expect(JSON.parse(text(tooBig)).error.type).toBe('validation.malformed');
    } finally {
      await rw.close();
    }
    expect((await api.get<Doc>(`/v1/memory-stores/${store}/document`, { path: 'n.md' })).content).toBe('alpha gamma');
    // Every write attempted through the tools is an audit record, as the Run; reads are not.
    const audit = await p.root.post<{ data: Array<{ action: string; target: string; outcome: string; status: number; actor: { id: string } }> }>('/v1/audit/export', { limit: 1000 });
    const writes = audit.data.filter((a) => a.action.startsWith('memoryStores.runtime') && a.target === store);
    expect(writes.map((a) => [a.action, a.outcome, a.status])).toEqual([
      ['memoryStores.runtimeCreate', 'denied', 403], ['memoryStores.runtimeCreate', 'succeeded', 200], ['memoryStores.runtimeCreate', 'failed', 409],
      ['memoryStores.runtimeEdit', 'succeeded', 200], ['memoryStores.runtimeEdit', 'failed', 409], ['memoryStores.runtimeCreate', 'failed', 400],
    ]);
    expect(writes.every((a) => a.actor.id === `run_${'e'.repeat(32)}`)).toBe(true);

    // Another store than the grant's, and an unknown bearer, are refused.
    const other = await newStore('not granted');
    const forbidden = await fetch(`${p.baseUrl}/v1/runtime/memory/${other}`, {
      method: 'POST', headers: { authorization: `Bearer ${await grant('read_write')}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    expect(forbidden.status).toBe(403);
    const unknown = await fetch(`${p.baseUrl}/v1/runtime/memory/${store}`, {
      method: 'POST', headers: { authorization: 'Bearer ap_rt_nope', 'content-type': 'application/json' }, body: '{}',
    });
    expect(unknown.status).toBe(401);
  });

  it("the runtime endpoint decides the Workspace's ActionPolicies itself: a denied memory tool never runs, and is recorded", async () => {
    const store = await newStore('governed');
    expect((await put(store, { path: 'keep.md', content: 'keep me' })).status).toBe(201);
    const rule = (await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'deny', tool: { kind: 'mcp', name: 'delete', connection_id: store } })).id;
    // A bearer used without the runner's own check first (a leaked one): the endpoint is the gate.
    const run = `run_${'f'.repeat(32)}`;
    const sessionId = `sess_${'f'.repeat(32)}`;
    await new LeaseFence(redis).claim({ sessionId, token: 'lease-governed', runnerId: 'runner_test', attempt: 1, runId: run }, 60_000);
    const bearer = await new RedisRuntimeBearers(redis).mint({
      run_id: run, session_id: sessionId, workspace_id: p.bootstrap.workspace_id, organization_id: p.bootstrap.organization_id,
      lease_id: 'lease-governed', expires_at: new Date(Date.now() + 120_000).toISOString(), connections: {}, memory: { [store]: 'read_write' },
    });
    const c = new Client({ name: 'harness', version: '1.0.0' });
    await c.connect(new StreamableHTTPClientTransport(new URL(`${p.baseUrl}/v1/runtime/memory/${store}`), { requestInit: { headers: { Authorization: `Bearer ${bearer}` } } }));
    const text = (r: { content: unknown }) => (r.content as { text: string }[])[0]?.text ?? '';
    try {
      const refused = await c.callTool({ name: 'delete', arguments: { path: 'keep.md' } });
      expect(refused.isError).toBe(true);
      expect(JSON.parse(text(refused)).error).toMatchObject({ type: 'policy.denied', message: expect.stringContaining(rule) });
      // What the rule does not name still runs.
      expect(JSON.parse(text(await c.callTool({ name: 'view', arguments: { path: 'keep.md' } })))).toMatchObject({ content: 'keep me', version: 1 });
    } finally {
      await c.close();
      await p.root.request('DELETE', `/v1/action-policies/${rule}`);
    }
    expect(await api.get<Doc>(`/v1/memory-stores/${store}/document`, { path: 'keep.md' })).toMatchObject({ content: 'keep me', version: 1 });
    type Row = { action: string; target: string | null; outcome: string; status: number | null; detail: string | null; actor: { id: string }; request_id: string | null };
    const writes = (await p.root.post<{ data: Row[] }>('/v1/audit/export', { target: store, limit: 1000 })).data.filter((a) => a.action.startsWith('memoryStores.runtime'));
    expect(writes.map((a) => [a.action, a.outcome, a.status, a.detail, a.actor.id])).toEqual([['memoryStores.runtimeDelete', 'denied', 403, 'policy.denied', run]]);
    expect(typeof writes[0]?.request_id).toBe('string');
    const decisions = (await p.root.post<{ data: Row[] }>('/v1/audit/export', { target: sessionId, limit: 1000 })).data;
    expect(decisions.map((a) => [a.action, a.outcome, a.detail, a.actor.id])).toEqual([['policy.mcp:delete', 'denied', rule, run]]);
  });
});
