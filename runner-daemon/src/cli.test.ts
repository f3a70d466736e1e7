import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { saveState } from './config.js';
import { connectUrl } from './probe.js';

/** The runner CLI as users run it: `node runner-daemon/dist/cli.js …`, exit code and output. */
const CLI = resolve(import.meta.dirname, '..', 'dist', 'cli.js');
const dirs: string[] = [];
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'runner-cli-'));
  dirs.push(d);
  return d;
};
/** Runs the CLI without blocking this process (the test's own HTTP server must keep answering). */
const cli = (args: string[], timeout = 90_000): Promise<{ code: number | null; stdout: string; stderr: string; timedOut: boolean }> =>
  new Promise((done) => {
    const child = spawn(process.execPath, [CLI, ...args], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: tmp() }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, timeout);
    child.on('close', (code) => {
      clearTimeout(timer);
      done({ code, stdout, stderr, timedOut });
    });
  });
const json = (s: string): { ok: boolean; error?: { type: string; message: string } } & Record<string, unknown> => JSON.parse(s.trim().split('\n').pop() ?? '{}');

afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

// Generous bounds: each case spawns a Node process, slow on a loaded machine.
describe('agentplane-runner: usage and configuration errors', { timeout: 240_000 }, () => {
  it('names the flag whose value is bad', async () => {
    const [r, hb, reap] = await Promise.all([
      cli(['start', '--slots', 'lots', '--config-dir', tmp()]),
      cli(['start', '--heartbeat-ms', '5', '--config-dir', tmp(), '--json']),
      cli(['start', '--sandbox-reap-grace-seconds=-1', '--config-dir', tmp()]),
    ]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain("--slots must be an integer in [0, 1024], got 'lots'");
    expect(r.stderr).not.toMatch(/\bv must/);
    expect(hb.code).toBe(2);
    expect(json(hb.stdout).error).toEqual({ type: 'config', message: "--heartbeat-ms must be an integer in [100, 9007199254740991], got '5'" });
    expect(reap.stderr).toContain('--sandbox-reap-grace-seconds must be an integer');
    const tiers = await cli(['start', '--tiers', 'container,kata', '--config-dir', tmp(), '--json']);
    expect(tiers.code).toBe(2);
    expect(json(tiers.stdout).error).toEqual({ type: 'config', message: "--tiers / RUNNER_TIERS: unknown tier 'kata' (known: container, gvisor)" });
  });

  it.each(['toString', '__proto__', 'nonsense'])('refuses the unknown command %s with a message and exit code 2', async (name) => {
    const [r, j] = await Promise.all([cli([name]), cli([name, '--json'])]);
    expect(r.code).toBe(2);
    expect(r.stderr).toContain(`unknown command '${name}'`);
    expect(r.stderr).toContain('Usage: agentplane-runner <command>');
    expect(j.code).toBe(2);
    expect(json(j.stdout)).toEqual({ ok: false, error: { type: 'usage', message: `unknown command '${name}'` } });
  });

  it('honours --json for usage, configuration and network errors', async () => {
    const [unknownFlag, missing, config, network, unpaired] = await Promise.all([
      cli(['status', '--bogus', '--json']),
      cli(['pair', '--code', 'X', '--json', '--config-dir', tmp()]),
      cli(['status', '--json', '--log-level', 'loud', '--config-dir', tmp()]),
      cli(['pair', '--code', 'X', '--url', 'http://127.0.0.1:9/agentplane', '--json', '--config-dir', tmp()]),
      cli(['start', '--json', '--config-dir', tmp()]),
    ]);
    expect(unknownFlag.code).toBe(2);
    expect(json(unknownFlag.stdout).error?.type).toBe('usage');
    expect(unknownFlag.stderr).toBe('');

    expect(missing.code).toBe(2);
    expect(json(missing.stdout).error).toEqual({ type: 'usage', message: '--url is required' });

    expect(config.code).toBe(2);
    expect(json(config.stdout).error?.type).toBe('config');

    expect(network.code).toBe(1);
    expect(json(network.stdout).error?.type).toBe('network');
    expect(network.stderr).toBe('');

    expect(unpaired.code).toBe(2);
    expect(json(unpaired.stdout).error?.message).toContain('no runner credential');
  });
});

describe('agentplane-runner drain --wait', { timeout: 240_000 }, () => {
  let stubborn: ChildProcess | undefined;
  afterAll(() => {
    stubborn?.kill('SIGKILL');
  });

  it('gives up after --timeout with a non-zero exit code when the daemon does not exit', async () => {
    // A "daemon" that ignores SIGTERM, as one finishing a long Run does.
    stubborn = spawn(process.execPath, ['-e', "process.on('SIGTERM', () => {}); process.stdout.write('ready\\n'); setInterval(() => {}, 1000)"], { stdio: ['ignore', 'pipe', 'ignore'] });
    await new Promise((r) => stubborn?.stdout?.once('data', r));
    const dir = tmp();
    saveState(dir, {
      pid: stubborn.pid ?? 0, status: 'ready', connected: true, generation: 1, base_url: 'http://127.0.0.1:1', runner_id: 'runner_x',
      last_heartbeat_ack_at: null, reconnect_attempt: 0, updated_at: new Date().toISOString(),
    });
    const started = Date.now();
    const r = await cli(['drain', '--wait', '--timeout', '1', '--json', '--config-dir', dir], 120_000);
    expect(r.timedOut).toBe(false); // without --timeout it would wait forever
    expect(r.code).toBe(1);
    expect(json(r.stdout)).toMatchObject({ ok: false, exited: false, timed_out: true });
    expect(Date.now() - started).toBeLessThan(120_000);
    expect(stubborn.exitCode).toBeNull();

    const bad = await cli(['drain', '--wait', '--timeout', 'soon', '--config-dir', dir]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("--timeout must be an integer");
  });
});

describe('a control-plane URL with a base path', { timeout: 240_000 }, () => {
  let server: Server;
  let base: string;
  const seen: string[] = [];
  beforeAll(async () => {
    server = createServer((req, res) => {
      seen.push(`${req.method} ${req.url}`);
      if (req.method === 'POST' && req.url === '/agentplane/v1/runner-pairings/redeem') {
        res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({
          secret: 's3cret', runner_credential: { id: 'rcred_1', runner_id: 'runner_1', runner_pool_id: 'rpool_1', workspace_id: 'wksp_1' },
        }));
        return;
      }
      res.writeHead(404, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { type: 'not_found', message: req.url } }));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/agentplane`;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  it('pair keeps the path', async () => {
    const r = await cli(['pair', '--code', 'AAAA-BBBB', '--url', base, '--json', '--config-dir', tmp()]);
    expect(seen).toContain('POST /agentplane/v1/runner-pairings/redeem');
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(json(r.stdout)).toMatchObject({ ok: true, runner_id: 'runner_1' });
  });

  it('the gateway URL keeps the path', () => {
    expect(connectUrl('https://host/agentplane').toString()).toBe('wss://host/agentplane/v1/runners/connect');
    expect(connectUrl('http://127.0.0.1:8080/').toString()).toBe('ws://127.0.0.1:8080/v1/runners/connect');
  });
});
