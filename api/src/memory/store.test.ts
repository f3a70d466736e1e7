import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { newId } from '@agentplane/core';
import { DocumentStore, type Redis } from '@agentplane/store';
import { MARKER_GRACE_MS, memoryKeys, MemoryStores } from './store.js';
import type { MemoryAuthor } from './model.js';

/**
 * A MemoryStore deleted while document writes are in flight: the racing orders are made
 * deterministic by running the deletion from inside the writer's own Redis calls. Then a write
 * sent again after its reply was lost, and what a listing reads.
 */
const testRedis = useEmbeddedRedis('memory-store');
let redis: Redis;
let stores: MemoryStores;
const author: MemoryAuthor = { kind: 'api_key', id: 'key_test', principal_id: null };

beforeAll(() => {
  redis = testRedis();
  stores = new MemoryStores(redis, new DocumentStore(redis));
});

/** Every key of one store's tag. */
async function storeKeys(storeId: string): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', `ap:{m:${storeId}}:*`, 'COUNT', 1000);
    found.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  return found.sort();
}

/**
 * A MemoryStores on a connection of its own whose next script call first runs `before`: the
 * writer's snapshot (and the operation's existence check) are done, its write script is next.
 */
function racingStores(before: () => Promise<void>): MemoryStores {
  const conn = testRedis.connect(`racing-${newId('event')}`);
  const evalsha = conn.evalsha.bind(conn) as (...args: unknown[]) => Promise<unknown>;
  let armed = true;
  (conn as unknown as { evalsha: (...args: unknown[]) => Promise<unknown> }).evalsha = async (...args: unknown[]) => {
    if (armed) {
      armed = false;
      await before();
    }
    return evalsha(...args);
  };
  return new MemoryStores(conn, new DocumentStore(conn));
}

describe('deleting a MemoryStore while documents are written', () => {
  it('a write whose existence check passed before the deletion is refused with 404 and leaves no key', async () => {
    const ws = newId('workspace');
    const store = await stores.createStore(ws, { name: 'racing' });
    await stores.write(store.id, { path: 'kept/a.md', content: 'one' }, author, ws);
    expect(await storeKeys(store.id)).not.toEqual([]);

    const racing = racingStores(() => stores.removeStore(ws, store.id));
    await expect(racing.write(store.id, { path: 'late/b.md', content: 'two' }, author, ws)).rejects.toMatchObject({ type: 'validation.not_found', status: 404 });
    expect(await storeKeys(store.id)).toEqual([]);
  });

  it('a write after the deletion, without the workspace to look the head up in, is refused too', async () => {
    const ws = newId('workspace');
    const store = await stores.createStore(ws, { name: 'gone' });
    await stores.removeStore(ws, store.id);
    await expect(stores.write(store.id, { path: 'x.md', content: 'x' }, author)).rejects.toMatchObject({ type: 'validation.not_found' });
    expect(await storeKeys(store.id)).toEqual([]);
  });

  it('a store created before stores carried their marker is given one by its next write', async () => {
    const ws = newId('workspace');
    const store = await stores.createStore(ws, { name: 'older' });
    await redis.del(memoryKeys(store.id).alive);
    const r = await stores.write(store.id, { path: 'a.md', content: 'still writable' }, author, ws);
    expect(r.document.version).toBe(1);
    expect(await redis.exists(memoryKeys(store.id).alive)).toBe(1);
    await stores.removeStore(ws, store.id);
    expect(await storeKeys(store.id)).toEqual([]);
  });
});

describe('creating a MemoryStore', () => {
  it('sets its marker to expire until the head exists, then makes it permanent', async () => {
    const ws = newId('workspace');
    const conn = testRedis.connect(`creating-${newId('event')}`);
    const persist = conn.persist.bind(conn);
    let beforeConfirm: number | undefined;
    (conn as unknown as { persist: (key: string) => Promise<number> }).persist = async (key: string) => {
      beforeConfirm = await redis.pttl(key);
      return persist(key);
    };
    const store = await new MemoryStores(conn, new DocumentStore(conn)).createStore(ws, { name: 'timed' });
    expect(beforeConfirm).toBeGreaterThan(0);
    expect(beforeConfirm).toBeLessThanOrEqual(MARKER_GRACE_MS);
    expect(await redis.pttl(memoryKeys(store.id).alive)).toBe(-1);
  });

  it('a store deleted between its head and the confirmation of its marker is given none back', async () => {
    const ws = newId('workspace');
    const conn = testRedis.connect(`creating-${newId('event')}`);
    const persist = conn.persist.bind(conn);
    (conn as unknown as { persist: (key: string) => Promise<number> }).persist = async (key: string) => {
      const id = /\{m:(memstore_[0-9a-f]{32})\}/.exec(key)?.[1] as string;
      await stores.removeStore(ws, id);
      return persist(key);
    };
    const store = await new MemoryStores(conn, new DocumentStore(conn)).createStore(ws, { name: 'brief' });
    expect(await storeKeys(store.id)).toEqual([]);
    await expect(stores.write(store.id, { path: 'a.md', content: 'late' }, author, ws)).rejects.toMatchObject({ type: 'validation.not_found' });
    expect(await storeKeys(store.id)).toEqual([]);
  });
});

/**
 * A MemoryStores on a connection of its own whose script calls run twice, the first answer lost:
 * what the client does when the connection drops after Redis ran a command but before its reply
 * arrived (ioredis sends unanswered commands again once it has reconnected).
 */
function resendingStores(): MemoryStores {
  const conn = testRedis.connect(`resending-${newId('event')}`);
  const evalsha = conn.evalsha.bind(conn) as (...args: unknown[]) => Promise<unknown>;
  (conn as unknown as { evalsha: (...args: unknown[]) => Promise<unknown> }).evalsha = async (...args: unknown[]) => {
    await evalsha(...args);
    return evalsha(...args);
  };
  return new MemoryStores(conn, new DocumentStore(conn));
}

describe('a document write sent again after its reply was lost', () => {
  it('is applied once and answered as written: no 409 for a compare-and-swap, no duplicate version, no 404 for a delete', async () => {
    const ws = newId('workspace');
    const store = await stores.createStore(ws, { name: 'resent' });
    const resending = resendingStores();

    const created = await resending.write(store.id, { path: 'a.md', content: 'one', expectedVersion: 0 }, author, ws);
    expect(created).toMatchObject({ created: true, document: { version: 1, content: 'one' } });
    const replaced = await resending.write(store.id, { path: 'a.md', content: 'two', expectedVersion: 1 }, author, ws);
    expect(replaced.document).toMatchObject({ version: 2, content: 'two' });
    const unconditional = await resending.write(store.id, { path: 'a.md', content: 'three' }, author, ws);
    expect(unconditional.document).toMatchObject({ version: 3, content: 'three' });
    const removed = await resending.remove(store.id, 'a.md', 3, author, ws);
    expect(removed).toMatchObject({ type: 'memory_document_deleted', version: 4 });

    // One history entry per write, in order.
    const history = await stores.history(store.id, 'a.md', 10);
    expect(history.data.map((v) => [v.version, v.type, 'content' in v ? v.content : null])).toEqual([
      [4, 'memory_document_deleted', null], [3, 'memory_document', 'three'], [2, 'memory_document', 'two'], [1, 'memory_document', 'one'],
    ]);
    expect(await stores.read(store.id, 'a.md')).toBeNull();
  });
});

describe('listing the documents of a store', () => {
  /** A MemoryStores on a connection of its own that counts the bytes of every hash field it reads. */
  function countingStores(): { stores: MemoryStores; read: () => number } {
    const conn = testRedis.connect(`counting-${newId('event')}`);
    let bytes = 0;
    const count = (values: (string | null)[]) => {
      for (const v of values) bytes += v === null ? 0 : Buffer.byteLength(v, 'utf8');
      return values;
    };
    const hmget = conn.hmget.bind(conn) as (...args: unknown[]) => Promise<(string | null)[]>;
    const hget = conn.hget.bind(conn) as (...args: unknown[]) => Promise<string | null>;
    (conn as unknown as { hmget: (...args: unknown[]) => Promise<(string | null)[]> }).hmget = async (...args: unknown[]) => count(await hmget(...args));
    (conn as unknown as { hget: (...args: unknown[]) => Promise<string | null> }).hget = async (...args: unknown[]) => count([await hget(...args)])[0] ?? null;
    return { stores: new MemoryStores(conn, new DocumentStore(conn)), read: () => bytes };
  }

  it('reads each entry without its content: a page of 100 kB documents costs bytes per entry, not per document', async () => {
    const ws = newId('workspace');
    const store = await stores.createStore(ws, { name: 'large' });
    const big = 'x'.repeat(100_000);
    for (let i = 0; i < 20; i++) await stores.write(store.id, { path: `d/${String(i).padStart(2, '0')}.md`, content: big, metadata: { n: String(i) } }, author, ws);
    await stores.write(store.id, { path: 'gone.md', content: big }, author, ws);
    await stores.remove(store.id, 'gone.md', undefined, author, ws);

    const { stores: counting, read } = countingStores();
    const page = await counting.list(store.id, { limit: 100 });
    expect(page.data.map((d) => d.path)).toEqual(Array.from({ length: 20 }, (_, i) => `d/${String(i).padStart(2, '0')}.md`));
    expect(page.data[3]).toEqual({ path: 'd/03.md', version: 1, size_bytes: 100_000, metadata: { n: '3' }, updated_at: expect.any(String) as string });
    expect(read()).toBeLessThan(20 * 1000);
  });

  it('lists documents written before stores kept listing entries, from the documents themselves', async () => {
    const ws = newId('workspace');
    const store = await stores.createStore(ws, { name: 'older-entries' });
    for (const path of ['a.md', 'b.md', 'c.md']) await stores.write(store.id, { path, content: path, metadata: { p: path } }, author, ws);
    await redis.hdel(memoryKeys(store.id).entries, 'a.md', 'c.md');
    const page = await stores.list(store.id, { limit: 10 });
    expect(page.data.map((d) => [d.path, d.version, d.size_bytes, d.metadata])).toEqual([['a.md', 1, 4, { p: 'a.md' }], ['b.md', 1, 4, { p: 'b.md' }], ['c.md', 1, 4, { p: 'c.md' }]]);
    expect(page.data.every((d) => !('content' in d))).toBe(true);
    await stores.removeStore(ws, store.id);
    expect(await storeKeys(store.id)).toEqual([]);
  });
});
