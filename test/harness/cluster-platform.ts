/**
 * A multi-node platform on a Redis Cluster: `startPlatform()` (bootstrap, its API node and
 * scheduler) with REDIS_URL pointing at the cluster, plus further API nodes and schedulers started
 * as their own processes on the same cluster and master key, as an operator runs them.
 */
import type { ChildProcess } from 'node:child_process';
import { createWriteStream, readFileSync } from 'node:fs';
import { connect, createServer, type Socket } from 'node:net';
import { join } from 'node:path';
import { HttpClient } from '@agentplane/client';
import { freePort } from '@agentplane/store';
import { ROOT_DIR, waitFor, type Platform } from './platform.js';
import { spawnOwned } from './spawn.js';

export interface NodeProcess {
  name: string;
  proc: ChildProcess;
  logFile: string;
  /** kill -9 and wait for the exit. */
  kill(): Promise<void>;
  /** SIGTERM (SIGKILL after 15 s) and wait for the exit. */
  stop(): Promise<void>;
}

export interface ApiNode extends NodeProcess {
  port: number;
  baseUrl: string;
  root: HttpClient;
}

function spawnNode(name: string, script: string, env: Record<string, string>, logDir: string): NodeProcess {
  const logFile = join(logDir, `${name}-${Date.now()}.log`);
  const log = createWriteStream(logFile);
  const proc = spawnOwned(process.execPath, [script], {
    env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp', LOG_LEVEL: process.env.TEST_LOG_LEVEL ?? 'info', ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  proc.stdout?.pipe(log);
  proc.stderr?.pipe(log);
  const exited = new Promise<void>((r) => proc.once('exit', () => r()));
  const alive = () => proc.exitCode === null && proc.signalCode === null;
  return {
    name,
    proc,
    logFile,
    async kill() {
      if (alive()) proc.kill('SIGKILL');
      await exited;
      log.end();
    },
    async stop() {
      if (alive()) {
        proc.kill('SIGTERM');
        const t = setTimeout(() => proc.kill('SIGKILL'), 15_000);
        await exited;
        clearTimeout(t);
      }
      log.end();
    },
  };
}

/** The environment every node of this platform shares (cluster URL, master key, data dir). */
export function nodeEnv(p: Platform, redisUrl: string, extra: Record<string, string> = {}): Record<string, string> {
  return { REDIS_URL: redisUrl, MASTER_KEY_FILE: join(p.dataDir, 'master.key'), DATA_DIR: p.dataDir, ...extra };
}

/**
 * One more API node (with its embedded runner gateway) on the platform's Redis. A port taken by
 * another process of the run before the node listened (EADDRINUSE) is replaced by a fresh one,
 * three tries at most, as `startPlatform` does.
 */
export async function startApiNode(p: Platform, redisUrl: string, name: string, extra: Record<string, string> = {}): Promise<ApiNode> {
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    const baseUrl = `http://127.0.0.1:${port}`;
    const node = spawnNode(name, join(ROOT_DIR, 'api/dist/main.js'), nodeEnv(p, redisUrl, { PORT: String(port), HOST: '127.0.0.1', PUBLIC_BASE_URL: baseUrl, ...extra }), p.dataDir);
    const root = new HttpClient({ baseUrl, token: p.bootstrap.root_key });
    let portTaken = false;
    try {
      await waitFor(`API node ${name}`, async () => {
        if (node.proc.exitCode !== null) {
          const text = readFileSync(node.logFile, 'utf8');
          portTaken = text.includes(`EADDRINUSE: address already in use 127.0.0.1:${port}`);
          throw new Error(`${name} exited with ${node.proc.exitCode}: ${text.slice(-2000)}`);
        }
        try {
          // Bounded: whatever else holds the port (the node could not listen) may never answer.
          return (await root.request('GET', '/v1/support/capabilities', { signal: AbortSignal.timeout(5_000) })).status === 200 ? true : undefined;
        } catch {
          return undefined;
        }
      }, 60_000);
    } catch (err) {
      await node.kill();
      if (portTaken && attempt < 3) continue;
      throw err;
    }
    return { ...node, port, baseUrl, root };
  }
}

/** One more scheduler on the platform's Redis. */
export function startSchedulerNode(p: Platform, redisUrl: string, name: string, extra: Record<string, string> = {}): NodeProcess {
  return spawnNode(name, join(ROOT_DIR, 'scheduler/dist/main.js'), nodeEnv(p, redisUrl, { SCHEDULER_PORT: '0', ...extra }), p.dataDir);
}

export interface FailoverProxy {
  url: string;
  /** The upstream port each accepted connection went to, in order. */
  routed: number[];
  close(): Promise<void>;
}

/**
 * The load balancer in front of the API nodes, reduced to what a runner needs: each new
 * connection goes to the first upstream that accepts it (in the order given), so when a node
 * dies its clients' reconnects land on the next one.
 */
export async function startFailoverProxy(upstreams: number[]): Promise<FailoverProxy> {
  const open = new Set<Socket>();
  const routed: number[] = [];
  const server = createServer((client) => {
    open.add(client);
    client.pause();
    const attempt = (i: number): void => {
      if (i >= upstreams.length) { client.destroy(); return; }
      const port = upstreams[i]!;
      const upstream = connect(port, '127.0.0.1');
      const failed = () => { upstream.destroy(); attempt(i + 1); };
      upstream.once('error', failed);
      upstream.once('connect', () => {
        upstream.off('error', failed);
        routed.push(port);
        open.add(upstream);
        const forget = () => { open.delete(client); open.delete(upstream); client.destroy(); upstream.destroy(); };
        client.on('close', forget).on('error', forget);
        upstream.on('close', forget).on('error', forget);
        client.pipe(upstream);
        upstream.pipe(client);
        client.resume();
      });
    };
    attempt(0);
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const addr = server.address();
  const port = typeof addr === 'object' && addr ? addr.port : 0;
  return {
    url: `http://127.0.0.1:${port}`,
    routed,
    close: () => new Promise<void>((resolve) => { for (const s of open) s.destroy(); server.close(() => resolve()); }),
  };
}
