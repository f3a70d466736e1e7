import { once } from 'node:events';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { ChildProcess } from 'node:child_process';
import { afterAll, describe, expect, it } from 'vitest';
import { freePort } from '@agentplane/store';
import { ROOT_DIR } from './harness/platform.js';
import { spawnOwned } from './harness/spawn.js';

/**
 * An api started before its Redis answers (a shared Redis still starting, or restarting, under a
 * service manager that starts both at once) waits for it instead of crashing at its first
 * command; once Redis answers it is ready, its runner gateway subscribed. It used to exit on an
 * unheard rejection of the gateway's first subscription, after a few hundred raw error dumps.
 */
const children: ChildProcess[] = [];
const dirs: string[] = [];
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** Resolves once the child's stdout has a line matching `pattern`; rejects if it exits first. */
function logged(child: ChildProcess, lines: string[], pattern: RegExp, timeoutMs = 60_000): Promise<void> {
  return new Promise((resolve, reject) => {
    const check = (): boolean => lines.some((l) => pattern.test(l));
    if (check()) return resolve();
    const timer = setTimeout(() => done(new Error(`no log line matching ${String(pattern)} within ${timeoutMs} ms`)), timeoutMs);
    const onData = (): void => void (check() && done());
    const onExit = (code: number | null): void => done(new Error(`exited with ${code} before logging ${String(pattern)}`));
    const done = (err?: Error): void => {
      clearTimeout(timer);
      child.stdout?.off('data', onData);
      child.off('exit', onExit);
      if (err) reject(err);
      else resolve();
    };
    child.stdout?.on('data', onData);
    child.once('exit', onExit);
  });
}

describe('an api whose Redis answers only after it started', () => {
  it('waits for Redis, then serves, its gateway subscribed; nothing raw on stderr', async () => {
    const [redisPort, apiPort] = [await freePort(), await freePort()];
    const api = spawnOwned(process.execPath, [join(ROOT_DIR, 'api/dist/main.js')], {
      env: { PATH: process.env.PATH, REDIS_URL: `redis://127.0.0.1:${redisPort}`, MASTER_KEY: '0'.repeat(64), PORT: String(apiPort), LOG_LEVEL: 'info' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    children.push(api);
    const lines: string[] = [];
    let stderr = '';
    api.stdout?.setEncoding('utf8').on('data', (d: string) => lines.push(...d.split('\n')));
    api.stderr?.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    await logged(api, lines, /"msg":"api listening"/);
    // Its first subscription gave up (Redis refuses connections): the api stays up.
    await logged(api, lines, /"msg":"gateway not subscribed yet: subscribing once Redis answers"/);
    expect((await fetch(`http://127.0.0.1:${apiPort}/readyz`)).status).toBe(503);

    const dir = mkdtempSync(join(tmpdir(), 'redis-late-'));
    dirs.push(dir);
    const redis = spawnOwned('redis-server', ['--port', String(redisPort), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir], { stdio: 'ignore' });
    children.push(redis);
    await logged(api, lines, /"msg":"gateway subscriber replaced: checking open connections against stored state"/);
    for (;;) {
      const r = await fetch(`http://127.0.0.1:${apiPort}/readyz`);
      if (r.status === 200) break;
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    expect(api.exitCode).toBeNull();
    expect(stderr).toBe('');
    api.kill('SIGTERM');
    const [code] = (await once(api, 'exit')) as [number | null];
    expect(code).toBe(0);
  }, 120_000);
});
