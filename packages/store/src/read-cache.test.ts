import { describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from './testing.js';
import { Redis } from 'ioredis';
import { cachedGet, forgetWritten, primeCache, ReadCache, storedJsonOf } from './read-cache.js';
import { DocumentStore } from './documents.js';
import { keys, tags } from './keys.js';


const testRedis = useEmbeddedRedis('read-cache-test');

/** Polls without sleeping a fixed time: resolves when `pred` holds (or fails after 5 s). */
async function until(pred: () => boolean | Promise<boolean>): Promise<void> {
  const end = Date.now() + 5000;
  while (!(await pred())) {
    if (Date.now() > end) throw new Error('condition not reached');
    await new Promise((r) => setImmediate(r));
  }
}

async function started(redis: Redis, options = {}): Promise<ReadCache> {
  const cache = new ReadCache(redis, options);
  await cache.start();
  await until(() => cache.active);
  return cache;
}

/**
 * A cache started on its own connection (`mine`) and a second connection for another process's
 * writes (`other`); all closed after `fn`.
 */
async function withCache(fn: (c: { cache: ReadCache; mine: Redis; other: Redis }) => Promise<void>, options = {}): Promise<void> {
  const mine = new Redis(testRedis.server().url);
  const other = new Redis(testRedis.server().url);
  try {
    const cache = await started(mine, options);
    try {
      await fn({ cache, mine, other });
    } finally {
      await cache.close();
    }
  } finally {
    mine.disconnect();
    other.disconnect();
  }
}

describe('ReadCache', () => {
  it('a key primed after this process wrote it is served without a read, and still invalidated by a later change', async () => {
    await withCache(async ({ cache, mine, other }) => {
      const docs = new DocumentStore(mine);
      const tag = tags.session('sess_prime');
      const now = new Date().toISOString();
      await docs.create(tag, { id: 'sess_prime', version: 1, created_at: now, updated_at: now });
      const key = keys.doc(tag, 'sess_prime');
      expect(cache.peek(key)).toBeUndefined(); // its own write dropped it
      primeCache(mine, [key]);
      await until(() => cache.peek(key) !== undefined);
      expect(JSON.parse(cache.peek(key) as string)).toMatchObject({ id: 'sess_prime', version: 1 });
      await other.set(key, JSON.stringify({ id: 'sess_prime', version: 2 }));
      await until(() => cache.peek(key) === undefined);
      expect(JSON.parse((await cachedGet(mine, key)) as string)).toMatchObject({ version: 2 });
    });
  });

  it('serves a read from memory, and another connection\'s write is seen once Redis invalidates it', () => withCache(async ({ cache, other }) => {
    await other.set('rc:{a}:k', 'one');
    expect(await cache.get('rc:{a}:k')).toBe('one');
    const misses = cache.misses;
    expect(await cache.get('rc:{a}:k')).toBe('one');
    expect(cache.misses).toBe(misses);
    expect(cache.hits).toBeGreaterThan(0);
    // Redis sends the invalidation before it answers the writer.
    await other.set('rc:{a}:k', 'two');
    await until(async () => (await cache.get('rc:{a}:k')) === 'two');
    // A deleted key (a revoked credential) reads as absent.
    await other.del('rc:{a}:k');
    await until(async () => (await cache.get('rc:{a}:k')) === null);
    // An absent key is cached as absent, and tracked: creating it invalidates.
    expect(await cache.get('rc:{a}:absent')).toBeNull();
    await other.set('rc:{a}:absent', 'now');
    await until(async () => (await cache.get('rc:{a}:absent')) === 'now');
  }));

  it('a write made by this process through a script or forgetWritten is read back at once', () => withCache(async ({ mine }) => {
    const docs = new DocumentStore(mine);
    const tag = tags.workspace('wrkspc_rc');
    const now = new Date().toISOString();
    await docs.create(tag, { id: 'prin_rc', version: 1, created_at: now, updated_at: now });
    expect((await docs.getCached(tag, 'prin_rc'))?.version).toBe(1);
    await docs.update(tag, 'prin_rc', (d) => ({ ...d }));
    // No wait: the script's keys were dropped locally when Redis answered.
    expect((await docs.getCached(tag, 'prin_rc'))?.version).toBe(2);
    await docs.remove(tag, 'prin_rc');
    expect(await docs.getCached(tag, 'prin_rc')).toBeNull();

    const k = keys.auth('rcdigest');
    await mine.set(k, 'live');
    expect(await cachedGet(mine, k)).toBe('live');
    await mine.del(k);
    forgetWritten(mine, [k]);
    expect(await cachedGet(mine, k)).toBeNull();
  }));

  it('a read under way when its key changes is not kept', () => withCache(async ({ cache, mine }) => {
    await mine.set('rc:{b}:k', 'old');
    const reading = cache.get('rc:{b}:k');
    cache.forget(['rc:{b}:k']); // what an invalidation arriving mid-read does
    expect(await reading).toBe('old');
    await mine.set('rc:{b}:k', 'new');
    expect(await cache.get('rc:{b}:k')).toBe('new');
  }));

  it('stops serving while its invalidation connection is down, and serves again after', () => withCache(async ({ cache, other: admin }) => {
    await admin.set('rc:{c}:k', 'a');
    expect(await cache.get('rc:{c}:k')).toBe('a');
    await admin.client('KILL', 'TYPE', 'pubsub');
    await until(() => !cache.active);
    // Off: every read goes to Redis, nothing is kept.
    await admin.set('rc:{c}:k', 'b');
    expect(await cache.get('rc:{c}:k')).toBe('b');
    await until(() => cache.active);
    await admin.set('rc:{c}:k', 'c');
    await until(async () => (await cache.get('rc:{c}:k')) === 'c');
  }));

  it('keeps nothing older than maxAgeMs', () => withCache(async ({ cache, mine }) => {
    await mine.set('rc:{d}:k', 'x');
    await cache.get('rc:{d}:k');
    const misses = cache.misses;
    const t = Date.now();
    await until(() => Date.now() > t + 2);
    await cache.get('rc:{d}:k');
    expect(cache.misses).toBe(misses + 1);
  }, { maxAgeMs: 1 }));
});

describe('ReadCache peeks', () => {
  it('peek answers only what the cache holds; peekShared parses once per text and sees every change', () => withCache(async ({ cache, other }) => {
    await other.set('rc:{p}:doc', JSON.stringify({ v: 1 }));
    expect(cache.peek('rc:{p}:doc')).toBeUndefined(); // never read: not held
    expect(cache.peekShared('rc:{p}:doc')).toBeUndefined();
    await cache.get('rc:{p}:doc');
    const first = cache.peekShared<{ v: number }>('rc:{p}:doc');
    expect(first).toEqual({ v: 1 });
    expect(Object.isFrozen(first)).toBe(true);
    expect(cache.peekShared('rc:{p}:doc')).toBe(first); // the same parsed copy
    // Its stored text, to answer it as it is; a copy or another object has none.
    expect(storedJsonOf(first as object)).toBe(JSON.stringify({ v: 1 }));
    expect(storedJsonOf({ ...first })).toBeUndefined();
    await other.set('rc:{p}:doc', JSON.stringify({ v: 2 }));
    await until(() => cache.peek('rc:{p}:doc') === undefined);
    expect(cache.peekShared('rc:{p}:doc')).toBeUndefined();
    await cache.get('rc:{p}:doc');
    const second = cache.peekShared<{ v: number }>('rc:{p}:doc');
    expect(second).toEqual({ v: 2 });
    expect(storedJsonOf(second as object)).toBe(JSON.stringify({ v: 2 }));
    expect(storedJsonOf(first as object)).toBe(JSON.stringify({ v: 1 })); // an old copy keeps its own text
    await other.del('rc:{p}:doc');
    await until(() => cache.peek('rc:{p}:doc') === undefined);
    await cache.get('rc:{p}:doc');
    expect([cache.peek('rc:{p}:doc'), cache.peekShared('rc:{p}:doc')]).toEqual([null, null]);
  }));
});
