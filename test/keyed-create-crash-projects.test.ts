import { existsSync, rmSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { sha256Hex } from '@agentplane/core';
import { useCrashPlatforms, type CrashPlatform } from './harness/crash-platform.js';
import type { Json } from './harness/turns.js';

/**
 * A keyed `POST /v1/projects` whose api died inside it (crash points `project-revision-committed`,
 * after revision 1 and its contents but before the head, and `project-created`, after the head),
 * its key's pending record gone as it goes once its owner is dead (here removed, as its expiry
 * would): the retry of the same request under the key answers the Project its first attempt
 * made, or finishes it under the same id, keeping that attempt's revision 1; one Project, its
 * files readable, nothing of another id left. A Project changed since is not answered (409).
 */
const JOURNAL = 'ap:{g:project_creations}:project_creations';
const PATH = '/v1/projects';
const b64 = (text: string) => Buffer.from(text).toString('base64');
const tree = (tag: string): Json[] => [
  { path: 'README.md', content_base64: b64(`# ${tag}\n`) },
  { path: 'src/main.py', content_base64: b64(`print("${tag}")\n`) },
  { path: 'run.sh', content_base64: b64('#!/bin/sh\necho run\n'), executable: true },
];

interface Revision { revision_number: number; files: { path: string; sha256: string; size_bytes: number }[] }
interface Made { id: string; name: string; version: number; latest_revision_number: number; latest_revision: Revision }

/** Sends the keyed create that kills the api at `point`, waits for its replacement and removes the key's pending record. */
async function crashedCreate(q: CrashPlatform, point: string, body: Json, key: string): Promise<void> {
  const api = q.p.root;
  rmSync(q.marker(point), { force: true });
  const before = q.p.pids().api;
  await expect(api.request('POST', PATH, { body, idempotencyKey: key })).rejects.toThrow();
  expect(existsSync(q.marker(point))).toBe(true);
  await q.apiRestarted(before, { client: api, path: PATH });
  const record = `ap:{w:${q.p.bootstrap.workspace_id}}:idem:${sha256Hex(key)}`;
  expect(await q.redis().get(record)).toContain('"pending"');
  expect(await q.redis().del(record)).toBe(1);
}

/** The ids of the projects that have keys of their own (`ap:{p:<id>}:…`). */
async function keyedIds(q: CrashPlatform): Promise<string[]> {
  const ids = new Set((await q.redis().keys('ap:{p:*')).map((k) => /\{p:(proj_[0-9a-f]{32})\}/.exec(k)?.[1] ?? k));
  return [...ids].sort();
}

/** The Project's revision 1 read through the API, and each of its contents as stored. */
async function readable(q: CrashPlatform, id: string, tag: string): Promise<void> {
  const rev = await q.p.root.get<Revision>(`${PATH}/${id}/revisions/1`);
  expect(rev.files.map((f) => f.path)).toEqual(['README.md', 'run.sh', 'src/main.py']);
  const want: Record<string, string> = { 'README.md': `# ${tag}\n`, 'run.sh': '#!/bin/sh\necho run\n', 'src/main.py': `print("${tag}")\n` };
  for (const f of rev.files) {
    const content = await q.redis().get(`ap:{p:${id}}:blob:${f.sha256.slice('sha256:'.length)}`);
    expect([f.path, content]).toEqual([f.path, want[f.path]]);
  }
}

describe('a crash inside a keyed Project create', () => {
  const crash = useCrashPlatforms('keyed-create-crash-projects');

  it('before its head: the retry finishes it under the same id, keeping revision 1; one Project, its files readable', async () => {
    const q = await crash.start(['project-revision-committed'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const named = async (name: string) => (await api.get<{ data: Made[] }>(PATH, { limit: 100 })).data.filter((x) => x.name === name);
    const body: Json = { name: 'keyed', files: tree('keyed') };

    await crashedCreate(q, 'project-revision-committed', body, 'k-project');
    // No Project yet, but revision 1 and its contents are written under the derived id, on record.
    expect(await named('keyed')).toEqual([]);
    const [orphan, ...others] = await keyedIds(q);
    expect(others).toEqual([]);
    expect(await q.redis().hlen(`ap:{p:${orphan}}:revs`)).toBe(1);
    const firstRevision = JSON.parse(String(await q.redis().hget(`ap:{p:${orphan}}:revs`, '1'))) as { created_at: string };
    expect(await q.redis().zrange(JOURNAL, 0, -1)).toEqual([`${q.p.bootstrap.workspace_id} ${orphan}`]);

    const retry = await api.request<Made>('POST', PATH, { body, idempotencyKey: 'k-project' });
    expect([retry.status, retry.body.id, retry.body.version, retry.body.latest_revision_number, retry.body.latest_revision.revision_number])
      .toEqual([201, orphan, 1, 1, 1]);
    // The first attempt's revision is kept, not appended again.
    expect(retry.body.latest_revision).toMatchObject({ created_at: firstRevision.created_at, base_revision_number: null });
    expect((await named('keyed')).map((x) => [x.id, x.latest_revision_number])).toEqual([[orphan, 1]]);
    expect((await api.get<Made>(`${PATH}/${orphan}`)).latest_revision_number).toBe(1);
    await readable(q, orphan!, 'keyed');
    expect(await keyedIds(q)).toEqual([orphan]);
    expect(await q.redis().zcard(JOURNAL)).toBe(0);

    const replay = await api.request<Made>('POST', PATH, { body, idempotencyKey: 'k-project' });
    expect([replay.status, replay.body.id, replay.headers.get('idempotent-replayed')]).toEqual([201, orphan, 'true']);
    // It can be changed as any Project.
    const pushed = await api.request<Revision>('POST', `${PATH}/${orphan}/push`, { body: { base_revision_number: 1, changes: [{ path: 'NOTES.md', content_base64: b64('n') }] } });
    expect([pushed.status, pushed.body.revision_number]).toEqual([201, 2]);

    // Without a key, each create makes its own.
    const a = await api.request<Made>('POST', PATH, { body: { name: 'plain', files: tree('plain') } });
    const b = await api.request<Made>('POST', PATH, { body: { name: 'plain', files: tree('plain') } });
    expect([a.status, b.status]).toEqual([201, 201]);
    expect(a.body.id).not.toBe(b.body.id);
    expect((await named('plain')).map((x) => x.id).sort()).toEqual([a.body.id, b.body.id].sort());
  }, 180_000);

  it('after its head, and a retry that died before it: the next retry answers the same Project, kept by the sweep; one changed since is refused', async () => {
    const q = await crash.start(['project-revision-committed', 'project-created'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const named = async (name: string) => (await api.get<{ data: Made[] }>(PATH, { limit: 100 })).data.filter((x) => x.name === name);
    const body: Json = { name: 'twice', files: tree('twice') };

    // The first attempt dies before the head, its retry after writing it.
    await crashedCreate(q, 'project-revision-committed', body, 'k-twice');
    const [orphan] = await keyedIds(q);
    await crashedCreate(q, 'project-created', body, 'k-twice');
    expect((await named('twice')).map((x) => x.id)).toEqual([orphan]);
    const pending = await q.redis().zrange(JOURNAL, 0, -1);
    expect(pending).toEqual([`${q.p.bootstrap.workspace_id} ${orphan}`]);

    const retry = await api.request<Made>('POST', PATH, { body, idempotencyKey: 'k-twice' });
    expect([retry.status, retry.body.id, retry.body.version, retry.body.latest_revision_number, retry.body.latest_revision.revision_number])
      .toEqual([201, orphan, 1, 1, 1]);
    expect((await named('twice')).map((x) => x.id)).toEqual([orphan]);
    await readable(q, orphan!, 'twice');
    expect(await keyedIds(q)).toEqual([orphan]);

    // The dead attempt's entry, past its grace (moved back rather than waited for), is swept by the
    // next creation: the Project, whose head exists, keeps everything.
    await q.redis().zadd(JOURNAL, 0, pending[0]!);
    const other = await api.request<Made>('POST', PATH, { body: { name: 'other', files: tree('other') } });
    expect(other.status).toBe(201);
    expect(await q.redis().zcard(JOURNAL)).toBe(0);
    await readable(q, orphan!, 'twice');
    expect(await keyedIds(q)).toEqual([orphan, other.body.id].sort());

    // A Project given a revision since its crashed keyed create is not answered to the retry: 409,
    // nothing written.
    const changedBody: Json = { name: 'changed', files: tree('changed') };
    await crashedCreate(q, 'project-created', changedBody, 'k-changed');
    const [changed] = await named('changed');
    const revised = await api.request<Revision>('POST', `${PATH}/${changed!.id}/revisions`, { body: { files: tree('changed-2'), expected_revision_number: 1 } });
    expect([revised.status, revised.body.revision_number]).toEqual([201, 2]);
    const refused = await api.request<{ error: { type: string } }>('POST', PATH, { body: changedBody, idempotencyKey: 'k-changed' });
    expect([refused.status, refused.body.error.type]).toEqual([409, 'idempotency.conflict']);
    expect((await named('changed')).map((x) => [x.id, x.version, x.latest_revision_number])).toEqual([[changed!.id, 2, 2]]);
  }, 180_000);
});
