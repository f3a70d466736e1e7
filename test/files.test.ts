import { createHash, randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { HttpClient } from '@agentplane/client';
import { RedisRuntimeBearers } from '@agentplane/domain';
import { LeaseFence } from '@agentplane/lease';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { useCrashPlatforms } from './harness/crash-platform.js';

let p: Platform;
let redis: Redis;
let api: HttpClient;
let other: HttpClient;
let envId: string;
let agentId: string;

type Json = Record<string, unknown>;
type FileHead = Json & { id: string; size_bytes: number; sha256: string; filename: string; content_type: string };
const errType = (r: { body: unknown }) => (r.body as { error?: { type?: string } }).error?.type;
const digest = (b: Uint8Array) => `sha256:${createHash('sha256').update(b).digest('hex')}`;
const MiB = 1024 * 1024;

async function contentKeys(): Promise<string[]> {
  const found: string[] = [];
  let cursor = '0';
  do {
    const [next, batch] = await redis.scan(cursor, 'MATCH', 'ap:{f:*}:content', 'COUNT', 1000);
    found.push(...batch);
    cursor = next;
  } while (cursor !== '0');
  return found.sort();
}

/** A hand-written multipart body, for framings FormData would not produce. */
function multipart(parts: Array<{ name: string; filename?: string; disposition?: string; type?: string; data: string | Buffer }>, boundary = 'xYzBoundary42'): { body: Buffer; type: string } {
  const chunks: Buffer[] = [];
  for (const part of parts) {
    const disp = part.disposition ?? `form-data; name="${part.name}"${part.filename !== undefined ? `; filename="${part.filename}"` : ''}`;
    chunks.push(Buffer.from(`--${boundary}\r\nContent-Disposition: ${disp}\r\n${part.type ? `Content-Type: ${part.type}\r\n` : ''}\r\n`));
    chunks.push(Buffer.isBuffer(part.data) ? part.data : Buffer.from(part.data));
    chunks.push(Buffer.from('\r\n'));
  }
  chunks.push(Buffer.from(`--${boundary}--\r\n`));
  return { body: Buffer.concat(chunks), type: `multipart/form-data; boundary=${boundary}` };
}

async function rawUpload(client: HttpClient, body: Buffer | string, contentType: string, headers: Record<string, string> = {}) {
  return client.request<Json>('POST', '/v1/files', { rawBody: typeof body === 'string' ? body : new Uint8Array(body), headers: { 'content-type': contentType, ...headers } });
}

/**
 * Streams `total` bytes of file content, chunked (no Content-Length), and returns status and
 * body. `onSent(bytes)` runs after each MiB and may pause the upload by returning a promise.
 */
function streamUpload(token: string, total: number, onSent?: (bytes: number) => Promise<void> | void): Promise<{ status: number; body: Json }> {
  const boundary = 'streamBoundary9';
  const head = Buffer.from(`--${boundary}\r\nContent-Disposition: form-data; name="file"; filename="big.bin"\r\n\r\n`);
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${p.baseUrl}/v1/files`, {
      method: 'POST',
      headers: { authorization: `Bearer ${token}`, 'service-version': '2026-08-27', 'content-type': `multipart/form-data; boundary=${boundary}`, 'transfer-encoding': 'chunked' },
    }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString() || '{}') as Json }));
    });
    req.on('error', reject);
    const block = Buffer.alloc(MiB, 7);
    let sent = 0;
    req.write(head);
    const pump = async (): Promise<void> => {
      while (sent < total) {
        const n = Math.min(block.length, total - sent);
        sent += n;
        req.write(block.subarray(0, n));
        await onSent?.(sent);
        if (req.writableNeedDrain) await new Promise((r) => req.once('drain', r));
      }
      req.end(Buffer.from(`\r\n--${boundary}--\r\n`));
    };
    pump().catch(reject);
  });
}

let devKey: string;

beforeAll(async () => {
  p = await startPlatform();
  redis = new Redis(p.redisUrl());
  redis.on('error', () => undefined); // one test restarts Redis
  const org = p.bootstrap.organization_id;
  const key = await p.root.post<{ secret: string }>(`/v1/organizations/${org}/api-keys`, {
    display_name: 'files', role: 'developer', scope: { type: 'workspace', workspace_id: p.bootstrap.workspace_id },
  }, { idempotencyKey: 'files-dev-key' });
  devKey = key.secret;
  api = new HttpClient({ baseUrl: p.baseUrl, token: key.secret });
  const ws2 = await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name: 'files-other' });
  const key2 = await p.root.post<{ secret: string }>(`/v1/organizations/${org}/api-keys`, {
    display_name: 'files-other', role: 'developer', scope: { type: 'workspace', workspace_id: ws2.id },
  }, { idempotencyKey: 'files-other-key' });
  other = new HttpClient({ baseUrl: p.baseUrl, token: key2.secret });
  envId = (await api.post<{ id: string }>('/v1/environments', { name: 'files', image: 'agentplane/sandbox:1' })).id;
  agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'files', model: 'default', tools: [] })).id;
});
afterAll(async () => {
  redis?.disconnect();
  await p?.stop();
});

describe('Files API', () => {
  it('uploads, reads the head, downloads the exact bytes, lists and deletes', async () => {
    const text = new TextEncoder().encode('id,name\n1,ada\n2,grace\n');
    const up = await api.uploadFile<FileHead>('people.csv', text, { contentType: 'text/csv' });
    expect(up.status).toBe(201);
    const f = up.body;
    expect(f).toMatchObject({ type: 'file', workspace_id: p.bootstrap.workspace_id, filename: 'people.csv', content_type: 'text/csv', size_bytes: text.length, sha256: digest(text), version: 1 });
    expect(f.id).toMatch(/^file_[0-9a-f]{32}$/);
    expect(await api.get(`/v1/files/${f.id}`)).toEqual(f);

    const res = await fetch(api.url(`/v1/files/${f.id}/content`), { headers: api.headers() });
    expect(res.status).toBe(200);
    expect(res.headers.get('content-type')).toBe('text/csv');
    expect(res.headers.get('x-content-type-options')).toBe('nosniff');
    expect(res.headers.get('content-disposition')).toContain('attachment');
    expect(res.headers.get('etag')).toBe(`"${f.sha256}"`);
    expect(new Uint8Array(await res.arrayBuffer())).toEqual(text);

    const list = await api.get<{ data: FileHead[] }>('/v1/files');
    expect(list.data.map((x) => x.id)).toContain(f.id);

    expect(await api.delete(`/v1/files/${f.id}`)).toEqual({ id: f.id, type: 'file_deleted' });
    expect((await api.request('GET', `/v1/files/${f.id}`)).status).toBe(404);
    expect((await api.request('GET', `/v1/files/${f.id}/content`)).status).toBe(404);
    expect(await redis.exists(`ap:{f:${f.id}}:content`)).toBe(0);
    const again = await api.request('DELETE', `/v1/files/${f.id}`);
    expect(again.status).toBe(404);
  });

  it('stores large binary content in chunks and returns it byte for byte; empty files work', async () => {
    const data = randomBytes(3 * MiB + 12_345);
    const up = await api.uploadFile<FileHead>('blob.bin', data);
    expect(up.status).toBe(201);
    expect(up.body).toMatchObject({ size_bytes: data.length, sha256: digest(data), content_type: 'application/octet-stream' });
    expect(await redis.hlen(`ap:{f:${up.body.id}}:content`)).toBe(4);
    expect(await redis.ttl(`ap:{f:${up.body.id}}:content`)).toBe(-1);
    expect(Buffer.from(await api.downloadFile(up.body.id)).equals(data)).toBe(true);

    const empty = await api.uploadFile<FileHead>('empty.txt', new Uint8Array(0), { contentType: 'text/plain' });
    expect(empty.status).toBe(201);
    expect(empty.body).toMatchObject({ size_bytes: 0, sha256: digest(new Uint8Array(0)) });
    expect((await api.downloadFile(empty.body.id)).length).toBe(0);
  });

  it('keeps only the file name (no directories) and a usable content type', async () => {
    const { body, type } = multipart([{ name: 'file', filename: '..\\..\\etc/passwd', type: 'weird', data: 'x' }]);
    const r = await rawUpload(api, body, type);
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    // RFC 7578: a part without a usable type is text/plain.
    expect(r.body).toMatchObject({ filename: 'passwd', content_type: 'text/plain' });
    // A type the multipart parser reads but that is not a plain `type/subtype` (or is too long) is text/plain too.
    for (const odd of ['application/x!y', `application/${'x'.repeat(300)}`]) {
      const m = multipart([{ name: 'file', filename: 'odd.bin', type: odd, data: 'x' }]);
      const u = await rawUpload(api, m.body, m.type);
      expect(u.status, JSON.stringify(u.body)).toBe(201);
      expect(u.body, odd.slice(0, 20)).toMatchObject({ content_type: 'text/plain' });
    }
  });

  it('names the download with RFC 8187 filename*: only attr-char is left unescaped', async () => {
    const up = await api.uploadFile<FileHead>("it's (1)*.csv", new TextEncoder().encode('a,b\n'), { contentType: 'text/csv' });
    expect(up.status, JSON.stringify(up.body)).toBe(201);
    expect(up.body.filename).toBe("it's (1)*.csv");
    const download = await fetch(`${p.baseUrl}/v1/files/${up.body.id}/content`, { headers: { authorization: `Bearer ${devKey}`, 'service-version': '2026-08-27' } });
    expect(download.status).toBe(200);
    await download.arrayBuffer();
    const disposition = download.headers.get('content-disposition') ?? '';
    expect(disposition).toBe("attachment; filename*=UTF-8''it%27s%20%281%29%2A.csv");
    // RFC 8187: value-chars = *( pct-encoded / attr-char ).
    expect(disposition.slice("attachment; filename*=UTF-8''".length)).toMatch(/^(?:%[0-9A-F]{2}|[A-Za-z0-9!#$&+\-.^_`|~])*$/);
  });

  it('keeps a non-ASCII file name: UTF-8 in filename, and RFC 5987 filename*', async () => {
    const name = 'résumé-日本.txt';
    const encoded = "UTF-8''r%C3%A9sum%C3%A9-%E6%97%A5%E6%9C%AC.txt";
    expect(`UTF-8''${encodeURIComponent(name)}`).toBe(encoded);
    const viaFormData = await api.uploadFile<FileHead>(name, new TextEncoder().encode('cv'), { contentType: 'text/plain' });
    expect(viaFormData.status, JSON.stringify(viaFormData.body)).toBe(201);
    expect(viaFormData.body.filename).toBe(name);
    expect((await api.get<FileHead>(`/v1/files/${viaFormData.body.id}`)).filename).toBe(name);
    const download = await fetch(`${p.baseUrl}/v1/files/${viaFormData.body.id}/content`, { headers: { authorization: `Bearer ${devKey}`, 'service-version': '2026-08-27' } });
    expect(download.status).toBe(200);
    expect(download.headers.get('content-disposition')).toBe(`attachment; filename*=${encoded}`);
    await download.arrayBuffer();

    const cases: Array<[string, string, string]> = [
      ['raw UTF-8 bytes in filename', `form-data; name="file"; filename="${name}"`, name],
      ['filename* alone', `form-data; name="file"; filename*=${encoded}`, name],
      ['filename* over an ASCII fallback', `form-data; name="file"; filename="resume.txt"; filename*=${encoded}`, name],
      ['filename* in ISO-8859-1', "form-data; name=\"file\"; filename*=iso-8859-1'fr'r%E9sum%E9.txt", 'résumé.txt'],
    ];
    for (const [what, disposition, expected] of cases) {
      const { body, type } = multipart([{ name: 'file', disposition, type: 'text/plain', data: 'cv' }]);
      const r = await rawUpload(api, body, type);
      expect(r.status, `${what}: ${JSON.stringify(r.body)}`).toBe(201);
      expect(r.body.filename, what).toBe(expected);
    }
  });

  it('Idempotency-Key: same bytes replay the same File; other bytes conflict; no staged bytes are left', async () => {
    const before = await contentKeys();
    const a = await api.uploadFile<FileHead>('a.txt', new TextEncoder().encode('one'), { idempotencyKey: 'upload-1' });
    const b = await api.uploadFile<FileHead>('a.txt', new TextEncoder().encode('one'), { idempotencyKey: 'upload-1' });
    expect(a.status).toBe(201);
    expect(b.status).toBe(201);
    expect(b.body.id).toBe(a.body.id);
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    const c = await api.uploadFile<FileHead>('a.txt', new TextEncoder().encode('two'), { idempotencyKey: 'upload-1' });
    expect(c.status).toBe(409);
    expect(errType(c)).toBe('idempotency.conflict');
    const d = await api.uploadFile<FileHead>('b.txt', new TextEncoder().encode('one'), { idempotencyKey: 'upload-1' });
    expect(d.status).toBe(409);
    // Exactly one new content key: the replay and the conflicts discarded what they staged.
    const after = await contentKeys();
    expect(after.filter((k) => !before.includes(k))).toEqual([`ap:{f:${a.body.id}}:content`]);
  });

  it('refuses malformed uploads with 400 validation.malformed and keeps nothing', async () => {
    const before = await contentKeys();
    const cases: Array<[string, { body: Buffer | string; type: string }, number]> = [
      ['json instead of multipart', { body: '{"file":"x"}', type: 'application/json' }, 400],
      ['text instead of multipart', { body: 'x', type: 'text/plain' }, 400],
      ['unknown field', multipart([{ name: 'file', filename: 'a.txt', data: 'a' }, { name: 'purpose', data: 'x' }]), 400],
      ['field only', multipart([{ name: 'purpose', data: 'x' }]), 400],
      ['two files', multipart([{ name: 'file', filename: 'a.txt', data: 'a' }, { name: 'file', filename: 'b.txt', data: 'b' }]), 400],
      ['wrong part name', multipart([{ name: 'upload', filename: 'a.txt', data: 'a' }]), 400],
      ['no filename', multipart([{ name: 'file', filename: '', data: 'a' }]), 400],
      ['no parts', multipart([]), 400],
      ['no boundary', { body: 'x', type: 'multipart/form-data' }, 400],
      ['cut short', { body: multipart([{ name: 'file', filename: 'a.txt', data: 'abc' }]).body.subarray(0, 80), type: multipart([]).type }, 400],
    ];
    for (const [what, c, status] of cases) {
      const r = await rawUpload(api, c.body, c.type);
      expect(r.status, what).toBe(status);
      expect(errType(r), what).toBe('validation.malformed');
    }
    // A file part whose filename cannot be read says so, whichever way the parser took it.
    for (const disposition of ['form-data; name="file"; filename=""', `form-data; name="file"; filename="x.txt"; filename*=UTF-8''%ZZ`]) {
      const { body, type } = multipart([{ name: 'file', disposition, type: 'text/plain', data: 'a' }]);
      const r = await rawUpload(api, body, type);
      expect([disposition, r.status, errType(r)]).toEqual([disposition, 400, 'validation.malformed']);
      expect(JSON.stringify(r.body), disposition).toContain('filename');
    }
    expect(await contentKeys()).toEqual(before);
  });

  it('413 at the limits: a declared oversize body at once, 64 MiB + 1 byte of content, and a streamed body past the framing allowance', async () => {
    const before = await contentKeys();
    const declared = await api.request('POST', '/v1/files', {
      rawBody: 'x', headers: { 'content-type': 'multipart/form-data; boundary=b', 'content-length': String(64 * MiB + 64 * 1024 + 1) },
    }).catch(() => ({ status: 413, body: { error: { type: 'validation.payload_too_large' } } }));
    expect(declared.status).toBe(413);

    const exact = await api.uploadFile<FileHead>('exact.bin', new Uint8Array(64 * MiB));
    expect(exact.status).toBe(201);
    expect(exact.body.size_bytes).toBe(64 * MiB);
    await api.delete(`/v1/files/${exact.body.id}`);

    const over = await api.uploadFile<FileHead>('over.bin', new Uint8Array(64 * MiB + 1));
    expect(over.status).toBe(413);
    expect(errType(over)).toBe('validation.payload_too_large');

    const streamed = await streamUpload(devKey, 64 * MiB + 2 * MiB);
    expect(streamed.status).toBe(413);
    expect((streamed.body.error as Json).type).toBe('validation.payload_too_large');
    // Nothing of the refused uploads is kept.
    expect(await contentKeys()).toEqual(before);
    // The API is still fine.
    expect((await api.request('GET', '/v1/files')).status).toBe(200);
  }, 60_000);

  it('Redis killed mid-upload: the upload is refused with 500 runtime.internal (an incident reference) or stored whole, never half', async () => {
    const before = p.pids().redis as number;
    let killed = false;
    const r = await streamUpload(devKey, 8 * MiB, async (sent) => {
      // Once, after the first 3 MiB went out, whatever the chunk sizes were.
      if (!killed && sent >= 3 * MiB) {
        killed = true;
        process.kill(before, 'SIGKILL');
        await new Promise((resolve) => setTimeout(resolve, 300));
      }
    });
    expect(killed).toBe(true);
    expect([201, 500], JSON.stringify(r.body)).toContain(r.status);
    await waitFor('redis restarted', async () => (p.pids().redis !== before ? true : undefined), 30_000);
    await waitFor('the API back on a restarted Redis', async () => ((await api.request('GET', '/v1/files')).status === 200 ? true : undefined), 30_000);
    expect(p.pids().redis).not.toBe(before);
    if (r.status === 201) {
      const f = r.body as FileHead;
      expect(f.size_bytes).toBe(8 * MiB);
      expect(digest(await api.downloadFile(f.id))).toBe(f.sha256);
    } else {
      expect((r.body.error as Json).type).toBe('runtime.internal');
      expect((r.body.error as Json).message).toMatch(/incident reference inc_/);
    }
    // Either way a retry works.
    const again = await api.uploadFile<FileHead>('after.bin', new Uint8Array(2 * MiB).fill(1));
    expect(again.status).toBe(201);
    expect((await api.downloadFile(again.body.id)).length).toBe(2 * MiB);
  }, 60_000);

  it('ids: wrong prefix is 400, unknown and other-workspace ids are 404', async () => {
    const f = (await api.uploadFile<FileHead>('mine.txt', new TextEncoder().encode('mine'))).body;
    const wrong = await api.request('GET', `/v1/files/sess_${'0'.repeat(32)}`);
    expect(wrong.status).toBe(400);
    expect(errType(wrong)).toBe('validation.malformed');
    expect((await api.request('GET', `/v1/files/file_${'0'.repeat(32)}`)).status).toBe(404);
    for (const [m, path] of [['GET', `/v1/files/${f.id}`], ['GET', `/v1/files/${f.id}/content`], ['DELETE', `/v1/files/${f.id}`]] as const) {
      const r = await other.request(m, path);
      expect(r.status, `${m} ${path}`).toBe(404);
      expect(errType(r)).toBe('validation.not_found');
    }
    expect((await other.get<{ data: FileHead[] }>('/v1/files')).data).toEqual([]);
    expect((await api.request('GET', `/v1/files/${f.id}`)).status).toBe(200);
  });

  it('a Session file resource must name a File of its Workspace', async () => {
    const f = (await api.uploadFile<FileHead>('input.txt', new TextEncoder().encode('hello'))).body;
    const s = await api.post<Json & { id: string; resources: Json[] }>('/v1/sessions', {
      agent: agentId, environment_id: envId, resources: [{ type: 'file', file_id: f.id, mount_path: '/data/input.txt' }],
    });
    expect(s.resources[0]).toMatchObject({ type: 'file', file_id: f.id, mount_path: '/data/input.txt' });
    const unknown = await api.request('POST', '/v1/sessions', {
      body: { agent: agentId, environment_id: envId, resources: [{ type: 'file', file_id: `file_${'1'.repeat(32)}` }] },
    });
    expect(unknown.status).toBe(404);
    expect(errType(unknown)).toBe('validation.not_found');
    const otherEnv = (await other.post<{ id: string }>('/v1/environments', { name: 'o', image: 'agentplane/sandbox:1' })).id;
    const otherAgent = (await other.post<{ id: string }>('/v1/agents', { name: 'o', model: 'default', tools: [] })).id;
    const cross = await other.request('POST', '/v1/sessions', { body: { agent: otherAgent, environment_id: otherEnv, resources: [{ type: 'file', file_id: f.id }] } });
    expect(cross.status).toBe(404);
    const add = await api.request('POST', `/v1/sessions/${s.id}/resources`, { body: { type: 'file', file_id: `file_${'2'.repeat(32)}` } });
    expect(add.status).toBe(404);
    const wrongPrefix = await api.request('POST', `/v1/sessions/${s.id}/resources`, { body: { type: 'file', file_id: `sess_${'2'.repeat(32)}` } });
    expect(wrongPrefix.status).toBe(400);
  });

  it('the runtime download route takes only a live runtime bearer', async () => {
    const f = (await api.uploadFile<FileHead>('r.txt', new TextEncoder().encode('r'))).body;
    const none = await fetch(`${p.baseUrl}/v1/runtime/files/${f.id}`);
    expect(none.status).toBe(401);
    expect(((await none.json()) as { error: { type: string } }).error.type).toBe('auth.invalid_key');
    const apiKey = await fetch(`${p.baseUrl}/v1/runtime/files/${f.id}`, { headers: { authorization: `Bearer ${devKey}` } });
    expect(apiKey.status).toBe(401);
    const forged = await fetch(`${p.baseUrl}/v1/runtime/files/${f.id}`, { headers: { authorization: `Bearer ap_rt_${'a'.repeat(40)}` } });
    expect(forged.status).toBe(401);
    const post = await fetch(`${p.baseUrl}/v1/runtime/files/${f.id}`, { method: 'POST' });
    expect(post.status).toBe(404);
    expect(((await post.json()) as { error: { type: string } }).error.type).toBe('validation.not_found');
  });

  it('the runtime download route serves a live lease its Session Files only, and nothing once the lease is gone', async () => {
    const granted = (await api.uploadFile<FileHead>('granted.txt', new TextEncoder().encode('for the runner'))).body;
    const other = (await api.uploadFile<FileHead>('other.txt', new TextEncoder().encode('not yours'))).body;
    const session = `sess_${randomBytes(16).toString('hex')}`;
    const leaseId = `lease_${randomBytes(8).toString('hex')}`;
    const fence = new LeaseFence(redis);
    expect(await fence.claim({ sessionId: session, token: leaseId, runnerId: 'runner_test', attempt: 1, runId: `run_${'0'.repeat(32)}` }, 60_000)).toBe('ok');
    const bearer = await new RedisRuntimeBearers(redis, fence).mint({
      run_id: `run_${'0'.repeat(32)}`, session_id: session, workspace_id: p.bootstrap.workspace_id, organization_id: p.bootstrap.organization_id,
      lease_id: leaseId, expires_at: new Date(Date.now() + 60_000).toISOString(), connections: {}, files: [granted.id],
    });
    const get = (id: string) => fetch(`${p.baseUrl}/v1/runtime/files/${id}`, { headers: { authorization: `Bearer ${bearer}` } });
    const ok = await get(granted.id);
    expect(ok.status).toBe(200);
    expect(await ok.text()).toBe('for the runner');
    const notGranted = await get(other.id);
    expect(notGranted.status).toBe(404);
    expect(((await notGranted.json()) as { error: { type: string } }).error.type).toBe('validation.not_found');
    const badPrefix = await get(`sess_${'0'.repeat(32)}`);
    expect(badPrefix.status).toBe(400);
    expect(((await badPrefix.json()) as { error: { type: string } }).error.type).toBe('validation.malformed');
    await fence.release(session, leaseId);
    expect((await get(granted.id)).status).toBe(401);
  });

  it('every attempt to store a Session output past the bearer is one audit record, as the Run, naming the request', async () => {
    const run = `run_${randomBytes(16).toString('hex')}`;
    const fence = new LeaseFence(redis);
    /** A live lease of the Run on a Session of its own, and its runtime bearer. */
    const mint = async (outputs: boolean): Promise<{ bearer: string; session: string }> => {
      const session = `sess_${randomBytes(16).toString('hex')}`;
      const leaseId = `lease_${randomBytes(8).toString('hex')}`;
      expect(await fence.claim({ sessionId: session, token: leaseId, runnerId: 'runner_test', attempt: 1, runId: run }, 60_000)).toBe('ok');
      const bearer = await new RedisRuntimeBearers(redis, fence).mint({
        run_id: run, session_id: session, workspace_id: p.bootstrap.workspace_id, organization_id: p.bootstrap.organization_id,
        lease_id: leaseId, expires_at: new Date(Date.now() + 60_000).toISOString(), connections: {}, outputs,
      });
      return { bearer, session };
    };
    const store = (bearer: string, type: string, body: string | Buffer) => fetch(`${p.baseUrl}/v1/runtime/files?filename=shot.png`, {
      method: 'POST', headers: { authorization: `Bearer ${bearer}`, 'content-type': type }, body,
    });
    const png = Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]);
    const ungranted = await mint(false);
    const denied = await store(ungranted.bearer, 'image/png', png);
    expect(denied.status).toBe(403);
    const granted = await mint(true);
    const malformed = await store(granted.bearer, 'text/plain', 'not an image');
    expect(malformed.status).toBe(400);
    const badKey = await fetch(`${p.baseUrl}/v1/runtime/files?filename=shot.png`, {
      method: 'POST', headers: { authorization: `Bearer ${granted.bearer}`, 'content-type': 'image/png', 'idempotency-key': 'has space' }, body: png,
    });
    expect([badKey.status, ((await badKey.json()) as { error: { type: string } }).error.type]).toEqual([400, 'validation.malformed']);
    const ok = await store(granted.bearer, 'image/png', png);
    expect(ok.status).toBe(201);
    const file = (await ok.json()) as { id: string };
    const records = (await p.root.post<{ data: Array<{ actor: Json; target: string; outcome: string; status: number; detail: string | null; request_id: string | null }> }>(
      '/v1/audit/export', { action: 'files.storeSessionOutput', actor: run, limit: 100 },
    )).data;
    const actor = { id: run, credential_id: null };
    expect(records.map((r) => [r.actor, r.target, r.outcome, r.status, r.detail, r.request_id])).toEqual([
      [actor, ungranted.session, 'denied', 403, 'policy.denied', denied.headers.get('request-id')],
      [actor, granted.session, 'failed', 400, 'validation.malformed', malformed.headers.get('request-id')],
      [actor, granted.session, 'failed', 400, 'validation.malformed', badKey.headers.get('request-id')],
      [actor, file.id, 'succeeded', 201, null, ok.headers.get('request-id')],
    ]);
  });

  it('is described in OpenAPI as multipart and kept off the MCP tool list', async () => {
    const doc = await api.get<{ paths: Record<string, Record<string, Json>> }>('/v1/openapi.json');
    const upload = doc.paths['/v1/files']?.post as { requestBody: { content: Record<string, unknown> } };
    expect(Object.keys(upload.requestBody.content)).toEqual(['multipart/form-data']);
  });
});

describe('a crash between making an upload\'s bytes permanent and creating its head', () => {
  const crash = useCrashPlatforms('files-crash');

  it('leaves no File, and the orphaned bytes are reclaimed by a later commit once their grace has passed', async () => {
    const q = await crash.start(['file-content-sealed'], { env: { LOG_LEVEL: 'warn' } });
    const r = q.redis();
    const scan = async () => (await r.keys('ap:{f:*}:content')).sort();
    const writer = q.p.root;
    const apiBefore = q.p.pids().api;
    // The API dies inside the commit: the request gets no answer.
    await expect(writer.uploadFile('lost.bin', new Uint8Array(3 * MiB).fill(5))).rejects.toThrow();
    expect(existsSync(q.marker('file-content-sealed'))).toBe(true);
    await q.apiRestarted(apiBefore, { client: writer, path: '/v1/files' });

    // No File; the bytes are permanent (no TTL), and the commit in flight is on record.
    expect((await writer.get<{ data: unknown[] }>('/v1/files')).data).toEqual([]);
    const orphans = await scan();
    expect(orphans).toHaveLength(1);
    const orphan = orphans[0] as string;
    const lostId = /\{f:(file_[0-9a-f]{32})\}/.exec(orphan)?.[1] as string;
    expect(await r.ttl(orphan)).toBe(-1);
    const journal = 'ap:{g:file_commits}:file_commits';
    const pending = await r.zrange(journal, 0, -1);
    expect(pending).toEqual([`${q.p.bootstrap.workspace_id} ${lostId}`]);

    // Its grace passes (moved back rather than waited for); the next commit sweeps it.
    await r.zadd(journal, 0, pending[0] as string);
    const kept = await writer.uploadFile<FileHead>('kept.bin', new Uint8Array(2 * MiB).fill(6));
    expect(kept.status).toBe(201);
    expect(await scan()).toEqual([`ap:{f:${kept.body.id}}:content`]);
    expect(await r.zcard(journal)).toBe(0);
    expect((await writer.downloadFile(kept.body.id)).length).toBe(2 * MiB);
  }, 120_000);
});

describe('a crash between deleting a File\'s head and its bytes', () => {
  const crash = useCrashPlatforms('files-delete-crash');

  it('leaves the deletion on record, and the bytes are reclaimed by a later commit once its grace has passed', async () => {
    const q = await crash.start(['file-head-removed'], { env: { LOG_LEVEL: 'warn' } });
    const r = q.redis();
    const writer = q.p.root;
    const gone = await writer.uploadFile<FileHead>('gone.bin', new Uint8Array(3 * MiB).fill(4));
    expect(gone.status).toBe(201);
    const content = `ap:{f:${gone.body.id}}:content`;
    const apiBefore = q.p.pids().api;
    // The API dies inside the deletion, after the head is gone: the request gets no answer.
    await expect(writer.request('DELETE', `/v1/files/${gone.body.id}`)).rejects.toThrow();
    expect(existsSync(q.marker('file-head-removed'))).toBe(true);
    await q.apiRestarted(apiBefore, { client: writer, path: '/v1/files' });

    // The File is gone for readers; its bytes are still there, and the deletion is on record.
    expect((await writer.request('GET', `/v1/files/${gone.body.id}`)).status).toBe(404);
    expect(await r.exists(content)).toBe(1);
    const journal = 'ap:{g:file_commits}:file_commits';
    const pending = await r.zrange(journal, 0, -1);
    expect(pending).toEqual([`${q.p.bootstrap.workspace_id} ${gone.body.id}`]);

    // Its grace passes (moved back rather than waited for); the next commit sweeps the bytes.
    await r.zadd(journal, 0, pending[0] as string);
    const kept = await writer.uploadFile<FileHead>('kept.bin', new Uint8Array(MiB).fill(6));
    expect(kept.status).toBe(201);
    expect(await r.exists(content)).toBe(0);
    expect(await r.zcard(journal)).toBe(0);
    expect((await writer.downloadFile(kept.body.id)).length).toBe(MiB);
  }, 120_000);
});
