import { spawnSync } from 'node:child_process';
import { join } from 'node:path';
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
    expect(full).toContain('redis+cluster://redis-1:6379');
    expect(full).toContain('--cluster-replicas 1');
  });
});
