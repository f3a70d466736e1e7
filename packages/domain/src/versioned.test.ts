import { beforeAll, describe, expect, it } from 'vitest';
import { keys, tags, type Redis } from '@agentplane/store';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { VersionedStore, type VersionedDoc } from './versioned.js';

interface Keyed extends VersionedDoc {
  workspace_id: string;
  key: string;
}

let redis: Redis;
const testRedis = useEmbeddedRedis('versioned');
beforeAll(() => {
  redis = testRedis();
});

const UNIQ = 'thing_keys';
let seq = 0;
function doc(ws: string, key: string): Keyed {
  const now = new Date().toISOString();
  seq += 1;
  return { id: `thing_${String(seq).padStart(32, '0')}`, workspace_id: ws, key, version: 1, created_at: now, updated_at: now, archived_at: null };
}

describe('VersionedStore creation under a Workspace-unique key', () => {
  const store = () => new VersionedStore<Keyed>(redis, 'things', 'thing');
  const uniq = (ws: string) => keys.unique(tags.workspace(ws), UNIQ);

  it('claims the key in the script that writes the head and version 1', async () => {
    const ws = 'wrkspc_unique_a';
    const d = doc(ws, 'alpha');
    await store().create(ws, d, { collection: UNIQ, key: 'alpha' });
    expect(await redis.hget(uniq(ws), 'alpha')).toBe(d.id);
    expect(await store().idByKey(ws, { collection: UNIQ, key: 'alpha' })).toBe(d.id);
    expect((await store().get(ws, d.id)).key).toBe('alpha');
    expect((await store().getVersion(ws, d.id, 1)).key).toBe('alpha');
  });

  it('a key another resource holds is 409 and writes nothing: no head, no version, no listing entry', async () => {
    const ws = 'wrkspc_unique_b';
    const first = doc(ws, 'beta');
    await store().create(ws, first, { collection: UNIQ, key: 'beta' });
    const second = doc(ws, 'beta');
    await expect(store().create(ws, second, { collection: UNIQ, key: 'beta' })).rejects.toMatchObject({ type: 'validation.conflict' });
    expect(await redis.hget(uniq(ws), 'beta')).toBe(first.id);
    expect(await redis.exists(keys.doc(tags.workspace(ws), second.id), keys.doc(tags.workspace(ws), `${second.id}:v1`))).toBe(0);
    expect((await store().list(ws, { limit: 10, includeArchived: true })).data.map((x) => x.id)).toEqual([first.id]);
  });

  it('a refused creation (the id exists) claims no key', async () => {
    const ws = 'wrkspc_unique_c';
    const d = doc(ws, 'gamma');
    await store().create(ws, d, { collection: UNIQ, key: 'gamma' });
    await expect(store().create(ws, { ...d, key: 'delta' }, { collection: UNIQ, key: 'delta' })).rejects.toMatchObject({ type: 'validation.conflict' });
    expect(await redis.hexists(uniq(ws), 'delta')).toBe(0);
  });

  it('a key claimed for a resource whose head was never written is released and taken', async () => {
    const ws = 'wrkspc_unique_d';
    await redis.hset(uniq(ws), 'epsilon', `thing_${'9'.repeat(32)}`);
    const d = doc(ws, 'epsilon');
    await store().create(ws, d, { collection: UNIQ, key: 'epsilon' });
    expect(await redis.hget(uniq(ws), 'epsilon')).toBe(d.id);
    // A holder whose head exists keeps its key.
    await expect(store().create(ws, doc(ws, 'epsilon'), { collection: UNIQ, key: 'epsilon' })).rejects.toMatchObject({ type: 'validation.conflict' });
    expect(await redis.hget(uniq(ws), 'epsilon')).toBe(d.id);
  });

  it('a creation without a key claims nothing', async () => {
    const ws = 'wrkspc_unique_e';
    const d = doc(ws, 'zeta');
    await store().create(ws, d);
    expect(await redis.exists(uniq(ws))).toBe(0);
    expect((await store().get(ws, d.id)).id).toBe(d.id);
  });
});

describe('VersionedStore: a keyed new version', () => {
  const store = () => new VersionedStore<Keyed>(redis, 'things', 'thing');
  const keyed = (token: string) => ({ token, keptMs: 60_000 });

  it('is written once per request: a later attempt, however it is fenced, is answered the version the first wrote', async () => {
    const ws = 'wrkspc_keyed_a';
    const d = doc(ws, 'one');
    await store().create(ws, d);
    const two = await store().newVersion(ws, d.id, 1, (cur) => ({ ...cur, key: 'two' }), keyed('req'));
    // The retry, fenced on the version the first attempt moved on from, is answered it, not refused as stale.
    expect(await store().newVersion(ws, d.id, 1, (cur) => ({ ...cur, key: 'two' }), keyed('req'))).toEqual(two);
    // Unfenced, it is not written again as version 3.
    expect(await store().newVersion(ws, d.id, undefined, (cur) => ({ ...cur, key: 'two' }), keyed('req'))).toEqual(two);
    expect((await store().get(ws, d.id)).version).toBe(2);
    // Another request writes its own.
    expect((await store().newVersion(ws, d.id, undefined, (cur) => ({ ...cur, key: 'three' }), keyed('other'))).version).toBe(3);
    const ttl = await redis.pttl(keys.scoped(tags.workspace(ws), 'things_req:req'));
    expect(ttl).toBeGreaterThan(50_000);
  });

  it('racing another attempt of the same request past its lookup: both are answered the one version written', async () => {
    const ws = 'wrkspc_keyed_b';
    const d = doc(ws, 'one');
    await store().create(ws, d);
    const [a, b] = await Promise.all([
      store().newVersion(ws, d.id, undefined, (cur) => ({ ...cur, key: 'two' }), keyed('same')),
      store().newVersion(ws, d.id, undefined, (cur) => ({ ...cur, key: 'two' }), keyed('same')),
    ]);
    expect([a.version, b.version]).toEqual([2, 2]);
    expect((await store().get(ws, d.id)).version).toBe(2);
    expect((await store().listVersions(ws, d.id, { limit: 10 })).data.map((v) => v.version)).toEqual([1, 2]);
  });
});

describe('VersionedStore archive', () => {
  const store = () => new VersionedStore<Keyed>(redis, 'things', 'thing');

  it('an archive that read the head before another archived it is stale: the first archived_at stays', async () => {
    const ws = 'wrkspc_archive_race';
    const d = doc(ws, 'archived-twice');
    await store().create(ws, d, { collection: UNIQ, key: 'archived-twice' });
    const first = await store().archive(ws, d.id);
    // The other archive's write, made from the head it read before the first archive landed.
    const late = { ...d, archived_at: '2099-01-01T00:00:00.000Z', updated_at: '2099-01-01T00:00:00.000Z' };
    const write = (store() as unknown as { write(ws: string, doc: Keyed, expected: number | null, withVersion: boolean): Promise<void> }).write.bind(store());
    await expect(write(ws, late, d.version, false)).rejects.toMatchObject({ type: 'validation.conflict' });
    expect((await store().get(ws, d.id)).archived_at).toBe(first.archived_at);
    // And archive() itself, retried on that conflict, answers the head as archived.
    expect(await store().archive(ws, d.id)).toEqual(first);
  });
});
