// bench:cluster — the platform on a 6-node Redis Cluster (3 masters + 3 replicas) with two API
// nodes (messages and SSE on one, the simulated runners' sockets on the other), beside the same
// measurements on the single embedded Redis in the same run:
//
//  1. bench:dispatch's 50 and 200 Runs/s levels: user.message accepted → lease offer received,
//     and → first runner event on the SSE stream;
//  2. bench:events' append throughput (EventLog.append, one event per call, 32 in flight), on the
//     cluster with and without EVENT_APPEND_WAIT_REPLICAS=1, spread over many Sessions (slots).
//
// The machine this runs on in CI has two cores: six redis-servers, two API processes, a scheduler,
// the simulated runners and the load generator share them. The ratios are the cost of the cluster
// protocol, replication and WAIT on such a machine, not the cluster's scaling across machines.
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { connectRedis, EventLog, type Redis as StoreRedis } from '@agentplane/store';
import { startPlatform, type Platform } from '../test/harness/platform.js';
import { startApiNode } from '../test/harness/cluster-platform.js';
import { startRedisCluster } from '../test/harness/redis-cluster.js';
import { level, setup, startSimulatedRunners, type Level } from './dispatch.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const RATES = (process.env.BENCH_RATES ?? '50,200').split(',').map(Number);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 2);
const out = (s: string) => process.stdout.write(`${s}\n`);
const fmt = (n: number): string => (Number.isFinite(n) ? (Math.abs(n) >= 100 ? n.toFixed(0) : n.toFixed(2)) : 'n/a');

async function throughput(concurrency: number, op: () => Promise<number>): Promise<number> {
  const end = performance.now() + SECONDS * 1000;
  let count = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (performance.now() < end) {
      const done = await op();
      count += done;
    }
  }));
  return count / SECONDS;
}

/** Appends of one event each, round-robin over 64 Sessions (so over every master of a cluster). */
async function appendRate(redis: StoreRedis, log: EventLog): Promise<number> {
  const sessions = Array.from({ length: 64 }, (_, i) => `sess_bench${i.toString().padStart(4, '0')}`);
  let i = 0;
  const op = async () => ((await log.append(sessions[i++ % sessions.length]!, [{ type: 'agent.message', payload: { content: 'x'.repeat(200) } }])).ok ? 1 : 0);
  await throughput(8, op); // warm-up: connections, slot map, scripts loaded on every master
  let best = 0;
  for (let round = 0; round < 2; round++) best = Math.max(best, await throughput(32, op));
  void redis;
  return best;
}

async function dispatchLevels(p: Platform, messagesOn: Platform['root']): Promise<Level[]> {
  const { principal, secrets, newSession } = await setup(p);
  const { leased, stop } = await startSimulatedRunners(p, secrets);
  const levels: Level[] = [];
  try {
    for (const rate of RATES) {
      out(`  ${rate} Runs/s …`);
      const l = await level(messagesOn, principal, newSession, rate, leased);
      out(`    completed ${l.done}/${l.sent}`);
      levels.push(l);
    }
  } finally {
    stop();
  }
  return levels;
}

async function main(): Promise<void> {
  out(`bench:cluster  rates ${RATES.join('/')} Runs/s with ${process.env.BENCH_RUNNERS} simulated runners; append runs of ${SECONDS}s`);
  const env = { LOG_LEVEL: 'warn', RUNNER_HEARTBEAT_INTERVAL_MS: '5000', PAIRING_REDEEM_PER_MINUTE: '100000' };

  out('single Redis …');
  const single = await startPlatform({ scheduler: true, runner: false, env });
  let singleLevels: Level[];
  let singleAppend: number;
  try {
    singleLevels = await dispatchLevels(single, single.root);
    const r = new Redis(single.redisUrl()) as StoreRedis;
    singleAppend = await appendRate(r, new EventLog(r));
    r.disconnect();
  } finally {
    await single.stop();
  }

  out('Redis Cluster (3 masters + 3 replicas), two API nodes …');
  const cluster = await startRedisCluster();
  let clusterLevels: Level[] = [];
  let clusterAppend = 0;
  let clusterAppendWait = 0;
  try {
    const p = await startPlatform({ scheduler: true, runner: false, env: { ...env, REDIS_URL: cluster.url } });
    const b = await startApiNode(p, cluster.url, 'api-b', env);
    try {
      // Runners connect to node A (p.baseUrl); messages and SSE go through node B.
      clusterLevels = await dispatchLevels(p, b.root);
      const r = connectRedis(cluster.url, { name: 'bench' });
      clusterAppend = await appendRate(r, new EventLog(r));
      clusterAppendWait = await appendRate(r, new EventLog(r, { waitReplicas: 1, waitTimeoutMs: 1000 }));
      r.disconnect();
    } finally {
      await b.stop();
      await p.stop();
    }
  } finally {
    await cluster.stop();
  }

  const rows: [string, string, string, string][] = [];
  for (let i = 0; i < RATES.length; i++) {
    const s = singleLevels[i]!;
    const c = clusterLevels[i]!;
    rows.push(
      [`${s.rate}/s message→lease p50`, `${fmt(s.lease.p50)} ms`, `${fmt(c.lease.p50)} ms`, `${fmt(c.lease.p50 / s.lease.p50)}x`],
      [`${s.rate}/s message→lease p99`, `${fmt(s.lease.p99)} ms`, `${fmt(c.lease.p99)} ms`, `${fmt(c.lease.p99 / s.lease.p99)}x`],
      [`${s.rate}/s message→first event p50`, `${fmt(s.visible.p50)} ms`, `${fmt(c.visible.p50)} ms`, `${fmt(c.visible.p50 / s.visible.p50)}x`],
      [`${s.rate}/s message→first event p99`, `${fmt(s.visible.p99)} ms`, `${fmt(c.visible.p99)} ms`, `${fmt(c.visible.p99 / s.visible.p99)}x`],
      [`${s.rate}/s Runs completed`, `${s.done}/${s.sent}`, `${c.done}/${c.sent}`, ''],
    );
  }
  rows.push(
    ['append, 1 event/call (32 in flight)', `${fmt(singleAppend)} ev/s`, `${fmt(clusterAppend)} ev/s`, `${fmt(clusterAppend / singleAppend)}x`],
    ['append + WAIT 1 replica', 'n/a (no replica)', `${fmt(clusterAppendWait)} ev/s`, `${fmt(clusterAppendWait / singleAppend)}x`],
  );
  const head: [string, string, string, string] = ['metric', 'single Redis', 'cluster, 2 API nodes', 'cluster / single'];
  const widths = head.map((h, i) => Math.max(h.length, ...rows.map((r) => r[i]!.length)));
  const line = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i]!)).join('  ');
  out(`\n${line(head)}\n${widths.map((w) => '-'.repeat(w)).join('  ')}`);
  for (const r of rows) out(line(r));
  out('(latency ratios above 1 and throughput ratios below 1 are the cluster\'s cost on this machine: every node shares its cores)');
}

main().then(() => process.exit(0), (err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
