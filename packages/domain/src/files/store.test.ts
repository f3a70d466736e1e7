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
