import { createHash } from 'node:crypto';
import { ApiError, crashPoint } from '@agentplane/core';
import { InFlightWrites, KEYED_WRITES_LUA, KeyedWrites, keys, LuaScript, tags, type DocumentStore, type KeyedWrite, type ListPage, type Redis } from '@agentplane/store';
import type { FileDoc } from './model.js';

/** Content is stored in chunks of this size, one hash field per chunk. */
export const CHUNK_BYTES = 1024 * 1024;
/** Staged content (an upload whose File is not created yet) expires after this long. */
const STAGED_TTL_SECONDS = 3600;
const INDEX = 'files';
/** Longest a single Redis write of an upload may take before the upload is refused (503). */
const WRITE_TIMEOUT_MS = 30_000;
/**
 * Commits and deletions in flight: a sorted set of `<workspace_id> <file_id>`, scored by the time
 * after which one that has not finished is taken for dead (its process crashed between making the
 * bytes permanent and creating the head, or between removing the head and dropping the bytes).
 * Far longer than either takes (two bounded writes).
 */
const COMMITS = keys.global('file_commits');
export const COMMIT_GRACE_MS = 10 * 60_000;
/**
 * How often an api process sweeps dead commits on its own (`startSweeping`), besides the sweep
 * after each finished commit: once per grace period, so orphaned bytes are reclaimed within about
 * two grace periods of their commit even if no File is ever committed again.
 */
export const COMMIT_SWEEP_MS = COMMIT_GRACE_MS;

/**
 * One chunk in, TTL refreshed: one command, so a write caught by a dropped connection is simply
 * resent (a MULTI in flight across a reconnect can hang the client).
 */
const PUT_CHUNK = new LuaScript('file_put_chunk', `
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1`);

/** Staged → permanent: the number of chunks present, and the TTL dropped. */
const SEAL = new LuaScript('file_seal', `
local n = redis.call('HLEN', KEYS[1])
redis.call('PERSIST', KEYS[1])
return n`);

/**
 * A keyed upload's head: created (with its index entry) only if no attempt of the same keyed
 * request committed a File already, and then recorded for the request (`KeyedWrites`) in the same
 * step. Returns 1 created, 0 the id is taken, or the File id the request's record names (nothing
 * written). KEYS: the head, the files index, the request's record. ARGV: the head's JSON, its
 * score, its id, how long the record is kept (ms).
 */
const CREATE_KEYED = new LuaScript('file_create_keyed', `${KEYED_WRITES_LUA}
local had = recorded_keyed(KEYS[3])
if had then return had end
if not redis.call('SET', KEYS[1], ARGV[1], 'NX') then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[3])
record_keyed(KEYS[3], ARGV[3], ARGV[4])
return 1`);

async function bounded<T>(what: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  try {
    return await Promise.race([what, new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error('Redis did not answer in time')), WRITE_TIMEOUT_MS)))]);
  } finally {
    clearTimeout(timer);
  }
}

/** Thrown by `stage` when the content passes its limit; the caller maps it to its 413. */
export class ContentTooLarge extends Error {
  constructor(readonly limit: number) {
    super(`the file content exceeds the limit of ${limit} bytes`);
    this.name = 'ContentTooLarge';
  }
}

/** Redis failed while bytes were being stored (not the client's fault: the caller answers 503). */
export class StorageError extends Error {
  constructor(cause: unknown) {
    super(`storing the file content failed: ${cause instanceof Error ? cause.message : String(cause)}`, { cause });
    this.name = 'StorageError';
  }
}

/**
 * Uploaded Files in Redis. The head is a workspace document (`{w:<ws>}:doc:<file_id>`, listed
 * in `{w:<ws>}:idx:files`); the bytes live under the File's own hash tag,
 * `ap:{f:<file_id>}:content`, a hash of 1 MiB chunks (field `0`, `1`, ...), so large files
 * spread over a Redis Cluster instead of piling onto the workspace's slot.
 *
 * Upload is two steps: `stage` streams the bytes in under a TTL while the digest is computed;
 * `commit` makes them permanent and creates the head. A crash between the two leaves only
 * staged bytes, which expire. A keyed upload's head is recorded under its request's token
 * (`{w:<ws>}:file_req:<token>` → file id, expiring when keys do), so that a retry whose first
 * attempt committed is answered that File (`KeyedWrites`, kind `file_req`).
 */
export class FileStore {
  private readonly commits: InFlightWrites;
  private readonly requests: KeyedWrites;

  constructor(
    private readonly redis: Redis,
    private readonly docs: DocumentStore,
  ) {
    this.commits = new InFlightWrites(redis, COMMITS, COMMIT_GRACE_MS);
    this.requests = new KeyedWrites(redis, 'file_req');
  }

  private contentKey(fileId: string): string {
    return keys.scoped(tags.file(fileId), 'content');
  }

  /** Streams `source` into staged chunks of `fileId`. Never holds more than one chunk in memory. */
  async stage(fileId: string, source: AsyncIterable<Buffer>, limit: number): Promise<{ size_bytes: number; sha256: string }> {
    const key = this.contentKey(fileId);
    const hash = createHash('sha256');
    let size = 0;
    let index = 0;
    let pending: Buffer[] = [];
    let pendingBytes = 0;
    const flush = async (all: boolean) => {
      while (pendingBytes >= CHUNK_BYTES || (all && pendingBytes > 0)) {
        const joined = Buffer.concat(pending);
        const chunk = joined.subarray(0, CHUNK_BYTES);
        const rest = joined.subarray(chunk.length);
        try {
          await bounded(PUT_CHUNK.run(this.redis, [key], [String(index), chunk, STAGED_TTL_SECONDS]));
        } catch (err) {
          throw new StorageError(err);
        }
        index += 1;
        pending = rest.length > 0 ? [rest] : [];
        pendingBytes = rest.length;
      }
    };
    try {
      for await (const piece of source) {
        size += piece.length;
        if (size > limit) throw new ContentTooLarge(limit);
        hash.update(piece);
        pending.push(piece);
        pendingBytes += piece.length;
        if (pendingBytes >= CHUNK_BYTES) await flush(false);
      }
      await flush(true);
    } catch (err) {
      // Staged bytes expire anyway if Redis cannot take the delete now.
      await this.discard(fileId).catch(() => undefined);
      throw err;
    }
    return { size_bytes: size, sha256: `sha256:${hash.digest('hex')}` };
  }

  /**
   * Makes staged content permanent and creates the File's head. Every chunk must still be there
   * (a Redis that restarted mid-upload may have lost the last ones): otherwise StorageError and
   * no head. Crash point `file-committed` right after the head is written.
   *
   * `keyed`: the head is written only if no attempt of the same request committed a File, and
   * the request's token is recorded with it in the same step (`CREATE_KEYED`). When one did, its
   * File answers this attempt (`earlier`) and this attempt's staged content is dropped: one
   * File per keyed request.
   */
  async commit(file: FileDoc, keyed?: KeyedWrite): Promise<FileDoc> {
    if (keyed) {
      const earlier = await this.earlier(file, keyed);
      if (earlier) return earlier;
    }
    const key = this.contentKey(file.id);
    let chunks: number;
    try {
      // Recorded before the bytes lose their TTL: a crash before the head exists leaves the entry,
      // and a later sweep drops the bytes no head names.
      await bounded(this.commits.begin(file.workspace_id, file.id));
      chunks = Number(await bounded(SEAL.run(this.redis, [key], [])));
    } catch (err) {
      throw new StorageError(err);
    }
    const expected = Math.ceil(file.size_bytes / CHUNK_BYTES);
    if (chunks !== expected) {
      await this.discard(file.id).catch(() => undefined);
      await this.commits.end(file.workspace_id, file.id).catch(() => undefined);
      throw new StorageError(`${chunks} of ${expected} chunks were stored`);
    }
    crashPoint('file-content-sealed');
    if (!keyed) {
      await this.docs.create(tags.workspace(file.workspace_id), file, [INDEX]);
    } else {
      const tag = tags.workspace(file.workspace_id);
      const made = await CREATE_KEYED.run(
        this.redis, [keys.doc(tag, file.id), keys.index(tag, INDEX), this.requests.key(tags.workspace(file.workspace_id), keyed)],
        [JSON.stringify(file), Date.parse(file.created_at), file.id, keyed.keptMs],
      );
      if (typeof made === 'string') {
        // An attempt of the same request committed its File meanwhile: that one answers, this one's bytes go.
        await this.discard(file.id);
        await this.commits.end(file.workspace_id, file.id);
        return this.answered(file.workspace_id, made);
      }
    }
    crashPoint('file-committed');
    await this.commits.end(file.workspace_id, file.id);
    await this.sweep().catch(() => undefined);
    return file;
  }

  /**
   * The File an earlier attempt of this keyed upload committed (its token's record), with this
   * attempt's staged content dropped; null when there is none (commit this one).
   */
  private async earlier(file: FileDoc, keyed: KeyedWrite): Promise<FileDoc | null> {
    const id = await this.requests.find(tags.workspace(file.workspace_id), keyed);
    if (id === null) return null;
    await this.discard(file.id);
    return this.answered(file.workspace_id, id);
  }

  /**
   * The File a keyed upload's earlier attempt committed, as the answer to a later one. Deleted
   * since: 404, not made again (the request took effect once, and its File was then deleted; a
   * new File needs a new key).
   */
  private async answered(workspaceId: string, id: string): Promise<FileDoc> {
    const doc = await this.docs.get<FileDoc>(tags.workspace(workspaceId), id);
    if (!doc || doc.type !== 'file') {
      throw new ApiError('validation.not_found', `file ${id}, uploaded by an earlier attempt of this request, was deleted since; upload it under a new Idempotency-Key`);
    }
    return doc;
  }

  /**
   * Reclaims the bytes of commits and deletions that never finished (their process died between
   * making the bytes permanent and creating the head, or between removing the head and dropping
   * the bytes): past their grace, bytes whose head does not exist are dropped. A head that exists
   * keeps its bytes; either way the entry goes.
   */
  sweep(now = Date.now()): Promise<number> {
    return this.commits.sweep(async (ws, id) => (await this.docs.get<FileDoc>(tags.workspace(ws), id)) !== null, (id) => this.discard(id), now);
  }

  /**
   * Sweeps now and every `intervalMs` (COMMIT_SWEEP_MS; a test passes a shorter one) until
   * `stopSweeping`, so dead commits are reclaimed with no later commit; a failure goes to
   * `onError`. The timer does not hold the process open.
   */
  startSweeping(onError: (err: unknown) => void, intervalMs = COMMIT_SWEEP_MS): void {
    this.commits.startSweeping(() => this.sweep(), onError, intervalMs);
  }

  stopSweeping(): void {
    this.commits.stopSweeping();
  }

  /** Drops staged (or orphaned) content. */
  async discard(fileId: string): Promise<void> {
    await this.redis.unlink(this.contentKey(fileId));
  }

  /** The File's head; 404 for an unknown id or one of another Workspace. */
  async get(workspaceId: string, fileId: string): Promise<FileDoc> {
    const doc = await this.docs.get<FileDoc>(tags.workspace(workspaceId), fileId);
    if (!doc || doc.type !== 'file') throw new ApiError('validation.not_found', `file ${fileId} not found`);
    return doc;
  }

  list(workspaceId: string, options: { limit: number; page?: string | undefined }): Promise<ListPage<FileDoc>> {
    return this.docs.list<FileDoc>(tags.workspace(workspaceId), INDEX, { ...options, order: 'desc' });
  }

  /**
   * Deletes the head first (the File is gone for readers at once), then its bytes. The deletion
   * is on record before the head goes: a crash before the bytes are dropped leaves the entry, and
   * a later sweep drops the bytes no head names.
   */
  async remove(workspaceId: string, fileId: string): Promise<void> {
    await this.get(workspaceId, fileId);
    await this.commits.begin(workspaceId, fileId);
    await this.docs.remove(tags.workspace(workspaceId), fileId, [INDEX]);
    crashPoint('file-head-removed');
    await this.discard(fileId);
    await this.commits.end(workspaceId, fileId);
  }

  /** The content, chunk by chunk. Throws if a chunk is missing (content lost). */
  async *read(file: Pick<FileDoc, 'id' | 'size_bytes'>): AsyncIterable<Buffer> {
    const key = this.contentKey(file.id);
    const chunks = Math.ceil(file.size_bytes / CHUNK_BYTES);
    for (let i = 0; i < chunks; i++) {
      const chunk = await this.redis.hgetBuffer(key, String(i));
      if (!chunk) throw new Error(`chunk ${i} of file ${file.id} is missing`);
      yield chunk;
    }
  }
}
