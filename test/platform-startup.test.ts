import { spawn } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
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
 * restarted forever.
 */
const left = new Leftovers();
afterAll(() => left.cleanUp());

interface Ended { code: number | null; signal: NodeJS.Signals | null; stdout: string; stderr: string }

function platform(env: Record<string, string>): Promise<Ended> {
  const dataDir = mkdtempSync(join(tmpdir(), 'agentplane-startup-'));
  left.dirs.push(dataDir);
  const proc = spawn(process.execPath, [join(ROOT_DIR, 'platform/dist/main.js')], {
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp', DATA_DIR: dataDir, LOG_LEVEL: 'info',
      AGENTPLANE_SANDBOX_SCOPE: `${process.env.AGENTPLANE_SANDBOX_SCOPE ?? 'test'}-startup`, ...env,
    },
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
    ['PORT', 'abc', "agentplane failed to start: PORT must be an integer in [0, 65535], got 'abc'"],
    ['LOG_LEVEL', 'loud', "agentplane failed to start: LOG_LEVEL must be one of fatal, error, warn, info, debug, trace, silent, got 'loud'"],
    ['START_RUNNER', 'maybe', "agentplane failed to start: START_RUNNER must be a boolean, got 'maybe'"],
  ])('%s=%s: the message alone, one line, exit code 2', async (name, value, message) => {
    const r = await platform({ [name]: value });
    expect(r.code).toBe(2);
    expect(r.stderr).toBe(`${message}\n`);
    expect(r.stdout).toBe('');
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
