import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { Logger } from '@agentplane/core';
import type { RunnerCredentialFile } from '@agentplane/protocol';
import { Supervisor, type FatalExit } from '../platform/dist/supervisor.js';
import { startPlatform, type Platform } from './harness/platform.js';

/**
 * The platform's local runner stops with exit code 5 when the control plane refuses its
 * credential for good (revoked): the launcher reports it and does not restart it (it would only be
 * refused again), and the rest of the platform runs on. Other exits keep their handling.
 */
const dir = mkdtempSync(join(tmpdir(), 'agentplane-final-exit-'));
const platforms: Platform[] = [];
afterAll(async () => {
  for (const p of platforms) await p.stop();
  rmSync(dir, { recursive: true, force: true });
});

interface Logged { level: 'info' | 'warn' | 'error'; fields: Record<string, unknown>; msg: string }

/** A logger that keeps its lines and tells `onLine` of each. */
function recorder(onLine: (l: Logged) => void = () => undefined): { log: Logger; lines: Logged[] } {
  const lines: Logged[] = [];
  const at = (level: Logged['level']) => (fields: Record<string, unknown>, msg: string) => {
    const l = { level, fields, msg };
    lines.push(l);
    onLine(l);
  };
  const log = { info: at('info'), warn: at('warn'), error: at('error'), fatal: at('error'), debug: () => undefined, flush: (cb?: () => void) => cb?.() } as unknown as Logger;
  return { log, lines };
}

describe('platform supervisor: a final exit code', () => {
  it('a child that was up and exits with a code of its finalExitCodes is reported, not restarted, not given up on', async () => {
    const script = join(dir, 'refused.mjs');
    const lives = join(dir, 'refused.lives');
    writeFileSync(lives, '0');
    writeFileSync(script, `import { readFileSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
writeFileSync(${JSON.stringify(lives)}, String(Number(readFileSync(${JSON.stringify(lives)}, 'utf8')) + 1));
createServer().listen(0, '127.0.0.1', () => setImmediate(() => {
  process.stderr.write('agentplane-runner start: the control plane refused the credential of runner runner_x (HTTP 401)\\n');
  process.exit(5);
}));
setInterval(() => undefined, 1000);
`);
    let reported: (l: Logged) => void = () => undefined;
    const report = new Promise<Logged>((r) => (reported = r));
    const { log, lines } = recorder((l) => {
      if (l.level === 'error') reported(l);
    });
    const fatals: FatalExit[] = [];
    const supervisor = new Supervisor(log, true, () => undefined, { onFatal: (f) => fatals.push(f), maxCrashes: 1 });
    supervisor.start({ name: 'runner', script, env: {}, stopGraceMs: 5000, ready: 'listen', finalExitCodes: { 5: 'its credential was refused' } });
    const line = await report;
    expect(line.msg).toBe('the runner process exited with code 5: its credential was refused; it is not restarted '
      + '(agentplane-runner start: the control plane refused the credential of runner runner_x (HTTP 401))');
    expect(line.fields).toMatchObject({ child: 'runner', code: 5 });
    // Nothing else follows: no restart (a second life), no fatal (maxCrashes 1 would have given up at once).
    expect(await supervisor.stopRest()).toEqual([{ name: 'runner', killed: false, ms: 0 }]);
    expect(readFileSync(lives, 'utf8')).toBe('1');
    expect(fatals).toEqual([]);
    expect(lines.map((l) => `${l.level} ${l.msg.slice(0, 40)}`)).toEqual(['warn platform process exited', `error ${line.msg.slice(0, 40)}`]);
  });
});

describe('the platform\'s local runner with its credential revoked', { timeout: 180_000 }, () => {
  it('exits with code 5 and is not restarted; the platform says so and runs on, and its next start gives the runner a new credential', async () => {
    // The process driver (no Docker): the local runner is up in a second.
    const env = { DOCKER_SOCKET: join(dir, 'no-docker.sock') };
    // A data directory of the test's own: the second start below reuses it.
    const dataDir = mkdtempSync(join(dir, 'data-'));
    const p = await startPlatform({ runner: true, env, dataDir });
    platforms.push(p);
    const lines: Array<Record<string, unknown> & { msg?: string }> = [];
    const waiters: Array<{ test: (l: (typeof lines)[number]) => boolean; done: (l: (typeof lines)[number]) => void }> = [];
    let buf = '';
    p.proc.stdout?.setEncoding('utf8').on('data', (d: string) => {
      buf += d;
      for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
        const raw = buf.slice(0, i);
        buf = buf.slice(i + 1);
        try {
          const l = JSON.parse(raw) as (typeof lines)[number];
          lines.push(l);
          for (const w of waiters.splice(0)) if (w.test(l)) w.done(l); else waiters.push(w);
        } catch {
          // not a log line
        }
      }
    });
    const line = (test: (l: (typeof lines)[number]) => boolean): Promise<(typeof lines)[number]> => {
      const seen = lines.find(test);
      return seen ? Promise.resolve(seen) : new Promise((done) => waiters.push({ test, done }));
    };
    const cred = JSON.parse(readFileSync(join(p.dataDir, 'runner', 'runner.json'), 'utf8')) as RunnerCredentialFile;
    const runnerPid = p.pids().runner;
    expect(runnerPid).toBeGreaterThan(0);
    // Revoked whether or not it connected yet: its connects are refused from now on either way.
    const rev = await p.root.request('POST', `/v1/runner-credentials/${cred.runner_credential_id}/revoke`);
    expect(rev.status).toBe(200);

    const reported = await line((l) => typeof l.msg === 'string' && l.msg.startsWith('the runner process exited with code 5'));
    expect(reported).toMatchObject({ level: 50, child: 'runner', code: 5 });
    expect(reported.msg).toContain('it is not restarted');
    expect(String(reported.error)).toContain(`refused the credential of runner ${cred.runner_id} (HTTP 401`);
    expect(String(reported.error)).toContain('agentplane-runner pair --force');
    // The platform runs on, its API answering, and no second runner life was started.
    expect(p.proc.exitCode).toBeNull();
    expect((await p.root.request('GET', '/v1/support/capabilities')).status).toBe(200);
    expect(p.pids().runner).toBe(runnerPid);
    expect(lines.filter((l) => l.msg === 'platform process exited' && l.child === 'runner')).toHaveLength(1);
    expect(lines.filter((l) => l.level === 60)).toEqual([]);
    await p.stop();
    expect(p.proc.exitCode).toBe(0);

    // Started again on the same data directory: the local runner gets a new credential.
    const again = await startPlatform({ runner: true, env, dataDir, port: p.port });
    platforms.push(again);
    const fresh = JSON.parse(readFileSync(join(p.dataDir, 'runner', 'runner.json'), 'utf8')) as RunnerCredentialFile;
    expect(fresh.runner_credential_id).not.toBe(cred.runner_credential_id);
  });
});
