import { describe, expect, it } from 'vitest';
import { crashedKeyed, useCrashPlatforms, type CrashPlatform } from './harness/crash-platform.js';
import type { Json } from './harness/turns.js';

/**
 * A keyed `POST /v1/projects` whose api died inside it (crash points `project-revision-committed`,
 * after revision 1 and its contents but before the head, and `project-created`, after the head),
 * its key's pending record gone as it goes once its owner is dead (here removed, as its expiry
 * would): the retry of the same request under the key answers the Project its first attempt
 * made, or finishes it under the same id, keeping that attempt's revision 1; one Project, its
 * files readable, nothing of another id left. A Project changed since is not answered (409).
 * Likewise a keyed revision (`POST …/revisions`, `POST …/push`) whose api died right after
 * appending it (`project-revision-appended`): its retry is answered that revision, no second one.
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

/** `crashedKeyed` for a JSON request at `path` (a Project's create by default). */
function crashedCreate(q: CrashPlatform, point: string, body: Json, key: string, path = PATH): Promise<void> {
  return crashedKeyed(q, point, key, () => q.p.root.request('POST', path, { body, idempotencyKey: key }), { probePath: PATH });
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

  it('after a revision is appended: the keyed retry of createRevision or push answers that revision, with no second one', async () => {
    const q = await crash.start(['project-revision-appended'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    type Appended = Revision & { created_at: string; source: string; base_revision_number: number | null };
    const made = await api.request<Made>('POST', PATH, { body: { name: 'revised', files: tree('revised') } });
    expect(made.status).toBe(201);
    const id = made.body.id;
    const revisions = `${PATH}/${id}/revisions`;
    const revs = `ap:{p:${id}}:revs`;
    const stored = async (n: number) => JSON.parse(String(await q.redis().hget(revs, String(n)))) as Appended;
    const head = () => api.get<Made>(`${PATH}/${id}`);

    // A complete tree without expected_revision_number: appended (revision 2) before the crash;
    // the retry is answered it, not given revision 3 with the same tree.
    const body: Json = { files: tree('revised-2') };
    await crashedCreate(q, 'project-revision-appended', body, 'k-revision', revisions);
    expect(await q.redis().hlen(revs)).toBe(2);
    const second = await stored(2);
    const retry = await api.request<Appended>('POST', revisions, { body, idempotencyKey: 'k-revision' });
    expect([retry.status, retry.body.revision_number, retry.body.created_at, retry.body.source]).toEqual([201, 2, second.created_at, 'revision']);
    expect(await q.redis().hlen(revs)).toBe(2);
    // The head, which the dead attempt did not move on, is moved on once.
    expect([(await head()).latest_revision_number, (await head()).version]).toEqual([2, 2]);
    const replay = await api.request<Appended>('POST', revisions, { body, idempotencyKey: 'k-revision' });
    expect([replay.status, replay.body.revision_number, replay.headers.get('idempotent-replayed')]).toEqual([201, 2, 'true']);
    // The same tree under another key is a revision of its own.
    const other = await api.request<Appended>('POST', revisions, { body, idempotencyKey: 'k-other' });
    expect([other.status, other.body.revision_number]).toEqual([201, 3]);

    // A push, whose base is stale for the retry (its own revision is the latest): answered its revision, not 409.
    const pushBody: Json = { base_revision_number: 3, changes: [{ path: 'NOTES.md', content_base64: b64('notes') }] };
    await crashedCreate(q, 'project-revision-appended', pushBody, 'k-push', `${PATH}/${id}/push`);
    expect(await q.redis().hlen(revs)).toBe(4);
    const fourth = await stored(4);
    const pushed = await api.request<Appended>('POST', `${PATH}/${id}/push`, { body: pushBody, idempotencyKey: 'k-push' });
    expect([pushed.status, pushed.body.revision_number, pushed.body.created_at, pushed.body.source, pushed.body.base_revision_number])
      .toEqual([201, 4, fourth.created_at, 'push', 3]);
    expect(await q.redis().hlen(revs)).toBe(4);

    // With expected_revision_number, stale for the retry as well: answered its revision, not 409.
    const expected: Json = { files: tree('revised-5'), expected_revision_number: 4 };
    await crashedCreate(q, 'project-revision-appended', expected, 'k-expected', revisions);
    const fifth = await stored(5);
    const answered = await api.request<Appended>('POST', revisions, { body: expected, idempotencyKey: 'k-expected' });
    expect([answered.status, answered.body.revision_number, answered.body.created_at]).toEqual([201, 5, fifth.created_at]);
    expect(await q.redis().hlen(revs)).toBe(5);
    expect((await head()).latest_revision_number).toBe(5);
    expect((await api.get<{ files: { path: string }[] }>(`${revisions}/4`)).files.map((f) => f.path)).toEqual(['NOTES.md', 'README.md', 'run.sh', 'src/main.py']);

    // Deleting the Project clears its keys; the keyed requests' records expire on their own.
    const records = await q.redis().keys(`ap:{p:${id}}:rev_req:*`);
    expect(records.length).toBeGreaterThan(0);
    for (const r of records) expect(await q.redis().pttl(r)).toBeGreaterThan(0);
    expect((await api.request('DELETE', `${PATH}/${id}`)).status).toBe(200);
    expect((await q.redis().keys(`ap:{p:${id}}:*`)).filter((k) => !k.includes(':rev_req:'))).toEqual([]);
  }, 180_000);
});
