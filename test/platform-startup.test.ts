import { spawn } from 'node:child_process';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '@agentplane/store';
import { ROOT_DIR } from './harness/platform.js';
import { alive, Leftovers } from './harness/processes.js';

/**
 * `npm start` that cannot start: a bad setting is one line and exit code 2; an API that cannot
 * listen (its port in use) stops the platform with a fatal line naming it, instead of being
 * restarted forever. The api, the scheduler and the gateway run on their own say a bad setting
 * the same way: one line, exit code 2.
 */
const left = new Leftovers();
afterAll(() => left.cleanUp());

interface Ended { code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }

function platform(env: Record<string, string>): Promise<Ended> {
  const dataDir = mkdtempSync(join(tmpdir(), 'agentplane-startup-'));
  left.dirs.push(dataDir);
  return run('platform/dist/main.js', {
    HOME: process.env.HOME ?? '/tmp', DATA_DIR: dataDir, LOG_LEVEL: 'info',
    AGENTPLANE_SANDBOX_SCOPE: `${process.env.AGENTPLANE_SANDBOX_SCOPE ?? 'test'}-startup`, ...env,
  });
}

/** Runs one entry point with only `env` (and PATH) to its end. */
function run(script: string, env: Record<string, string>): Promise<Ended> {
  const proc = spawn(process.execPath, [join(ROOT_DIR, script)], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  if (proc.pid) left.pids.push(proc.pid);
  let stdout = '';
  let stderr = '';
  proc.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
  proc.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
  return new Promise((done) => proc.once('close', (code, signal) => done({ code, signal, stdout, stderr })));
}

describe('npm start that cannot start', () => {
  it.each([
    ['PORT', 'abc', "agentplane failed to start: PORT must be an integer in [1, 65535], got 'abc'"],
    // An ephemeral port cannot be handed to the local runner and the bootstrap file before the API listens.
    ['PORT', '0', "agentplane failed to start: PORT must be an integer in [1, 65535], got '0'"],
    ['LOG_LEVEL', 'loud', "agentplane failed to start: LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent, got 'loud'"],
    ['START_RUNNER', 'maybe', "agentplane failed to start: START_RUNNER must be a boolean, got 'maybe'"],
    ['REDIS_URL', 'redis://127.0.0.1:abc', 'agentplane failed to start: REDIS_URL is not a URL: redis://[:password@]host:port, unix:///path/to/redis.sock or redis+cluster://host:port,host:port'],
  ])('%s=%s: the message alone, one line, exit code 2', async (name, value, message) => {
    const r = await platform({ [name]: value });
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(`${message}\n`);
    expect(r.stdout).toBe('');
  }, 30_000);

  it('the outbound address guard\'s setting and its deprecated alias disagreeing: one line naming both, exit code 2', async () => {
    const r = await platform({ EGRESS_ALLOW_PRIVATE_NETWORKS: 'false', WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'true' });
    expect(r.code).toBe(2);
    expect(r.stderr).toBe("agentplane failed to start: EGRESS_ALLOW_PRIVATE_NETWORKS='false' and its deprecated alias WEBHOOK_ALLOW_PRIVATE_NETWORKS='true' disagree; set EGRESS_ALLOW_PRIVATE_NETWORKS only\n");
    expect(r.stdout).toBe('');
  }, 30_000);

  it('a data directory it cannot write: one line naming the path and why, exit code 1, no stack', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'agentplane-startup-'));
    left.dirs.push(dir);
    const file = join(dir, 'a-file');
    writeFileSync(file, 'x');
    const r = await platform({ DATA_DIR: join(file, 'data') });
    expect(r.code).toBe(1);
    expect(r.stderr).toBe(`agentplane failed to start: cannot write ${join(file, 'data')} (ENOTDIR: a part of the path is not a directory); fix that and start again\n`);
  }, 30_000);

  it('the API\'s port in use: the platform stops, with a fatal line naming the api and its error, exit code 1', async () => {
    const port = await freePort();
    const taken: Server = createServer();
    await new Promise<void>((r) => taken.listen(port, '127.0.0.1', r));
    try {
      const r = await platform({ PORT: String(port), START_RUNNER: 'false', START_SCHEDULER: 'false' });
      expect(r.code).toBe(1);
      const lines = r.stdout.split('\n').filter(Boolean).map((l) => JSON.parse(l) as { level: number; msg: string } & Record<string, unknown>);
      const fatal = lines.filter((l) => l.level === 60);
      expect(fatal).toHaveLength(1);
      expect(fatal[0]).toMatchObject({ child: 'api', code: 1, error: expect.stringContaining('EADDRINUSE') });
      expect(fatal[0]?.msg).toMatch(/^the api process exited before it was ready: .*EADDRINUSE.*; stopping the platform$/);
      // It was started once, never again, and the platform stopped what it had started.
      expect(lines.filter((l) => l.msg === 'platform process exited')).toHaveLength(1);
      expect(lines.some((l) => l.msg === 'platform stopped' && l.code === 1)).toBe(true);
      expect(r.stderr).toContain('api failed to start: listen EADDRINUSE');
      const redis = lines.find((l) => l.msg === 'stopping the embedded redis-server');
      expect(redis).toBeDefined();
      for (const pid of left.pids) expect(alive(pid)).toBe(false);
    } finally {
      await new Promise((r) => taken.close(r));
    }
  }, 90_000);
});

describe('the api, the scheduler and the gateway run on their own, with a bad setting', () => {
  // Never reached: each refuses its settings before it connects.
  const redis = { REDIS_URL: 'redis://127.0.0.1:1' };
  const key = { MASTER_KEY: '0'.repeat(64) };
  it.each([
    ['api', 'PORT=abc', { PORT: 'abc' }, "PORT must be an integer in [0, 65535], got 'abc'"],
    ['api', 'LOG_LEVEL=loud', { ...redis, ...key, LOG_LEVEL: 'loud' }, "LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent, got 'loud'"],
    ['api', 'LEASE_MS=soon', { ...redis, ...key, LEASE_MS: 'soon' }, "LEASE_MS must be an integer in [2000, 2147483647], got 'soon'"],
    ['api', 'a MASTER_KEY_FILE that is not there', { ...redis, MASTER_KEY_FILE: '/nonexistent/master.key' }, 'MASTER_KEY_FILE cannot be read: ENOENT'],
    ['api', 'EGRESS_ALLOW_PRIVATE_NETWORKS and its alias disagreeing', { ...redis, ...key, EGRESS_ALLOW_PRIVATE_NETWORKS: 'true', WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'no' },
      "EGRESS_ALLOW_PRIVATE_NETWORKS='true' and its deprecated alias WEBHOOK_ALLOW_PRIVATE_NETWORKS='no' disagree; set EGRESS_ALLOW_PRIVATE_NETWORKS only"],
    ['scheduler', 'SCHEDULER_PORT=abc', { ...redis, SCHEDULER_PORT: 'abc' }, "SCHEDULER_PORT must be an integer in [0, 65535], got 'abc'"],
    ['scheduler', 'LEASE_MS=soon', { ...redis, LEASE_MS: 'soon' }, "LEASE_MS must be an integer in [2000, 2147483647], got 'soon'"],
    ['gateway', 'PORT=abc', { ...redis, PORT: 'abc' }, "PORT must be an integer in [0, 65535], got 'abc'"],
    ['api', 'PUBLIC_BASE_URL that is not a URL', { ...redis, ...key, PUBLIC_BASE_URL: 'notaurl' }, "PUBLIC_BASE_URL must be an http or https URL without query, fragment or credentials (e.g. https://agents.example.com), got 'notaurl'"],
    ['api', 'REDIS_URL that is not a URL', { REDIS_URL: 'redis://127.0.0.1:abc', ...key }, 'REDIS_URL is not a URL: redis://[:password@]host:port'],
    ['scheduler', 'REDIS_URL of another scheme', { REDIS_URL: 'http://127.0.0.1:6379' }, "REDIS_URL: unknown scheme 'http:'"],
    ['scheduler', 'REDIS_URL=unix://', { REDIS_URL: 'unix://' }, 'REDIS_URL: a Unix socket URL needs an absolute path'],
    ['gateway', 'REDIS_URL with a word for its database', { REDIS_URL: 'redis://127.0.0.1:6379/zero' }, 'REDIS_URL: the path is a database number'],
    ['gateway', 'LOG_LEVEL=loud', { ...redis, LOG_LEVEL: 'loud' }, "LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent, got 'loud'"],
  ] as const)('%s with %s: one line naming the setting, exit code 2', async (name, _label, env, message) => {
    const r = await run(`${name}/dist/main.js`, env);
    expect(r.code).toBe(2);
    expect(r.stdout).toBe('');
    expect(r.stderr.endsWith('\n')).toBe(true);
    expect(r.stderr.split('\n')).toHaveLength(2);
    expect(r.stderr).toContain(`${name} failed to start: ${message}`);
  }, 30_000);
});
