import { execFile, spawnSync } from 'node:child_process';
import { request } from 'node:http';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { SERVICE_VERSION } from '@agentplane/client';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ROOT_DIR } from './harness/platform.js';

/**
 * `docker compose up` of docker/compose.cluster.yaml, offline: the image is built FROM scratch
 * out of this machine's files (`npm run build:image`), then the topology starts under its own
 * project name, subnet and host port: a 3+3 Redis Cluster, two API nodes behind the balancer,
 * two schedulers. Runners stay at scale 0 (their profile is not enabled): they need a pool and a
 * runner key first, and each starts sandboxes through the host's Docker engine. Everything the
 * project created is removed afterwards (`down -v`), whatever happened.
 */
const FILE = join(ROOT_DIR, 'docker/compose.cluster.yaml');
const docker = spawnSync('docker', ['info'], { encoding: 'utf8' }).status === 0;
const plugin = docker && spawnSync('docker', ['compose', 'version'], { encoding: 'utf8' }).status === 0;
const standalone = spawnSync('docker-compose', ['version'], { encoding: 'utf8' }).status === 0;
const available = docker && (plugin || standalone);
const required = process.env.REQUIRE_COMPOSE === '1';

const project = `apcl${process.pid}${Date.now().toString(36)}`;
/** A tag of this run's own, so that a concurrent build of agentplane:local changes nothing here. */
const image = `agentplane:${project}`;
let subnet = '';
let port = 0;

function run(cmd: string, args: string[], timeoutMs: number, env: NodeJS.ProcessEnv = {}): Promise<{ status: number; out: string }> {
  return new Promise((resolve) => {
    execFile('nice', [cmd, ...args], { encoding: 'utf8', timeout: timeoutMs, maxBuffer: 64 * 1024 * 1024, env: { ...process.env, ...env } }, (err, stdout, stderr) => {
      const status = err ? (typeof (err as { code?: unknown }).code === 'number' ? ((err as { code: number }).code) : 1) : 0;
      resolve({ status, out: `${stdout}${stderr}` });
    });
  });
}

function compose(args: string[], timeoutMs = 120_000): Promise<{ status: number; out: string }> {
  const [cmd, pre] = plugin ? ['docker', ['compose']] : ['docker-compose', []];
  return run(cmd, [...pre, '-p', project, '-f', FILE, ...args], timeoutMs, {
    MASTER_KEY: 'ab'.repeat(32),
    AGENTPLANE_SUBNET: subnet,
    AGENTPLANE_PORT: String(port),
    AGENTPLANE_IMAGE: image,
    LOG_LEVEL: 'warn',
  });
}

/** A /24 in 172.28.100-249 that no Docker network uses. */
function freeSubnet(): string {
  const ids = spawnSync('docker', ['network', 'ls', '-q'], { encoding: 'utf8' }).stdout.split('\n').filter(Boolean);
  const used = ids.length
    ? spawnSync('docker', ['network', 'inspect', '--format', '{{range .IPAM.Config}}{{.Subnet}} {{end}}', ...ids], { encoding: 'utf8' }).stdout
    : '';
  const start = process.pid % 150;
  for (let i = 0; i < 150; i++) {
    const prefix = `172.28.${100 + ((start + i) % 150)}`;
    if (!used.includes(`${prefix}.0/`)) return prefix;
  }
  throw new Error('no free 172.28.x.0/24 subnet for the test project');
}

function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once('error', reject);
    server.listen(0, '127.0.0.1', () => {
      const address = server.address();
      server.close(() => resolve(typeof address === 'object' && address ? address.port : 0));
    });
  });
}

/** One request on its own connection (the balancer picks an API node per connection). */
function get(path: string, headers: Record<string, string> = {}): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request({ host: '127.0.0.1', port, path, headers, agent: false, timeout: 5_000 }, (res) => {
      let body = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => (body += chunk));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      res.on('error', reject);
    });
    req.on('timeout', () => req.destroy(new Error('timeout')));
    req.on('error', reject);
    req.end();
  });
}

async function until<T>(what: string, deadlineMs: number, probe: () => Promise<T | undefined>): Promise<T> {
  const deadline = Date.now() + deadlineMs;
  let last: unknown;
  for (;;) {
    try {
      const value = await probe();
      if (value !== undefined) return value;
    } catch (err) {
      last = err;
    }
    if (Date.now() > deadline) throw new Error(`${what} did not happen within ${deadlineMs} ms${last ? ` (last error: ${String(last)})` : ''}`);
    await new Promise((r) => setTimeout(r, 500));
  }
}

describe.skipIf(!available && !required)('docker/compose.cluster.yaml up, offline', () => {
  let started = false;

  beforeAll(async () => {
    expect(available, 'Docker and `docker compose` or `docker-compose` are needed').toBe(true);
    started = true;
    const build = await run(join(ROOT_DIR, 'node_modules/.bin/tsx'), [join(ROOT_DIR, 'docker/image/build.ts'), '--tag', image], 150_000);
    expect(build.status, build.out).toBe(0);
    subnet = freeSubnet();
    port = await freePort();
    const up = await compose(['up', '-d'], 150_000);
    if (up.status !== 0) {
      const logs = await compose(['logs', '--no-color', '--tail', '30']);
      throw new Error(`compose up failed:\n${up.out}\n${logs.out}`);
    }
  }, 300_000);

  afterAll(async () => {
    if (!started) return;
    let down = subnet ? await compose(['down', '-v', '--remove-orphans', '-t', '5'], 120_000) : { status: 0, out: '' };
    // The engine releases a removed container's network endpoint a moment after it answers:
    // a network removed in that moment "has active endpoints". Taken down again, it goes.
    for (let tries = 0; down.status !== 0 && /has active endpoints/.test(down.out) && tries < 5; tries++) {
      await new Promise((r) => setTimeout(r, 1000));
      down = await compose(['down', '-v', '--remove-orphans', '-t', '5'], 60_000);
    }
    // Only this run's tag: the layers stay while another tag (agentplane:local) shares them.
    await run('docker', ['image', 'rm', image], 60_000);
    expect(down.status, down.out).toBe(0);
  }, 150_000);

  it('forms a 3+3 Redis Cluster, runs two schedulers and serves the API through the balancer from both API nodes', async () => {
    // The Redis Cluster formed by cluster-init (`up` waits for it to complete).
    const info = await compose(['exec', '-T', 'redis-1', 'redis-cli', 'cluster', 'info']);
    expect(info.out).toContain('cluster_state:ok');
    expect(info.out).toMatch(/cluster_known_nodes:6\b/);
    expect(info.out).toMatch(/cluster_size:3\b/);

    // Both API nodes answer behind the balancer.
    await until('the balancer answering /healthz', 90_000, async () => ((await get('/healthz')).status === 200 ? true : undefined));
    for (const n of [1, 2]) {
      const direct = await compose(['exec', '-T', `api-${n}`, 'node', '-e', "fetch('http://127.0.0.1:8080/healthz').then(r=>r.text()).then(t=>process.stdout.write(t))"]);
      expect(direct.out, `api-${n}`).toContain('"status":"ok"');
    }

    // Both schedulers are up against the cluster.
    for (const n of [1, 2]) {
      const health = await until(`scheduler-${n} answering /healthz`, 60_000, async () => {
        const r = await compose(['exec', '-T', `scheduler-${n}`, 'node', '-e', "fetch('http://127.0.0.1:9464/healthz').then(r=>process.stdout.write(String(r.status)))"]);
        return r.status === 0 && r.out.includes('200') ? r.out : undefined;
      });
      expect(health).toContain('200');
    }

    // The root key the bootstrap job wrote into the cluster authenticates on every node.
    const key = await until('the bootstrap job printing the root key', 60_000, async () => {
      const logs = await compose(['logs', '--no-color', 'bootstrap']);
      return /\b(ap_key_[A-Za-z0-9_-]+)/.exec(logs.out)?.[1];
    });
    for (let i = 0; i < 4; i++) {
      const caps = await get('/v1/support/capabilities', { authorization: `Bearer ${key}`, 'service-version': SERVICE_VERSION });
      expect(caps.status, caps.body).toBe(200);
      expect((JSON.parse(caps.body) as { data: unknown[] }).data.length).toBeGreaterThan(0);
    }
    const anonymous = await get('/v1/support/capabilities', { 'service-version': SERVICE_VERSION });
    expect(anonymous.status).toBe(401);
  }, 150_000);
});
