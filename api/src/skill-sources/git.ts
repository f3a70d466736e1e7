import { execFile } from 'node:child_process';
import { appendFile, mkdtemp, readdir, rm, stat, writeFile, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { ApiError } from '@agentplane/core';
import { SKILL_LIMITS, type SkillFile } from '@agentplane/domain';

const GIT_TIMEOUT_MS = 60_000;
const MAX_OUTPUT = 8 * 1024 * 1024;

export class GitError extends Error {
  /** `overflow`: git wrote more than `MAX_OUTPUT` bytes and was stopped. */
  constructor(message: string, readonly stderr: string, readonly overflow = false) {
    super(message);
    this.name = 'GitError';
  }
}

/** A source git cannot read (unreachable, refused, no such repository): the source's fault, 409. */
function unreadable(err: unknown): unknown {
  return err instanceof GitError ? new ApiError('validation.conflict', `the skill source could not be read: ${err.message}`) : err;
}

/** Skill content in a source over the contract's limits: 400, as the same files sent directly. */
function tooLarge(message: string): ApiError {
  return new ApiError('validation.malformed', `the skill source: ${message}`);
}

/** The names of this module's scratch directories under the temp folder. */
const SCRATCH_PREFIXES = ['agentplane-skill-source-', 'agentplane-skill-work-'] as const;
/**
 * A scratch directory untouched this long belongs to no read in progress (each git command is
 * bounded by `GIT_TIMEOUT_MS`, and a read writes into its directory as it goes): it was left by
 * a process killed mid-read.
 */
export const STALE_SCRATCH_MS = 60 * 60_000;

/**
 * Removes the scratch directories of skill-source reads that a killed process left in the temp
 * folder (untouched for `maxAgeMs`); reads of live processes, here or on another api process of
 * this host, are younger. Returns how many were removed.
 */
export async function removeStaleScratch(maxAgeMs = STALE_SCRATCH_MS, now = Date.now()): Promise<number> {
  const root = tmpdir();
  const names = (await readdir(root).catch(() => [] as string[])).filter((n) => SCRATCH_PREFIXES.some((p) => n.startsWith(p)));
  let removed = 0;
  for (const name of names) {
    const path = join(root, name);
    const st = await stat(path).catch(() => null);
    if (!st?.isDirectory() || now - st.mtimeMs < maxAgeMs) continue;
    await rm(path, { recursive: true, force: true });
    removed++;
  }
  return removed;
}

/** Runs `git` with no prompt, no user or system configuration, and a timeout. */
export function git(args: readonly string[], options: { cwd?: string; env?: NodeJS.ProcessEnv; input?: Buffer } = {}): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const child = execFile('git', [...args], {
      cwd: options.cwd, encoding: 'buffer', timeout: GIT_TIMEOUT_MS, maxBuffer: MAX_OUTPUT,
      env: {
        PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: tmpdir(), GIT_TERMINAL_PROMPT: '0', GIT_CONFIG_NOSYSTEM: '1', GIT_CONFIG_GLOBAL: '/dev/null',
        GIT_ASKPASS: '/bin/false',
        // A private remote's credentials are the api host's SSH agent (docs/SKILLS.md); its
        // GIT_SSH_COMMAND is folded into the pinned ssh command (`SkillSourceService.remote`).
        ...(process.env.SSH_AUTH_SOCK ? { SSH_AUTH_SOCK: process.env.SSH_AUTH_SOCK } : {}),
        ...options.env,
      },
    }, (err, stdout, stderr) => {
      if (err) {
        const text = Buffer.isBuffer(stderr) ? stderr.toString('utf8') : String(stderr);
        const command = args.find((a, i) => !a.startsWith('-') && args[i - 1] !== '-c') ?? '';
        const overflow = (err as { code?: unknown }).code === 'ERR_CHILD_PROCESS_STDIO_MAXBUFFER';
        reject(new GitError(`git ${command} failed: ${text.trim().split('\n').slice(-3).join(' ').slice(0, 500)}`, text, overflow));
        return;
      }
      resolve(stdout);
    });
    if (options.input) child.stdin?.end(options.input);
  });
}

/**
 * Where git reaches a skill source for one operation: its address, and the git settings (in
 * git's environment) that hold its host to the address the outbound guard checked
 * (`SkillSourceService.remote`). A local repository has none.
 */
export interface GitRemote {
  url: string;
  env: Readonly<Record<string, string>>;
}

/** The commit a remote branch points at, or null when the branch does not exist. */
export async function remoteHead(remote: GitRemote, branch: string): Promise<string | null> {
  const out = (await git(['ls-remote', '--', remote.url, `refs/heads/${branch}`], { env: { ...remote.env } }).catch((err: unknown) => { throw unreadable(err); })).toString('utf8');
  // ls-remote's pattern matches the end of a ref's name (`refs/heads/x/refs/heads/<branch>` too):
  // only the line of the branch's own ref counts.
  const want = `refs/heads/${branch}`;
  for (const line of out.split('\n')) {
    const tab = line.indexOf('\t');
    if (tab < 0 || line.slice(tab + 1) !== want) continue;
    const sha = line.slice(0, tab);
    return /^[0-9a-f]{40}([0-9a-f]{24})?$/.test(sha) ? sha : null;
  }
  return null;
}

/**
 * The largest file a skill may hold (`SKILL.md` or any other): a fetch of a skill's files asks
 * the server to leave out every bigger blob, so none is ever downloaded.
 */
const SKILL_FILE_BOUND = Math.max(SKILL_LIMITS.maxFileBytes, SKILL_LIMITS.maxInstructionsBytes);

/** No background maintenance in a repository about to be removed. */
const FETCH_CONFIG = ['-c', 'gc.auto=0', '-c', 'maintenance.auto=false', '-c', 'fetch.writeCommitGraph=false'];

/**
 * A scratch repository holding one fetched commit of the source; its directory is removed by
 * `close`, whatever happened.
 *
 * What is downloaded is bounded: the fetch is shallow (the branch's head, no history) and
 * blob-less (the commit and its trees, no file content), where the server supports filters. A
 * skill directory's files are fetched only when that directory is read, after its listing has
 * been counted, by a fetch of that directory alone that leaves out every blob over
 * `SKILL_FILE_BOUND`: at most `SKILL_LIMITS.maxFiles + 1` files of at most 1 MiB each, and
 * nothing of the rest of the repository.
 */
export class Scratch {
  private fetches = 0;

  private constructor(private readonly root: string, private readonly remote: GitRemote, private readonly branch: string) {}

  /** The bare repository reads and commits run in. */
  get dir(): string {
    return join(this.root, 'source.git');
  }

  static async fetch(remote: GitRemote, branch: string): Promise<{ scratch: Scratch; head: string | null }> {
    const root = await mkdtemp(join(tmpdir(), SCRATCH_PREFIXES[0]));
    const scratch = new Scratch(root, remote, branch);
    try {
      await scratch.init(scratch.dir);
      let head = await remoteHead(remote, branch);
      if (head) {
        await scratch.fetchInto(scratch.dir, remote, ['--depth', '1', '--filter=blob:none', 'source', `+refs/heads/${branch}:refs/remotes/source/${branch}`]);
        // The commit fetched: the branch may have moved since it was listed.
        head = (await git(['rev-parse', '--verify', `refs/remotes/source/${branch}^{commit}`], { cwd: scratch.dir })).toString('utf8').trim();
      }
      return { scratch, head };
    } catch (err) {
      await scratch.close();
      throw err;
    }
  }

  private async init(dir: string): Promise<void> {
    await git(['init', '--quiet', '--bare', dir]);
    await git(['config', '--', 'remote.source.url', this.remote.url], { cwd: dir });
  }

  /**
   * `git fetch` from the source into `dir`. A filtered fetch makes the source a promisor remote,
   * from which git would then fetch any object it misses on demand, whole and one at a time;
   * that is turned off again, so an object left out stays out (and reads as missing).
   */
  private async fetchInto(dir: string, remote: GitRemote, args: readonly string[]): Promise<void> {
    await git([...FETCH_CONFIG, 'fetch', '--quiet', '--no-tags', ...args], { cwd: dir, env: { ...remote.env } }).catch((err: unknown) => { throw unreadable(err); });
    for (const key of ['remote.source.promisor', 'remote.source.partialclonefilter', 'extensions.partialclone']) {
      // Exit status 5: the key is not set.
      await git(['config', '--unset-all', key], { cwd: dir }).catch(() => undefined);
    }
  }

  /** Size of each object here (null: not here), by its id. */
  private async sizes(objects: readonly string[]): Promise<Map<string, number | null>> {
    const out = (await git(['cat-file', '--batch-check=%(objectname) %(objecttype) %(objectsize)'], { cwd: this.dir, input: Buffer.from(objects.map((o) => `${o}\n`).join('')) })).toString('utf8');
    const sizes = new Map<string, number | null>();
    for (const line of out.split('\n')) {
      const [object, type, size] = line.split(' ');
      if (!object) continue;
      sizes.set(object, type === 'blob' && size !== undefined ? Number(size) : null);
    }
    return sizes;
  }

  /**
   * Fetches the files of the directory `path` at `commit` (a tree of it), leaving out every blob
   * over `SKILL_FILE_BOUND`, into a repository of their own that this one reads as an alternate.
   * A server that takes no request for a tree (protocol v0) is asked for the branch's head
   * instead, with the same filter.
   */
  private async fetchContent(commit: string, path: string): Promise<void> {
    const tree = (await git(['rev-parse', '--verify', `${commit}:${path}`], { cwd: this.dir })).toString('utf8').trim();
    const into = join(this.root, `content-${++this.fetches}.git`);
    await this.init(into);
    const filter = `--filter=blob:limit=${SKILL_FILE_BOUND + 1}`;
    try {
      await this.fetchInto(into, this.remote, [filter, 'source', tree]);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      const ref = `refs/remotes/source/${this.branch}`;
      await this.fetchInto(into, this.remote, ['--depth', '1', filter, 'source', `+refs/heads/${this.branch}:${ref}`]);
      const fetched = (await git(['rev-parse', '--verify', `${ref}^{commit}`], { cwd: into })).toString('utf8').trim();
      if (fetched !== commit) throw new ApiError('validation.conflict', `the skill source's branch '${this.branch}' moved while it was read; try again`);
    }
    await appendFile(join(this.dir, 'objects', 'info', 'alternates'), `${join(into, 'objects')}\n`);
  }

  /**
   * Regular files under `dir/` at `commit` (none when the directory is absent). Refused (400)
   * from the listing, before any content is fetched, when it holds too many files; then from the
   * sizes of what was fetched, before a byte is read, when one is over the limit (the server left
   * it out) or all of them are.
   */
  async readDir(commit: string, path: string): Promise<SkillFile[]> {
    const tooMany = () => tooLarge(`${path}/: over ${SKILL_LIMITS.maxFiles} files; a skill holds at most that`);
    // A listing too long to hold is far past the count.
    const listing = (await git(['ls-tree', '-r', '-z', '--full-tree', commit, '--', `${path}/`], { cwd: this.dir }).catch((err: unknown) => {
      throw err instanceof GitError && err.overflow ? tooMany() : err;
    })).toString('utf8');
    const rows: { mode: string; object: string; name: string }[] = [];
    let blobs = 0;
    for (const row of listing.split('\0')) {
      if (!row) continue;
      const m = /^(\d{6}) (\w+) ([0-9a-f]+)\t(.*)$/s.exec(row);
      if (!m || m[2] !== 'blob') continue;
      // Countless files cost one listing, not their content. Symbolic links count: their
      // targets are blobs the content fetch would bring too.
      if (++blobs > SKILL_LIMITS.maxFiles + 1) throw tooMany();
      // Symbolic links (120000) and submodules are not skill content.
      if (m[1] !== '100644' && m[1] !== '100755') continue;
      rows.push({ mode: m[1], object: m[3] ?? '', name: (m[4] ?? '').slice(path.length + 1) });
    }
    if (rows.length === 0) return [];
    const objects = [...new Set(rows.map((r) => r.object))];
    let sizes = await this.sizes(objects);
    // Here already when the server ignored the blob filter (it sent the whole tree).
    if ([...sizes.values()].some((s) => s === null)) {
      await this.fetchContent(commit, path);
      sizes = await this.sizes(objects);
    }
    let total = 0;
    for (const r of rows) {
      // Left out by the server: over the bound (`checkSkillFiles` then applies the exact limits).
      const size = sizes.get(r.object) ?? null;
      if (size === null || size > SKILL_FILE_BOUND) {
        throw tooLarge(`${path}/${r.name}: ${size === null ? `over ${SKILL_FILE_BOUND}` : size} bytes; a skill file holds at most ${SKILL_LIMITS.maxFileBytes} bytes (1 MiB)`);
      }
      total += size;
      if (total > SKILL_LIMITS.maxTotalBytes + SKILL_LIMITS.maxInstructionsBytes) throw tooLarge(`${path}/: over ${SKILL_LIMITS.maxTotalBytes} bytes of files; a skill holds at most that`);
    }
    const content = await this.contents(objects);
    return rows.map((r) => ({ path: r.name, content: content.get(r.object) ?? Buffer.alloc(0), executable: r.mode === '100755' }));
  }

  /** The content of blobs that are here, in one `cat-file --batch`. */
  private async contents(objects: readonly string[]): Promise<Map<string, Buffer>> {
    const out = await git(['cat-file', '--batch'], { cwd: this.dir, input: Buffer.from(objects.map((o) => `${o}\n`).join('')) });
    const content = new Map<string, Buffer>();
    let at = 0;
    while (at < out.length) {
      const eol = out.indexOf(0x0a, at);
      if (eol < 0) break;
      const [object, , size] = out.subarray(at, eol).toString('utf8').split(' ');
      const n = Number(size);
      if (!object || !Number.isSafeInteger(n)) throw new Error(`reading a skill source: unexpected git output at byte ${at}`);
      content.set(object, out.subarray(eol + 1, eol + 1 + n));
      at = eol + 1 + n + 1;
    }
    return content;
  }

  /**
   * A commit of `files` at `dir/` on top of `base` (or a root commit), made with fixed author,
   * committer and dates, so the same inputs always make the same commit id (a retried
   * submission prepares exactly the commit it recorded).
   */
  async commit(base: string | null, dir: string, files: readonly SkillFile[], message: string, at: string): Promise<string> {
    const work = await mkdtemp(join(tmpdir(), SCRATCH_PREFIXES[1]));
    const env = {
      GIT_DIR: this.dir, GIT_WORK_TREE: work, GIT_INDEX_FILE: join(work, '.index'),
      GIT_AUTHOR_NAME: 'agentplane', GIT_AUTHOR_EMAIL: 'skills@agentplane.invalid', GIT_COMMITTER_NAME: 'agentplane', GIT_COMMITTER_EMAIL: 'skills@agentplane.invalid',
      GIT_AUTHOR_DATE: at, GIT_COMMITTER_DATE: at,
    };
    try {
      if (base) await git(['read-tree', base], { env });
      else await git(['read-tree', '--empty'], { env });
      await git(['rm', '-r', '--cached', '--quiet', '--ignore-unmatch', '--', `${dir}/`], { env });
      for (const f of files) {
        const p = join(work, dir, f.path);
        await mkdir(dirname(p), { recursive: true });
        await writeFile(p, f.content);
        const blob = (await git(['hash-object', '-w', '--', p], { env })).toString('utf8').trim();
        await git(['update-index', '--add', '--cacheinfo', `${f.executable ? '100755' : '100644'},${blob},${dir}/${f.path}`], { env });
      }
      // The base's files outside `dir/` are not here (the fetch was blob-less): the new tree names them as the base's does.
      const tree = (await git(['write-tree', '--missing-ok'], { env })).toString('utf8').trim();
      const args = ['commit-tree', tree, '-m', message, ...(base ? ['-p', base] : [])];
      return (await git(args, { env })).toString('utf8').trim();
    } finally {
      await rm(work, { recursive: true, force: true });
    }
  }

  /**
   * Pushes `commit` to `branch` only if the branch is where `expected` says (null: it must not
   * exist): the compare-and-swap that keeps a concurrent writer's branch intact.
   */
  async push(remote: GitRemote, commit: string, branch: string, expected: string | null): Promise<void> {
    await git(['push', '--quiet', `--force-with-lease=refs/heads/${branch}:${expected ?? ''}`, '--', remote.url, `${commit}:refs/heads/${branch}`], { cwd: this.dir, env: { ...remote.env } });
  }

  /** Makes sure this repository holds `commit` and its trees (a recovery after the default branch moved on). */
  async fetchCommit(remote: GitRemote, commit: string): Promise<void> {
    try {
      await git(['cat-file', '-e', `${commit}^{commit}`], { cwd: this.dir });
    } catch {
      await this.fetchInto(this.dir, remote, ['--depth', '1', '--filter=blob:none', 'source', commit]);
    }
  }

  async close(): Promise<void> {
    await rm(this.root, { recursive: true, force: true });
  }
}
