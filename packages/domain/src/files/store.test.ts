import { beforeAll, describe, expect, it, vi } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { newId, nowIso } from '@agentplane/core';
import { DocumentStore, type Redis } from '@agentplane/store';
import type { FileDoc } from './model.js';
import { CHUNK_BYTES, FileStore } from './store.js';

/**
 * A commit whose process died between making the bytes permanent and creating the head leaves
 * them in Redis for good unless a sweep drops them. Each api process sweeps on a timer as well as
 * after each commit: here the orphan goes with no later commit, and no longer once the timer is
 * stopped.
 */
const testRedis = useEmbeddedRedis('files');
const JOURNAL = 'ap:{g:file_commits}:file_commits';
let redis: Redis;

beforeAll(() => {
  redis = testRedis();
});

const contentKey = (fileId: string) => `ap:{f:${fileId}}:content`;

async function* bytes(size: number): AsyncIterable<Buffer> {
  yield Buffer.alloc(size, 7);
}

/**
 * A commit whose process dies before its head exists (the head's write never returns): its bytes
 * are permanent and it is on record. Its deadline is then moved back, as if its grace had passed.
 */
async function deadCommit(): Promise<string> {
  const docs = new DocumentStore(redis);
  docs.create = () => new Promise<never>(() => undefined);
  const dying = new FileStore(redis, docs);
  const ws = newId('workspace');
  const id = newId('file');
  const size = CHUNK_BYTES + 5;
  const { sha256 } = await dying.stage(id, bytes(size), 2 * CHUNK_BYTES);
  const now = nowIso();
  const doc: FileDoc = { id, type: 'file', workspace_id: ws, filename: 'lost.bin', content_type: 'application/octet-stream', size_bytes: size, sha256, version: 1, created_at: now, updated_at: now };
  void dying.commit(doc);
  await vi.waitFor(async () => expect(await redis.ttl(contentKey(id))).toBe(-1), { timeout: 5_000, interval: 20 });
  expect(await redis.zscore(JOURNAL, `${ws} ${id}`)).not.toBeNull();
  await redis.zadd(JOURNAL, 0, `${ws} ${id}`);
  return id;
}

describe('the periodic sweep of dead File commits', () => {
  it('reclaims the bytes of a commit whose process died with no later commit, and stops when told', async () => {
    const files = new FileStore(redis, new DocumentStore(redis));
    const failures: unknown[] = [];
    files.startSweeping((err) => failures.push(err), 50);
    try {
      const lost = await deadCommit();
      await vi.waitFor(async () => expect(await redis.exists(contentKey(lost))).toBe(0), { timeout: 5_000, interval: 20 });
      expect(await redis.zcard(JOURNAL)).toBe(0);
    } finally {
      files.stopSweeping();
    }

    // Stopped: a dead commit past its grace stays until a sweep runs.
    const kept = await deadCommit();
    await new Promise((r) => setTimeout(r, 300));
    expect(await redis.exists(contentKey(kept))).toBe(1);
    expect(await files.sweep()).toBe(1);
    expect(await redis.exists(contentKey(kept))).toBe(0);
    expect(failures).toEqual([]);
  });

  it('logs a failed sweep and keeps sweeping', async () => {
    const files = new FileStore(redis, new DocumentStore(redis));
    let calls = 0;
    const sweep = files.sweep.bind(files);
    files.sweep = () => (++calls <= 2 ? Promise.reject(new Error('Redis away')) : sweep());
    const failures: unknown[] = [];
    files.startSweeping((err) => failures.push(err), 50);
    try {
      const lost = await deadCommit();
      await vi.waitFor(async () => expect(await redis.exists(contentKey(lost))).toBe(0), { timeout: 5_000, interval: 20 });
    } finally {
      files.stopSweeping();
    }
    expect(failures.map((e) => (e as Error).message)).toEqual(['Redis away', 'Redis away']);
  });
});

describe('a keyed commit', () => {
  const keyed = { token: 'file_0123456789abcdef0123456789abcdef', keptMs: 60_000 };
  const upload = async (files: FileStore, ws: string, size = CHUNK_BYTES + 5): Promise<FileDoc> => {
    const id = newId('file');
    const { sha256 } = await files.stage(id, bytes(size), 2 * CHUNK_BYTES);
    const now = nowIso();
    return { id, type: 'file', workspace_id: ws, filename: 'kept.bin', content_type: 'application/octet-stream', size_bytes: size, sha256, version: 1, created_at: now, updated_at: now };
  };
  const listed = async (files: FileStore, ws: string) => (await files.list(ws, { limit: 10 })).data.map((f) => f.id);

  it('records the request with its File; a later attempt is answered that File, its own bytes dropped', async () => {
    const files = new FileStore(redis, new DocumentStore(redis));
    const ws = newId('workspace');
    const first = await files.commit(await upload(files, ws), keyed);
    const record = `ap:{w:${ws}}:file_req:${keyed.token}`;
    expect(await redis.get(record)).toBe(first.id);
    const ttl = await redis.pttl(record);
    expect(ttl).toBeGreaterThan(50_000);
    expect(ttl).toBeLessThanOrEqual(60_000);

    const again = await upload(files, ws);
    expect(await files.commit(again, keyed)).toEqual(first);
    expect(await redis.exists(contentKey(again.id))).toBe(0);
    expect(await redis.exists(contentKey(first.id))).toBe(1);
    expect(await listed(files, ws)).toEqual([first.id]);
    expect(await redis.zscore(JOURNAL, `${ws} ${again.id}`)).toBeNull();

    // Another request (another token) makes its own; so does one without a key.
    const other = await files.commit(await upload(files, ws), { ...keyed, token: 'file_ffffffffffffffffffffffffffffffff' });
    const plain = await files.commit(await upload(files, ws));
    expect(new Set([first.id, other.id, plain.id]).size).toBe(3);
    expect((await listed(files, ws)).sort()).toEqual([first.id, other.id, plain.id].sort());
  });

  it('that finds the request committed only in its own write answers that File, its bytes sealed and dropped', async () => {
    const files = new FileStore(redis, new DocumentStore(redis));
    const ws = newId('workspace');
    const first = await files.commit(await upload(files, ws), keyed);
    // The lookup before the commit missed it (an attempt that committed meanwhile).
    (files as unknown as { earlier: () => Promise<null> }).earlier = () => Promise.resolve(null);
    const racing = await upload(files, ws);
    expect(await files.commit(racing, keyed)).toEqual(first);
    expect(await redis.exists(contentKey(racing.id))).toBe(0);
    expect(await redis.zscore(JOURNAL, `${ws} ${racing.id}`)).toBeNull();
    expect(await listed(files, ws)).toEqual([first.id]);
  });

  it('whose File was deleted since is 404, nothing made again', async () => {
    const files = new FileStore(redis, new DocumentStore(redis));
    const ws = newId('workspace');
    const first = await files.commit(await upload(files, ws), keyed);
    await files.remove(ws, first.id);
    const again = await upload(files, ws);
    await expect(files.commit(again, keyed)).rejects.toMatchObject({ type: 'validation.not_found' });
    expect(await redis.exists(contentKey(again.id))).toBe(0);
    expect(await listed(files, ws)).toEqual([]);
  });
});
