// bench:observability — what tracing costs. bench:dispatch at 50 Runs/s and bench:api's
// authenticated GET, each against a platform with tracing off (the floor) and one with tracing on
// (100% sampling, OTLP/HTTP to a local sink in this process), in the same run; plus the cost of
// the tracing calls on a hot path when tracing is off (per call, against a plain call).
import { createServer } from 'node:http';
import autocannon from 'autocannon';
import { freePort } from '@agentplane/store';
import { injectTrace, inSpan } from '@agentplane/core';
import { startPlatform, type Platform } from '../test/harness/platform.js';
import { printTable, type HttpLoad, type Row } from './lib/report.js';
import { level, setup, startSimulatedRunners, type Level } from './dispatch.js';

const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 64);
const DURATION = Number(process.env.BENCH_SECONDS ?? 10);
const RATE = Number(process.env.BENCH_RATE ?? 50);

/** A local OTLP/HTTP sink: accepts every export, counts requests and bytes. */
async function startSink(): Promise<{ url: string; exports: () => { requests: number; bytes: number }; close(): Promise<void> }> {
  let requests = 0;
  let bytes = 0;
  const server = createServer((req, res) => {
    req.on('data', (c: Buffer) => (bytes += c.length));
    req.on('end', () => {
      requests++;
      res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
    });
  });
  const port = await freePort();
  await new Promise<void>((r) => server.listen(port, '127.0.0.1', () => r()));
  return { url: `http://127.0.0.1:${port}`, exports: () => ({ requests, bytes }), close: () => new Promise((r) => server.close(() => r())) };
}

async function httpLoad(url: string, headers: Record<string, string>): Promise<HttpLoad> {
  await autocannon({ url, headers, connections: CONNECTIONS, duration: 2 });
  const r = await autocannon({ url, headers, connections: CONNECTIONS, duration: DURATION });
  return { p50: r.latency.p50, p99: r.latency.p99, rps: r.requests.average, errors: r.errors, non2xx: r.non2xx };
}

async function apiLoad(p: Platform): Promise<HttpLoad> {
  const ws = p.bootstrap.workspace_id;
  const principal = await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
    external_subject_id: 'bench', principal_type: 'service', display_name: 'Bench',
  });
  return httpLoad(`${p.baseUrl}/v1/principals/${principal.id}`, { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27' });
}

async function dispatchLoad(p: Platform): Promise<Level> {
  const { api, principal, envId, secrets } = await setup(p);
  const sims = await startSimulatedRunners(p, secrets);
  try {
    await level(api, principal, envId, RATE, sims.leased); // warm-up at the same rate
    return await level(api, principal, envId, RATE, sims.leased);
  } finally {
    sims.stop();
  }
}

async function measure(env: Record<string, string>): Promise<{ api: HttpLoad; dispatch: Level }> {
  const apiPlatform = await startPlatform({ env: { LOG_LEVEL: 'warn', ...env } });
  let api: HttpLoad;
  try {
    api = await apiLoad(apiPlatform);
  } finally {
    await apiPlatform.stop();
  }
  const dispatchPlatform = await startPlatform({
    scheduler: true, runner: false, env: { LOG_LEVEL: 'warn', RUNNER_HEARTBEAT_INTERVAL_MS: '5000', PAIRING_REDEEM_PER_MINUTE: '100000', ...env },
  });
  try {
    return { api, dispatch: await dispatchLoad(dispatchPlatform) };
  } finally {
    await dispatchPlatform.stop();
  }
}

/** ns per call of the tracing calls a hot path makes with tracing off, and of a plain call. */
async function offPathCost(): Promise<{ traced: number; plain: number }> {
  const N = 200_000;
  const work = async (): Promise<number> => 1;
  const time = async (fn: () => Promise<unknown>): Promise<number> => {
    for (let i = 0; i < 10_000; i++) await fn();
    const t = process.hrtime.bigint();
    for (let i = 0; i < N; i++) await fn();
    return Number(process.hrtime.bigint() - t) / N;
  };
  // Alternate the two, five rounds each, and keep each one's best (JIT and GC noise is one-sided).
  let plain = Infinity;
  let traced = Infinity;
  for (let round = 0; round < 5; round++) {
    plain = Math.min(plain, await time(work));
    traced = Math.min(traced, await time(() => inSpan('x', {}, () => (injectTrace(), work()))));
  }
  return { traced, plain };
}

async function main(): Promise<void> {
  process.stdout.write(`bench:observability  api: ${CONNECTIONS} connections, ${DURATION}s; dispatch: ${RATE} Runs/s\n`);
  const off = await offPathCost();
  process.stdout.write('tracing off …\n');
  const floor = await measure({});
  const sink = await startSink();
  process.stdout.write('tracing on (100% sampling, OTLP/HTTP to a local sink) …\n');
  let on: { api: HttpLoad; dispatch: Level };
  try {
    on = await measure({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: sink.url, OTEL_TRACES_SAMPLER: 'always_on' });
  } finally {
    await sink.close();
  }
  const rows: Row[] = [
    { metric: 'api GET latency p50', ours: on.api.p50, floor: floor.api.p50, unit: 'ms' },
    { metric: 'api GET latency p99', ours: on.api.p99, floor: floor.api.p99, unit: 'ms' },
    { metric: 'api GET throughput', ours: on.api.rps, floor: floor.api.rps, unit: 'req/s', higherIsBetter: true },
    { metric: `dispatch ${RATE}/s message→lease p50`, ours: on.dispatch.lease.p50, floor: floor.dispatch.lease.p50, unit: 'ms' },
    { metric: `dispatch ${RATE}/s message→lease p99`, ours: on.dispatch.lease.p99, floor: floor.dispatch.lease.p99, unit: 'ms' },
    { metric: `dispatch ${RATE}/s message→first event p50`, ours: on.dispatch.visible.p50, floor: floor.dispatch.visible.p50, unit: 'ms' },
    { metric: `dispatch ${RATE}/s message→first event p99`, ours: on.dispatch.visible.p99, floor: floor.dispatch.visible.p99, unit: 'ms' },
    { metric: `dispatch ${RATE}/s Runs completed`, ours: on.dispatch.done, floor: floor.dispatch.done, unit: 'Runs', higherIsBetter: true },
  ];
  printTable('tracing on (agentplane column) vs tracing off (floor column), same run', rows);
  const { requests, bytes } = sink.exports();
  process.stdout.write(`OTLP exports received by the sink: ${requests} requests, ${(bytes / 1024 / 1024).toFixed(1)} MiB\n`);
  process.stdout.write(`errors: api off ${floor.api.errors + floor.api.non2xx}, on ${on.api.errors + on.api.non2xx}; dispatch off ${floor.dispatch.done}/${floor.dispatch.sent}, on ${on.dispatch.done}/${on.dispatch.sent} done\n`);
  printTable('tracing off: the tracing calls of a hot path (span + context injection) vs a plain async call', [
    { metric: 'per call', ours: off.traced, floor: off.plain, unit: 'ns' },
  ]);
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
