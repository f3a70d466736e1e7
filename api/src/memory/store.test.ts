import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { newId } from '@agentplane/core';
import { DocumentStore, type Redis } from '@agentplane/store';
import { MARKER_GRACE_MS, memoryKeys, MemoryStores } from './store.js';
import type { MemoryAuthor } from './model.js';

/**
 * A MemoryStore deleted while document writes are in flight: the racing orders are made
 * deterministic by running the deletion from inside the writer's own Redis calls.
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
