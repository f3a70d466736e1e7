/**
 * npm run bench:fleet — N simulated runners (real WebSocket clients in a few child processes)
 * connect and heartbeat against ONE gateway process (the API with the embedded gateway).
 * Reports connect rate, gateway CPU and memory per runner, and presence-list latency p50/p99.
 * Floor in the same run: a bare `ws` echo server with the same clients and the same frames.
 *
 * Options (env): FLEET_SIZES=1000,5000  FLEET_CLIENTS=3  FLEET_HEARTBEAT_MS=5000  FLEET_STEADY_MS=15000
 * Loopback only; everything it starts (redis-server, servers, clients) is stopped at the end.
 */
import { fork, spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

import { connectRedis, DocumentStore, freePort, startEmbeddedRedis, waitForRedis } from '@agentplane/store';
import { CredentialIndex, IdentityService, RunnerService } from '@agentplane/domain';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const ROOT = resolve(import.meta.dirname, '..');
const SIZES = (process.env.FLEET_SIZES ?? '1000,5000').split(',').map(Number);
const CLIENTS = Number(process.env.FLEET_CLIENTS ?? 3);
const HEARTBEAT_MS = Number(process.env.FLEET_HEARTBEAT_MS ?? 5000);
const STEADY_MS = Number(process.env.FLEET_STEADY_MS ?? 15000);
const HARD_LIMIT_MS = 15 * 60_000;
const CLK_TCK = 100;

const hard = setTimeout(() => {
  process.stderr.write('bench:fleet exceeded its time bound; stopping\n');
  void cleanup().finally(() => process.exit(2));
}, HARD_LIMIT_MS);
hard.unref();

const started: ChildProcess[] = [];
let cleanupRedis: (() => Promise<void>) | null = null;
let dataDir = '';
async function cleanup(): Promise<void> {
  for (const c of started) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await cleanupRedis?.();
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
}

function cpuTicks(pid: number): number {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
  return Number(fields[11]) + Number(fields[12]); // utime + stime
}
function rssMib(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return m ? Number(m[1]) / 1024 : 0;
}
const pct = (xs: number[], q: number): number => {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.floor(q * s.length))]!;
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function onMessage<T>(child: ChildProcess, kind: string): Promise<T> {
  return new Promise((resolve) => {
    const h = (m: { kind?: string }) => {
      if (m.kind === kind) {
        child.off('message', h);
        resolve(m as T);
      }
    };
    child.on('message', h);
  });
}

interface Result {
  target: string;
  n: number;
  connected: number;
  failed: number;
  connectSeconds: number;
  connectRate: number;
  connectP50: number;
  connectP99: number;
  cpuPerConnectMs: number;
  cpuPct: number;
  cpuMsPerRunnerPerMin: number;
  rssPerRunnerKib: number;
  rssMib: number;
  acksPerSec: number;
  listP50?: number;
  listP99?: number;
  floorHttpP50?: number;
  floorHttpP99?: number;
}

async function runClients(target: string, url: string, serverPid: number, secrets: string[], mode: 'gateway' | 'echo', listUrl?: { url: string; token: string; healthz: string }): Promise<Result> {
  const clients = Array.from({ length: CLIENTS }, () => {
    const c = fork(join(ROOT, 'bench/fleet-client.ts'), [], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    started.push(c);
    return c;
  });
  await Promise.all(clients.map((c) => onMessage(c, 'up')));
  await sleep(500);
  const rss0 = rssMib(serverPid);
  const cpuConnect0 = cpuTicks(serverPid);
  const t0 = performance.now();
  const results = await Promise.all(
    clients.map((c, i) => {
      const slice = secrets.filter((_, j) => j % CLIENTS === i);
      const done = onMessage<{ latencies: number[]; failed: number }>(c, 'connected');
      c.send({ cmd: 'connect', url, secrets: slice, mode, heartbeatMs: HEARTBEAT_MS, concurrency: 32 });
      return done;
    }),
  );
  const connectSeconds = (performance.now() - t0) / 1000;
  const cpuPerConnectMs = ((cpuTicks(serverPid) - cpuConnect0) / CLK_TCK) * 1000 / Math.max(1, secrets.length);
  const latencies = results.flatMap((r) => r.latencies);
  const failed = results.reduce((a, r) => a + r.failed, 0);
  // Steady state: heartbeats flowing. Measure CPU over the window, and list latency inside it.
  await sleep(Math.min(HEARTBEAT_MS, 3000));
  const stats0 = await Promise.all(clients.map((c) => { const p = onMessage<{ acks: number }>(c, 'stats'); c.send({ cmd: 'stats' }); return p; }));
  const cpu0 = cpuTicks(serverPid);
  const w0 = performance.now();
  const lat: number[] = [];
  const floorLat: number[] = [];
  if (listUrl) {
    const end = performance.now() + STEADY_MS;
    while (performance.now() < end) {
      let t = performance.now();
      const r = await fetch(listUrl.url, { headers: { authorization: `Bearer ${listUrl.token}`, 'service-version': '2026-08-27' } });
      await r.arrayBuffer();
      if (r.status !== 200) throw new Error(`presence list answered ${r.status}`);
      lat.push(performance.now() - t);
      t = performance.now();
      await (await fetch(listUrl.healthz)).arrayBuffer();
      floorLat.push(performance.now() - t);
      await sleep(40);
    }
  } else {
    await sleep(STEADY_MS);
  }
  const windowS = (performance.now() - w0) / 1000;
  const cpu1 = cpuTicks(serverPid);
  const stats1 = await Promise.all(clients.map((c) => { const p = onMessage<{ acks: number }>(c, 'stats'); c.send({ cmd: 'stats' }); return p; }));
  const rss1 = rssMib(serverPid);
  const acks = stats1.reduce((a, s) => a + s.acks, 0) - stats0.reduce((a, s) => a + s.acks, 0);
  for (const c of clients) c.send({ cmd: 'stop' });
  await Promise.all(clients.map((c) => new Promise((r) => c.once('exit', r))));
  const cpuSeconds = (cpu1 - cpu0) / CLK_TCK;
  const n = latencies.length;
  return {
    target, n: secrets.length, connected: n, failed, connectSeconds, connectRate: n / connectSeconds,
    connectP50: pct(latencies, 0.5), connectP99: pct(latencies, 0.99), cpuPerConnectMs,
    cpuPct: (cpuSeconds / windowS) * 100,
    cpuMsPerRunnerPerMin: n ? ((cpuSeconds * 1000) / windowS / n) * 60 : NaN,
    rssPerRunnerKib: n ? ((rss1 - rss0) * 1024) / n : NaN, rssMib: rss1,
    acksPerSec: acks / windowS,
    ...(listUrl ? { listP50: pct(lat, 0.5), listP99: pct(lat, 0.99), floorHttpP50: pct(floorLat, 0.5), floorHttpP99: pct(floorLat, 0.99) } : {}),
  };
}

async function main(): Promise<void> {
  dataDir = mkdtempSync(join(tmpdir(), 'agentplane-fleet-'));
  const redisSrv = await startEmbeddedRedis({ dir: join(dataDir, 'redis'), hz: 100 });
  cleanupRedis = () => redisSrv.stop();
  const redis = connectRedis(redisSrv.url, { name: 'bench' });
  await waitForRedis(redis);
  const docs = new DocumentStore(redis);
  const credentials = new CredentialIndex(redis);
  const identity = new IdentityService(docs, redis, credentials);
  const runners = new RunnerService(docs, redis, credentials, identity);
  const { org, workspace } = await identity.createOrganization('bench', 'bench');
  const { secret: rootKey } = await identity.createApiKey(org.id, { display_name: 'bench', role: 'root', scope: { type: 'workspace', workspace_id: workspace.id } });
  const max = Math.max(...SIZES);
  process.stdout.write(`minting ${max} runner credentials...\n`);
  const secrets: string[] = new Array(max);
  let next = 0;
  await Promise.all(Array.from({ length: 64 }, async () => {
    while (next < max) {
      const i = next++;
      secrets[i] = (await runners.mintLocal(workspace.id, `bench-${i}`)).secret;
    }
  }));
  await redis.quit();
  const masterKey = randomBytes(32).toString('hex');
  const results: Result[] = [];

  for (const n of SIZES) {
    const slice = secrets.slice(0, n);
    // Floor: bare ws echo server, same clients, same frames.
    const echo = fork(join(ROOT, 'bench/echo-server.ts'), [], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
    started.push(echo);
    const { port: echoPort } = await onMessage<{ port: number }>(echo, 'up');
    process.stdout.write(`N=${n}: floor (ws echo)...\n`);
    results.push(await runClients('floor: ws echo', `ws://127.0.0.1:${echoPort}/`, echo.pid!, slice, 'echo'));
    echo.kill('SIGTERM');

    // Ours: one API process with the embedded gateway.
    const port = await freePort();
    const api = spawn(process.execPath, [join(ROOT, 'api/dist/main.js')], {
      env: {
        PATH: process.env.PATH ?? '', REDIS_URL: redisSrv.url, PORT: String(port), MASTER_KEY: masterKey, LOG_LEVEL: 'warn',
        RUNNER_HEARTBEAT_INTERVAL_MS: String(HEARTBEAT_MS), RUNNER_PRESENCE_TTL_MS: String(HEARTBEAT_MS * 3 + 5000),
      },
      stdio: ['ignore', 'inherit', 'inherit'],
    });
    started.push(api);
    for (let i = 0; i < 100; i++) {
      try {
        if ((await fetch(`http://127.0.0.1:${port}/healthz`)).ok) break;
      } catch {
        /* starting */
      }
      await sleep(100);
    }
    process.stdout.write(`N=${n}: agentplane gateway...\n`);
    results.push(await runClients('agentplane gateway', `ws://127.0.0.1:${port}/v1/runners/connect`, api.pid!, slice, 'gateway', {
      url: `http://127.0.0.1:${port}/v1/runner-pools/presences?limit=100`, token: rootKey, healthz: `http://127.0.0.1:${port}/healthz`,
    }));
    api.kill('SIGTERM');
    await new Promise((r) => api.once('exit', r));
  }

  const f = (x: number | undefined, d = 1) => (x === undefined || Number.isNaN(x) ? '-' : x.toFixed(d));
  const lines = [
    '',
    `bench:fleet  clients=${CLIENTS} processes, heartbeat every ${HEARTBEAT_MS} ms, steady window ${STEADY_MS} ms, loopback`,
    '',
    '| N | target | connected | connect/s | connect p50 / p99 ms | server CPU ms per connect | server CPU % (steady) | CPU ms per runner per min | RSS KiB per runner | RSS MiB | acks/s | presence list (limit 100) p50 / p99 ms | HTTP floor (/healthz) p50 / p99 ms |',
    '|---|---|---|---|---|---|---|---|---|---|---|---|---|',
    ...results.map((r) =>
      `| ${r.n} | ${r.target} | ${r.connected}${r.failed ? ` (${r.failed} failed)` : ''} | ${f(r.connectRate, 0)} | ${f(r.connectP50)} / ${f(r.connectP99)} | ${f(r.cpuPerConnectMs, 2)} | ${f(r.cpuPct)} | ${f(r.cpuMsPerRunnerPerMin, 2)} | ${f(r.rssPerRunnerKib)} | ${f(r.rssMib, 0)} | ${f(r.acksPerSec, 0)} | ${r.listP50 !== undefined ? `${f(r.listP50, 2)} / ${f(r.listP99, 2)}` : '-'} | ${r.floorHttpP50 !== undefined ? `${f(r.floorHttpP50, 2)} / ${f(r.floorHttpP99, 2)}` : '-'} |`),
    '',
  ];
  for (const n of SIZES) {
    const floor = results.find((r) => r.n === n && r.target.startsWith('floor'));
    const ours = results.find((r) => r.n === n && !r.target.startsWith('floor'));
    if (floor && ours) {
      lines.push(`N=${n}: connect rate ${f(ours.connectRate / floor.connectRate, 2)}x floor; CPU ${f(ours.cpuPct / Math.max(0.1, floor.cpuPct), 2)}x floor; RSS per runner ${f(ours.rssPerRunnerKib / Math.max(0.1, floor.rssPerRunnerKib), 2)}x floor`);
    }
  }
  process.stdout.write(`${lines.join('\n')}\n`);

}

main()
  .catch((err: unknown) => {
    process.stderr.write(`bench:fleet failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exitCode = 1;
  })
  .finally(async () => {
    await cleanup();
    process.exit();
  });
