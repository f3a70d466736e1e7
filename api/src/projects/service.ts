import { createHash, randomBytes } from 'node:crypto';
import { ApiError, crashPoint, newId, nowIso } from '@agentplane/core';
import { InFlightWrites, KEYED_WRITES_LUA, KeyedWrites, keys, LuaScript, tags, type DocumentStore, type KeyedWrite, type ListPage, type Redis } from '@agentplane/store';
import { checkWellFormed } from '../memory/model.js';
import { checkProjectPath, decodeContent, PROJECT_LIMITS, type ManifestEntry, type ProjectDoc, type ProjectRevision } from './model.js';

const INDEX = 'projects';
/**
 * Creations and deletions in flight: `<workspace_id> <project_id>` scored by the time after which
 * one that has not finished is taken for dead (its process crashed after writing contents and
 * revision 1 but before the head, or after removing the head but before its keys). Far longer
 * than either takes.
 */
const CREATIONS = keys.global('project_creations');
const CREATION_GRACE_MS = 10 * 60_000;
/**
 * How often an api process sweeps dead creations on its own (`startSweeping`), besides the sweep
 * after each finished creation: once per grace period, so what a dead creation wrote is reclaimed
 * within about two grace periods even if no Project is ever created again.
 */
const CREATION_SWEEP_MS = CREATION_GRACE_MS;

/**
 * Appends revision `ARGV[1]` only if the project still exists (its `alive` marker: -1 otherwise)
 * and holds exactly `ARGV[1] - 1` revisions (0 otherwise), and notes `<number> <append id>`
 * (`ARGV[4]`, this attempt's own; '' for a create, which notes nothing) as the last append
 * (KEYS[3]). The same append run again (the client sends a command again when its connection
 * dropped before the reply) finds itself noted as the last append and answers 1 without writing
 * again. The id, not the manifest, tells it apart: another request with the same tree made in the
 * same millisecond builds the same manifest, and must lose the race. A create's resend is answered
 * by `firstRevision`.
 *
 * A keyed request's append is recorded for it (KEYS[4], `KeyedWrites`: the revision number, kept
 * `ARGV[3]` ms) in the same step. A request already recorded answers the number it appended (a
 * string), nothing written: an attempt of the same request appended it. KEYS: revs, alive, last
 * append, and the request's record for a keyed append.
 */
const APPEND = new LuaScript('project_append_revision', `${KEYED_WRITES_LUA}
if redis.call('EXISTS', KEYS[2]) == 0 then return -1 end
if KEYS[4] then
  local had = recorded_keyed(KEYS[4])
  if had then return had end
end
local mine = ARGV[1] .. ' ' .. ARGV[4]
if ARGV[4] ~= '' and redis.call('GET', KEYS[3]) == mine then return 1 end
if redis.call('HLEN', KEYS[1]) ~= tonumber(ARGV[1]) - 1 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
if ARGV[4] ~= '' then redis.call('SET', KEYS[3], mine) end
if KEYS[4] then record_keyed(KEYS[4], ARGV[1], ARGV[3]) end
return 1`);

/**
 * The first step of clearing what a creation or deletion that never finished left (its process
 * died): its marker goes, only while it is still `ARGV[1]` (the value read before the sweep
 * checked the entry again, or this attempt's own; '' for none). A later attempt of the same keyed
 * create takes the project's id over by setting a marker of its own before it writes anything:
 * what it finds and writes is then kept. KEYS: alive.
 */
const CLAIM_LEFTOVERS = new LuaScript('project_claim_leftovers', `
if (redis.call('GET', KEYS[1]) or '') ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
return 1`);

/**
 * The next steps: the contents (in batches), then the manifests and the contents' list, each only
 * while no marker has been set since the first step (no attempt took the id over). KEYS: alive,
 * then the keys to remove.
 */
const UNLINK_UNCLAIMED = new LuaScript('project_unlink_unclaimed', `
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
for i = 2, #KEYS do redis.call('UNLINK', KEYS[i]) end
return 1`);

/**
 * Stores one file content by digest (kept if present) and lists the digest in `:blobs`, only if
 * the project still exists (-1 otherwise): a content written after the project's deletion began
 * would be listed nowhere its deletion looks. KEYS: blob, blobs, alive. ARGV: content, digest.
 */
const PUT_BLOB = new LuaScript('project_put_blob', `
if redis.call('EXISTS', KEYS[3]) == 0 then return -1 end
redis.call('SET', KEYS[1], ARGV[1], 'NX')
redis.call('SADD', KEYS[2], ARGV[2])
return 1`);

export interface TreeFileInput {
  path: string;
  content_base64: string;
  executable?: boolean | undefined;
}

export interface PushChange {
  path: string;
  content_base64?: string | undefined;
  executable?: boolean | undefined;
  delete?: boolean | undefined;
}

interface Staged {
  entry: ManifestEntry;
  content?: Buffer;
}

function projectKeys(projectId: string) {
  const tag = tags.project(projectId);
  return {
    revs: keys.scoped(tag, 'revs'), blobs: keys.scoped(tag, 'blobs'), blob: (digest: string) => keys.scoped(tag, `blob:${digest}`),
    /**
     * Set while the project exists: the scripts that write its contents and revisions check it.
     * Its value is the creation attempt's own (random), so that what a dead attempt left is cleared
     * only while no later attempt under the same id has taken it over (`clearCreation`).
     */
    alive: keys.scoped(tag, 'alive'),
    /** `<revision number> <append id>` of the last revision appended (not by a create): `APPEND`'s resend check. */
    lastAppend: keys.scoped(tag, 'last_append'),
    /** What earlier versions kept of keyed appends (a hash): removed with the project. */
    legacyReqs: keys.scoped(tag, 'reqs'),
  };
}

/** No path may be both a file and a directory of another file. */
function checkTree(paths: readonly string[], field: string): void {
  const files = new Set<string>();
  for (const p of paths) {
    if (files.has(p)) throw new ApiError('validation.malformed', `${field}: '${p.slice(0, 80)}' appears twice`);
    files.add(p);
  }
  for (const p of paths) {
    const parts = p.split('/');
    for (let i = 1; i < parts.length; i++) {
      const dir = parts.slice(0, i).join('/');
      if (files.has(dir)) throw new ApiError('validation.malformed', `${field}: '${dir.slice(0, 80)}' is a file and a directory of '${p.slice(0, 80)}'`);
    }
  }
}

function checkBudget(entries: readonly ManifestEntry[], field: string): number {
  if (entries.length > PROJECT_LIMITS.maxFiles) {
    throw new ApiError('validation.malformed', `${field}: ${entries.length} files; a project revision holds at most ${PROJECT_LIMITS.maxFiles}`);
  }
  const total = entries.reduce((n, e) => n + e.size_bytes, 0);
  if (total > PROJECT_LIMITS.maxRevisionBytes) {
    throw new ApiError('validation.malformed', `${field}: ${total} bytes decoded; a project revision holds at most ${PROJECT_LIMITS.maxRevisionBytes} bytes (20 MiB)`);
  }
  return total;
}

/**
 * Uploaded Projects: a head in the Workspace (`{w:<ws>}:doc:<proj>`, listed in `:idx:projects`)
 * and, under the project's own tag `{p:<proj>}`, its immutable revisions (`:revs`, a hash
 * revision number → manifest JSON) and file contents by digest (`:blob:<sha256>`, shared by every
 * revision that holds the same bytes; their digests in `:blobs`), and the record of each keyed
 * request that appended a revision (`:rev_req:<token>`, `KeyedWrites`: it outlives the project's
 * deletion until it expires, and is never read once the project is gone: `APPEND` checks first).
 */
export class ProjectService {
  private readonly creations: InFlightWrites;
  /** Keyed revision requests (creates and pushes), each with the revision number it appended. */
  private readonly appends: KeyedWrites;

  constructor(
    private readonly redis: Redis,
    private readonly docs: DocumentStore,
  ) {
    this.creations = new InFlightWrites(redis, CREATIONS, CREATION_GRACE_MS);
    this.appends = new KeyedWrites(redis, 'rev_req');
  }

  /**
   * `id`: a keyed create's, derived from its key and request (`createdId`), the same for every
   * attempt; the retry of one whose first attempt died before its head existed finishes it under
   * that id, keeping the revision 1 that attempt appended (the same tree: the same request).
   */
  async create(workspaceId: string, name: string, files: readonly TreeFileInput[], id = newId('project')): Promise<{ project: ProjectDoc; revision: ProjectRevision }> {
    checkWellFormed(name, 'body.name');
    const staged = this.stageTree(files, 'body.files');
    const now = nowIso();
    const project: ProjectDoc = { id, type: 'project', workspace_id: workspaceId, name, version: 1, created_at: now, updated_at: now };
    const k = projectKeys(project.id);
    // On record before anything of the project is written: a crash before its head exists leaves
    // the entry, and a later sweep drops what was written. A retry under the same id begins the
    // entry again (a new deadline) before it sets its own marker, which takes over what the dead
    // attempt wrote: a sweep clears that only while the marker is still the dead attempt's.
    const marker = randomBytes(16).toString('hex');
    await this.creations.begin(workspaceId, project.id);
    await this.redis.set(k.alive, marker);
    let headWritten = false;
    try {
      const { revision } = await this.commit(workspaceId, project.id, 1, staged, 'create', null);
      crashPoint('project-revision-committed');
      headWritten = await this.docs.create(tags.workspace(workspaceId), project, [INDEX]);
      if (!headWritten) {
        // Only a keyed create's id can be taken: another attempt of the same request wrote the
        // head meanwhile (its first, slower than its key's pending record). That one is answered.
        const head = await this.find(workspaceId, project.id);
        if (!head) throw new ApiError('idempotency.conflict', `project ${project.id} is being created by another attempt of this request; retry it`);
        headWritten = true;
        await this.creations.end(workspaceId, project.id);
        return { project: head, revision: await this.revision(project.id, 1) };
      }
      crashPoint('project-created');
      await this.creations.end(workspaceId, project.id);
      await this.sweep().catch(() => undefined);
      return { project, revision };
    } catch (err) {
      // Nobody knows the id yet: what this attempt wrote of it goes (not what a later attempt of
      // the same keyed create took over, nor a project whose head was written).
      if (!headWritten) await this.clearCreation(project.id, marker);
      await this.creations.end(workspaceId, project.id);
      throw err;
    }
  }

  /** The Project of the Workspace stored under `id`, null when there is none. */
  async find(workspaceId: string, projectId: string): Promise<ProjectDoc | null> {
    const doc = await this.docs.get<ProjectDoc>(tags.workspace(workspaceId), projectId);
    return doc && doc.type === 'project' && doc.workspace_id === workspaceId ? doc : null;
  }

  /**
   * What a keyed create's earlier attempt made under `id` (`createdId`): the head, its revision 1
   * and how many revisions it holds (a revision beyond the first changed it, even one whose head
   * was not moved on: its process died in between). Null when its head does not exist.
   */
  async findCreated(workspaceId: string, projectId: string): Promise<{ project: ProjectDoc; revision: ProjectRevision; revisions: number } | null> {
    const project = await this.find(workspaceId, projectId);
    if (!project) return null;
    const [revisions, revision] = await Promise.all([this.latestNumber(projectId), this.revision(projectId, 1)]);
    return { project, revision, revisions };
  }

  /**
   * Reclaims creations and deletions that never finished (their process died after writing
   * contents and a revision but before the head, or after removing the head but before its keys):
   * past their grace, a project whose head does not exist loses every key. A head that exists
   * keeps them; either way the entry goes. An entry begun again meanwhile (a keyed create's retry
   * under the same id) is left to that retry: its marker is read before the entry is checked again
   * (the retry begins the entry before it sets its marker), and the keys are cleared in one step
   * only while the marker is the one read, so nothing the retry finds or writes is cleared.
   */
  async sweep(now = Date.now()): Promise<number> {
    const markers = new Map<string, string>();
    return this.creations.sweep(async (ws, id) => {
      const marker = (await this.redis.get(projectKeys(id).alive)) ?? '';
      if (!(await this.creations.due(ws, id, now))) return true;
      if ((await this.docs.get<ProjectDoc>(tags.workspace(ws), id)) !== null) return true;
      markers.set(id, marker);
      return false;
    }, (id) => this.clearCreation(id, markers.get(id) ?? ''), now);
  }

  /**
   * Sweeps now and every `intervalMs` (CREATION_SWEEP_MS; a test passes a shorter one) until
   * `stopSweeping`, so dead creations are reclaimed with no later creation; a failure goes to
   * `onError`. The timer does not hold the process open.
   */
  startSweeping(onError: (err: unknown) => void, intervalMs = CREATION_SWEEP_MS): void {
    this.creations.startSweeping(() => this.sweep(), onError, intervalMs);
  }

  stopSweeping(): void {
    this.creations.stopSweeping();
  }

  async get(workspaceId: string, projectId: string): Promise<ProjectDoc> {
    const doc = await this.find(workspaceId, projectId);
    if (!doc) throw new ApiError('validation.not_found', `project ${projectId} not found`);
    return doc;
  }

  list(workspaceId: string, options: { limit: number; page?: string | undefined }): Promise<ListPage<ProjectDoc>> {
    return this.docs.list<ProjectDoc>(tags.workspace(workspaceId), INDEX, { ...options, order: 'asc' });
  }

  latestNumber(projectId: string): Promise<number> {
    return this.redis.hlen(projectKeys(projectId).revs);
  }

  async view(p: ProjectDoc): Promise<ProjectDoc & { latest_revision_number: number }> {
    return { ...p, latest_revision_number: await this.latestNumber(p.id) };
  }

  async revision(projectId: string, n: number): Promise<ProjectRevision> {
    const raw = await this.redis.hget(projectKeys(projectId).revs, String(n));
    if (raw === null) throw new ApiError('validation.not_found', `project ${projectId} has no revision ${n}`);
    return JSON.parse(raw) as ProjectRevision;
  }

  /**
   * The head goes first (the project is gone for readers at once), then its keys: the `alive`
   * marker first, so no content or revision is written after it (a commit whose existence check
   * passed before the deletion is refused by its scripts), then the revisions and every content
   * `:blobs` lists, which is complete from then on. The deletion is on record before the head
   * goes: a crash before its keys are cleared leaves the entry, and a later sweep clears them.
   * Of concurrent deletions only the one that removed the head goes on; the others are 404
   * `validation.not_found`, as a deletion after it is.
   */
  async remove(workspaceId: string, projectId: string): Promise<void> {
    await this.get(workspaceId, projectId);
    await this.creations.begin(workspaceId, projectId);
    const removed = await this.docs.removeIfVersion(tags.workspace(workspaceId), projectId, undefined, [INDEX]);
    // The entry is left as it is: the deletion that removed the head ends it once the keys are
    // gone, and ending it here could drop it while that one still clears. Begun again after that
    // ended, it stays until a sweep, which finds no head and clears keys already gone.
    if (removed.kind !== 'removed') throw new ApiError('validation.not_found', `project ${projectId} not found`);
    crashPoint('project-head-removed');
    await this.clear(projectId);
    await this.creations.end(workspaceId, projectId);
  }

  private async clear(projectId: string): Promise<void> {
    const k = projectKeys(projectId);
    await this.redis.del(k.alive);
    await this.redis.unlink(k.revs, k.lastAppend, k.legacyReqs);
    const digests = await this.redis.smembers(k.blobs);
    for (let i = 0; i < digests.length; i += 500) await this.redis.unlink(...digests.slice(i, i + 500).map((d) => k.blob(d)));
    await this.redis.unlink(k.blobs);
  }

  /**
   * What a creation or deletion that never finished left, cleared only while its marker is
   * `marker` ('' for none) and then while no attempt has set one since (`CLAIM_LEFTOVERS`,
   * `UNLINK_UNCLAIMED`): a keyed create's retry that took the id over keeps what it found. The
   * contents listed once the marker is gone are all there are (each is written by a script that
   * checks the marker), unless an attempt took the id over, which stops the clearing.
   */
  private async clearCreation(projectId: string, marker: string): Promise<void> {
    const k = projectKeys(projectId);
    if ((await CLAIM_LEFTOVERS.run(this.redis, [k.alive], [marker])) !== 1) return;
    const digests = await this.redis.smembers(k.blobs);
    for (let i = 0; i < digests.length; i += 500) {
      if ((await UNLINK_UNCLAIMED.run(this.redis, [k.alive, ...digests.slice(i, i + 500).map((d) => k.blob(d))], [])) !== 1) return;
    }
    await UNLINK_UNCLAIMED.run(this.redis, [k.alive, k.revs, k.lastAppend, k.legacyReqs, k.blobs], []);
  }

  /**
   * A complete new tree. `expected` (the revision number the caller last saw) makes a concurrent
   * revision a 409; without it, a revision that lost the race to a concurrent one is appended
   * after it instead (`commit`). `keyed`: the revision an earlier attempt of the same keyed
   * request appended answers it (`appended`), unchecked against `expected`.
   */
  async addRevision(workspaceId: string, projectId: string, files: readonly TreeFileInput[], expected: number | undefined, keyed?: KeyedWrite): Promise<ProjectRevision> {
    await this.get(workspaceId, projectId);
    const earlier = keyed ? await this.appended(workspaceId, projectId, keyed) : null;
    if (earlier) return earlier;
    const staged = this.stageTree(files, 'body.files');
    const latest = await this.latestNumber(projectId);
    if (expected !== undefined && expected !== latest) throw new ApiError('validation.conflict', `expected_revision_number ${expected} is stale; the latest revision is ${latest}`);
    return this.committed(workspaceId, projectId, await this.commit(workspaceId, projectId, latest + 1, staged, 'revision', latest, keyed, expected === undefined));
  }

  /**
   * The revision an earlier attempt of this keyed request appended (`APPEND` recorded it, for as
   * long as keys are kept); null when there is none (append it: a record of an earlier use of the
   * key has expired with the key). The head is moved on if that attempt died before moving it
   * (`committed`).
   */
  private async appended(workspaceId: string, projectId: string, keyed: KeyedWrite): Promise<ProjectRevision | null> {
    const n = await this.appends.find(tags.project(projectId), keyed);
    if (n === null) return null;
    return this.committed(workspaceId, projectId, { revision: await this.revision(projectId, Number(n)), fresh: false });
  }

  /**
   * A new revision changes the head: its `version` and `updated_at` move on (compare-and-swap).
   * A revision appended by an earlier attempt of the same keyed request (`fresh` false) moves it
   * on only while the head's version is below that revision's number (only revisions move a head,
   * one step each, from version 1 with revision 1), that is when the attempt died before moving
   * it: decided by counts, not by comparing clocks (which a machine may step back).
   */
  private async committed(workspaceId: string, projectId: string, { revision, fresh }: { revision: ProjectRevision; fresh: boolean }): Promise<ProjectRevision> {
    await this.docs.update<ProjectDoc>(tags.workspace(workspaceId), projectId, (cur) => (fresh || cur.version < revision.revision_number ? { ...cur } : null), {
      notFound: `project ${projectId}`,
    });
    return revision;
  }

  /**
   * Up to 64 changed or deleted files on top of `base`, which must be the latest revision.
   * `keyed`: as `addRevision`'s (the revision an earlier attempt appended answers it, whatever
   * the latest revision is now).
   */
  async push(workspaceId: string, projectId: string, base: number, changes: readonly PushChange[], keyed?: KeyedWrite): Promise<ProjectRevision> {
    await this.get(workspaceId, projectId);
    const earlier = keyed ? await this.appended(workspaceId, projectId, keyed) : null;
    if (earlier) return earlier;
    if (changes.length > PROJECT_LIMITS.maxPushFiles) {
      throw new ApiError('validation.malformed', `body.changes: ${changes.length} files; a push carries at most ${PROJECT_LIMITS.maxPushFiles}`);
    }
    const latest = await this.latestNumber(projectId);
    if (base !== latest) throw new ApiError('validation.conflict', `base_revision_number ${base} is not the latest revision (${latest}); fetch it and push again`);
    const tree = new Map<string, Staged>((await this.revision(projectId, base)).files.map((e) => [e.path, { entry: e }]));
    const seen = new Set<string>();
    changes.forEach((c, i) => {
      const field = `body.changes[${i}]`;
      checkProjectPath(c.path, `${field}.path`);
      if (seen.has(c.path)) throw new ApiError('validation.malformed', `${field}.path: '${c.path.slice(0, 80)}' appears twice`);
      seen.add(c.path);
      if (c.delete === true) {
        if (c.content_base64 !== undefined || c.executable !== undefined) throw new ApiError('validation.malformed', `${field}: a deletion carries no content and no executable flag`);
        if (!tree.delete(c.path)) throw new ApiError('validation.malformed', `${field}.path: '${c.path.slice(0, 80)}' is not in revision ${base}`);
        return;
      }
      if (c.content_base64 === undefined) throw new ApiError('validation.malformed', `${field}: content_base64 or delete is required`);
      // A content-only change keeps the file's mode; a new file is not executable unless it says so.
      tree.set(c.path, this.stageFile(c.path, c.content_base64, c.executable ?? tree.get(c.path)?.entry.executable ?? false, `${field}.content_base64`));
    });
    const staged = [...tree.values()];
    checkTree(staged.map((s) => s.entry.path), 'body.changes');
    checkBudget(staged.map((s) => s.entry), 'the pushed revision');
    return this.committed(workspaceId, projectId, await this.commit(workspaceId, projectId, latest + 1, staged, 'push', base, keyed));
  }

  /**
   * Every file of a revision with its bytes (for the runner that mounts it). A content missing
   * means the project is being deleted (its contents go after its head): 404 like the project.
   */
  async readFiles(projectId: string, n: number): Promise<Array<ManifestEntry & { content: Buffer }>> {
    const rev = await this.revision(projectId, n);
    const k = projectKeys(projectId);
    const out: Array<ManifestEntry & { content: Buffer }> = [];
    for (const e of rev.files) {
      const content = await this.redis.getBuffer(k.blob(e.sha256.slice('sha256:'.length)));
      if (!content) throw new ApiError('validation.not_found', `project ${projectId} not found (the content of revision ${n}'s ${e.path.slice(0, 80)} is gone)`);
      out.push({ ...e, content });
    }
    return out;
  }

  private stageFile(path: string, b64: string, executable: boolean, field: string): Staged {
    const content = decodeContent(b64, field);
    const sha256 = `sha256:${createHash('sha256').update(content).digest('hex')}`;
    return { entry: { path, size_bytes: content.length, sha256, executable }, content };
  }

  private stageTree(files: readonly TreeFileInput[], field: string): Staged[] {
    if (files.length > PROJECT_LIMITS.maxFiles) throw new ApiError('validation.malformed', `${field}: ${files.length} files; a project revision holds at most ${PROJECT_LIMITS.maxFiles}`);
    files.forEach((f, i) => checkProjectPath(f.path, `${field}[${i}].path`));
    checkTree(files.map((f) => f.path), field);
    let total = 0;
    return files.map((f, i) => {
      const s = this.stageFile(f.path, f.content_base64, f.executable ?? false, `${field}[${i}].content_base64`);
      total += s.entry.size_bytes;
      if (total > PROJECT_LIMITS.maxRevisionBytes) {
        throw new ApiError('validation.malformed', `${field}: more than ${PROJECT_LIMITS.maxRevisionBytes} bytes decoded; a project revision holds at most 20 MiB`);
      }
      return s;
    });
  }

  /**
   * Contents first (by digest, idempotent), then the manifest, appended only if `n` is next; each
   * by a script that refuses once the project's deletion began (404, nothing more written).
   * `keyed`: the request's token is recorded with the revision in the same step; when an attempt
   * of the same request appended one meanwhile, that one is answered (`fresh` false), nothing
   * appended. `onLatest`: a revision that lost the race for `n` to a concurrent one is built again
   * on top of the latest revision and appended after it (no fence was asked for); else 409.
   * Crash point `project-revision-appended` right after the append.
   */
  private async commit(
    workspaceId: string, projectId: string, n: number, staged: readonly Staged[], source: ProjectRevision['source'], base: number | null, keyed?: KeyedWrite,
    onLatest = false,
  ): Promise<{ revision: ProjectRevision; fresh: boolean }> {
    const k = projectKeys(projectId);
    const run = async (write: () => Promise<unknown>): Promise<unknown> => {
      let r = await write();
      if (r === -1 && (await this.adopt(workspaceId, projectId))) r = await write();
      if (r === -1) throw new ApiError('validation.not_found', `project ${projectId} not found`);
      return r;
    };
    for (const s of staged) {
      if (!s.content) continue;
      const digest = s.entry.sha256.slice('sha256:'.length);
      const content = s.content;
      await run(() => PUT_BLOB.run(this.redis, [k.blob(digest), k.blobs, k.alive], [content, digest]));
    }
    const files = staged.map((s) => s.entry).sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
    const totalBytes = checkBudget(files, 'the revision');
    const record = keyed ? [this.appends.key(tags.project(projectId), keyed)] : [];
    for (let attempt = 0; attempt < 16; attempt++) {
      const revision: ProjectRevision = {
        type: 'project_revision', project_id: projectId, revision_number: n, source, base_revision_number: base, files,
        file_count: files.length, total_bytes: totalBytes, created_at: nowIso(),
      };
      const json = JSON.stringify(revision);
      const appendId = source === 'create' ? '' : randomBytes(12).toString('hex');
      const ok = await run(() => APPEND.run(this.redis, [k.revs, k.alive, k.lastAppend, ...record], [String(n), json, String(keyed?.keptMs ?? 0), appendId]));
      if (typeof ok === 'string') return { revision: await this.revision(projectId, Number(ok)), fresh: false };
      if (ok === 1) {
        if (source !== 'create') crashPoint('project-revision-appended');
        return { revision, fresh: true };
      }
      if (source === 'create') return { revision: await this.firstRevision(projectId, files), fresh: true };
      if (!onLatest) throw new ApiError('validation.conflict', `another revision of project ${projectId} was written at the same time; fetch the latest and retry`);
      const latest = await this.latestNumber(projectId);
      n = latest + 1;
      base = latest;
    }
    throw new ApiError('validation.conflict', `too many concurrent revisions of project ${projectId}; nothing was written, retry`);
  }

  /**
   * Revision 1 already there when a create appends it: only a keyed create's id can hold one, that
   * an earlier attempt of the same request appended before it died (its head never written). Its
   * tree is this one (the same request), so it is kept, and its contents are all there (written
   * before it, and cleared only with it). Anything else under the id (more revisions: a project
   * made and deleted since, its keys not yet cleared) is no longer what the request made: 409.
   */
  private async firstRevision(projectId: string, files: readonly ManifestEntry[]): Promise<ProjectRevision> {
    const k = projectKeys(projectId);
    const [count, raw] = await Promise.all([this.redis.hlen(k.revs), this.redis.hget(k.revs, '1')]);
    const found = raw === null ? null : (JSON.parse(raw) as ProjectRevision);
    if (count === 1 && found && found.source === 'create' && JSON.stringify(found.files) === JSON.stringify(files)) return found;
    throw new ApiError('idempotency.conflict', `project ${projectId} was made by an earlier use of this Idempotency-Key and has changed since; use a new key`);
  }

  /**
   * A project without its `alive` marker whose head still exists was created before projects
   * carried one: it gets it now. A project being deleted has lost its head before its marker, so
   * it is not given one again.
   */
  private async adopt(workspaceId: string, projectId: string): Promise<boolean> {
    const head = await this.docs.get<ProjectDoc>(tags.workspace(workspaceId), projectId);
    if (!head || head.type !== 'project' || head.workspace_id !== workspaceId) return false;
    await this.redis.set(projectKeys(projectId).alive, '1', 'NX');
    return true;
  }
}
