/**
 * Repository snapshots for Session `repository` resources. The sandbox has no network, so the
 * runner fetches the repository on its own host with the `git` CLI (shallow where it can), checks
 * it out in a throwaway directory and hands the tree, `.git` included, to `materializeResources`
 * as a tar that the sandbox user extracts.
 *
 * Git runs hardened: argv only (never a shell), https and ssh transports only, no hooks, no
 * submodules, no prompts (no askpass, no terminal: every git runs in its own session), one overall
 * deadline, and its whole process group is killed on timeout, abort or a size overrun. The
 * temporary directory is removed whatever happens; after a crash of the runner, by its next start
 * (`removeStaleCheckouts`).
 */
import { spawn } from 'node:child_process';
import { mkdtemp, readdir, readFile, readlink, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export type RepositoryFetchReason = 'invalid_url' | 'not_found' | 'auth_required' | 'timeout' | 'too_large' | 'failed';

export class RepositoryFetchError extends Error {
  override readonly name = 'RepositoryFetchError';

  constructor(
    readonly reason: RepositoryFetchReason,
    message: string,
  ) {
    super(message);
  }
}

export interface FetchRepositoryOptions {
  /** `https://…` or `git@host:path`; anything else is refused before git runs. */
  url: string;
  /** Branch, tag, full ref (`refs/…`) or full commit sha; null or absent for the default branch. */
  ref?: string | null;
  /** Deadline for the whole fetch, checkout and archive (default 120 s). */
  timeoutMs?: number;
  /** Largest tar accepted (default 256 MiB); checked while fetching, before checkout and while archiving. */
  maxBytes?: number;
  signal?: AbortSignal;
  /** Environment git runs with (default `process.env`); the hardening variables are applied on top. */
  env?: NodeJS.ProcessEnv;
  /** Parent of the temporary checkout directory (default `os.tmpdir()`). */
  tempDir?: string;
}

export interface RepositorySnapshot {
  /** The checked-out tree with its `.git`, rooted at `.`. */
  tar: Buffer;
  /** The commit checked out (full sha). */
  commit: string;
  bytes: number;
}

export const REPOSITORY_FETCH_DEFAULTS = { timeoutMs: 120_000, maxBytes: 256 * 1024 * 1024 } as const;

const STDERR_TAIL_BYTES = 8 * 1024;
const PACK_POLL_MS = 200;

/** Git configuration for every invocation; later `-c` values win over any user or system config. */
const HARDENING = [
  'protocol.allow=never',
  'protocol.https.allow=always',
  'protocol.ssh.allow=always',
  'protocol.file.allow=never',
  'protocol.ext.allow=never',
  'core.hooksPath=/dev/null',
  'core.askPass=',
  'core.fsmonitor=false',
  'advice.detachedHead=false',
  'submodule.recurse=false',
  'fetch.recurseSubmodules=false',
  'init.defaultBranch=main',
  'gc.auto=0',
  'maintenance.auto=false',
  // Keep fetched objects in one pack (never exploded into loose objects): the size watch reads it.
  'fetch.unpackLimit=1',
  'transfer.unpackLimit=1',
].flatMap((kv) => ['-c', kv]);

/** Variables that would point git at another repository or make it ask for credentials. */
const DROPPED_ENV = [
  'GIT_ASKPASS',
  'SSH_ASKPASS',
  'SSH_ASKPASS_REQUIRE',
  'GIT_DIR',
  'GIT_WORK_TREE',
  'GIT_INDEX_FILE',
  'GIT_OBJECT_DIRECTORY',
  'GIT_ALTERNATE_OBJECT_DIRECTORIES',
  'GIT_COMMON_DIR',
  'GIT_NAMESPACE',
  'GIT_CONFIG_PARAMETERS',
];

const URL_PATTERN = /^(https:\/\/|git@)/;

/** Removes `user:password@` from every URL in `text`. */
export function redactCredentials(text: string): string {
  return text.replace(/\b([a-z][a-z0-9+.-]*:\/\/)[^\s/?#]*@/gi, '$1');
}

/** Whether `url` is a repository address the runner fetches: `https://host/…` or `git@host:path`. */
export function isRepositoryUrl(url: string): boolean {
  if (!URL_PATTERN.test(url) || /[\s\0-\x1f\x7f]/.test(url)) return false;
  if (url.startsWith('git@')) return /^git@[A-Za-z0-9][A-Za-z0-9.-]*:[^-]/.test(url);
  try {
    const parsed = new URL(url);
    return parsed.protocol === 'https:' && parsed.hostname !== '';
  } catch {
    return false;
  }
}

/** A ref name git could hold (git-check-ref-format rules, one level allowed), not an option. */
function isRefName(ref: string): boolean {
  if (ref.length > 1024 || ref.startsWith('-') || ref.startsWith('/') || ref.endsWith('/')) return false;
  if (ref.endsWith('.') || ref.endsWith('.lock') || ref.includes('..') || ref.includes('@{') || ref.includes('//')) return false;
  if (ref === '@' || /[\0-\x20\x7f~^:?*[\\]/.test(ref)) return false;
  return ref.split('/').every((part) => part !== '' && !part.startsWith('.'));
}

const FULL_SHA = /^(?:[0-9a-f]{40}|[0-9a-f]{64})$/i;

const AUTH_PATTERNS = [
  /could not read (username|password)/i,
  /authentication failed/i,
  /terminal prompts disabled/i,
  /permission denied \(publickey/i,
  /returned error: 40[13]\b/i,
  /invalid username or password/i,
  /access denied/i,
];
const REPOSITORY_MISSING_PATTERNS = [
  /repository '.*' not found/i,
  /repository not found/i,
  /project not found/i,
  /does not appear to be a git repository/i,
  /returned error: 404\b/i,
  /no such repository/i,
];
const REF_MISSING_PATTERNS = [/not found in upstream/i, /couldn't find remote ref/i, /not our ref/i, /unadvertised object/i];

function classify(stderr: string): RepositoryFetchReason {
  if (AUTH_PATTERNS.some((p) => p.test(stderr))) return 'auth_required';
  if (REPOSITORY_MISSING_PATTERNS.some((p) => p.test(stderr))) return 'not_found';
  if (REF_MISSING_PATTERNS.some((p) => p.test(stderr))) return 'not_found';
  return 'failed';
}

/** Advice git prints after an ssh failure; the line before it says what went wrong. */
const SSH_ADVICE = [/^please make sure you have the correct access rights$/i, /^and the repository exists\.$/i];
const GENERIC_REMOTE_FAILURE = /^fatal: could not read from remote repository\.$/i;

/** Git's last stderr line (with the ssh client's reason in front of git's generic one), without credentials. */
function lastLine(stderr: string): string {
  const lines = redactCredentials(stderr)
    .split(/[\r\n]+/)
    .map((l) => l.trim())
    .filter((l) => l !== '' && !SSH_ADVICE.some((p) => p.test(l)));
  const last = lines.at(-1) ?? '';
  const before = lines.at(-2);
  return GENERIC_REMOTE_FAILURE.test(last) && before !== undefined ? `${before}; ${last}` : last;
}

interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

interface RunOptions {
  cwd?: string;
  env: NodeJS.ProcessEnv;
  signal: AbortSignal;
  /** Receives stdout; when given, stdout is not collected. */
  onStdout?: (chunk: Buffer) => void;
  /** Collected stdout is capped (it is only ever a sha or a short listing). */
  stdoutLimit?: number;
}

/**
 * Runs `cmd` as the leader of a new session and process group (so it has no controlling terminal
 * to prompt on); the abort signal kills the whole group. Resolves when the leader exits.
 */
/** Temporary checkouts are `<temp dir>/agentplane-repo-<pid of the fetching process>-<random>`. */
const CHECKOUT_PREFIX = 'agentplane-repo-';
const CHECKOUT_NAME = /^agentplane-repo-(\d+)-[A-Za-z0-9]{6}$/;

/**
 * Removes the temporary checkouts of runner processes that died mid-fetch (a kill -9 runs none of
 * their cleanup), with the git processes still working in them: git runs detached, in its own
 * session, and outlives the runner (on a stalled server, for good). A checkout whose process still
 * lives is kept. Returns the removed directories.
 */
export async function removeStaleCheckouts(tempDir: string = tmpdir()): Promise<string[]> {
  const names = await readdir(tempDir).catch(() => [] as string[]);
  const stale = names.filter((name) => {
    const pid = CHECKOUT_NAME.exec(name)?.[1];
    return pid !== undefined && !processAlive(Number(pid));
  }).map((name) => join(tempDir, name));
  if (stale.length === 0) return [];
  await killProcessesIn(stale);
  const removed: string[] = [];
  for (const dir of stale) {
    await rm(dir, { recursive: true, force: true, maxRetries: 5, retryDelay: 50 }).then(() => removed.push(dir), () => undefined);
  }
  return removed;
}

function processAlive(pid: number): boolean {
  if (pid === process.pid) return true;
  try {
    process.kill(pid, 0);
    return true;
  } catch (err) {
    // Another user's process: alive.
    return (err as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/** Kills, with their process groups, the processes whose working directory or an argument lies in one of `dirs`. */
async function killProcessesIn(dirs: readonly string[]): Promise<void> {
  const inside = (path: string): boolean => dirs.some((d) => path === d || path.startsWith(`${d}/`));
  for (const name of await readdir('/proc').catch(() => [] as string[])) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    const cwd = await readlink(`/proc/${name}/cwd`).catch(() => '');
    const argv = await readFile(`/proc/${name}/cmdline`, 'utf8').catch(() => '');
    if (!inside(cwd) && !argv.split('\0').some(inside)) continue;
    for (const target of [-Number(name), Number(name)]) {
      try {
        process.kill(target, 'SIGKILL');
      } catch {
        // Not a group leader, or gone already.
      }
    }
  }
}

function runProcess(cmd: string, args: readonly string[], options: RunOptions): Promise<Exit> {
  return new Promise((resolve, reject) => {
    if (options.signal.aborted) {
      resolve({ code: null, signal: 'SIGKILL', stdout: '', stderr: '' });
      return;
    }
    const child = spawn(cmd, args, { cwd: options.cwd, env: options.env, detached: true, stdio: ['ignore', 'pipe', 'pipe'] });
    const limit = options.stdoutLimit ?? 64 * 1024;
    const out: Buffer[] = [];
    let outBytes = 0;
    let errTail = Buffer.alloc(0);
    const kill = (): void => {
      if (child.pid === undefined) return;
      try {
        process.kill(-child.pid, 'SIGKILL');
      } catch {
        // The group is already gone.
      }
    };
    options.signal.addEventListener('abort', kill, { once: true });
    child.stdout.on('data', (chunk: Buffer) => {
      if (options.onStdout) {
        options.onStdout(chunk);
        return;
      }
      if (outBytes < limit) out.push(chunk.subarray(0, limit - outBytes));
      outBytes += chunk.length;
    });
    child.stderr.on('data', (chunk: Buffer) => {
      errTail = Buffer.concat([errTail, chunk]);
      if (errTail.length > STDERR_TAIL_BYTES) errTail = errTail.subarray(errTail.length - STDERR_TAIL_BYTES);
    });
    child.once('error', (err: NodeJS.ErrnoException) => {
      options.signal.removeEventListener('abort', kill);
      kill();
      const detail = err.code === 'ENOENT' ? `${cmd} is not installed on this runner` : `${cmd} could not start: ${err.message}`;
      reject(new RepositoryFetchError('failed', detail));
    });
    child.once('close', (code, signal) => {
      options.signal.removeEventListener('abort', kill);
      // Anything the leader left behind in its group goes with it.
      kill();
      resolve({ code, signal, stdout: Buffer.concat(out).toString('utf8'), stderr: errTail.toString('utf8') });
    });
  });
}

async function directorySize(dir: string): Promise<number> {
  let total = 0;
  let entries;
  try {
    entries = await readdir(dir, { withFileTypes: true });
  } catch {
    return 0;
  }
  for (const entry of entries) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) total += await directorySize(path);
    else if (entry.isFile()) total += await stat(path).then((s) => s.size, () => 0);
  }
  return total;
}

function hardenedEnv(base: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...base };
  for (const name of DROPPED_ENV) delete env[name];
  env.GIT_TERMINAL_PROMPT = '0';
  env.GCM_INTERACTIVE = 'never';
  // Stable (English) messages: failures are classified from git's stderr.
  env.LC_ALL = 'C';
  env.LANGUAGE = 'C';
  if (env.GIT_SSH_COMMAND === undefined && env.GIT_SSH === undefined) env.GIT_SSH_COMMAND = 'ssh -o BatchMode=yes';
  return env;
}

/**
 * Fetches `url` at `ref` on this host and returns a tar of the checked-out tree (with `.git`).
 * Throws `RepositoryFetchError` (`reason` says why); an abort through `signal` rejects with the
 * signal's reason.
 */
export async function fetchRepositorySnapshot(opts: FetchRepositoryOptions): Promise<RepositorySnapshot> {
  const { url } = opts;
  const shownUrl = redactCredentials(url);
  if (!isRepositoryUrl(url)) {
    throw new RepositoryFetchError('invalid_url', `repository url ${JSON.stringify(shownUrl)} is not an https:// or git@ address`);
  }
  const ref = opts.ref === undefined || opts.ref === null || opts.ref === '' || opts.ref === 'HEAD' ? null : opts.ref;
  if (ref !== null && !isRefName(ref)) {
    throw new RepositoryFetchError('not_found', `ref ${JSON.stringify(ref)} is not a valid git ref name`);
  }
  const timeoutMs = opts.timeoutMs ?? REPOSITORY_FETCH_DEFAULTS.timeoutMs;
  const maxBytes = opts.maxBytes ?? REPOSITORY_FETCH_DEFAULTS.maxBytes;
  opts.signal?.throwIfAborted();

  const what = ref === null ? shownUrl : `${shownUrl} at ${ref}`;
  const stop = new AbortController();
  const onAbort = (): void => stop.abort(opts.signal?.reason);
  opts.signal?.addEventListener('abort', onAbort, { once: true });
  const timer = setTimeout(() => stop.abort(new RepositoryFetchError('timeout', `fetching ${what} took longer than ${timeoutMs} ms`)), timeoutMs);
  const tooLarge = (): RepositoryFetchError => new RepositoryFetchError('too_large', `${what} is larger than ${maxBytes} bytes`);
  const env = hardenedEnv(opts.env ?? process.env);

  // Named after this process: a checkout whose process died mid-fetch is found and removed (`removeStaleCheckouts`).
  const root = await mkdtemp(join(opts.tempDir ?? tmpdir(), `${CHECKOUT_PREFIX}${process.pid}-`)).catch((err: unknown) => {
    clearTimeout(timer);
    opts.signal?.removeEventListener('abort', onAbort);
    throw new RepositoryFetchError('failed', `no temporary directory for ${what}: ${err instanceof Error ? err.message : String(err)}`);
  });
  const work = join(root, 'tree');
  let packWatch: NodeJS.Timeout | undefined;

  /** Throws why the fetch was stopped, if it was. */
  const checkStopped = (): void => {
    if (stop.signal.aborted) throw stop.signal.reason;
  };
  const git = async (args: string[], cwd?: string, extra: Partial<RunOptions> = {}): Promise<Exit> => {
    const exit = await runProcess('git', [...HARDENING, ...args], { cwd, env, signal: stop.signal, ...extra });
    checkStopped();
    return exit;
  };
  const failure = (action: string, exit: Exit, reason = classify(exit.stderr)): RepositoryFetchError => {
    const line = lastLine(exit.stderr) || `git exited with ${exit.code ?? exit.signal ?? 'unknown status'}`;
    return new RepositoryFetchError(reason, `${action} ${what} failed: ${line}`);
  };
  const must = async (action: string, args: string[], cwd?: string): Promise<Exit> => {
    const exit = await git(args, cwd);
    if (exit.code !== 0) throw failure(action, exit);
    return exit;
  };

  try {
    // The pack grows while objects arrive: stop as soon as it alone exceeds the limit.
    let measuring = false;
    packWatch = setInterval(() => {
      if (measuring) return;
      measuring = true;
      void directorySize(join(work, '.git', 'objects', 'pack')).then((size) => {
        measuring = false;
        if (size > maxBytes && !stop.signal.aborted) stop.abort(tooLarge());
      });
    }, PACK_POLL_MS);

    if (ref !== null && (FULL_SHA.test(ref) || ref.startsWith('refs/'))) {
      await must('initialising a repository for', ['init', '-q', work]);
      await must('configuring', ['remote', 'add', 'origin', url], work);
      const target = FULL_SHA.test(ref) ? ref.toLowerCase() : ref;
      const shallow = await git(['fetch', '-q', '--depth', '1', '--no-tags', 'origin', target], work);
      if (shallow.code !== 0) {
        const reason = classify(shallow.stderr);
        const repositoryMissing = REPOSITORY_MISSING_PATTERNS.some((p) => p.test(shallow.stderr));
        if (!FULL_SHA.test(ref) || reason === 'auth_required' || repositoryMissing) throw failure('fetching', shallow, reason);
        // The server refused a shallow fetch by sha (protocol v0 without allow*SHA1InWant):
        // fetch every branch and tag and look for the commit there.
        await must('fetching', ['fetch', '-q', '--no-tags', 'origin', '+refs/heads/*:refs/remotes/origin/*', '+refs/tags/*:refs/tags/*'], work);
        const found = await git(['cat-file', '-e', `${target}^{commit}`], work);
        if (found.code !== 0) throw new RepositoryFetchError('not_found', `fetching ${what} failed: commit ${target} is not reachable from any branch or tag`);
      }
      // Detached at the commit (an annotated tag fetched by its full ref is peeled).
      await must('checking out', ['update-ref', '--no-deref', 'HEAD', FULL_SHA.test(ref) ? target : 'FETCH_HEAD^{commit}'], work);
    } else {
      const branch = ref === null ? [] : ['--branch', ref];
      await must('cloning', ['clone', '-q', '--depth', '1', '--single-branch', '--no-tags', '--no-checkout', '--no-recurse-submodules', ...branch, '--', url, work]);
    }

    const head = await git(['rev-parse', '--verify', '-q', 'HEAD^{commit}'], work);
    const commit = head.stdout.trim();
    if (head.code !== 0 || !FULL_SHA.test(commit)) throw new RepositoryFetchError('not_found', `${what} has no commits`);

    // Refuse before writing the tree: its blobs plus the repository already exceed the limit.
    let treeBytes = 0;
    let pending = '';
    const sizes = (chunk: Buffer): void => {
      const lines = (pending + chunk.toString('utf8')).split('\0');
      pending = lines.pop() ?? '';
      for (const line of lines) {
        const size = Number(/^\S+ blob \S+ +(\d+)\t/.exec(line)?.[1] ?? 0);
        treeBytes += size;
      }
    };
    const listing = await git(['ls-tree', '-r', '-l', '-z', commit], work, { onStdout: sizes });
    if (listing.code !== 0) throw failure('listing', listing);
    if (treeBytes + (await directorySize(join(work, '.git'))) > maxBytes) throw tooLarge();

    await must('checking out', ['reset', '-q', '--hard', commit], work);
    if (shownUrl !== url) await must('configuring', ['remote', 'set-url', 'origin', shownUrl], work);
    clearInterval(packWatch);

    const chunks: Buffer[] = [];
    let bytes = 0;
    const archive = await runProcess('tar', ['-c', '-f', '-', '-C', work, '.'], {
      env,
      signal: stop.signal,
      onStdout: (chunk) => {
        bytes += chunk.length;
        if (bytes > maxBytes) {
          if (!stop.signal.aborted) stop.abort(tooLarge());
          return;
        }
        chunks.push(chunk);
      },
    });
    checkStopped();
    if (archive.code !== 0) throw new RepositoryFetchError('failed', `archiving ${what} failed: ${lastLine(archive.stderr) || `tar exited with ${archive.code ?? archive.signal}`}`);
    const tar = Buffer.concat(chunks, bytes);
    return { tar, commit, bytes };
  } finally {
    clearTimeout(timer);
    if (packWatch) clearInterval(packWatch);
    opts.signal?.removeEventListener('abort', onAbort);
    await rm(root, { recursive: true, force: true, maxRetries: 5, retryDelay: 50 });
  }
}
