import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { newId } from '@agentplane/core';
import { DocumentStore, type Redis } from '@agentplane/store';
import { MemoryService } from './service.js';
import { memoryKeys } from './store.js';
import type { MemoryAuthor } from './model.js';

/**
 * A process's search index of a store whose Redis went back in time (a replica promoted without
 * the last writes it had not received yet): the index catches up from the change log it finds,
 * and answers for the documents that are there, the writes made since included.
 */
const testRedis = useEmbeddedRedis('memory-search');
let redis: Redis;
let memory: MemoryService;
const author: MemoryAuthor = { kind: 'api_key', id: 'key_test', principal_id: null };

beforeAll(() => {
  redis = testRedis();
  memory = new MemoryService(redis, new DocumentStore(redis));
});

const paths = async (storeId: string, query: string) => (await memory.search(storeId, { query, limit: 10 })).results.map((r) => r.path);

describe('searching a store whose change log went back', () => {
  it('finds a write made after the log lost entries this process had indexed, and not the lost ones', async () => {
    const ws = newId('workspace');
    const store = await memory.stores.createStore(ws, { name: 'failover' });
    const k = memoryKeys(store.id);
    await memory.stores.write(store.id, { path: 'a.md', content: 'alpha' }, author, ws);
    expect(await paths(store.id, 'alpha')).toEqual(['a.md']);

    // What the promoted replica will hold: everything before the next write.
    const kept = [k.docs, k.ver, k.paths, k.changes];
    const snapshot = await Promise.all(kept.map((key) => redis.dumpBuffer(key)));
    await memory.stores.write(store.id, { path: 'b.md', content: 'bravo' }, author, ws);
    expect(await paths(store.id, 'bravo')).toEqual(['b.md']);
    // The next entry's id is another than the lost one's (a later millisecond), as after any failover.
    const lost = Number(((await redis.xrevrange(k.changes, '+', '-', 'COUNT', 1))[0]?.[0] ?? '0-0').split('-')[0]);
    while (Date.now() <= lost) await new Promise((resolve) => setImmediate(resolve));

    // The failover: the write of b.md is lost, and one more write lands after it.
    for (const [i, key] of kept.entries()) await redis.restore(key, 0, snapshot[i] as Buffer, 'REPLACE');
    await redis.unlink(k.hist('b.md'));
    await memory.stores.write(store.id, { path: 'c.md', content: 'charlie' }, author, ws);

    expect(await paths(store.id, 'charlie')).toEqual(['c.md']);
    expect(await paths(store.id, 'bravo')).toEqual([]);
    expect(await paths(store.id, 'alpha')).toEqual(['a.md']);
    // The next page of a query only counts documents that are there.
    const page = await memory.search(store.id, { query: 'bravo', limit: 1 });
    expect(page.next_cursor).toBeNull();
  });
});
