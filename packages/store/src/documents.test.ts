import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from './testing.js';
import { DocumentStore } from './documents.js';
import { keys, tags } from './keys.js';
import type { Redis } from './redis.js';

const testRedis = useEmbeddedRedis('documents');
let redis: Redis;
let docs: DocumentStore;

beforeAll(() => {
  redis = testRedis();
  docs = new DocumentStore(redis);
});

let n = 0;
async function stored(tag: ReturnType<typeof tags.workspace>): Promise<{ id: string; version: number }> {
  const now = new Date().toISOString();
  const doc = { id: `doc_${++n}`, version: 1, created_at: now, updated_at: now };
  await docs.create(tag, doc, ['things', 'others']);
  return doc;
}

describe('DocumentStore.removeIfVersion', () => {
  it('deletes the document and its index entries only at the expected version', async () => {
    const tag = tags.workspace('wrkspc_docs_a');
    const doc = await stored(tag);
    await docs.update(tag, doc.id, (d) => ({ ...d }));
    const stale = await docs.removeIfVersion(tag, doc.id, 1, ['things', 'others']);
    expect(stale.kind).toBe('stale');
    expect(stale.kind === 'stale' && (JSON.parse(stale.current) as { version: number }).version).toBe(2);
    expect(await docs.get(tag, doc.id)).toMatchObject({ version: 2 });
    expect(await redis.zrange(keys.index(tag, 'things'), 0, -1)).toEqual([doc.id]);

    expect(await docs.removeIfVersion(tag, doc.id, 2, ['things', 'others'])).toEqual({ kind: 'removed' });
    expect(await docs.get(tag, doc.id)).toBeNull();
    expect(await redis.zcard(keys.index(tag, 'things'))).toBe(0);
    expect(await redis.zcard(keys.index(tag, 'others'))).toBe(0);
    expect(await docs.removeIfVersion(tag, doc.id, 2, ['things'])).toEqual({ kind: 'missing' });
  });

  it('without an expected version deletes whatever version is stored', async () => {
    const tag = tags.workspace('wrkspc_docs_b');
    const doc = await stored(tag);
    await docs.update(tag, doc.id, (d) => ({ ...d }));
    expect(await docs.removeIfVersion(tag, doc.id, undefined, ['things', 'others'])).toEqual({ kind: 'removed' });
    expect(await docs.get(tag, doc.id)).toBeNull();
    expect(await redis.zcard(keys.index(tag, 'things'))).toBe(0);
  });
});
