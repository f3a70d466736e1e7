import { spawn, type ChildProcess } from 'node:child_process';
import { createServer, type Server } from 'node:http';
import { existsSync, mkdtempSync, readdirSync, rmSync, watch } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadState, saveCredential, statePath } from '@agentplane/protocol';
import { acquireDaemonLock, lockDir, processStart, type DaemonLock } from './lock.js';

/** The runner CLI as users run it: `node runner-daemon/dist/cli.js …`, exit code and output. */
const CLI = resolve(import.meta.dirname, '..', 'dist', 'cli.js');
const dirs: string[] = [];
const tmp = (): string => {
  const d = mkdtempSync(join(tmpdir(), 'runner-cli-'));
  dirs.push(d);
  return d;
};
/** Runs the CLI without blocking this process (the test's own HTTP server must keep answering). */
const cli = (args: string[], timeout = 90_000, env: Record<string, string> = {}): Promise<{ code: number | null; stdout: string; stderr: string; timedOut: boolean }> =>
  new Promise((done) => {
    const child = spawn(process.execPath, [CLI, ...args], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: tmp(), ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
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
const credential = (baseUrl: string): Parameters<typeof saveCredential>[1] => ({
  base_url: baseUrl, secret: 's', runner_id: 'runner_cli', runner_credential_id: 'rcred_cli', runner_pool_id: 'rpool_cli',
  workspace_id: 'wksp_cli', machine_label: 'box', paired_at: '2026-01-01T00:00:00.000Z',
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
    expect(r.stderr).toContain("--slots must be an integer in [1, 1024], got 'lots'");
    expect(r.stderr).not.toMatch(/\bv must/);
    expect(hb.code).toBe(2);
    expect(json(hb.stdout).error).toEqual({ type: 'config', message: "--heartbeat-ms must be an integer in [100, 2147483647], got '5'" });
    expect(reap.stderr).toContain('--sandbox-reap-grace-seconds must be an integer');
    const tiers = await cli(['start', '--tiers', 'container,kata', '--config-dir', tmp(), '--json']);
    expect(tiers.code).toBe(2);
    expect(json(tiers.stdout).error).toEqual({ type: 'config', message: "--tiers / RUNNER_TIERS: unknown tier 'kata' (known: container, gvisor)" });
  });

  it("refuses a duration past a timer's reach, which Node would fire after 1 ms, and numbers not written in digits", async () => {
    const [drain, report, slots, service] = await Promise.all([
      cli(['start', '--drain-deadline-ms', '2592000000', '--config-dir', tmp(), '--json']),
      cli(['start', '--sandbox-report-seconds', '3000000', '--config-dir', tmp(), '--json']),
      cli(['start', '--slots', '0x10', '--config-dir', tmp(), '--json']),
      cli(['service', 'install', '--drain-deadline-ms', '9007199254740991', '--no-systemctl', '--config-dir', tmp(), '--json']),
    ]);
    expect([drain.code, json(drain.stdout).error]).toEqual([2, { type: 'config', message: "--drain-deadline-ms must be an integer in [0, 2147483647], got '2592000000'" }]);
    expect([report.code, json(report.stdout).error]).toEqual([2, { type: 'config', message: "--sandbox-report-seconds must be an integer in [1, 2147483], got '3000000'" }]);
    expect([slots.code, json(slots.stdout).error]).toEqual([2, { type: 'config', message: "--slots must be an integer in [1, 1024], got '0x10'" }]);
    expect([service.code, json(service.stdout).error?.message]).toEqual([2, "--drain-deadline-ms must be an integer in [0, 2147483647], got '9007199254740991'"]);
  });

  it('pair and enroll explain every option their usage line names', async () => {
    for (const command of ['pair', 'enroll']) {
      const r = await cli([command, '--help']);
      expect(r.code).toBe(0);
      const usage = r.stdout.split('\n\n')[0] ?? '';
      const named = [...new Set([...usage.matchAll(/--[a-z-]+/g)].map((m) => m[0]))];
      expect(named.length, command).toBeGreaterThan(3);
      expect(named.filter((flag) => !new RegExp(`^  ${flag}\\b`, 'm').test(r.stdout)), command).toEqual([]);
    }
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
      cli(['start', '--json', '--log-level', 'loud', '--config-dir', tmp()]),
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

  it('no command is a usage error (exit 2); --help and help <command> are not', async () => {
    const [none, noneJson, help, helpDrain, helpBogus] = await Promise.all([cli([]), cli(['--json']), cli(['--help']), cli(['help', 'drain']), cli(['help', 'bogus'])]);
    expect(none.code).toBe(2);
    expect(none.stderr).toContain('no command given');
    expect(none.stderr).toContain('Usage: agentplane-runner <command>');
    expect(none.stdout).toBe('');
    expect(noneJson.code).toBe(2);
    expect(json(noneJson.stdout).error).toEqual({ type: 'usage', message: 'no command given' });
    expect(help.code).toBe(0);
    expect(help.stdout).toContain('Usage: agentplane-runner <command>');
    expect(helpDrain.code).toBe(0);
    expect(helpDrain.stdout).toContain('Usage: agentplane-runner drain');
    expect(helpBogus.code).toBe(2);
  });

  it("an unknown option shows the subcommand's usage, not the top-level one", async () => {
    const [pair, service] = await Promise.all([cli(['pair', '--bogus']), cli(['service', 'status', '--bogus'])]);
    expect(pair.code).toBe(2);
    expect(pair.stderr).toContain("Unknown option '--bogus'");
    expect(pair.stderr).toContain('Usage: agentplane-runner pair');
    expect(pair.stderr).not.toContain('Usage: agentplane-runner <command>');
    expect(service.code).toBe(2);
    expect(service.stderr).toContain('Usage: agentplane-runner service');
  });

  it("each command takes only its own options and words: another command's option is a usage error", async () => {
    const [drainDry, statusSlots, statusWord, startImage] = await Promise.all([
      cli(['drain', '--dry-run', '--config-dir', tmp()]), cli(['status', '--slots', '4', '--config-dir', tmp()]),
      cli(['status', 'extra', '--config-dir', tmp()]), cli(['start', '--help']),
    ]);
    expect([drainDry.code, statusSlots.code, statusWord.code]).toEqual([2, 2, 2]);
    expect(drainDry.stderr).toContain('drain does not take --dry-run');
    expect(drainDry.stderr).toContain('Usage: agentplane-runner drain');
    expect(statusSlots.stderr).toContain('status does not take --slots');
    expect(statusWord.stderr).toContain("status does not take 'extra'");
    expect(startImage.code).toBe(0);
    expect(startImage.stdout).toContain('--image <image>');
    expect(startImage.stdout).toContain('SANDBOX_IMAGE');
  });

  it('refuses --slots 0 and RUNNER_MAX_SLOTS=0 (a runner that takes no work is a drained one)', async () => {
    const [flag, env, help] = await Promise.all([
      cli(['start', '--slots', '0', '--config-dir', tmp(), '--json']),
      cli(['start', '--config-dir', tmp(), '--json'], 90_000, { RUNNER_MAX_SLOTS: '0' }),
      cli(['start', '--help']),
    ]);
    expect(flag.code).toBe(2);
    expect(json(flag.stdout).error).toEqual({ type: 'config', message: "--slots must be an integer in [1, 1024], got '0'" });
    expect(env.code).toBe(2);
    expect(json(env.stdout).error).toEqual({ type: 'config', message: "RUNNER_MAX_SLOTS must be an integer in [1, 1024], got '0'" });
    expect(help.stdout).toContain('1 to 1024');
  });

  it('drain without a daemon answers with the documented error object', async () => {
    const dir = tmp();
    const [j, human] = await Promise.all([cli(['drain', '--json', '--config-dir', dir]), cli(['drain', '--config-dir', dir])]);
    expect(j.code).toBe(1);
    expect(json(j.stdout)).toEqual({ ok: false, running: false, error: { type: 'not_running', message: `no running daemon on ${dir}` } });
    expect(human.code).toBe(1);
    expect(human.stderr).toContain('no running daemon');
  });

  it('service install checks that --user exists; --user is in its help', async () => {
    const dir = tmp();
    saveCredential(dir, credential('http://127.0.0.1:1'));
    const unitDir = tmp();
    const [unknown, help] = await Promise.all([
      cli(['service', 'install', '--user', 'agentplane-no-such-user-7f3a', '--no-systemctl', '--unit-dir', unitDir, '--config-dir', dir, '--json']),
      cli(['service', '--help']),
    ]);
    expect(unknown.code).toBe(2);
    expect(json(unknown.stdout).error?.type).toBe('config');
    expect(json(unknown.stdout).error?.message).toContain("no user 'agentplane-no-such-user-7f3a'");
    expect(readdirSync(unitDir)).toEqual([]);
    expect(help.stdout).toMatch(/^ {2}--user <user> /m);
    expect(help.stdout).toContain('--no-systemctl systemd is not asked');
  });
});

/**
 * A stand-in daemon: counts SIGTERMs and prints `TERM <n>` for each; with `record`, it notes the
 * drain in its state file on the first, as the real daemon does. Lines on stdin ask for the count.
 */
interface FakeDaemon {
  child: ChildProcess;
  /** Resolves when a line matching `re` was printed (or already was). */
  line(re: RegExp): Promise<string>;
  /** How many SIGTERMs it has handled, once it has answered. */
  count(): Promise<number>;
}
const fakes: ChildProcess[] = [];
async function fakeDaemon(dir: string, record: boolean): Promise<FakeDaemon> {
  const script = `
    const fs = require('node:fs');
    const [dir, record] = process.argv.slice(1);
    let n = 0;
    const write = (drain) => {
      fs.writeFileSync(dir + '/state.json.tmp', JSON.stringify({ pid: process.pid, status: 'ready', connected: true, generation: 1,
        base_url: 'http://127.0.0.1:1', runner_id: 'runner_x', last_heartbeat_ack_at: null, reconnect_attempt: 0, drain, updated_at: new Date().toISOString() }));
      fs.renameSync(dir + '/state.json.tmp', dir + '/state.json');
    };
    write(null);
    process.on('SIGTERM', () => { n += 1; if (n === 1 && record === 'record') write('local'); process.stdout.write('TERM ' + n + '\\n'); });
    process.stdin.on('data', () => process.stdout.write('COUNT ' + n + '\\n'));
    process.stdout.write('ready\\n');
    setInterval(() => {}, 1000);`;
  const child = spawn(process.execPath, ['-e', script, dir, record ? 'record' : 'ignore'], { stdio: ['pipe', 'pipe', 'ignore'] });
  fakes.push(child);
  const lines: string[] = [];
  const waiters: Array<{ re: RegExp; done: (l: string) => void }> = [];
  let buf = '';
  child.stdout.setEncoding('utf8').on('data', (d: string) => {
    buf += d;
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      const l = buf.slice(0, i);
      buf = buf.slice(i + 1);
      lines.push(l);
      for (const w of waiters.splice(0)) if (w.re.test(l)) w.done(l); else waiters.push(w);
    }
  });
  const line = (re: RegExp): Promise<string> => {
    const seen = lines.find((l) => re.test(l));
    return seen !== undefined ? Promise.resolve(seen) : new Promise((done) => waiters.push({ re, done }));
  };
  await line(/^ready$/);
  let asked = 0;
  const count = async (): Promise<number> => {
    asked += 1;
    const want = lines.filter((l) => l.startsWith('COUNT ')).length + 1;
    const answered = new Promise<string>((done) => {
      const check = (): void => {
        const answers = lines.filter((l) => l.startsWith('COUNT '));
        if (answers.length >= want) done(answers[want - 1] ?? '');
        else waiters.push({ re: /^COUNT /, done: () => check() });
      };
      check();
    });
    child.stdin.write(`${asked}\n`);
    return Number((await answered).slice('COUNT '.length));
  };
  return { child, line, count };
}

describe('agentplane-runner drain', { timeout: 240_000 }, () => {
  afterAll(() => {
    for (const f of fakes) if (f.exitCode === null && f.signalCode === null) f.kill('SIGKILL');
  });

  it('drain --wait again does not signal a daemon that has not yet noted its drain; --timeout gives up with exit code 1', async () => {
    // A daemon that does not exit (a long Run) and has not written its drain to state.json yet.
    const dir = tmp();
    const d = await fakeDaemon(dir, false);
    const first = await cli(['drain', '--json', '--config-dir', dir]);
    expect(first.code, first.stdout + first.stderr).toBe(0);
    expect(json(first.stdout)).toMatchObject({ ok: true, signalled: true, already_draining: false, exited: false });
    await d.line(/^TERM 1$/);

    const started = Date.now();
    const again = await cli(['drain', '--wait', '--timeout', '1', '--json', '--config-dir', dir], 120_000);
    expect(again.timedOut).toBe(false); // without --timeout it would wait forever
    expect(again.code).toBe(1);
    expect(json(again.stdout)).toMatchObject({ ok: false, signalled: false, already_draining: true, exited: false, timed_out: true });
    expect(Date.now() - started).toBeLessThan(120_000);
    const human = await cli(['drain', '--wait', '--timeout', '0', '--config-dir', dir]);
    expect(human.stdout).toContain('already draining');
    expect(human.stdout).toContain('waits again without signalling it');
    expect(await d.count()).toBe(1);
    expect(d.child.exitCode).toBeNull();

    const bad = await cli(['drain', '--wait', '--timeout', 'soon', '--config-dir', dir]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--timeout must be an integer');
  });

  it('a daemon that noted its drain (systemctl stop, a signal) is not signalled; --cancel escalates', async () => {
    const dir = tmp();
    const d = await fakeDaemon(dir, true);
    d.child.kill('SIGTERM'); // e.g. systemctl stop
    await d.line(/^TERM 1$/);
    expect(loadState(dir)?.drain).toBe('local');
    const r = await cli(['drain', '--json', '--config-dir', dir]);
    expect(r.code).toBe(0);
    expect(json(r.stdout)).toMatchObject({ ok: true, signalled: false, already_draining: true, canceled: false });
    expect(await d.count()).toBe(1);

    const cancel = await cli(['drain', '--cancel', '--json', '--config-dir', dir]);
    expect(cancel.code).toBe(0);
    expect(json(cancel.stdout)).toMatchObject({ ok: true, signalled: false, canceled: true });
    await d.line(/^TERM 2$/);
  });

  it('--cancel on a daemon not draining yet drains it first, then cancels once it took the drain', async () => {
    const dir = tmp();
    const d = await fakeDaemon(dir, true);
    const r = await cli(['drain', '--cancel', '--json', '--config-dir', dir]);
    expect(r.code, r.stdout + r.stderr).toBe(0);
    expect(json(r.stdout)).toMatchObject({ ok: true, signalled: true, canceled: true });
    await d.line(/^TERM 2$/);
    expect(await d.count()).toBe(2);
  });
});

/** `start` for real: no Docker (the process driver), an unreachable control plane (it keeps reconnecting). */
function daemon(dir: string): ChildProcess {
  const child = spawn(process.execPath, [CLI, 'start', '--config-dir', dir, '--log-level', 'error'], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: tmp(), DOCKER_SOCKET: join(tmp(), 'no-docker.sock') }, stdio: ['ignore', 'ignore', 'pipe'],
  });
  fakes.push(child);
  return child;
}
const exitOf = (c: ChildProcess): Promise<number | null> =>
  c.exitCode !== null || c.signalCode !== null ? Promise.resolve(c.exitCode) : new Promise((r) => c.once('exit', (code) => r(code)));
/** Resolves once state.json names the daemon (it is up, its signal handlers set); rejects if it exits first. */
function up(dir: string, c: ChildProcess): Promise<void> {
  return new Promise((resolve, reject) => {
    const watcher = watch(dir);
    const settle = (err?: Error): void => {
      watcher.close();
      c.off('exit', onExit);
      if (err) reject(err);
      else resolve();
    };
    const check = (): void => {
      if (loadState(dir)?.pid === c.pid) settle();
    };
    const onExit = (code: number | null): void => settle(new Error(`daemon exited with ${code}`));
    watcher.on('change', check);
    c.once('exit', onExit);
    check();
  });
}
const kill9 = async (c: ChildProcess): Promise<void> => {
  const gone = exitOf(c);
  c.kill('SIGKILL');
  await gone;
};

describe('agentplane-runner start: one daemon per config dir', { timeout: 240_000 }, () => {
  const held: DaemonLock[] = [];
  afterAll(() => {
    for (const l of held) l.release();
    for (const f of fakes) if (f.exitCode === null && f.signalCode === null) f.kill('SIGKILL');
  });

  it('refuses to start while a live daemon holds the config dir: exit code 3, nothing touched', async () => {
    const dir = tmp();
    saveCredential(dir, credential('http://127.0.0.1:1'));
    const live = await fakeDaemon(tmp(), false);
    const pid = live.child.pid ?? 0;
    held.push(acquireDaemonLock(dir, { pid, start: processStart(pid) }));
    const [j, human] = await Promise.all([cli(['start', '--json', '--config-dir', dir]), cli(['start', '--config-dir', dir])]);
    expect(j.code).toBe(3);
    expect(json(j.stdout)).toMatchObject({ ok: false, pid, error: { type: 'already_running' } });
    expect(human.code).toBe(3);
    expect(human.stderr).toContain(`another runner daemon (pid ${pid}) is running or starting on ${dir}`);
    expect(existsSync(statePath(dir))).toBe(false);
  });

  it('starts after a daemon killed with kill -9 (stale lock), and releases the lock on exit', async () => {
    const dir = tmp();
    saveCredential(dir, credential('http://127.0.0.1:1'));
    const first = daemon(dir);
    await up(dir, first);
    expect(readdirSync(lockDir(dir)).map((n) => n.split(/[-.]/)[0])).toEqual([String(first.pid)]);
    await kill9(first);
    expect(readdirSync(lockDir(dir))).toHaveLength(1); // stale: nobody removed it

    const second = daemon(dir);
    await up(dir, second);
    expect(readdirSync(lockDir(dir)).map((n) => n.split(/[-.]/)[0])).toEqual([String(second.pid)]);
    const exited = exitOf(second);
    second.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(readdirSync(lockDir(dir))).toEqual([]);
  });

  it('of two starts at once, at most one runs; the other exits with code 3', async () => {
    const dir = tmp();
    saveCredential(dir, credential('http://127.0.0.1:1'));
    const both = [daemon(dir), daemon(dir)];
    const outcomes = await Promise.all(both.map((c) => Promise.race([exitOf(c), up(dir, c).then(() => 'running' as const, () => exitOf(c))])));
    expect(outcomes.filter((o) => o === 'running').length).toBeLessThanOrEqual(1);
    for (const o of outcomes) if (o !== 'running') expect(o).toBe(3);
    const running = both.find((_, i) => outcomes[i] === 'running');
    if (running) {
      const exited = exitOf(running);
      running.kill('SIGTERM');
      expect(await exited).toBe(0);
    }
    expect(readdirSync(lockDir(dir))).toEqual([]);
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
      if (req.method === 'POST' && req.url === '/denied/v1/runner-pairings/redeem') {
        res.writeHead(401, { 'content-type': 'application/json' }).end(JSON.stringify({ error: { type: 'auth.invalid_key', message: 'the pairing code is not valid' } }));
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

  it('pair: the control plane refusing is error type api, with its own error kept', async () => {
    const denied = base.replace(/\/agentplane$/, '/denied');
    const [j, human] = await Promise.all([
      cli(['pair', '--code', 'USED-CODE', '--url', denied, '--json', '--config-dir', tmp()]),
      cli(['pair', '--code', 'USED-CODE', '--url', denied, '--config-dir', tmp()]),
    ]);
    expect(j.code).toBe(1);
    expect(json(j.stdout)).toEqual({
      ok: false, status: 401,
      error: {
        type: 'api', message: 'pair failed: HTTP 401 auth.invalid_key: the pairing code is not valid', status: 401,
        api_error: { type: 'auth.invalid_key', message: 'the pairing code is not valid' },
      },
    });
    expect(human.code).toBe(1);
    expect(human.stderr).toContain('pair failed: HTTP 401 auth.invalid_key');
  });
});

describe('prune without a Docker engine', () => {
  it('says the engine does not answer (error type docker_unavailable, exit code 4), with or without --dry-run', async () => {
    const socket = join(tmp(), 'no-docker.sock');
    for (const args of [['prune'], ['prune', '--dry-run']]) {
      const json = await cli([...args, '--json', '--config-dir', tmp()], 30_000, { DOCKER_SOCKET: socket });
      expect(json.code).toBe(4);
      expect(JSON.parse(json.stdout)).toMatchObject({ ok: false, error: { type: 'docker_unavailable', message: expect.stringContaining(`the Docker engine (${socket}) does not answer`) } });
      const human = await cli([...args, '--config-dir', tmp()], 30_000, { DOCKER_SOCKET: socket });
      expect(human.code).toBe(4);
      expect(human.stderr).toContain('start Docker (or fix DOCKER_SOCKET)');
    }
  });
});
