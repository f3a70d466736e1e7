import { createHash } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { randomBytes } from 'node:crypto';
import { existsSync, rmSync } from 'node:fs';
import { sha256Hex } from '@agentplane/core';
import { RedisRuntimeBearers } from '@agentplane/domain';
import { LeaseFence } from '@agentplane/lease';
import { crashedKeyed, useCrashPlatforms, type CrashPlatform } from './harness/crash-platform.js';

/**
 * A keyed `POST /v1/files` whose api died right after committing its File (crash point
 * `file-committed`: bytes permanent, head and the request's record written), its key's pending
 * record gone as it goes once its owner is dead (here removed, as its expiry would): the retry of
 * the same request (same key, same multipart body) is answered the File its first attempt
 * committed (201, the same id), what the retry staged is dropped, and there is one File, its
 * content downloadable. One that died before committing (`file-content-sealed`) leaves nothing
 * its retry is answered: the retry commits a File of its own. A File deleted since is not made
 * again: the retry is 404.
 */
interface FileHead { id: string; filename: string; size_bytes: number; sha256: string; content_type: string }

const MiB = 1024 * 1024;
const JOURNAL = 'ap:{g:file_commits}:file_commits';
const digest = (b: Uint8Array) => `sha256:${createHash('sha256').update(b).digest('hex')}`;

/** `crashedKeyed` for an upload. */
function crashedUpload(q: CrashPlatform, point: string, filename: string, content: Uint8Array, key: string): Promise<void> {
  return crashedKeyed(q, point, key, () => q.p.root.uploadFile(filename, content, { idempotencyKey: key }), { probePath: '/v1/files' });
}

async function contentKeys(q: CrashPlatform): Promise<string[]> {
  return (await q.redis().keys('ap:{f:*}:content')).sort();
}

describe('a crash inside a keyed File upload', () => {
  const crash = useCrashPlatforms('keyed-create-crash-files');

  it('after its commit: the retry of the same upload is answered the same File, its own bytes dropped; one File, downloadable', async () => {
    const q = await crash.start(['file-committed'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const ws = q.p.bootstrap.workspace_id;
    const files = async () => (await api.get<{ data: FileHead[] }>('/v1/files', { limit: 100 })).data;
    const content = new Uint8Array(2 * MiB + 17).fill(9);

    await crashedUpload(q, 'file-committed', 'kept.bin', content, 'k-file');
    // The first attempt's File exists; its commit is still on record (it died before ending it).
    const written = await files();
    expect(written.map((f) => f.filename)).toEqual(['kept.bin']);
    const first = written[0]!;
    expect(await contentKeys(q)).toEqual([`ap:{f:${first.id}}:content`]);
    expect(await q.redis().zrange(JOURNAL, 0, -1)).toEqual([`${ws} ${first.id}`]);

    const retry = await api.uploadFile<FileHead>('kept.bin', content, { idempotencyKey: 'k-file' });
    expect([retry.status, retry.body.id, retry.body.sha256, retry.body.size_bytes, retry.headers.get('idempotent-replayed')])
      .toEqual([201, first.id, digest(content), content.length, null]);
    expect((await files()).map((f) => f.id)).toEqual([first.id]);
    // What the retry staged is gone: only the first attempt's bytes are kept.
    expect(await contentKeys(q)).toEqual([`ap:{f:${first.id}}:content`]);
    expect(Buffer.from(await api.downloadFile(first.id)).equals(Buffer.from(content))).toBe(true);
    // The request's record: the File's id, expiring when keys do.
    const records = await q.redis().keys(`ap:{w:${ws}}:file_req:*`);
    expect(records).toHaveLength(1);
    expect(await q.redis().get(records[0]!)).toBe(first.id);
    expect(await q.redis().pttl(records[0]!)).toBeGreaterThan(0);

    const replay = await api.uploadFile<FileHead>('kept.bin', content, { idempotencyKey: 'k-file' });
    expect([replay.status, replay.body.id, replay.headers.get('idempotent-replayed')]).toEqual([201, first.id, 'true']);

    // The dead attempt's entry, past its grace (moved back rather than waited for), is swept by the
    // next commit: the File, whose head exists, keeps its bytes.
    await q.redis().zadd(JOURNAL, 0, `${ws} ${first.id}`);
    const plain = await api.uploadFile<FileHead>('plain.bin', new Uint8Array(10).fill(1));
    const again = await api.uploadFile<FileHead>('plain.bin', new Uint8Array(10).fill(1));
    expect([plain.status, again.status]).toEqual([201, 201]);
    // Without a key, each upload makes its own File.
    expect(plain.body.id).not.toBe(again.body.id);
    expect(await q.redis().zcard(JOURNAL)).toBe(0);
    expect(Buffer.from(await api.downloadFile(first.id)).equals(Buffer.from(content))).toBe(true);

    // Another upload under the same key, once the first one's record lapsed, makes its own.
    await q.redis().del(`ap:{w:${ws}}:idem:${sha256Hex('k-file')}`);
    const other = await api.uploadFile<FileHead>('other.bin', content, { idempotencyKey: 'k-file' });
    expect(other.status).toBe(201);
    expect(other.body.id).not.toBe(first.id);
  }, 180_000);

  it('before its commit, then after it, then deleted: the retry commits its own File; a deleted one is 404, not made again', async () => {
    const q = await crash.start(['file-content-sealed', 'file-committed'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const ws = q.p.bootstrap.workspace_id;
    const files = async () => (await api.get<{ data: FileHead[] }>('/v1/files', { limit: 100 })).data;
    const content = new Uint8Array(MiB + 3).fill(4);

    // The first attempt dies with its bytes permanent but no head: nothing answers the retry, which
    // commits its own File (and dies right after); the next retry is answered that one.
    await crashedUpload(q, 'file-content-sealed', 'twice.bin', content, 'k-twice');
    expect(await files()).toEqual([]);
    const [orphan] = await contentKeys(q);
    expect(await q.redis().keys(`ap:{w:${ws}}:file_req:*`)).toEqual([]);
    await crashedUpload(q, 'file-committed', 'twice.bin', content, 'k-twice');
    const written = await files();
    expect(written).toHaveLength(1);
    const made = written[0]!;
    expect(orphan).not.toBe(`ap:{f:${made.id}}:content`);
    const retry = await api.uploadFile<FileHead>('twice.bin', content, { idempotencyKey: 'k-twice' });
    expect([retry.status, retry.body.id]).toEqual([201, made.id]);
    expect((await files()).map((f) => f.id)).toEqual([made.id]);

    // Both dead attempts' entries past their grace: the sweep drops the orphan, keeps the File's bytes.
    for (const entry of await q.redis().zrange(JOURNAL, 0, -1)) await q.redis().zadd(JOURNAL, 0, entry);
    expect((await api.uploadFile<FileHead>('plain.bin', new Uint8Array(5))).status).toBe(201);
    expect(await q.redis().zcard(JOURNAL)).toBe(0);
    expect(await q.redis().exists(orphan!)).toBe(0);
    expect(Buffer.from(await api.downloadFile(made.id)).equals(Buffer.from(content))).toBe(true);

    // The File is deleted; the same request retried once more (its key's record lapsed) is 404:
    // the request took effect once, and is not made again. Nothing of it is kept.
    expect((await api.request('DELETE', `/v1/files/${made.id}`)).status).toBe(200);
    await q.redis().del(`ap:{w:${ws}}:idem:${sha256Hex('k-twice')}`);
    const before = await contentKeys(q);
    const gone = await api.uploadFile<{ error: { type: string } }>('twice.bin', content, { idempotencyKey: 'k-twice' });
    expect([gone.status, gone.body.error.type]).toEqual([404, 'validation.not_found']);
    expect(await contentKeys(q)).toEqual(before);
    expect((await files()).filter((f) => f.filename === 'twice.bin')).toEqual([]);
  }, 180_000);

  it('a Run\'s stored output sent under an Idempotency-Key, after its commit: the runner\'s retry is answered the same File; another content under the key is 409', async () => {
    const q = await crash.start(['file-committed'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const redis = q.redis();
    const run = `run_${randomBytes(16).toString('hex')}`;
    const session = `sess_${randomBytes(16).toString('hex')}`;
    const leaseId = `lease_${randomBytes(8).toString('hex')}`;
    const fence = new LeaseFence(redis);
    expect(await fence.claim({ sessionId: session, token: leaseId, runnerId: 'runner_test', attempt: 1, runId: run }, 120_000)).toBe('ok');
    const bearer = await new RedisRuntimeBearers(redis, fence).mint({
      run_id: run, session_id: session, workspace_id: q.p.bootstrap.workspace_id, organization_id: q.p.bootstrap.organization_id,
      lease_id: leaseId, expires_at: new Date(Date.now() + 120_000).toISOString(), connections: {}, outputs: true,
    });
    const png = Buffer.concat([Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]), randomBytes(1024)]);
    const store = (body: Buffer, key: string) => fetch(`${q.p.baseUrl}/v1/runtime/files?filename=shot.png`, {
      method: 'POST', headers: { authorization: `Bearer ${bearer}`, 'content-type': 'image/png', 'idempotency-key': key }, body,
    });
    const ofSession = async () => (await api.get<{ data: (FileHead & { session_id?: string })[] }>('/v1/files', { limit: 100 })).data.filter((f) => f.session_id === session);

    rmSync(q.marker('file-committed'), { force: true });
    const before = q.p.pids().api;
    await expect(store(png, 'shot-1')).rejects.toThrow();
    expect(existsSync(q.marker('file-committed'))).toBe(true);
    await q.apiRestarted(before, { client: api, path: '/v1/files' });
    const written = await ofSession();
    expect(written).toHaveLength(1);

    const retry = await store(png, 'shot-1');
    expect(retry.status).toBe(201);
    expect(((await retry.json()) as FileHead).id).toBe(written[0]!.id);
    expect((await ofSession()).map((f) => f.id)).toEqual([written[0]!.id]);
    const other = await store(Buffer.concat([png, Buffer.from('more')]), 'shot-1');
    expect(other.status).toBe(409);
    expect(((await other.json()) as { error: { type: string } }).error.type).toBe('idempotency.conflict');
    expect((await ofSession())).toHaveLength(1);
    // Another key stores another File.
    expect((await store(png, 'shot-2')).status).toBe(201);
    expect((await ofSession())).toHaveLength(2);
  }, 120_000);
});
