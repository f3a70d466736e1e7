import { execFile, spawn } from 'node:child_process';
import * as childProcess from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync } from 'node:fs';
import { mkdtemp, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { startGitServer, type GitServer } from '../../../test/harness/git-server.js';
import { fetchRepositorySnapshot, redactCredentials, RepositoryFetchError, type FetchRepositoryOptions } from './repository.js';

vi.mock('node:child_process', async (importOriginal) => {
  const actual = await importOriginal<typeof import('node:child_process')>();
  return { ...actual, spawn: vi.fn(actual.spawn) };
});

const run = promisify(execFile);

let server: GitServer;
let scratch: string;

/** Git trusting the test server's certificate, with no user or system configuration. */
function clientEnv(s: GitServer = server): NodeJS.ProcessEnv {
  return { ...process.env, GIT_SSL_CAINFO: s.caFile, GIT_CONFIG_GLOBAL: '/dev/null', GIT_CONFIG_NOSYSTEM: '1' };
}

function fetchFrom(opts: FetchRepositoryOptions): ReturnType<typeof fetchRepositorySnapshot> {
  return fetchRepositorySnapshot({ env: clientEnv(), timeoutMs: 30_000, ...opts });
}

async function rejection(promise: Promise<unknown>): Promise<RepositoryFetchError> {
  const err = await promise.then(
    () => {
      throw new Error('expected the fetch to fail');
    },
    (e: unknown) => e,
  );
  expect(err).toBeInstanceOf(RepositoryFetchError);
  return err as RepositoryFetchError;
}

/** Extracts a snapshot with the system tar, as the sandbox does. */
async function extract(tar: Buffer): Promise<string> {
  const dir = await mkdtemp(join(scratch, 'x-'));
  await new Promise<void>((resolve, reject) => {
    const child = spawn('tar', ['-x', '-f', '-', '-C', dir], { stdio: ['pipe', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => (code === 0 ? resolve() : reject(new Error(`tar -x failed: ${err}`))));
    child.stdin.end(tar);
  });
  return dir;
}

async function gitIn(dir: string, ...args: string[]): Promise<string> {
  const { stdout } = await run('git', ['-C', dir, ...args], { env: clientEnv() });
  return stdout.trim();
}

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), 'repository-test-'));
  server = await startGitServer();
});

afterAll(async () => {
  await server?.close();
  if (scratch) await rm(scratch, { recursive: true, force: true });
});

describe('fetchRepositorySnapshot', () => {
  it('clones the default branch into a tar with its .git', async () => {
    await server.createRepo('default-branch', { 'README.md': 'first\n' }, { branch: 'trunk' });
    const second = await server.commit('default-branch', { 'README.md': 'second\n', 'src/app.ts': 'export {};\n' });
    const snap = await fetchFrom({ url: server.url('default-branch') });
    expect(snap.commit).toBe(second.commit);
    expect(snap.bytes).toBe(snap.tar.length);
    const dir = await extract(snap.tar);
    expect(await readFile(join(dir, 'README.md'), 'utf8')).toBe('second\n');
    expect(await readFile(join(dir, 'src/app.ts'), 'utf8')).toBe('export {};\n');
    expect(await gitIn(dir, 'rev-parse', 'HEAD')).toBe(second.commit);
    expect(await gitIn(dir, 'symbolic-ref', '--short', 'HEAD')).toBe('trunk');
    expect(await gitIn(dir, 'status', '--porcelain')).toBe('');
    expect(existsSync(join(dir, '.git', 'shallow'))).toBe(true);
  });

  it('clones a branch', async () => {
    await server.createRepo('branches', { 'README.md': 'main\n' });
    const feature = await server.commit('branches', { 'feature.txt': 'only on the branch\n' }, { branch: 'feature/x' });
    await server.commit('branches', { 'README.md': 'main moved on\n' });
    const snap = await fetchFrom({ url: server.url('branches'), ref: 'feature/x' });
    expect(snap.commit).toBe(feature.commit);
    const dir = await extract(snap.tar);
    expect(await readFile(join(dir, 'feature.txt'), 'utf8')).toBe('only on the branch\n');
    expect(await readFile(join(dir, 'README.md'), 'utf8')).toBe('main\n');
    expect(await gitIn(dir, 'symbolic-ref', '--short', 'HEAD')).toBe('feature/x');

    const byFullRef = await fetchFrom({ url: server.url('branches'), ref: 'refs/heads/feature/x' });
    expect(byFullRef.commit).toBe(feature.commit);
    expect(await readFile(join(await extract(byFullRef.tar), 'feature.txt'), 'utf8')).toBe('only on the branch\n');
  });

  it('clones a tag', async () => {
    const tagged = await server.createRepo('tags', { 'VERSION': '1.0.0\n' }, { tags: ['v1.0.0'] });
    await server.commit('tags', { 'VERSION': '2.0.0\n' });
    const snap = await fetchFrom({ url: server.url('tags'), ref: 'v1.0.0' });
    expect(snap.commit).toBe(tagged.commit);
    const dir = await extract(snap.tar);
    expect(await readFile(join(dir, 'VERSION'), 'utf8')).toBe('1.0.0\n');
  });

  it('fetches an older commit by sha, shallowly', async () => {
    await server.createRepo('history', { 'a.txt': 'one\n' });
    const older = await server.commit('history', { 'a.txt': 'two\n', 'b.txt': 'added in two\n' });
    await server.commit('history', { 'a.txt': 'three\n' });
    const snap = await fetchFrom({ url: server.url('history'), ref: older.commit });
    expect(snap.commit).toBe(older.commit);
    const dir = await extract(snap.tar);
    expect(await readFile(join(dir, 'a.txt'), 'utf8')).toBe('two\n');
    expect(await readFile(join(dir, 'b.txt'), 'utf8')).toBe('added in two\n');
    expect(await gitIn(dir, 'rev-parse', 'HEAD')).toBe(older.commit);
    expect(existsSync(join(dir, '.git', 'shallow'))).toBe(true);
  });

  it('falls back to a full fetch when the server refuses a sha it does not advertise', async () => {
    const v0 = await startGitServer({ protocolV2: false });
    try {
      await v0.createRepo('history', { 'a.txt': 'one\n' });
      const older = await v0.commit('history', { 'a.txt': 'two\n' });
      await v0.commit('history', { 'a.txt': 'three\n' });
      const snap = await fetchRepositorySnapshot({ url: v0.url('history'), ref: older.commit, env: clientEnv(v0), timeoutMs: 30_000 });
      expect(snap.commit).toBe(older.commit);
      const dir = await extract(snap.tar);
      expect(await readFile(join(dir, 'a.txt'), 'utf8')).toBe('two\n');
      expect(existsSync(join(dir, '.git', 'shallow'))).toBe(false);

      const missing = await rejection(fetchRepositorySnapshot({ url: v0.url('history'), ref: 'f'.repeat(40), env: clientEnv(v0) }));
      expect(missing.reason).toBe('not_found');
    } finally {
      await v0.close();
    }
  });

  it('reports an unknown ref or commit as not_found', async () => {
    await server.createRepo('refs', { 'a.txt': 'a\n' });
    const branch = await rejection(fetchFrom({ url: server.url('refs'), ref: 'no-such-branch' }));
    expect(branch.reason).toBe('not_found');
    expect(branch.message).toContain('no-such-branch');
    expect(branch.message).toMatch(/not found in upstream/);

    const sha = await rejection(fetchFrom({ url: server.url('refs'), ref: '0123456789abcdef0123456789abcdef01234567' }));
    expect(sha.reason).toBe('not_found');

    const full = await rejection(fetchFrom({ url: server.url('refs'), ref: 'refs/heads/no-such-branch' }));
    expect(full.reason).toBe('not_found');

    const malformed = await rejection(fetchFrom({ url: server.url('refs'), ref: '--upload-pack=touch' }));
    expect(malformed.reason).toBe('not_found');
  });

  it('reports an unknown repository as not_found', async () => {
    const err = await rejection(fetchFrom({ url: server.url('does-not-exist') }));
    expect(err.reason).toBe('not_found');
    expect(err.message).toMatch(/not found/);
  });

  it('refuses urls that are not https:// or git@ without running anything', async () => {
    const spawned = vi.mocked(childProcess.spawn);
    const marker = join(scratch, 'ext-was-run');
    const before = spawned.mock.calls.length;
    const served = server.requests.length;
    for (const url of [
      server.url('refs').replace('https://', 'http://'),
      `file://${scratch}`,
      scratch,
      `ext::touch ${marker}`,
      '--upload-pack=touch',
      'git@-oProxyCommand=touch:repo.git',
      'https://',
      `${server.url('refs')} extra`,
    ]) {
      const err = await rejection(fetchFrom({ url }));
      expect(err.reason, url).toBe('invalid_url');
    }
    expect(spawned.mock.calls.length).toBe(before);
    expect(server.requests.length).toBe(served);
    expect(existsSync(marker)).toBe(false);
  });

  it('reports a repository behind authentication as auth_required without prompting', async () => {
    const auth = { username: 'reader', password: 's3cret-token' };
    const made = await server.createRepo('private', { 'secret.txt': 'classified\n' }, { auth });
    const started = Date.now();
    // An askpass program in the caller's environment must not be asked either.
    const asked = join(scratch, 'askpass-was-run');
    const askpass = join(scratch, 'askpass.sh');
    await writeFile(askpass, `#!/bin/sh\necho asked >> '${asked}'\necho ${auth.password}\n`, { mode: 0o755 });
    const env = { ...clientEnv(), GIT_ASKPASS: askpass, SSH_ASKPASS: askpass };
    const anonymous = await rejection(fetchRepositorySnapshot({ url: server.url('private'), env, timeoutMs: 30_000 }));
    expect(anonymous.reason).toBe('auth_required');
    expect(anonymous.message).toMatch(/could not read Username/);
    expect(Date.now() - started).toBeLessThan(10_000);
    expect(existsSync(asked)).toBe(false);

    const wrong = await rejection(fetchFrom({ url: server.url('private', { ...auth, password: 'wrong-password' }) }));
    expect(wrong.reason).toBe('auth_required');
    expect(wrong.message).not.toContain('wrong-password');

    const snap = await fetchFrom({ url: server.url('private', auth) });
    expect(snap.commit).toBe(made.commit);
    expect(snap.tar.includes(Buffer.from(auth.password))).toBe(false);
    const dir = await extract(snap.tar);
    expect(await readFile(join(dir, 'secret.txt'), 'utf8')).toBe('classified\n');
    expect(await gitIn(dir, 'remote', 'get-url', 'origin')).toBe(server.url('private'));
  });

  it('refuses a repository larger than maxBytes', async () => {
    await server.createRepo('large', { 'blob.bin': randomBytes(512 * 1024) });
    const err = await rejection(fetchFrom({ url: server.url('large'), maxBytes: 128 * 1024 }));
    expect(err.reason).toBe('too_large');
    const fits = await fetchFrom({ url: server.url('large'), maxBytes: 4 * 1024 * 1024 });
    expect(fits.bytes).toBeGreaterThan(512 * 1024);
    expect(fits.bytes).toBeLessThanOrEqual(4 * 1024 * 1024);
  });

  it('counts the archive itself against maxBytes, not only the file contents', async () => {
    // 400 one-byte files: tiny blobs, but every tar member takes at least 1 KiB.
    const files = Object.fromEntries(Array.from({ length: 400 }, (_, i) => [`f/${i}.txt`, String(i % 10)]));
    await server.createRepo('many-files', files);
    const err = await rejection(fetchFrom({ url: server.url('many-files'), maxBytes: 200 * 1024 }));
    expect(err.reason).toBe('too_large');
    const fits = await fetchFrom({ url: server.url('many-files') });
    expect(fits.bytes).toBeGreaterThan(400 * 1024);
  });

  it('gives up at the deadline', async () => {
    await server.createRepo('slow', { 'a.txt': 'a\n' }, { stall: true });
    const started = Date.now();
    const err = await rejection(fetchFrom({ url: server.url('slow'), timeoutMs: 1_000 }));
    expect(err.reason).toBe('timeout');
    expect(Date.now() - started).toBeLessThan(5_000);
  });

  it('stops promptly on abort, kills git and removes its directory', async () => {
    await server.createRepo('stalled', { 'a.txt': 'a\n' }, { stall: true });
    const parent = await mkdtemp(join(scratch, 'tmp-'));
    const controller = new AbortController();
    const seen = server.requests.length;
    const pending = fetchFrom({ url: server.url('stalled'), tempDir: parent, signal: controller.signal });
    const settled = pending.then(
      () => 'resolved',
      (e: unknown) => e,
    );
    for (let i = 0; i < 200 && !server.requests.slice(seen).some((r) => r.path.startsWith('/stalled.git/')); i++) {
      await new Promise((r) => setTimeout(r, 25));
    }
    expect(server.requests.slice(seen).some((r) => r.path.startsWith('/stalled.git/'))).toBe(true);
    expect(await readdir(parent)).toHaveLength(1);

    const reason = new Error('lease lost');
    const aborted = Date.now();
    controller.abort(reason);
    expect(await settled).toBe(reason);
    expect(Date.now() - aborted).toBeLessThan(2_000);
    expect(await readdir(parent)).toEqual([]);
    const { stdout } = await run('ps', ['-eo', 'args']);
    expect(stdout).not.toContain(server.url('stalled'));
  });

  it('strips credentials from urls it echoes', () => {
    expect(redactCredentials("fatal: unable to access 'https://user:pa55@example.com/x.git/'")).toBe("fatal: unable to access 'https://example.com/x.git/'");
    expect(redactCredentials('git@example.com:org/repo.git')).toBe('git@example.com:org/repo.git');
  });
});
