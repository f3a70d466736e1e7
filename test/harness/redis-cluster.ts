/**
 * A throwaway Redis Cluster on loopback: six `redis-server --cluster-enabled yes` (3 masters,
 * 3 replicas, `redis-cli --cluster create --cluster-replicas 1`), password-protected, no
 * persistence. Starts in a few seconds; `url` is the platform's cluster form of REDIS_URL.
 */
import { spawnSync, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { spawnOwned } from './spawn.js';

export interface ClusterNodeInfo {
  port: number;
  id: string;
  role: 'master' | 'slave';
  /** For a replica, the id of its master. */
  masterId: string | null;
  /** Slot ranges this node serves (masters). */
  slots: [number, number][];
  /** Flagged fail or fail? by the node asked. */
  failed: boolean;
}

export interface RedisClusterHandle {
  /** `redis+cluster://:<password>@127.0.0.1:<p1>,...` (every node). */
  url: string;
  password: string;
  ports: number[];
  /** A plain connection to one node (no cluster redirection). */
  node(port: number): Redis;
  /** CLUSTER NODES, parsed (asked of any live node). */
  nodes(): Promise<ClusterNodeInfo[]>;
  /** The port of the master that serves `key`'s slot. */
  masterOf(key: string): Promise<number>;
  /** The live replica of the master on `port`, if it has one. */
  replicaOf(port: number): Promise<number | undefined>;
  /** Pause (SIGSTOP) or resume (SIGCONT) one node's process. */
  pause(port: number, paused: boolean): void;
  /** kill -9 one node. */
  kill(port: number): Promise<void>;
  /** Start a killed node again on its port and node file: it rejoins (a failed-over master as a replica). */
  restart(port: number): Promise<void>;
  /** Wait until every live node says cluster_state:ok and sees the same slot owners, and every replica is in sync. */
  waitHealthy(timeoutMs?: number): Promise<void>;
  stop(): Promise<void>;
}

const bindable = (port: number): Promise<boolean> => new Promise((resolve) => {
  const s = createServer();
  s.once('error', () => resolve(false));
  s.listen(port, '127.0.0.1', () => s.close(() => resolve(true)));
});

/** Six ports p whose cluster bus ports p + 10000 are free too (kept below the ephemeral range). */
async function clusterPorts(n: number): Promise<number[]> {
  const out: number[] = [];
  for (let tries = 0; out.length < n && tries < 500; tries++) {
    const p = 20_000 + Math.floor(Math.random() * 2_700);
    if (out.includes(p)) continue;
    if ((await bindable(p)) && (await bindable(p + 10_000))) out.push(p);
  }
  if (out.length < n) throw new Error('no free loopback ports for a Redis Cluster');
  return out;
}

export function redisClusterAvailable(): boolean {
  return spawnSync('redis-server', ['--version']).status === 0 && spawnSync('redis-cli', ['--version']).status === 0;
}

export async function startRedisCluster(options: { nodeTimeoutMs?: number } = {}): Promise<RedisClusterHandle> {
  const dir = mkdtempSync(join(tmpdir(), 'redis-cluster-'));
  const password = randomBytes(16).toString('hex');
  const ports = await clusterPorts(6);
  const procs = new Map<number, ChildProcess>();
  const clients: Redis[] = [];
  const launch = (port: number): void => {
    const nodeDir = join(dir, String(port));
    mkdirSync(nodeDir, { recursive: true });
    const conf = [
      `port ${port}`, 'bind 127.0.0.1', 'protected-mode yes', `dir "${nodeDir}"`,
      'cluster-enabled yes', `cluster-config-file nodes-${port}.conf`, `cluster-node-timeout ${options.nodeTimeoutMs ?? 2000}`,
      // A replica takes over however far behind it is (the tests measure what that loses).
      'cluster-replica-validity-factor 0',
      'appendonly no', 'save ""', 'hz 100', 'daemonize no', 'logfile ""',
      `requirepass "${password}"`, `masterauth "${password}"`,
    ].join('\n');
    const child = spawnOwned('redis-server', ['-'], { stdio: ['pipe', 'ignore', 'ignore'] });
    child.stdin?.end(`${conf}\n`);
    procs.set(port, child);
  };
  for (const port of ports) launch(port);
  const node = (port: number): Redis => {
    const c = new Redis({ host: '127.0.0.1', port, password, lazyConnect: false, maxRetriesPerRequest: 1, retryStrategy: () => null });
    c.on('error', () => undefined);
    clients.push(c);
    return c;
  };
  const stop = async (): Promise<void> => {
    for (const c of clients) c.disconnect();
    await Promise.all([...procs.values()].map((p) => new Promise<void>((resolve) => {
      if (p.exitCode !== null || p.signalCode !== null) return resolve();
      p.once('exit', () => resolve());
      p.kill('SIGKILL');
    })));
    rmSync(dir, { recursive: true, force: true });
  };
  const anyLive = (): number => {
    const port = ports.find((p) => { const c = procs.get(p); return c && c.exitCode === null && c.signalCode === null; });
    if (port === undefined) throw new Error('no live cluster node');
    return port;
  };
  const parse = (text: string): ClusterNodeInfo[] => text.trim().split('\n').map((line) => {
    const f = line.split(' ');
    const flags = f[2] ?? '';
    return {
      id: f[0] ?? '',
      port: Number((f[1] ?? '').split('@')[0]?.split(':')[1]),
      role: flags.includes('master') ? 'master' : 'slave',
      failed: flags.includes('fail'),
      masterId: f[3] && f[3] !== '-' ? f[3] : null,
      slots: f.slice(8).filter((s) => /^\d+(-\d+)?$/.test(s)).map((s) => {
        const [a, b] = s.split('-').map(Number);
        return [a!, b ?? a!] as [number, number];
      }),
    };
  });
  const handle: RedisClusterHandle = {
    url: `redis+cluster://:${password}@${ports.map((p) => `127.0.0.1:${p}`).join(',')}`,
    password,
    ports,
    node,
    async nodes() {
      const c = new Redis({ host: '127.0.0.1', port: anyLive(), password, maxRetriesPerRequest: 1, retryStrategy: () => null });
      c.on('error', () => undefined);
      try { return parse(String(await c.call('CLUSTER', 'NODES'))); } finally { c.disconnect(); }
    },
    async masterOf(key: string) {
      const c = new Redis({ host: '127.0.0.1', port: anyLive(), password, maxRetriesPerRequest: 1, retryStrategy: () => null });
      c.on('error', () => undefined);
      try {
        const slot = Number(await c.call('CLUSTER', 'KEYSLOT', key));
        const owner = parse(String(await c.call('CLUSTER', 'NODES'))).find((n) => n.role === 'master' && !n.failed && n.slots.some(([a, b]) => slot >= a && slot <= b));
        if (!owner) throw new Error(`no master serves slot ${slot}`);
        return owner.port;
      } finally { c.disconnect(); }
    },
    async replicaOf(port: number) {
      const all = await handle.nodes();
      const master = all.find((n) => n.port === port);
      return all.find((n) => n.role === 'slave' && !n.failed && master && n.masterId === master.id)?.port;
    },
    pause(port: number, paused: boolean) {
      procs.get(port)?.kill(paused ? 'SIGSTOP' : 'SIGCONT');
    },
    async kill(port: number) {
      const p = procs.get(port);
      if (!p || p.exitCode !== null || p.signalCode !== null) return;
      const gone = new Promise<void>((resolve) => p.once('exit', () => resolve()));
      p.kill('SIGKILL');
      await gone;
    },
    async restart(port: number) {
      launch(port);
      const deadline = Date.now() + 15_000;
      for (;;) {
        const r = spawnSync('redis-cli', ['-p', String(port), '--no-auth-warning', '-a', password, 'ping'], { encoding: 'utf8' });
        if (r.stdout.trim() === 'PONG') return;
        if (Date.now() > deadline) throw new Error(`cluster node ${port} did not restart`);
        await new Promise((res) => setTimeout(res, 50));
      }
    },
    async waitHealthy(timeoutMs = 30_000) {
      const deadline = Date.now() + timeoutMs;
      for (;;) {
        const live = ports.filter((p) => { const c = procs.get(p); return c && c.exitCode === null && c.signalCode === null; });
        let ok = true;
        for (const port of live) {
          const c = new Redis({ host: '127.0.0.1', port, password, maxRetriesPerRequest: 1, retryStrategy: () => null, lazyConnect: true });
          c.on('error', () => undefined);
          try {
            await c.connect();
            const info = String(await c.call('CLUSTER', 'INFO'));
            if (!info.includes('cluster_state:ok') || !/cluster_slots_ok:16384/.test(info)) ok = false;
            // A replica (a restarted master rejoins as one) counts once it has synced: until then
            // appends that wait for a replica are refused.
            const replication = String(await c.call('INFO', 'replication'));
            if (replication.includes('role:slave') && !replication.includes('master_link_status:up')) ok = false;
          } catch {
            ok = false;
          } finally {
            c.disconnect();
          }
          if (!ok) break;
        }
        if (ok) return;
        if (Date.now() > deadline) throw new Error('the Redis Cluster did not become healthy');
        await new Promise((r) => setTimeout(r, 100));
      }
    },
    stop,
  };
  try {
    // Every node answers PING before the cluster is formed.
    const deadline = Date.now() + 15_000;
    for (const port of ports) {
      for (;;) {
        const r = spawnSync('redis-cli', ['-p', String(port), '--no-auth-warning', '-a', password, 'ping'], { encoding: 'utf8' });
        if (r.stdout.trim() === 'PONG') break;
        if (Date.now() > deadline) throw new Error(`cluster node ${port} did not start`);
        await new Promise((res) => setTimeout(res, 50));
      }
    }
    const create = spawnSync('redis-cli', [
      '--no-auth-warning', '-a', password, '--cluster', 'create', ...ports.map((p) => `127.0.0.1:${p}`), '--cluster-replicas', '1', '--cluster-yes',
    ], { encoding: 'utf8', timeout: 30_000 });
    if (create.status !== 0) throw new Error(`redis-cli --cluster create failed: ${create.stdout}${create.stderr}`);
    await handle.waitHealthy();
    // Replicas attached and in sync, so a failover has someone to promote.
    await waitReplicas(handle);
  } catch (err) {
    await stop();
    throw err;
  }
  return handle;
}

async function waitReplicas(c: RedisClusterHandle, timeoutMs = 20_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const nodes = await c.nodes();
    const masters = nodes.filter((n) => n.role === 'master' && !n.failed && n.slots.length > 0);
    let synced = 0;
    for (const n of nodes.filter((x) => x.role === 'slave' && !x.failed)) {
      const r = c.node(n.port);
      const info = String(await r.info('replication').catch(() => ''));
      r.disconnect();
      if (/master_link_status:up/.test(info)) synced++;
    }
    if (masters.length === 3 && synced === 3) return;
    if (Date.now() > deadline) throw new Error('cluster replicas did not come in sync');
    await new Promise((r) => setTimeout(r, 100));
  }
}
