import { existsSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { useCrashPlatforms } from './harness/crash-platform.js';

type Store = { id: string; name: string };

/**
 * The API killed while a MemoryStore is created: between its `alive` marker and its head (crash
 * point `memory-store-marker-set`), and between its head and the marker's confirmation
 * (`memory-store-created`). The first leaves only a marker that expires; the second a store that
 * stays writable once that marker has lapsed.
 */
describe('a crash while a MemoryStore is created', () => {
  const crash = useCrashPlatforms('memory-crash');

  it('leaves no marker for good, and a store whose head was written stays writable', async () => {
    const q = await crash.start(['memory-store-marker-set', 'memory-store-created'], { env: { LOG_LEVEL: 'warn' } });
    const markerSet = q.marker('memory-store-marker-set');
    const created = q.marker('memory-store-created');
    const r = q.redis();
    const c = q.p.root;
    const restarted = (before: number | undefined) => q.apiRestarted(before, { client: c, path: '/v1/memory-stores' });
    const storeKeys = async () => (await r.keys('ap:{m:*')).sort();
    const list = async () => (await c.get<{ data: Store[] }>('/v1/memory-stores')).data;

    // Dead before the head: no store, and its marker is the only key left, expiring.
    let before = q.p.pids().api;
    await expect(c.request('POST', '/v1/memory-stores', { body: { name: 'notes' } })).rejects.toThrow();
    expect(existsSync(markerSet)).toBe(true);
    await restarted(before);
    expect(await list()).toEqual([]);
    const orphans = await storeKeys();
    expect(orphans).toEqual([expect.stringMatching(/^ap:\{m:memstore_[0-9a-f]{32}\}:alive$/)]);
    const ttl = await r.pttl(orphans[0] as string);
    expect(ttl).toBeGreaterThan(0);
    expect(ttl).toBeLessThanOrEqual(10 * 60_000);

    // Dead after the head, with the same name (names are not unique): the store exists.
    before = q.p.pids().api;
    await expect(c.request('POST', '/v1/memory-stores', { body: { name: 'notes' } })).rejects.toThrow();
    expect(existsSync(created)).toBe(true);
    await restarted(before);
    const [store] = await list();
    expect(store).toMatchObject({ name: 'notes' });
    const id = (store as Store).id;
    const alive = `ap:{m:${id}}:alive`;
    expect(await r.pttl(alive)).toBeGreaterThan(0);
    // Its marker lapses (as its expiry would make it); its next write gives it one for good.
    await r.del(alive);
    const put = await c.request('PUT', `/v1/memory-stores/${id}/document`, { body: { path: 'a.md', content: 'still writable' } });
    expect(put.status).toBe(201);
    expect(await r.pttl(alive)).toBe(-1);

    // A creation that finishes confirms its marker at once; a deletion takes every key of the store.
    const kept = await c.post<Store>('/v1/memory-stores', { name: 'kept' });
    expect(await r.pttl(`ap:{m:${kept.id}}:alive`)).toBe(-1);
    expect((await c.request('DELETE', `/v1/memory-stores/${id}`)).status).toBe(200);
    expect((await storeKeys()).filter((k) => k.includes(id))).toEqual([]);
  }, 180_000);
});

describe('a crash between deleting a MemoryStore\'s head and its documents', () => {
  const crash = useCrashPlatforms('memory-delete-crash');

  it('leaves the deletion on record, and the documents and their history are reclaimed by a later deletion once its grace has passed', async () => {
    const q = await crash.start(['memory-store-head-removed'], { env: { LOG_LEVEL: 'warn' } });
    const r = q.redis();
    const c = q.p.root;
    const keysOf = async (id: string) => (await r.keys(`ap:{m:${id}}:*`)).sort();
    const gone = await c.post<Store>('/v1/memory-stores', { name: 'gone' });
    for (const path of ['a.md', 'b/c.md', 'a.md']) {
      expect((await c.request('PUT', `/v1/memory-stores/${gone.id}/document`, { body: { path, content: `text of ${path}` } })).status).toBeLessThan(300);
    }
    expect((await keysOf(gone.id)).length).toBeGreaterThanOrEqual(6);
    const before = q.p.pids().api;
    // The API dies inside the deletion, after the head is gone: the request gets no answer.
    await expect(c.request('DELETE', `/v1/memory-stores/${gone.id}`)).rejects.toThrow();
    expect(existsSync(q.marker('memory-store-head-removed'))).toBe(true);
    await q.apiRestarted(before, { client: c, path: '/v1/memory-stores' });

    // The store is gone for readers; its keys are still there, and the deletion is on record.
    expect((await c.request('GET', `/v1/memory-stores/${gone.id}`)).status).toBe(404);
    expect((await keysOf(gone.id)).length).toBeGreaterThanOrEqual(6);
    const journal = 'ap:{g:memory_store_deletions}:memory_store_deletions';
    const pending = await r.zrange(journal, 0, -1);
    expect(pending).toEqual([`${q.p.bootstrap.workspace_id} ${gone.id}`]);

    // Its grace passes (moved back rather than waited for); the next deletion sweeps it.
    await r.zadd(journal, 0, pending[0] as string);
    const other = await c.post<Store>('/v1/memory-stores', { name: 'other' });
    expect((await c.request('DELETE', `/v1/memory-stores/${other.id}`)).status).toBe(200);
    expect(await keysOf(gone.id)).toEqual([]);
    expect(await keysOf(other.id)).toEqual([]);
    expect(await r.zcard(journal)).toBe(0);
  }, 120_000);
});
