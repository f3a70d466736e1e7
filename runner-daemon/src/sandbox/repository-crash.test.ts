import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { mkdir, mkdtemp, readdir, readFile, readlink, rm, writeFile } from 'node:fs/promises';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { removeStaleCheckouts } from './repository.js';

/**
 * A runner killed (kill -9) while it fetched a repository runs none of its cleanup: its temporary
 * checkout stays, and its git process, detached in its own session, goes on (on a stalled server,
 * for good). The next start removes both; a checkout whose process lives is kept.
 */
let scratch: string;
let server: Server;
const sockets: Socket[] = [];

beforeAll(async () => {
  scratch = await mkdtemp(join(tmpdir(), 'repo-crash-'));
  // Accepts and never answers: git waits in its TLS handshake.
  server = createServer((s) => sockets.push(s));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
});
afterAll(async () => {
  for (const s of sockets) s.destroy();
  await new Promise<void>((r) => server.close(() => r()));
  await rm(scratch, { recursive: true, force: true });
});

/** Processes (not zombies) whose working directory or an argument lies in `dir`. */
async function processesIn(dir: string): Promise<number[]> {
  const found: number[] = [];
  for (const name of await readdir('/proc').catch(() => [] as string[])) {
    if (!/^\d+$/.test(name)) continue;
    const stat = await readFile(`/proc/${name}/stat`, 'utf8').catch(() => '');
    if (!stat || / Z /.test(stat.slice(stat.lastIndexOf(')')))) continue;
    const cwd = await readlink(`/proc/${name}/cwd`).catch(() => '');
    const argv = await readFile(`/proc/${name}/cmdline`, 'utf8').catch(() => '');
    if (cwd.startsWith(dir) || argv.split('\0').some((a) => a.startsWith(dir))) found.push(Number(name));
  }
  return found;
}

describe('repository checkouts of a runner killed mid-fetch', () => {
  it('are removed, with their git processes, by the next start; a live process\'s checkout is kept', async () => {
    const temp = join(scratch, 'tmp');
    await mkdir(temp);
    const script = join(scratch, 'fetch.mjs');
    const module = fileURLToPath(new URL('./repository.ts', import.meta.url));
    const { port } = server.address() as { port: number };
    await writeFile(script, `import { fetchRepositorySnapshot } from ${JSON.stringify(module)};\n` +
      `await fetchRepositorySnapshot({ url: 'https://127.0.0.1:${port}/org/repo.git', tempDir: ${JSON.stringify(temp)}, timeoutMs: 600000 });\n`);
    const connected = new Promise<void>((r) => server.once('connection', () => r()));
    const runner = spawn(process.execPath, ['--import', 'tsx', script], { stdio: 'ignore' });
    const exited = new Promise<void>((r) => runner.once('exit', () => r()));
    await connected;
    const [checkout] = await readdir(temp);
    expect(checkout).toMatch(new RegExp(`^agentplane-repo-${runner.pid}-`));
    const dir = join(temp, checkout as string);
    await expect.poll(() => processesIn(dir), { timeout: 10_000 }).not.toEqual([]);

    runner.kill('SIGKILL');
    await exited;
    // Nothing of the runner cleaned up: the checkout and its git are still there.
    expect(existsSync(dir)).toBe(true);
    expect(await processesIn(dir)).not.toEqual([]);

    // A checkout of a process that lives (this one) is another runner's fetch under way.
    const live = join(temp, `agentplane-repo-${process.pid}-abcdef`);
    await mkdir(live);
    expect(await removeStaleCheckouts(temp)).toEqual([dir]);
    expect(existsSync(dir)).toBe(false);
    await expect.poll(() => processesIn(dir), { timeout: 10_000 }).toEqual([]);
    expect(existsSync(live)).toBe(true);
  }, 60_000);
});
