import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import { createServer as createTlsServer } from 'node:https';
import { mkdtempSync, readFileSync, rmSync, statSync, writeFileSync, chmodSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { acquireDaemonLock, processStart } from '../runner-daemon/dist/lock.js';
import { RUNNER_CLI } from './harness/daemon.js';
import { makeTestPki, type TestPki } from './harness/tls-certs.js';

/**
 * `agentplane-runner pair` as a person runs it, against stand-in control planes: one that issues
 * credentials, one that never answers, one behind a certificate of a private CA.
 */
const dirs: string[] = [];
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'runner-pair-cli-'));
  dirs.push(d);
  return d;
};
const children: ChildProcess[] = [];
const servers: Server[] = [];
let pki: TestPki | undefined;
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  for (const s of servers) {
    s.closeAllConnections();
    await new Promise((r) => s.close(r));
  }
  pki?.dispose();
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

interface Ran { code: number | null; stdout: string; stderr: string }
const cli = (args: string[], env: Record<string, string> = {}): Promise<Ran> =>
  new Promise((done) => {
    const child = spawn(process.execPath, [RUNNER_CLI, ...args], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: tmp(), ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
    children.push(child);
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('close', (code) => done({ code, stdout, stderr }));
  });
const json = (s: string): Record<string, unknown> & { ok: boolean; error?: { type: string; message: string } } => JSON.parse(s.trim().split('\n').pop() ?? '{}');

/** Answers every redeem with a new credential; counts the requests. */
let redeems = 0;
const issue = (req: IncomingMessage, res: ServerResponse): void => {
  redeems += 1;
  req.resume();
  res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({
    secret: `ap_runner_${redeems}`, runner_credential: { id: `rcred_${redeems}`, runner_id: `runner_${redeems}`, runner_pool_id: 'rpool_1', workspace_id: 'wksp_1' },
  }));
};
let base = '';
let silentBase = '';
let tlsBase = '';

async function listen(s: Server): Promise<number> {
  servers.push(s);
  await new Promise<void>((r) => s.listen(0, '127.0.0.1', r));
  return (s.address() as AddressInfo).port;
}

beforeAll(async () => {
  base = `http://127.0.0.1:${await listen(createServer(issue))}`;
  // Accepts the connection and the request, never answers.
  silentBase = `http://127.0.0.1:${await listen(createServer(() => undefined))}`;
  pki = makeTestPki();
  tlsBase = `https://127.0.0.1:${await listen(createTlsServer({ cert: pki.server.cert, key: pki.server.key }, issue))}`;
});

describe('agentplane-runner pair', { timeout: 120_000 }, () => {
  it('into a config dir it cannot write: a config error (exit code 2), and the code is not used', async () => {
    const file = join(tmp(), 'file');
    writeFileSync(file, 'x');
    const before = redeems;
    const r = await cli(['pair', '--code', 'AAAA', '--url', base, '--config-dir', join(file, 'cfg'), '--json']);
    expect(r.code, r.stdout + r.stderr).toBe(2);
    expect(json(r.stdout).error).toMatchObject({ type: 'config', code: 'ENOTDIR' });
    expect(json(r.stdout).error?.message).toContain('the pairing code is still unused');
    expect(redeems).toBe(before);
  });

  it('a control plane that never answers: gives up after --timeout with an error naming the URL', async () => {
    const r = await cli(['pair', '--code', 'AAAA', '--url', silentBase, '--timeout', '1', '--config-dir', tmp(), '--json']);
    expect(r.code).toBe(1);
    expect(json(r.stdout).error).toMatchObject({ type: 'network', url: `${silentBase}/v1/runner-pairings/redeem`, cause: 'timeout' });
    expect(json(r.stdout).error?.message).toContain(`no answer from ${silentBase}/v1/runner-pairings/redeem within 1 s`);
    const bad = await cli(['pair', '--code', 'AAAA', '--url', silentBase, '--timeout', '0', '--config-dir', tmp()]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--timeout must be an integer in [1, 3600]');
    expect((await cli(['pair', '--help'])).stdout).toContain('--timeout <seconds>  how long to wait for the control plane\'s answer (default 30)');
  });

  it('a certificate of a private CA: says NODE_EXTRA_CA_CERTS, which then makes it work', async () => {
    const untrusted = await cli(['pair', '--code', 'AAAA', '--url', tlsBase, '--config-dir', tmp()]);
    expect(untrusted.code).toBe(1);
    expect(untrusted.stderr).toContain(`the TLS certificate of ${tlsBase}/v1/runner-pairings/redeem is not trusted by this machine (UNABLE_TO_VERIFY_LEAF_SIGNATURE)`);
    expect(untrusted.stderr).toContain('NODE_EXTRA_CA_CERTS=<ca.pem>');
    const trusted = await cli(['pair', '--code', 'AAAA', '--url', tlsBase, '--config-dir', tmp(), '--json'], { NODE_EXTRA_CA_CERTS: pki!.caFile });
    expect(trusted.code, trusted.stdout + trusted.stderr).toBe(0);
    expect(json(trusted.stdout)).toMatchObject({ ok: true });
  });

  it('a refused connection names the URL', async () => {
    const closed = createServer();
    const port = await new Promise<number>((r) => closed.listen(0, '127.0.0.1', () => r((closed.address() as AddressInfo).port)));
    await new Promise((r) => closed.close(r));
    const r = await cli(['pair', '--code', 'AAAA', '--url', `http://127.0.0.1:${port}/agentplane`, '--config-dir', tmp()]);
    expect(r.code).toBe(1);
    expect(r.stderr).toContain(`http://127.0.0.1:${port}/agentplane/v1/runner-pairings/redeem refused the connection (ECONNREFUSED)`);
  });

  it('into a paired config dir: refused unless --force, which names the replaced credential; the dir is made 0700', async () => {
    const dir = tmp();
    chmodSync(dir, 0o755);
    const first = await cli(['pair', '--code', 'AAAA', '--url', base, '--config-dir', dir, '--json']);
    expect(first.code, first.stdout + first.stderr).toBe(0);
    expect(statSync(dir).mode & 0o777).toBe(0o700);
    const stored = readFileSync(join(dir, 'runner.json'), 'utf8');
    const old = JSON.parse(stored) as { runner_id: string; runner_credential_id: string };
    const before = redeems;
    const again = await cli(['pair', '--code', 'BBBB', '--url', base, '--config-dir', dir]);
    expect(again.code).toBe(2);
    expect(again.stderr).toContain(`is already paired: ${join(dir, 'runner.json')} holds runner ${old.runner_id} (credential ${old.runner_credential_id})`);
    expect(redeems).toBe(before);
    expect(readFileSync(join(dir, 'runner.json'), 'utf8')).toBe(stored);
    const forced = await cli(['pair', '--code', 'BBBB', '--url', base, '--config-dir', dir, '--force']);
    expect(forced.code, forced.stderr).toBe(0);
    expect(forced.stdout).toContain(`replaced the credential ${old.runner_credential_id} of runner ${old.runner_id}; it stays active until revoked: POST /v1/runner-credentials/${old.runner_credential_id}/revoke`);
  });

  it('a credential the control plane refused is replaced without sending its user off to revoke it, and its refusal goes with it', async () => {
    const dir = tmp();
    expect((await cli(['pair', '--code', 'AAAA', '--url', base, '--config-dir', dir])).code).toBe(0);
    const old = JSON.parse(readFileSync(join(dir, 'runner.json'), 'utf8')) as { runner_id: string; runner_credential_id: string };
    // What a daemon records when the control plane refuses its credential (it then exits 5).
    const refusal = { http_status: 401, error_type: 'auth.invalid_key', error_message: 'revoked', at: '2026-12-07T10:00:00.000Z' };
    writeFileSync(join(dir, 'state.json'), `${JSON.stringify({ pid: 1, status: 'stopped', connected: false, generation: null, base_url: base, runner_id: old.runner_id, last_heartbeat_ack_at: null, reconnect_attempt: 0, credential_refused: refusal })}\n`);
    expect((await cli(['status', '--config-dir', dir])).stdout).toContain('the control plane refused this runner\'s credential');
    const forced = await cli(['pair', '--code', 'BBBB', '--url', base, '--config-dir', dir, '--force']);
    expect(forced.code, forced.stderr).toBe(0);
    expect(forced.stdout).toContain(`replaced the credential ${old.runner_credential_id} of runner ${old.runner_id}, which the control plane had refused (HTTP 401 at ${refusal.at})`);
    expect(forced.stdout).not.toContain('stays active until revoked');
    expect((await cli(['status', '--config-dir', dir])).stdout).not.toContain('refused');
  });

  it('an empty --config-dir, or one that is a file, is a usage or config error that touches nothing', async () => {
    const cwd = tmp();
    chmodSync(cwd, 0o755);
    const before = redeems;
    const empty = await new Promise<Ran>((done) => {
      const child = spawn(process.execPath, [RUNNER_CLI, 'pair', '--code', 'AAAA', '--url', base, '--config-dir', '', '--json'], { cwd, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: tmp() }, stdio: ['ignore', 'pipe', 'pipe'] });
      let stdout = '';
      child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
      child.on('close', (code) => done({ code, stdout, stderr: '' }));
    });
    expect(empty.code).toBe(2);
    expect(json(empty.stdout).error?.message).toContain('--config-dir: must not be empty');
    expect(statSync(cwd).mode & 0o777).toBe(0o755);
    expect(redeems).toBe(before);
    const file = join(tmp(), 'not-a-dir');
    writeFileSync(file, 'x');
    const status = await cli(['status', '--config-dir', file, '--json']);
    expect(status.code).toBe(2);
    expect(json(status.stdout).error).toMatchObject({ type: 'config', message: expect.stringContaining(`the runner config dir ${file} is not a directory`) });
  });

  it('while a daemon runs on the config dir: refused (exit code 3), --force or not, before the code is used', async () => {
    const dir = tmp();
    const holder = spawn(process.execPath, ['-e', 'setInterval(() => {}, 1000)'], { stdio: 'ignore' });
    children.push(holder);
    const pid = holder.pid ?? 0;
    const lock = acquireDaemonLock(dir, { pid, start: processStart(pid) });
    try {
      const before = redeems;
      const r = await cli(['pair', '--code', 'AAAA', '--url', base, '--config-dir', dir, '--force', '--json']);
      expect(r.code).toBe(3);
      expect(json(r.stdout)).toMatchObject({ ok: false, pid, error: { type: 'already_running' } });
      expect(redeems).toBe(before);
    } finally {
      lock.release();
    }
  });
});

describe('agentplane-runner with a damaged runner.json', { timeout: 60_000 }, () => {
  it('names the file, as a config error (exit code 2)', async () => {
    const dir = tmp();
    writeFileSync(join(dir, 'runner.json'), '{"secret": "ap_runner_');
    const [status, start] = await Promise.all([cli(['status', '--config-dir', dir, '--json']), cli(['start', '--config-dir', dir, '--json'])]);
    for (const r of [status, start]) {
      expect(r.code).toBe(2);
      expect(json(r.stdout).error).toMatchObject({ type: 'config' });
      expect(json(r.stdout).error?.message).toContain(`the runner credential file ${join(dir, 'runner.json')} is not valid JSON`);
    }
  });
});
