import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '@agentplane/store';
import { ROOT_DIR, waitFor } from './harness/platform.js';
import { alive, Leftovers } from './harness/processes.js';

/**
 * `npm start` at a terminal, then Ctrl-C: the terminal signals the whole foreground process
 * group. The platform is started as a group leader (detached) so that `kill(-pid)` reaches it
 * and every process in its group, exactly as a terminal's SIGINT does.
 */

interface Started {
  proc: ChildProcess;
  dataDir: string;
  stdout: () => string[];
  stderr: () => string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>;
  pids: () => Record<string, number | undefined>;
}

const left = new Leftovers();
afterAll(() => left.cleanUp());

async function start(env: Record<string, string>): Promise<Started> {
  const dataDir = mkdtempSync(join(tmpdir(), 'agentplane-signals-'));
  left.dirs.push(dataDir);
  const port = await freePort();
  const proc = spawn(process.execPath, [join(ROOT_DIR, 'platform/dist/main.js')], {
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp', DATA_DIR: dataDir, PORT: String(port), LOG_LEVEL: 'info',
      // A sandbox scope of its own (a sub-scope of the run's, removed at its end): sandboxes other
      // test files keep at this moment are not "an earlier platform's" for this first boot.
      AGENTPLANE_SANDBOX_SCOPE: `${process.env.AGENTPLANE_SANDBOX_SCOPE ?? 'test'}-signals-${port}`,
      ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  let out = '';
  let err = '';
  proc.stdout?.on('data', (d: Buffer) => (out += d.toString('utf8')));
  proc.stderr?.on('data', (d: Buffer) => (err += d.toString('utf8')));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>((r) =>
    proc.once('exit', (code, signal) => r({ code, signal, at: Date.now() })));
  const pids = () => JSON.parse(readFileSync(join(dataDir, 'processes.json'), 'utf8')) as Record<string, number | undefined>;
  await waitFor('the platform to serve', async () => {
    if (proc.exitCode !== null) throw new Error(`platform exited with ${proc.exitCode}: ${out.slice(-2000)} ${err.slice(-2000)}`);
    if (!existsSync(join(dataDir, 'bootstrap.json')) || !existsSync(join(dataDir, 'processes.json'))) return undefined;
    try {
      return (await fetch(`http://127.0.0.1:${port}/healthz`)).status === 200 ? true : undefined;
    } catch {
      return undefined;
    }
  }, 90_000);
  for (const pid of Object.values(pids())) if (pid) left.pids.push(pid);
  return { proc, dataDir, stdout: () => out.split('\n').filter((l) => l.length > 0), stderr: () => err, exited, pids };
}

/** The pino level of a log line (0 for a line that is not JSON: checked on its own). */
const levelOf = (line: string): number => {
  try {
    return (JSON.parse(line) as { level: number }).level;
  } catch {
    return 0;
  }
};

describe('signals', () => {
  it('Ctrl-C (SIGINT to the process group) with no work in flight: exits within a few seconds, Redis last, no warning; stdout is JSON only', async () => {
    // As `npm start` runs: API, scheduler and a local runner.
    const p = await start({ START_SCHEDULER: 'true', START_RUNNER: 'true' });
    // The scheduler is working against Redis, and the runner is connected, before the Ctrl-C.
    await waitFor('the scheduler to start', () => (p.stdout().some((l) => l.includes('"name":"scheduler"')) ? true : undefined), 60_000);
    await waitFor('the runner to connect', () => (p.stdout().some((l) => l.includes('connected to the control plane')) ? true : undefined), 120_000);
    const { redis } = p.pids();
    expect(redis).toBeGreaterThan(0);
    const sent = Date.now();
    process.kill(-(p.proc.pid as number), 'SIGINT');
    const { code, at } = await p.exited;
    expect(code).toBe(0);
    expect(at - sent).toBeLessThan(8_000);
    await waitFor('the embedded redis-server to stop', () => (alive(redis as number) ? undefined : true), 10_000);

    const lines = p.stdout();
    // No warning or error on the way down (nor before it).
    expect(lines.filter((l) => levelOf(l) >= 40)).toEqual([]);
    expect(lines.some((l) => l.includes('stopping the platform'))).toBe(true);
    // Every stdout line is a structured log record: no SDK notice, no banner.
    for (const line of lines) expect(() => JSON.parse(line), line).not.toThrow();
    expect(`${lines.join('\n')}${p.stderr()}`).not.toContain('responseMode');
  }, 300_000);

  it('a platform killed outright (SIGKILL) leaves no redis-server running', async () => {
    const p = await start({ START_SCHEDULER: 'false', START_RUNNER: 'false' });
    const { redis, api } = p.pids();
    expect(redis).toBeGreaterThan(0);
    p.proc.kill('SIGKILL');
    await p.exited;
    await waitFor('the orphaned redis-server to stop', () => (alive(redis as number) ? undefined : true), 15_000);
    await waitFor('the orphaned api process to stop', () => (alive(api as number) ? undefined : true), 30_000);
  }, 180_000);
});
