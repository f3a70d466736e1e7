import { existsSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import type { Platform } from './harness/platform.js';
import { useCrashPlatforms } from './harness/crash-platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnPlatform } from './harness/turns.js';
import { errType } from './harness/governance.js';

/**
 * Uploaded Projects: JSON trees with base64 contents, immutable revisions, pushes on the latest
 * revision, the contract's limits (1,024 files, 10 MiB per file, 20 MiB per revision, 64 files
 * per push, the JSON envelope), and a revision mounted in a Session's sandbox and read by bash.
 */
const MiB = 1024 * 1024;
let t: TurnPlatform;
let p: Platform;
let api: HttpClient;

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'projects' });
  ({ p, api } = t);
}, 180_000);
afterAll(async () => {
  await p?.stop();
});

const b64 = (text: string | Buffer) => Buffer.from(text).toString('base64');
const file = (path: string, text: string | Buffer, executable?: boolean) => ({ path, content_base64: b64(text), ...(executable ? { executable } : {}) });
interface Revision { revision_number: number; files: { path: string; size_bytes: number; executable: boolean }[]; total_bytes: number; base_revision_number: number | null }

describe('Projects (REST)', () => {
  it('creates revision 1, pushes changes on the latest revision and refuses stale bases', async () => {
    const created = await api.request<{ id: string; latest_revision_number: number; latest_revision: Revision }>('POST', '/v1/projects', {
      body: { name: 'webapp', files: [file('README.md', '# webapp\n'), file('src/main.py', 'print("v1")\n'), file('run.sh', '#!/bin/sh\necho run\n', true)] },
    });
    expect(created.status).toBe(201);
    expect(created.body.id).toMatch(/^proj_[0-9a-f]{32}$/);
    expect(created.body.latest_revision_number).toBe(1);
    expect(created.body.latest_revision.files.map((f) => f.path)).toEqual(['README.md', 'run.sh', 'src/main.py']);
    const id = created.body.id;

    const pushed = await api.request<Revision>('POST', `/v1/projects/${id}/push`, {
      body: { base_revision_number: 1, changes: [{ path: 'src/main.py', content_base64: b64('print("v2")\n') }, { path: 'README.md', delete: true }] },
    });
    expect(pushed.status).toBe(201);
    expect(pushed.body).toMatchObject({ revision_number: 2, base_revision_number: 1 });
    expect(pushed.body.files.map((f) => f.path)).toEqual(['run.sh', 'src/main.py']);
    const afterPush = await api.get<{ latest_revision_number: number; version: number; created_at: string; updated_at: string }>(`/v1/projects/${id}`);
    expect(afterPush.latest_revision_number).toBe(2);
    // A new revision moves the head on.
    expect(afterPush.version).toBe(2);
    expect(Date.parse(afterPush.updated_at)).toBeGreaterThanOrEqual(Date.parse(afterPush.created_at));
    // Revision 1 is immutable.
    expect((await api.get<Revision>(`/v1/projects/${id}/revisions/1`)).files).toHaveLength(3);

    const stale = await api.request('POST', `/v1/projects/${id}/push`, { body: { base_revision_number: 1, changes: [{ path: 'x', content_base64: b64('x') }] } });
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('validation.conflict');
    const staleTree = await api.request('POST', `/v1/projects/${id}/revisions`, { body: { files: [file('a', 'a')], expected_revision_number: 1 } });
    expect(staleTree.status).toBe(409);
    const tree = await api.request<Revision>('POST', `/v1/projects/${id}/revisions`, { body: { files: [file('a', 'a')], expected_revision_number: 2 } });
    expect(tree.status).toBe(201);
    expect(tree.body.revision_number).toBe(3);
    // The stale attempts moved nothing; the revision did.
    const afterTree = await api.get<{ version: number; updated_at: string }>(`/v1/projects/${id}`);
    expect(afterTree.version).toBe(3);
    expect(Date.parse(afterTree.updated_at)).toBeGreaterThanOrEqual(Date.parse(afterPush.updated_at));

    const tooMany = await api.request('POST', `/v1/projects/${id}/push`, {
      body: { base_revision_number: 3, changes: Array.from({ length: 65 }, (_, i) => ({ path: `f${i}`, content_base64: b64('x') })) },
    });
    expect(tooMany.status).toBe(400);
    expect(errType(tooMany)).toBe('validation.malformed');
    const sixtyFour = await api.request('POST', `/v1/projects/${id}/push`, {
      body: { base_revision_number: 3, changes: Array.from({ length: 64 }, (_, i) => ({ path: `f${i}`, content_base64: b64('x') })) },
    });
    expect(sixtyFour.status).toBe(201);

    for (const path of ['../etc/passwd', '/abs', 'a//b', 'a/./b']) {
      const bad = await api.request('POST', '/v1/projects', { body: { name: 'bad', files: [file(path, 'x')] } });
      expect(bad.status, path).toBe(400);
    }
    const clash = await api.request('POST', '/v1/projects', { body: { name: 'bad', files: [file('a', 'x'), file('a/b', 'y')] } });
    expect(clash.status).toBe(400);
  });

  it('a content-only push keeps the file\'s mode; executable changes it; a new file is not executable unless it says so', async () => {
    const created = await api.post<{ id: string }>('/v1/projects', { name: 'modes', files: [file('run.sh', '#!/bin/sh\necho 1\n', true), file('notes.txt', 'n')] });
    const push = (changes: Json[], base: number) => api.request<Revision>('POST', `/v1/projects/${created.id}/push`, { body: { base_revision_number: base, changes } });
    const modes = (r: { body: Revision }) => Object.fromEntries(r.body.files.map((f) => [f.path, f.executable]));

    const contentOnly = await push([{ path: 'run.sh', content_base64: b64('#!/bin/sh\necho 2\n') }, { path: 'new.sh', content_base64: b64('#!/bin/sh\n') }], 1);
    expect(contentOnly.status).toBe(201);
    expect(modes(contentOnly)).toEqual({ 'run.sh': true, 'notes.txt': false, 'new.sh': false });
    const cleared = await push([{ path: 'run.sh', content_base64: b64('#!/bin/sh\necho 3\n'), executable: false }, { path: 'notes.txt', content_base64: b64('m'), executable: true }], 2);
    expect(modes(cleared)).toEqual({ 'run.sh': false, 'notes.txt': true, 'new.sh': false });
    expect(modes(await push([{ path: 'notes.txt', content_base64: b64('o') }], 3))).toMatchObject({ 'notes.txt': true, 'run.sh': false });
    // A deletion says nothing else: an executable flag on it is refused, and nothing is pushed.
    const both = await push([{ path: 'new.sh', delete: true, executable: true }], 4);
    expect([both.status, errType(both)]).toEqual([400, 'validation.malformed']);
    expect(modes(await push([{ path: 'new.sh', delete: true }], 4))).toEqual({ 'run.sh': false, 'notes.txt': true });
  });

  it('refuses paths and names that are not well-formed Unicode (a lone surrogate)', async () => {
    for (const body of [{ name: 'p', files: [file('src/x\ud800.txt', 'x')] }, { name: 'name \udc00', files: [file('a.txt', 'a')] }]) {
      const r = await api.request('POST', '/v1/projects', { body });
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
    const id = (await api.post<{ id: string }>('/v1/projects', { name: 'wf', files: [file('a.txt', 'a')] })).id;
    const push = await api.request('POST', `/v1/projects/${id}/push`, { body: { base_revision_number: 1, changes: [{ path: 'b\udfff', content_base64: b64('b') }] } });
    expect(push.status).toBe(400);
    expect(errType(push)).toBe('validation.malformed');
  });

  it('refuses a file or directory name longer than 255 bytes of UTF-8, which no sandbox file system could hold; 255 are taken', async () => {
    const at = (name: string) => [`d/${name}`, `${name}/f.txt`];
    const over = ['x'.repeat(256), '\u8a9e'.repeat(86), `${'x'.repeat(254)}\u00e9`];
    for (const path of over.flatMap(at)) {
      const r = await api.request('POST', '/v1/projects', { body: { name: 'long', files: [file(path, 'x')] } });
      expect([r.status, errType(r)], path.slice(0, 20)).toEqual([400, 'validation.malformed']);
    }
    const id = (await api.post<{ id: string }>('/v1/projects', { name: 'long', files: [file('a.txt', 'a')] })).id;
    for (const [path] of over.map(at)) {
      const revision = await api.request('POST', `/v1/projects/${id}/revisions`, { body: { files: [file(path as string, 'x')] } });
      expect([revision.status, errType(revision)]).toEqual([400, 'validation.malformed']);
      const push = await api.request('POST', `/v1/projects/${id}/push`, { body: { base_revision_number: 1, changes: [{ path, content_base64: b64('x') }] } });
      expect([push.status, errType(push)]).toEqual([400, 'validation.malformed']);
    }
    const fits = ['x'.repeat(255), '\u8a9e'.repeat(85), `${'x'.repeat(253)}\u00e9`].flatMap(at);
    const ok = await api.request('POST', '/v1/projects', { body: { name: 'fits', files: fits.map((path) => file(path, 'x')) } });
    expect(ok.status).toBe(201);
  });

  it('enforces 1,024 files, 10 MiB per file and 20 MiB per revision (400), and the JSON envelope (413)', async () => {
    const files = (n: number) => Array.from({ length: n }, (_, i) => file(`f/${i}.txt`, String(i)));
    expect((await api.request('POST', '/v1/projects', { body: { name: 'max', files: files(1024) } })).status).toBe(201);
    const over = await api.request('POST', '/v1/projects', { body: { name: 'over', files: files(1025) } });
    expect(over.status).toBe(400);
    expect(errType(over)).toBe('validation.malformed');

    const big = await api.request('POST', '/v1/projects', { body: { name: 'big', files: [file('big.bin', Buffer.alloc(10 * MiB + 1, 1))] } });
    expect(big.status).toBe(400);
    expect(errType(big)).toBe('validation.malformed');

    const full = [file('a.bin', Buffer.alloc(10 * MiB, 2)), file('b.bin', Buffer.alloc(10 * MiB, 3))];
    const atLimit = await api.request<{ latest_revision: Revision }>('POST', '/v1/projects', { body: { name: 'full', files: full } });
    expect(atLimit.status).toBe(201);
    expect(atLimit.body.latest_revision.total_bytes).toBe(20 * MiB);
    const overRevision = await api.request('POST', '/v1/projects', { body: { name: 'over', files: [...full, file('c.bin', 'x')] } });
    expect(overRevision.status).toBe(400);
    expect(errType(overRevision)).toBe('validation.malformed');
    // A push that would take the tree past 20 MiB is refused too.
    const id = (await api.get<{ data: { id: string; name: string }[] }>('/v1/projects', { limit: 100 })).data.find((x) => x.name === 'full')?.id;
    const grow = await api.request('POST', `/v1/projects/${id}/push`, { body: { base_revision_number: 1, changes: [file('c.bin', 'x')] } });
    expect(grow.status).toBe(400);

    const envelope = await api.request('POST', '/v1/projects', { rawBody: `{"name":"e","files":[],"pad":"${'x'.repeat(36 * MiB)}"}`, headers: { 'content-type': 'application/json' } });
    expect(envelope.status).toBe(413);
    expect(errType(envelope)).toBe('validation.payload_too_large');
  }, 120_000);
});

describe('a Project mounted in a Session', () => {
  it('is in the sandbox as uploaded_project before the first Run, pinned to its revision, and read by bash', async () => {
    const proj = await api.post<{ id: string }>('/v1/projects', {
      name: 'tool', files: [file('src/data.txt', 'hello from the project\n'), file('bin/go.sh', '#!/bin/sh\necho executed\n', true)],
    });
    const s = await api.post<{ id: string; resources: Json[] }>('/v1/sessions', {
      agent: {
        name: 'reader', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
        system: SCRIPT([
          { when: { on: 'tool_result' }, then: [{ reply: 'OUT {{tool_result}}' }] },
          { then: [{ tool: 'bash', input: { command: 'cat tool/src/data.txt; ./tool/bin/go.sh; stat -c %a tool/bin/go.sh' } }] },
        ]),
      },
      environment_id: t.envId,
      resources: [{ type: 'uploaded_project', project_id: proj.id }],
    });
    expect(s.resources[0]).toMatchObject({ type: 'uploaded_project', project_id: proj.id, revision_number: 1 });
    // A later revision does not change what this Session mounts.
    await api.post(`/v1/projects/${proj.id}/push`, { base_revision_number: 1, changes: [{ path: 'src/data.txt', content_base64: b64('changed\n') }] });

    await api.post(`/v1/sessions/${s.id}/events`, t.msg('go'));
    const events = await untilEvents(api, s.id, (e) => idleCount(e) >= 1, 120_000);
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    const out = JSON.stringify(events.filter((e) => e.type === 'agent.tool_result'));
    expect(out).toContain('hello from the project\\nexecuted\\n755');

    const missing = await api.request('POST', '/v1/sessions', {
      body: { agent: { name: 'x', model: 'default' }, environment_id: t.envId, resources: [{ type: 'uploaded_project', project_id: proj.id, revision_number: 9 }] },
    });
    expect(missing.status).toBe(404);
  }, 180_000);
});

describe('a crash after a new Project\'s contents and revision 1 are written, before its head', () => {
  const crash = useCrashPlatforms('projects-crash');

  it('leaves no Project, and what was written is reclaimed by a later creation once its grace has passed', async () => {
    const q = await crash.start(['project-revision-committed'], { env: { LOG_LEVEL: 'warn' } });
    const r = q.redis();
    const writer = q.p.root;
    const projectKeys = async () => (await r.keys('ap:{p:*')).sort();
    const apiBefore = q.p.pids().api;
    // The API dies inside the creation: the request gets no answer.
    await expect(writer.post('/v1/projects', { name: 'lost', files: [file('big.bin', Buffer.alloc(MiB, 3)), file('a.txt', 'a')] })).rejects.toThrow();
    expect(existsSync(q.marker('project-revision-committed'))).toBe(true);
    await q.apiRestarted(apiBefore, { client: writer, path: '/v1/projects' });

    // No Project, but its marker, revision and contents are there, and the creation is on record.
    expect((await writer.get<{ data: unknown[] }>('/v1/projects')).data).toEqual([]);
    const orphaned = await projectKeys();
    const lostId = /\{p:(proj_[0-9a-f]{32})\}/.exec(orphaned[0] ?? '')?.[1] as string;
    expect(orphaned.length).toBeGreaterThanOrEqual(4);
    const journal = 'ap:{g:project_creations}:project_creations';
    const pending = await r.zrange(journal, 0, -1);
    expect(pending).toEqual([`${q.p.bootstrap.workspace_id} ${lostId}`]);

    // Its grace passes (moved back rather than waited for); the next creation sweeps it.
    await r.zadd(journal, 0, pending[0] as string);
    const kept = await writer.request<{ id: string }>('POST', '/v1/projects', { body: { name: 'kept', files: [file('b.txt', 'b')] } });
    expect(kept.status).toBe(201);
    const left = await projectKeys();
    expect(left.filter((k) => k.includes(lostId))).toEqual([]);
    expect(left.every((k) => k.includes(kept.body.id))).toBe(true);
    expect(await r.zcard(journal)).toBe(0);
  }, 120_000);
});

describe('a crash between deleting a Project\'s head and its revisions and contents', () => {
  const crash = useCrashPlatforms('projects-delete-crash');

  it('leaves the deletion on record, and what the Project held is reclaimed by a later creation once its grace has passed', async () => {
    const q = await crash.start(['project-head-removed'], { env: { LOG_LEVEL: 'warn' } });
    const r = q.redis();
    const writer = q.p.root;
    const keysOf = async (id: string) => (await r.keys(`ap:{p:${id}}:*`)).sort();
    const gone = await writer.request<{ id: string }>('POST', '/v1/projects', { body: { name: 'gone', files: [file('big.bin', Buffer.alloc(MiB, 3)), file('a.txt', 'a')] } });
    expect(gone.status).toBe(201);
    const id = gone.body.id;
    expect((await keysOf(id)).length).toBeGreaterThanOrEqual(4);
    const apiBefore = q.p.pids().api;
    // The API dies inside the deletion, after the head is gone: the request gets no answer.
    await expect(writer.request('DELETE', `/v1/projects/${id}`)).rejects.toThrow();
    expect(existsSync(q.marker('project-head-removed'))).toBe(true);
    await q.apiRestarted(apiBefore, { client: writer, path: '/v1/projects' });

    // The Project is gone for readers; its keys are still there, and the deletion is on record.
    expect((await writer.request('GET', `/v1/projects/${id}`)).status).toBe(404);
    expect((await keysOf(id)).length).toBeGreaterThanOrEqual(4);
    const journal = 'ap:{g:project_creations}:project_creations';
    const pending = await r.zrange(journal, 0, -1);
    expect(pending).toEqual([`${q.p.bootstrap.workspace_id} ${id}`]);

    // Its grace passes (moved back rather than waited for); the next creation sweeps it.
    await r.zadd(journal, 0, pending[0] as string);
    const kept = await writer.request<{ id: string }>('POST', '/v1/projects', { body: { name: 'kept', files: [file('b.txt', 'b')] } });
    expect(kept.status).toBe(201);
    expect(await keysOf(id)).toEqual([]);
    expect((await keysOf(kept.body.id)).length).toBeGreaterThan(0);
    expect(await r.zcard(journal)).toBe(0);
  }, 120_000);
});
