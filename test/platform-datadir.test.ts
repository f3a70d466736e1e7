import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '@agentplane/store';
import { ROOT_DIR, startPlatform, waitFor, type Platform } from './harness/platform.js';
import { alive, Leftovers } from './harness/processes.js';

/**
 * One platform per data directory: a second `npm start` on a DATA_DIR a live platform uses is one
 * line and exit code 1, and leaves the running platform (its embedded redis-server above all)
 * alone. An entry left by a platform killed with `kill -9` does not stop the next start, nor do
 * its children still stopping (an api holds its port until its stop ends, at most its bound): the
 * next start waits for them, and kills one still there after its bound.
 */
const left = new Leftovers();
let first: Platform | undefined;
let second: Platform | undefined;
const dataDir = mkdtempSync(join(tmpdir(), 'agentplane-datadir-'));
afterAll(async () => {
  await first?.stop();
  await second?.stop();
  left.cleanUp();
  rmSync(dataDir, { recursive: true, force: true });
});

/** Running, not a zombie waiting for whoever adopted it to reap it. */
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !['Z', 'X'].includes(stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0] ?? '');
  } catch {
    return false;
  }
}

interface Ended { code: number | null; stdout: string; stderr: string }

function secondPlatform(port: number): Promise<Ended> {
  const proc = spawn(process.execPath, [join(ROOT_DIR, 'platform/dist/main.js')], {
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp', DATA_DIR: dataDir, PORT: String(port),
      START_RUNNER: 'false', START_SCHEDULER: 'false', LOG_LEVEL: 'info',
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  if (proc.pid) left.pids.push(proc.pid);
  let stdout = '';
  let stderr = '';
  proc.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  proc.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  // Bounded: one that does not refuse would run on (fighting the first over its redis-server).
  const timer = setTimeout(() => proc.kill('SIGKILL'), 30_000);
  return new Promise((done) => proc.once('close', (code) => {
    clearTimeout(timer);
    done({ code, stdout, stderr });
  }));
}

describe('npm start on a data directory in use', () => {
  it('a stale entry (kill -9) is removed; a second platform on the same DATA_DIR exits 1 with one line and the first runs on', async () => {
    // What a platform killed with SIGKILL leaves: an entry whose process is gone.
    mkdirSync(join(dataDir, 'platform.lock'), { recursive: true });
    writeFileSync(join(dataDir, 'platform.lock', '999999999-1.json'), '{}\n');
    first = await startPlatform({ dataDir });
    const before = first.pids();
    expect(before.redis).toBeDefined();

    const r = await secondPlatform(await freePort());
    expect(r.code).toBe(1);
    expect(r.stdout).toBe('');
    expect(r.stderr).toMatch(new RegExp(`^agentplane failed to start: another platform \\(pid ${first.proc.pid}\\) is running or starting on .*; stop it first, or set another DATA_DIR \\(if no such platform runs, remove .*\\)\\n$`));

    // The first platform's redis-server was not touched: same process, and the API still works on it.
    expect(alive(before.redis as number)).toBe(true);
    expect(first.pids()).toEqual(before);
    const s = await first.root.request('GET', '/v1/support/capabilities');
    expect(s.status).toBe(200);
    // The stale entry went; the first platform's own is the only one.
    expect(readdirSync(join(dataDir, 'platform.lock'))).toEqual([expect.stringMatching(new RegExp(`^${first.proc.pid}-\\d+\\.json$`))]);

    await first.stop();
    first = undefined;
    // Its entry goes with it.
    expect(readdirSync(join(dataDir, 'platform.lock'))).toEqual([]);
  }, 120_000);
});

describe('npm start again right after the platform was killed with kill -9', () => {
  it('waits for the earlier api, still stopping on the same port, instead of giving up on its own api', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'agentplane-datadir-'));
    left.dirs.push(dir);
    first = await startPlatform({ dataDir: dir });
    const p = first;
    const session = (await p.root.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'a', model: 'default' },
      environment_id: (await p.root.post<{ id: string }>('/v1/environments', { name: 'sb', image: 'agentplane/sandbox:latest' })).id,
    })).id;
    const { api } = p.pids() as { api: number };
    // An api whose stop hangs (stopped here, so it never gets to it) holds its listening port
    // until it is killed at its bound.
    left.pids.push(api);
    process.kill(api, 'SIGSTOP');
    p.proc.kill('SIGKILL');
    await new Promise<void>((r) => (p.proc.exitCode !== null || p.proc.signalCode !== null ? r() : p.proc.once('exit', () => r())));
    first = undefined;
    expect(running(api)).toBe(true);

    // Its bootstrap file is there and the earlier api may still answer: the start is only known
    // once the earlier api has ended and this platform's own api serves.
    second = await startPlatform({ dataDir: dir, port: p.port });
    const q = second;
    await waitFor('the earlier api to end', () => (running(api) ? undefined : true), 60_000);
    await waitFor('the new api', async () => {
      if (q.proc.exitCode !== null) return false;
      const pids = JSON.parse(readFileSync(join(dir, 'processes.json'), 'utf8')) as Record<string, number>;
      if (pids.platform !== q.proc.pid || !pids.api) return undefined;
      const r = await q.root.request('GET', `/v1/sessions/${session}`).catch(() => undefined);
      return r?.status === 200 ? true : undefined;
    }, 30_000);
    const log = readFileSync(q.logFile, 'utf8');
    expect(q.proc.exitCode, log.slice(-3000)).toBeNull();
    expect(q.pids().api).not.toBe(api);
    expect(log).toContain('processes of an earlier platform on this data directory are still stopping; waiting for them to end');
    expect(log).toContain('a process of an earlier platform did not stop in time; killing it (SIGKILL)');
  }, 120_000);
});
