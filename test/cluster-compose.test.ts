import { spawnSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startEmbeddedRedis } from '@agentplane/store';
import { describe, expect, it } from 'vitest';
import { ROOT_DIR } from './harness/platform.js';

/**
 * docker/compose.cluster.yaml is valid Compose for the tools operators have: `docker compose`
 * (the plugin) or `docker-compose` (Debian's package). CI installs the latter (.ci/run sets
 * REQUIRE_COMPOSE=1): there a missing one fails instead of skipping.
 */
const FILE = join(ROOT_DIR, 'docker/compose.cluster.yaml');
const plugin = spawnSync('docker', ['compose', 'version'], { encoding: 'utf8' }).status === 0;
const standalone = spawnSync('docker-compose', ['version'], { encoding: 'utf8' }).status === 0;
const compose = (args: string[]) => {
  const [cmd, pre] = plugin ? ['docker', ['compose']] : ['docker-compose', []];
  const r = spawnSync(cmd, [...pre, '-f', FILE, ...args], { encoding: 'utf8', env: { ...process.env, MASTER_KEY: '0'.repeat(64) } });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
};

describe('the cluster compose topology', () => {
  it.skipIf(!plugin && !standalone && process.env.REQUIRE_COMPOSE !== '1')('validates and has 3+3 Redis nodes, two API nodes behind a balancer, two schedulers and scalable runners', () => {
    expect(plugin || standalone, 'neither `docker compose` nor `docker-compose` is installed').toBe(true);
    const check = compose(['config', '-q']);
    expect(check.status, check.out).toBe(0);
    const services = compose(['--profile', 'runners', 'config', '--services']).out.split('\n').filter(Boolean).sort();
    expect(services).toEqual(['api-1', 'api-2', 'bootstrap', 'cluster-init', 'lb', 'redis-1', 'redis-2', 'redis-3', 'redis-4', 'redis-5', 'redis-6', 'runner', 'scheduler-1', 'scheduler-2']);
    const full = compose(['config']).out;
    // Built here, never pulled: every service uses the local image.
    expect(full.match(/image: (.+)/g)?.every((l) => l === 'image: agentplane:local')).toBe(true);
    expect(full).not.toMatch(/^\s+build:/m);
    expect(full.match(/pull_policy: (.+)/g)?.length).toBe(full.match(/image: /g)?.length);
    expect(full.match(/pull_policy: (.+)/g)?.every((l) => l === 'pull_policy: never')).toBe(true);
    expect(full).toContain('redis+cluster://redis-1:6379');
    expect(full).toContain('--cluster-replicas 1');
  });
});

describe('the single-node compose file', () => {
  it.skipIf(!plugin && !standalone && process.env.REQUIRE_COMPOSE !== '1')('validates and pulls nothing outside the observability profile', () => {
    const [cmd, pre] = plugin ? ['docker', ['compose']] : ['docker-compose', []];
    const r = spawnSync(cmd, [...pre, '-f', join(ROOT_DIR, 'docker/compose.yaml'), 'config'], { encoding: 'utf8', env: { ...process.env, MASTER_KEY: '0'.repeat(64) } });
    expect(r.status, r.stderr).toBe(0);
    expect(r.stdout).not.toMatch(/^\s+build:/m);
    const services = (r.stdout.split(/^services:\n/m)[1] ?? '').split(/^\S/m)[0]?.split(/^ {2}(?=\S)/m).filter(Boolean) ?? [];
    expect(services.length).toBeGreaterThan(3);
    for (const service of services) {
      if (/profiles:\s*\n\s*- observability/.test(service)) continue;
      expect(service, service).toMatch(/image: agentplane:local\n/);
      expect(service, service).toMatch(/pull_policy: never/);
    }
  });
});

describe('platform --bootstrap-only', () => {
  it('boots a shared Redis once (Organization, Workspace, root key) and exits; a second run finds it booted', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'bootstrap-only-'));
    const redis = await startEmbeddedRedis({ dir: join(dir, 'redis') });
    try {
      const run = (dataDir: string) => spawnSync(process.execPath, [join(ROOT_DIR, 'platform/dist/main.js'), '--bootstrap-only'], {
        encoding: 'utf8', timeout: 60_000, env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: dir, DATA_DIR: dataDir, REDIS_URL: redis.url, LOG_LEVEL: 'warn' },
      });
      const first = run(join(dir, 'a'));
      expect(first.status, first.stderr).toBe(0);
      expect(first.stderr).toContain('root API key');
      expect(JSON.parse(readFileSync(join(dir, 'a', 'bootstrap.json'), 'utf8'))).toMatchObject({ root_key: expect.stringMatching(/^ap_key_/) });
      const second = run(join(dir, 'b'));
      expect(second.status, second.stderr).toBe(0);
      expect(second.stderr).not.toContain('root API key');
      const refused = spawnSync(process.execPath, [join(ROOT_DIR, 'platform/dist/main.js'), '--bootstrap-only'], { encoding: 'utf8', env: { PATH: process.env.PATH ?? '', DATA_DIR: join(dir, 'c') } });
      expect(refused.status).toBe(2);
    } finally {
      await redis.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
