import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { connect, createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '@agentplane/store';
import { createPerson, DAEMON_READY_MS, pairDaemon, RUNNER_CLI, WITH_DAEMON_MS } from './harness/daemon.js';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { spawnOwned } from './harness/spawn.js';

/**
 * A runner started while Docker does not answer runs on the unisolated process driver, keeps
 * trying Docker, and once the engine answers switches to the container driver and reports it to
 * the control plane. Docker is reached through a socket this test opens later (a relay to the
 * machine's engine), and closes again at the end.
 */
let p: Platform;
const tmpDirs: string[] = [];
const procs: ChildProcess[] = [];
const ENGINE = process.env.DOCKER_SOCKET ?? '/var/run/docker.sock';

beforeAll(async () => {
  p = await startPlatform({ runner: false, scheduler: false });
}, 90_000);
afterAll(async () => {
  for (const c of procs) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await p?.stop();
  for (const d of tmpDirs) rmSync(d, { recursive: true, force: true });
});

/** A socket that relays to the Docker engine while open. */
async function relay(path: string): Promise<{ close: () => Promise<void> }> {
  const open = new Set<Socket>();
  const server: Server = createServer((c) => {
    const up = connect(ENGINE);
    open.add(c).add(up);
    const drop = (): void => {
      c.destroy();
      up.destroy();
      open.delete(c);
      open.delete(up);
    };
    c.on('error', drop).on('close', drop);
    up.on('error', drop).on('close', drop);
    c.pipe(up).pipe(c);
  });
  await new Promise<void>((r) => server.listen(path, r));
  return {
    close: () => new Promise<void>((r) => {
      server.close(() => r());
      for (const s of open) s.destroy();
    }),
  };
}

interface Presence { runner: string; status: string; capabilities: { drivers?: string[] } }
const presenceOf = async (runnerId: string): Promise<Presence | undefined> =>
  (await p.root.get<{ data: Presence[] }>('/v1/runner-pools/presences')).data.find((x) => x.runner === runnerId);
const health = async (port: number): Promise<{ code: number; body: Record<string, unknown> }> => {
  const r = await fetch(`http://127.0.0.1:${port}/healthz`);
  return { code: r.status, body: (await r.json()) as Record<string, unknown> };
};

describe('a runner started without Docker', () => {
  it('switches to the container driver once Docker answers, says so, and reports the Docker provider', async () => {
    const owner = await createPerson(p, 'switch-owner', 'Owner');
    const { dir, runnerId } = await pairDaemon(p, owner, 'switch-box');
    const sockDir = mkdtempSync(join(tmpdir(), 'runner-docker-'));
    tmpDirs.push(sockDir);
    const socket = join(sockDir, 'docker.sock');
    const port = await freePort();
    const proc = spawnOwned(process.execPath, [RUNNER_CLI, 'start', '--config-dir', dir, '--log-level', 'info', '--reconnect-base-ms', '200', '--reconnect-cap-ms', '1000'], {
      env: { ...process.env, DOCKER_SOCKET: socket, RUNNER_METRICS_ADDR: `127.0.0.1:${port}` },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    procs.push(proc);
    const lines: Array<{ msg: string; level: number } & Record<string, unknown>> = [];
    const waiting: Array<{ msg: string; done: () => void }> = [];
    let buf = '';
    proc.stdout?.setEncoding('utf8').on('data', (d: string) => {
      buf += d;
      for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
        const raw = buf.slice(0, i);
        buf = buf.slice(i + 1);
        try {
          const l = JSON.parse(raw) as (typeof lines)[number];
          lines.push(l);
          for (const w of waiting.splice(0)) if (l.msg.startsWith(w.msg)) w.done(); else waiting.push(w);
        } catch {
          // not a log line
        }
      }
    });
    const logged = (msg: string): Promise<void> => (lines.some((l) => l.msg.startsWith(msg)) ? Promise.resolve() : new Promise((done) => waiting.push({ msg, done })));
    const exited = new Promise<number | null>((r) => proc.once('exit', (code) => r(code)));

    const first = await waitFor('the runner ready on the process driver', async () => {
      const x = await presenceOf(runnerId);
      return x?.status === 'ready' ? x : undefined;
    }, DAEMON_READY_MS);
    expect(first.capabilities.drivers).toEqual(['process']);
    expect(lines.find((l) => l.msg.startsWith('Docker is tried again with backoff'))).toMatchObject({ level: 40 });
    expect(await health(port)).toEqual({ code: 200, body: { status: 'ok', connected: true, driver: 'process', docker_ok: false, draining: false, tiers: [] } });

    const engine = await relay(socket);
    let closed = false;
    try {
      await logged('switched to the container driver');
      expect(lines.find((l) => l.msg.startsWith('switched to the container driver'))).toMatchObject({ level: 40, driver: 'docker' });
      // Reported at once (a heartbeat with the new capabilities), not at the next facts refresh
      // a minute later.
      const now = await waitFor('the Docker provider reported', async () => {
        const x = await presenceOf(runnerId);
        return x?.capabilities.drivers?.includes('docker') ? x : undefined;
      }, 30_000);
      expect([...(now.capabilities.drivers ?? [])].sort()).toEqual(['docker', 'process']);
      const up = await health(port);
      expect(up).toMatchObject({ code: 200, body: { status: 'ok', driver: 'docker', docker_ok: true } });
      expect(up.body.tiers).toContain('container');

      // Docker goes away again: the daemon is not healthy while its driver does not answer.
      await engine.close();
      closed = true;
      const down = await waitFor('healthz to see Docker gone', async () => {
        const h = await health(port);
        return h.code === 503 ? h : undefined;
      }, 30_000);
      expect(down.body).toMatchObject({ status: 'docker_unavailable', connected: true, driver: 'docker', docker_ok: false });
    } finally {
      if (!closed) await engine.close();
    }
    proc.kill('SIGTERM');
    expect(await exited).toBe(0);
  }, WITH_DAEMON_MS);
});
