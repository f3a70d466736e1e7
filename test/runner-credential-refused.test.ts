import type { ChildProcess } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocketServer } from 'ws';
import { freePort } from '@agentplane/store';
import { credentialPath, frame, loadState, parseFrame, saveCredential, type RunnerCredentialFile } from '@agentplane/protocol';
import { lockDir } from '../runner-daemon/dist/lock.js';
import { createPerson, pairDaemon } from './harness/daemon.js';
import { runnerCli, startLoggedDaemon, type CliRun, type LoggedDaemon } from './harness/runner-cli.js';
import { startPlatform, type Platform } from './harness/platform.js';

/**
 * A runner daemon whose credential the control plane refuses for good (revoked, deleted: HTTP 401
 * or 403 on the upgrade, seen twice in a row) stops with one line saying to pair again and exit
 * code 5, where a refusal that does not repeat, or a control plane that answers 503 while it
 * starts, only makes it reconnect.
 */
const dirs: string[] = [];
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'runner-refused-'));
  dirs.push(d);
  return d;
};
const children: ChildProcess[] = [];
const servers: Array<{ close: () => Promise<void> }> = [];
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  for (const s of servers) await s.close();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** `agentplane-runner start` with the process driver (no Docker: it is up in a second), its log lines parsed. */
const startDaemon = (dir: string, env: Record<string, string> = {}, args: string[] = []): LoggedDaemon =>
  startLoggedDaemon(dir, { home: tmp(), env: { DOCKER_SOCKET: join(tmp(), 'no-docker.sock'), ...env }, args, started: (proc) => children.push(proc) });
const cli = (args: string[]): Promise<CliRun> => runnerCli(args, tmp());

describe('a daemon whose credential is revoked', { timeout: 120_000 }, () => {
  let p: Platform;
  let owner: string;
  beforeAll(async () => {
    p = await startPlatform();
    servers.push({ close: () => p.stop() });
    owner = await createPerson(p, `refused-${Date.now()}`, 'Refused Owner');
  });

  it('stops with one line naming `pair --force` and exit code 5; the lock is given up and status says why', async () => {
    const { dir, runnerId } = await pairDaemon(p, owner, 'revoked-box');
    const cred = JSON.parse(readFileSync(credentialPath(dir), 'utf8')) as RunnerCredentialFile;
    const d = startDaemon(dir);
    await d.line('connected to the control plane');
    const rev = await p.root.request('POST', `/v1/runner-credentials/${cred.runner_credential_id}/revoke`);
    expect(rev.status).toBe(200);

    expect(await d.exited).toEqual({ code: 5, signal: null });
    // One line on stderr, naming what refused, why, and what to do.
    const stderr = d.stderr().trim().split('\n');
    expect(stderr).toHaveLength(1);
    expect(stderr[0]).toMatch(/^agentplane-runner start: /);
    expect(stderr[0]).toContain(`refused the credential of runner ${runnerId} (HTTP 401`);
    expect(stderr[0]).toContain('(HTTP 401: unknown or revoked credential) twice in a row: it was revoked or deleted');
    expect(stderr[0]).toContain('agentplane-runner pair --force');
    // Said in the log too (error level), after two refusals in a row, and stopped cleanly.
    const refused = await d.line('the control plane refused this runner\'s credential');
    expect(refused).toMatchObject({ level: 50, http_status: 401, refusals: 2 });
    await d.line('runner stopped');
    expect(d.lines.filter((l) => l.msg.startsWith('the control plane refused this runner\'s credential'))).toHaveLength(1);
    expect(readdirSync(lockDir(dir))).toEqual([]);
    expect(loadState(dir)).toMatchObject({ status: 'stopped', connected: false, credential_refused: { http_status: 401 } });

    const status = await cli(['status', '--config-dir', dir, '--json']);
    expect(JSON.parse(status.stdout)).toMatchObject({ running: false, status: 'stopped', credential_refused: { http_status: 401 } });
    const human = await cli(['status', '--config-dir', dir]);
    expect(human.stdout).toMatch(/^status {6}stopped: the control plane refused this runner's credential \(HTTP 401, at .+\); pair this machine again: agentplane-runner pair --force/m);

    // Started again on the same refused credential: it stops again, the same way (--json: the error type).
    const again = startDaemon(dir, {}, ['--json']);
    expect((await again.exited).code).toBe(5);
    const answer = again.stdout().trim().split('\n').map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.ok === false);
    expect(answer).toMatchObject({ ok: false, error: { type: 'credential_refused', http_status: 401, runner_id: runnerId } });
  });
});

/**
 * A stand-in control plane: answers each runner upgrade with the next status of `plan` (101 takes
 * the socket and welcomes the runner), the last one repeated.
 */
async function standIn(plan: number[]): Promise<{ url: string; upgrades: number[]; hello: Promise<void> }> {
  const server: Server = createServer((_req, res) => res.writeHead(404).end());
  const wss = new WebSocketServer({ noServer: true });
  const upgrades: number[] = [];
  let helloSeen: () => void = () => undefined;
  const hello = new Promise<void>((r) => (helloSeen = r));
  server.on('upgrade', (req, socket, head) => {
    const status = plan[Math.min(upgrades.length, plan.length - 1)] ?? 101;
    upgrades.push(status);
    if (status !== 101) {
      const body = JSON.stringify({ error: { type: status === 503 ? 'runtime.unavailable' : 'auth.invalid_key', message: `stand-in ${status}` } });
      socket.end(`HTTP/1.1 ${status} Refused\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      ws.on('message', (data) => {
        const msg = parseFrame(data.toString(), 'runner');
        const now = new Date().toISOString();
        if (msg.type === 'hello') {
          ws.send(frame('welcome', 'w1', {
            protocol_version: 1, runner_id: 'runner_standin', runner_pool_id: 'rpool_x', workspace_id: 'wksp_x', generation: 1, heartbeat_interval_ms: 1000,
            presence_ttl_ms: 5000, max_frame_bytes: 1 << 20, server_time: now, resumed_leases: [],
          }, msg.id));
          helloSeen();
        } else if (msg.type === 'heartbeat') {
          ws.send(frame('heartbeat.ack', `a${msg.id}`, { server_time: now, presence_expires_at: now, cancellations: [] }, msg.id));
        }
      });
    });
  });
  const port = await freePort();
  await new Promise<void>((r) => server.listen(port, '127.0.0.1', r));
  servers.push({
    close: async () => {
      for (const c of wss.clients) c.terminate();
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    },
  });
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, upgrades, hello };
}

function pairedTo(url: string): string {
  const dir = tmp();
  saveCredential(dir, {
    base_url: url, secret: 'ap_runner_standin', runner_id: 'runner_standin', runner_credential_id: 'rcred_standin', runner_pool_id: 'rpool_x',
    workspace_id: 'wksp_x', machine_label: 'box', paired_at: new Date().toISOString(),
  });
  return dir;
}

describe('a refusal that is not final', { timeout: 120_000 }, () => {
  it('503s while the control plane starts, and a 401 that does not repeat, only make the daemon reconnect', async () => {
    const s = await standIn([503, 503, 401, 503, 403, 503, 101]);
    const dir = pairedTo(s.url);
    const d = startDaemon(dir);
    await s.hello;
    await d.line('connected to the control plane');
    expect(s.upgrades).toEqual([503, 503, 401, 503, 403, 503, 101]);
    expect(d.proc.exitCode).toBeNull();
    expect(d.lines.filter((l) => l.msg.startsWith('the control plane refused this runner\'s credential'))).toEqual([]);
    d.proc.kill('SIGTERM');
    expect(await d.exited).toEqual({ code: 0, signal: null });
    expect(d.stderr()).toBe('');
  });

  it('a 403 that repeats is final: exit code 5, the control plane\'s words in the line', async () => {
    const s = await standIn([503, 403]);
    const dir = pairedTo(s.url);
    const d = startDaemon(dir);
    expect(await d.exited).toEqual({ code: 5, signal: null });
    expect(s.upgrades).toEqual([503, 403, 403]);
    expect(d.stderr()).toContain('(HTTP 403: stand-in 403)');
    expect(d.stderr()).toContain('agentplane-runner pair --force');
  });
});
