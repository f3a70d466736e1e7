import type { ChildProcess } from 'node:child_process';
import { createServer, type IncomingMessage, type Server } from 'node:http';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '@agentplane/store';
import { loadState, saveCredential, statePath } from '@agentplane/protocol';
import { lockDir } from '../runner-daemon/dist/lock.js';
import { waitFor } from './harness/platform.js';
import { runnerCli, startLoggedDaemon, type CliRun, type LoggedDaemon } from './harness/runner-cli.js';

/**
 * `agentplane-runner start` through its life: the startup (a Docker engine that answers its ping
 * and then hangs keeps it there), a stop during it, Docker refused with --require-docker, /healthz,
 * and state writes that fail while it runs. No control plane answers here (the daemon keeps
 * reconnecting), except where a test says so.
 */
const dirs: string[] = [];
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'runner-startup-'));
  dirs.push(d);
  return d;
};
const children: ChildProcess[] = [];
const servers: Server[] = [];
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** A paired config dir whose control plane is nowhere (connections refused). */
function pairedDir(): string {
  const dir = tmp();
  saveCredential(dir, {
    base_url: 'http://127.0.0.1:1', secret: 'ap_runner_x', runner_id: 'runner_startup', runner_credential_id: 'rcred_startup', runner_pool_id: 'rpool_x',
    workspace_id: 'wksp_x', machine_label: 'box', paired_at: new Date().toISOString(),
  });
  return dir;
}

/** A Docker engine that answers its ping and never anything else: a daemon using it stays in its startup. */
async function hangingDocker(): Promise<{ socket: string; asked: Promise<string> }> {
  const socket = join(tmp(), 'docker.sock');
  let tell: (url: string) => void = () => undefined;
  const asked = new Promise<string>((r) => (tell = r));
  const server = createServer((req: IncomingMessage, res) => {
    if (/\/_ping$/.test(req.url ?? '')) {
      res.writeHead(200, { 'content-type': 'text/plain' }).end('OK');
      return;
    }
    tell(`${req.method} ${req.url}`);
  });
  servers.push(server);
  await new Promise<void>((r) => server.listen(socket, r));
  return { socket, asked };
}

const startDaemon = (dir: string, env: Record<string, string>, args: string[] = []): LoggedDaemon =>
  startLoggedDaemon(dir, { home: tmp(), env, args, started: (proc) => children.push(proc) });
const cli = (args: string[]): Promise<CliRun> => runnerCli(args, tmp());
const json = (s: string): Record<string, unknown> => JSON.parse(s.trim().split('\n').pop() ?? '{}') as Record<string, unknown>;

describe('a daemon that is starting', { timeout: 120_000 }, () => {
  it('is shown as starting by status, and drain stops it cleanly (exit code 0, lock given up)', async () => {
    const dir = pairedDir();
    const docker = await hangingDocker();
    const d = startDaemon(dir, { DOCKER_SOCKET: docker.socket });
    await docker.asked; // in its startup steps, and stays there
    expect(loadState(dir)).toMatchObject({ pid: d.proc.pid, status: 'starting', connected: false });
    const status = await cli(['status', '--config-dir', dir, '--json']);
    expect(status.code).toBe(1);
    expect(json(status.stdout)).toMatchObject({ running: true, pid: d.proc.pid, status: 'starting', connected: false });
    const human = await cli(['status', '--config-dir', dir]);
    expect(human.stdout).toMatch(/^daemon {6}running \(pid \d+\)$/m);
    expect(human.stdout).toMatch(/^status {6}starting \(sandbox image and isolation checks; not connected yet\)$/m);

    const drain = await cli(['drain', '--wait', '--timeout', '60', '--config-dir', dir, '--json']);
    expect(drain.code, drain.stdout + drain.stderr).toBe(0);
    expect(json(drain.stdout)).toMatchObject({ ok: true, signalled: true, exited: true });
    expect(await d.exited).toEqual({ code: 0, signal: null });
    expect(d.lines.find((l) => l.msg === 'stopping during startup')).toMatchObject({ signal: 'SIGTERM' });
    expect(readdirSync(lockDir(dir))).toEqual([]);
    expect(loadState(dir)?.status).toBe('stopped');
    expect((await cli(['status', '--config-dir', dir, '--json'])).stdout).toContain('"running":false');
  });

  it.each(['SIGTERM', 'SIGINT'] as const)('%s during the startup: "stopping during startup" logged, lock given up, exit code 0', async (signal) => {
    const dir = pairedDir();
    const docker = await hangingDocker();
    const d = startDaemon(dir, { DOCKER_SOCKET: docker.socket });
    await docker.asked;
    d.proc.kill(signal);
    expect(await d.exited).toEqual({ code: 0, signal: null });
    expect(d.lines.find((l) => l.msg === 'stopping during startup')).toMatchObject({ level: 30, signal });
    expect(d.stderr()).toBe('');
    expect(readdirSync(lockDir(dir))).toEqual([]);
    // The next start is not refused for a stale lock entry.
    const again = startDaemon(dir, { DOCKER_SOCKET: join(tmp(), 'no-docker.sock') });
    await again.line('sandbox driver ready');
    again.proc.kill('SIGTERM');
    expect((await again.exited).code).toBe(0);
  });
});

describe('a daemon that requires Docker', { timeout: 120_000 }, () => {
  it('exits with code 4 (error type docker_unavailable) when Docker does not answer at start, by flag or environment', async () => {
    const noDocker = join(tmp(), 'no-docker.sock');
    const flagDir = pairedDir();
    const envDir = pairedDir();
    const [flag, env] = await Promise.all([
      new Promise<CliRun & { lines: LoggedDaemon['lines'] }>((done) => {
        const d = startDaemon(flagDir, { DOCKER_SOCKET: noDocker }, ['--require-docker', '--json']);
        void d.exited.then((e) => done({ code: e.code, stdout: d.stdout(), stderr: d.stderr(), lines: d.lines }));
      }),
      new Promise<CliRun>((done) => {
        const d = startDaemon(envDir, { DOCKER_SOCKET: noDocker, RUNNER_REQUIRE_DOCKER: 'true' });
        void d.exited.then((e) => done({ code: e.code, stdout: '', stderr: d.stderr() }));
      }),
    ]);
    expect(flag.code).toBe(4);
    const answer = flag.stdout.trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.ok === false);
    expect(answer).toMatchObject({ ok: false, error: { type: 'docker_unavailable' } });
    expect((answer?.error as { message: string }).message).toContain(`the Docker engine (${noDocker}) does not answer`);
    expect(env.code).toBe(4);
    expect(env.stderr).toContain('--require-docker');
    for (const dir of [flagDir, envDir]) {
      expect(readdirSync(lockDir(dir))).toEqual([]);
      expect(loadState(dir)?.status).toBe('stopped');
    }
    const help = await cli(['start', '--help']);
    expect(help.stdout).toContain('--require-docker');
    expect(help.stdout).toContain('RUNNER_REQUIRE_DOCKER (true|false)');
  });
});

describe('the daemon\'s /healthz', { timeout: 120_000 }, () => {
  it('answers 503 with the reason while starting and while not connected to the control plane', async () => {
    const dir = pairedDir();
    const docker = await hangingDocker();
    const port = await freePort();
    const url = `http://127.0.0.1:${port}/healthz`;
    const starting = startDaemon(dir, { DOCKER_SOCKET: docker.socket, RUNNER_METRICS_ADDR: `127.0.0.1:${port}` });
    await docker.asked;
    await starting.line('runner metrics listening');
    const h = await fetch(url);
    expect(h.status).toBe(503);
    expect(await h.json()).toEqual({ status: 'starting', connected: false, driver: null, docker_ok: true, draining: false, tiers: [] });
    starting.proc.kill('SIGTERM');
    expect((await starting.exited).code).toBe(0);

    // Up (the process driver: no Docker), its control plane unreachable.
    const d = startDaemon(dir, { DOCKER_SOCKET: join(tmp(), 'no-docker.sock'), RUNNER_METRICS_ADDR: `127.0.0.1:${port}` });
    await d.line('reconnecting');
    const down = await fetch(url);
    expect(down.status).toBe(503);
    expect(await down.json()).toEqual({ status: 'disconnected', connected: false, driver: 'process', docker_ok: false, draining: false, tiers: [] });
    expect(await (await fetch(`http://127.0.0.1:${port}/metrics`)).text()).toContain('agentplane_runner_sandbox_driver_info{driver="process"} 1');
    d.proc.kill('SIGTERM');
    expect((await d.exited).code).toBe(0);
  });
});

describe('status of a daemon that is up but not connected', { timeout: 120_000 }, () => {
  it('says disconnected once: "disconnected (reconnecting)"', async () => {
    const dir = pairedDir();
    const d = startDaemon(dir, { DOCKER_SOCKET: join(tmp(), 'no-docker.sock') });
    await d.line('reconnecting');
    const human = await cli(['status', '--config-dir', dir]);
    expect(human.code).toBe(1);
    expect(human.stdout).toMatch(/^status {6}disconnected \(reconnecting\)$/m);
    expect(human.stdout).not.toContain('disconnected, disconnected');
    d.proc.kill('SIGTERM');
    expect((await d.exited).code).toBe(0);
  });
});

describe('a daemon whose state file cannot be written while it runs (a full disk)', { timeout: 120_000 }, () => {
  it('says so at warn level and still stops cleanly on SIGTERM (exit code 0, no stack trace, no temp file)', async () => {
    const dir = pairedDir();
    const d = startDaemon(dir, { DOCKER_SOCKET: join(tmp(), 'no-docker.sock') });
    await d.line('reconnecting');
    // From now on every state write fails (the rename meets a directory), as on a full disk.
    await waitFor('state.json replaced by a directory', () => {
      rmSync(statePath(dir), { force: true });
      try {
        mkdirSync(statePath(dir));
        return true;
      } catch {
        return undefined; // the daemon wrote it again in between
      }
    });
    await d.line('state file could not be written');
    d.proc.kill('SIGTERM');
    expect(await d.exited).toEqual({ code: 0, signal: null });
    await d.line('runner stopped');
    expect(d.lines.filter((l) => l.msg.startsWith('state file could not be written'))).toHaveLength(1);
    expect(d.stderr()).toBe('');
    expect(readdirSync(dir).filter((n) => n.endsWith('.tmp'))).toEqual([]);
    expect(existsSync(join(statePath(dir)))).toBe(true);
  });
});
