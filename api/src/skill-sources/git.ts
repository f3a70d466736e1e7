import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile, mkdir } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { ApiError } from '@agentplane/core';
import { SKILL_LIMITS, type SkillFile } from '@agentplane/domain';

const GIT_TIMEOUT_MS = 60_000;
const MAX_OUTPUT = 8 * 1024 * 1024;

export class GitError extends Error {
  constructor(message: string, readonly stderr: string) {
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
        reject(new GitError(`git ${args[0] ?? ''} failed: ${text.trim().split('\n').slice(-3).join(' ').slice(0, 500)}`, text));
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
  const out = (await git(['ls-remote', '--', remote.url, `refs/heads/${branch}`], { env: { ...remote.env } }).catch((err: unknown) => { throw unreadable(err); })).toString('utf8').trim();
  const sha = out.split(/\s+/)[0];
  return sha && /^[0-9a-f]{40}([0-9a-f]{24})?$/.test(sha) ? sha : null;
}

/** A scratch bare repository holding one fetched branch of the source; removed by `close`. */
export class Scratch {
  private constructor(readonly dir: string) {}

  static async fetch(remote: GitRemote, branch: string): Promise<{ scratch: Scratch; head: string | null }> {
    const dir = await mkdtemp(join(tmpdir(), 'agentplane-skill-source-'));
    const scratch = new Scratch(dir);
    try {
      await git(['init', '--quiet', '--bare', dir]);
      const head = await remoteHead(remote, branch);
      if (head) {
        await git(['fetch', '--quiet', '--no-tags', '--depth', '1', '--', remote.url, `+refs/heads/${branch}:refs/remotes/source/${branch}`], { cwd: dir, env: { ...remote.env } })
          .catch((err: unknown) => { throw unreadable(err); });
      }
      return { scratch, head };
    } catch (err) {
      await scratch.close();
      throw err;
    }
  }

  /** Regular files under `dir/` at `commit` (none when the directory is absent). */
  async readDir(commit: string, path: string): Promise<SkillFile[]> {
    const listing = (await git(['ls-tree', '-r', '-z', '-l', '--full-tree', commit, '--', `${path}/`], { cwd: this.dir })).toString('utf8');
    const rows: { mode: string; object: string; name: string }[] = [];
    let total = 0;
    for (const row of listing.split('\0')) {
      if (!row) continue;
      const m = /^(\d{6}) (\w+) ([0-9a-f]+) +(\d+|-)\t(.*)$/s.exec(row);
      if (!m || m[2] !== 'blob') continue;
      // Symbolic links (120000) and submodules are not skill content.
      if (m[1] !== '100644' && m[1] !== '100755') continue;
      // A source's content is refused by its listing before a byte is read: a hostile
      // repository's huge or countless files cost one listing, not their content
      // (`checkSkillFiles` then applies the exact limits).
      const size = Number(m[4]);
      const name = (m[5] ?? '').slice(path.length + 1);
      if (size > Math.max(SKILL_LIMITS.maxFileBytes, SKILL_LIMITS.maxInstructionsBytes)) throw tooLarge(`${path}/${name}: ${size} bytes; a skill file holds at most ${SKILL_LIMITS.maxFileBytes} bytes (1 MiB)`);
      total += size;
      if (total > SKILL_LIMITS.maxTotalBytes + SKILL_LIMITS.maxInstructionsBytes) throw tooLarge(`${path}/: over ${SKILL_LIMITS.maxTotalBytes} bytes of files; a skill holds at most that`);
      rows.push({ mode: m[1], object: m[3] ?? '', name });
      if (rows.length > SKILL_LIMITS.maxFiles + 1) throw tooLarge(`${path}/: over ${SKILL_LIMITS.maxFiles} files; a skill holds at most that`);
    }
    const files: SkillFile[] = [];
    for (const r of rows) {
      const content = await git(['cat-file', 'blob', r.object], { cwd: this.dir });
      files.push({ path: r.name, content, executable: r.mode === '100755' });
    }
    return files;
  }

  /**
   * A commit of `files` at `dir/` on top of `base` (or a root commit), made with fixed author,
   * committer and dates, so the same inputs always make the same commit id (a retried
   * submission prepares exactly the commit it recorded).
   */
  async commit(base: string | null, dir: string, files: readonly SkillFile[], message: string, at: string): Promise<string> {
    const work = await mkdtemp(join(tmpdir(), 'agentplane-skill-work-'));
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
      const tree = (await git(['write-tree'], { env })).toString('utf8').trim();
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

  /** Makes sure this repository holds `commit` (a recovery after the default branch moved on). */
  async fetchCommit(remote: GitRemote, commit: string): Promise<void> {
    try {
      await git(['cat-file', '-e', `${commit}^{commit}`], { cwd: this.dir });
    } catch {
      await git(['fetch', '--quiet', '--no-tags', '--', remote.url, commit], { cwd: this.dir, env: { ...remote.env } });
    }
  }

  async close(): Promise<void> {
    await rm(this.dir, { recursive: true, force: true });
  }
}
