import type { ChildProcess } from 'node:child_process';
import { rmSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '@agentplane/store';
import { createPerson, DAEMON_READY_MS, pairDaemon, RUNNER_CLI } from './harness/daemon.js';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { spawnOwned } from './harness/spawn.js';

/**
 * The runner's sandbox image (`--image`, SANDBOX_IMAGE) is the one its sandboxes and tier
 * canaries use: an image of the operator's own is used as it is, never replaced by the built-in
 * one. A missing one is said, no tier is verified, and the daemon's /healthz says it takes no work.
 */
let p: Platform;
const procs: ChildProcess[] = [];
const dirs: string[] = [];

beforeAll(async () => {
  p = await startPlatform({ runner: false, scheduler: false });
}, 90_000);
afterAll(async () => {
  for (const c of procs) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await p?.stop();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

describe('the runner\'s sandbox image', () => {
  it('is the one SANDBOX_IMAGE names: a missing one is said, no tier verified, and /healthz is 503 no_tiers', async () => {
    const owner = await createPerson(p, 'image-owner', 'Owner');
    const { dir } = await pairDaemon(p, owner, 'image-box');
    dirs.push(dir);
    const port = await freePort();
    const image = 'agentplane/sandbox:absent-from-this-machine';
    const proc = spawnOwned(process.execPath, [RUNNER_CLI, 'start', '--config-dir', dir, '--log-level', 'info', '--tiers', 'container'], {
      env: { ...process.env, SANDBOX_IMAGE: image, RUNNER_METRICS_ADDR: `127.0.0.1:${port}` },
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    procs.push(proc);
    const lines: Array<{ msg: string } & Record<string, unknown>> = [];
    let buf = '';
    proc.stdout?.setEncoding('utf8').on('data', (d: string) => {
      buf += d;
      for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
        const raw = buf.slice(0, i);
        buf = buf.slice(i + 1);
        try {
          lines.push(JSON.parse(raw) as (typeof lines)[number]);
        } catch {
          // not a log line
        }
      }
    });
    const ready = await waitFor('the sandbox driver ready', async () => lines.find((l) => l.msg === 'sandbox driver ready'), DAEMON_READY_MS);
    expect(ready).toMatchObject({ driver: 'docker', image, tiers: [] });
    expect(lines.some((l) => l.msg.startsWith('the sandbox image is not present on this machine') && l.image === image)).toBe(true);
    const health = await waitFor('a connected runner\'s health', async () => {
      const r = await fetch(`http://127.0.0.1:${port}/healthz`).catch(() => null);
      if (!r) return undefined;
      const body = (await r.json()) as { status: string; connected: boolean; tiers: string[] };
      return body.connected ? { code: r.status, body } : undefined;
    }, DAEMON_READY_MS);
    expect(health).toMatchObject({ code: 503, body: { status: 'no_tiers', tiers: [] } });
    proc.kill('SIGTERM');
    await new Promise((r) => proc.once('exit', r));
  }, 120_000);
});
