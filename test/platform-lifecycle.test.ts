import { readFileSync, statSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { spawn } from 'node:child_process';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import { ROOT_DIR, startPlatform, waitFor } from './harness/platform.js';

const dataDir = mkdtempSync(join(tmpdir(), 'agentplane-lifecycle-'));

/** The addresses the platform's own connections (named `agentplane:…`) come from. */
async function platformClientAddresses(url: string): Promise<Set<string>> {
  const r = new Redis(url);
  try {
    const list = (await r.client('LIST')) as string;
    const named = list.split('\n').filter((l) => / name=agentplane:/.test(l));
    expect(named.length).toBeGreaterThan(3);
    return new Set(named.map((l) => /addr=(\S+)/.exec(l)?.[1] ?? '?'));
  } finally {
    r.disconnect();
  }
}
afterAll(() => rmSync(dataDir, { recursive: true, force: true }));

describe('npm start life cycle', () => {
  it('first boot writes bootstrap.json 0600 and prints the key once; a restart reuses the store and prints nothing', async () => {
    const first = await startPlatform({ dataDir });
    const file = join(dataDir, 'bootstrap.json');
    expect(statSync(file).mode & 0o777).toBe(0o600);
    const boot = JSON.parse(readFileSync(file, 'utf8')) as { root_key: string; organization_id: string; base_url: string };
    expect(boot.base_url).toBe(first.baseUrl);
    await waitFor('the key in the log', () => (readFileSync(first.logFile, 'utf8').includes(boot.root_key) ? true : undefined));
    const principal = await first.root.post<{ id: string }>(`/v1/organizations/workspaces/${first.bootstrap.workspace_id}/principals`, {
      external_subject_id: 'survivor', principal_type: 'person', display_name: 'Survivor',
    });
    // The platform's processes reach the embedded Redis by its Unix socket, which only this user may open.
    const socket = join(dataDir, 'redis', 'redis.sock');
    expect(statSync(socket).isSocket()).toBe(true);
    expect(statSync(socket).mode & 0o777).toBe(0o700);
    expect(await platformClientAddresses(first.redisUrl())).toEqual(new Set([`${socket}:0`]));
    await first.stop();
    expect(first.proc.exitCode).toBe(0);
    const before = readFileSync(file, 'utf8');

    // REDIS_SOCKET=false: over loopback TCP instead.
    const second = await startPlatform({ dataDir, env: { REDIS_SOCKET: 'false' } });
    expect([...(await platformClientAddresses(second.redisUrl()))].every((a) => a.startsWith('127.0.0.1:'))).toBe(true);
    expect(readFileSync(file, 'utf8')).toBe(before);
    // The AOF kept everything: same org, same principal, same key.
    const again = await second.root.get<{ id: string }>(`/v1/principals/${principal.id}`);
    expect(again.id).toBe(principal.id);
    expect(readFileSync(second.logFile, 'utf8')).not.toContain(boot.root_key);
    await second.stop();
  });

  it('prints --help and says how to install redis-server when it is missing', async () => {
    const help = spawn(process.execPath, [join(ROOT_DIR, 'platform/dist/main.js'), '--help']);
    let out = '';
    help.stdout.on('data', (d: Buffer) => (out += d.toString()));
    await new Promise((r) => help.once('exit', r));
    expect(out).toContain('DATA_DIR');

    const dir = mkdtempSync(join(tmpdir(), 'agentplane-noredis-'));
    const proc = spawn(process.execPath, [join(ROOT_DIR, 'platform/dist/main.js')], {
      env: { PATH: '/nonexistent', DATA_DIR: dir, HOME: dir },
    });
    let err = '';
    proc.stderr.on('data', (d: Buffer) => (err += d.toString()));
    const code = await new Promise((r) => proc.once('exit', r));
    expect(code).toBe(2);
    expect(err).toContain('apt-get install -y redis-server');
    rmSync(dir, { recursive: true, force: true });
  });

  it('restarts a crashed API process (kill -9) and keeps serving', async () => {
    const p = await startPlatform();
    const before = p.pids().api;
    expect(before).toBeGreaterThan(0);
    process.kill(before as number, 'SIGKILL');
    await waitFor('a new api process', () => {
      const now = p.pids().api;
      return now && now !== before ? now : undefined;
    });
    await waitFor('the api to answer again', async () => {
      try {
        return (await p.root.request('GET', '/v1/support/capabilities')).status === 200 ? true : undefined;
      } catch {
        return undefined;
      }
    });
    await p.stop();
  });
});
