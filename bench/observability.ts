// bench:observability — what tracing costs. bench:dispatch at 50 Runs/s and bench:api's
// authenticated GET, each against a platform with tracing off (the floor) and one with tracing on
// (100% sampling, OTLP/HTTP to a local sink in this process), both running at once and loaded in
// alternating rounds; plus the cost of the tracing calls on a hot path when tracing is off (per
// call, against a plain call).
import { createServer } from 'node:http';
import autocannon from 'autocannon';
import { freePort } from '@agentplane/store';
import { injectTrace, inSpan } from '@agentplane/core';
import { startPlatform, type Platform } from '../test/harness/platform.js';
import { printTable, type HttpLoad, type Row } from './lib/report.js';
import { level, setup, startSimulatedRunners, type Level } from './dispatch.js';

const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 64);
const DURATION = Number(process.env.BENCH_SECONDS ?? 5);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
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

async function httpLoad(url: string, headers: Record<string, string>, duration: number): Promise<HttpLoad> {
  const r = await autocannon({ url, headers, connections: CONNECTIONS, duration });
  return { p50: r.latency.p50, p99: r.latency.p99, rps: r.requests.average, errors: r.errors, non2xx: r.non2xx };
}

async function principalUrl(p: Platform): Promise<{ url: string; headers: Record<string, string> }> {
  const ws = p.bootstrap.workspace_id;
  const principal = await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
    external_subject_id: 'bench', principal_type: 'service', display_name: 'Bench',
  });
  return { url: `${p.baseUrl}/v1/principals/${principal.id}`, headers: { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27' } };
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

/**
 * Both platforms run at once and are loaded in turn, ROUNDS times each (off, on, off, on, …):
 * drift in the machine's load hits both alike. Each figure is the median of its rounds.
 */
async function compare<T>(label: string, run: (side: 'off' | 'on') => Promise<T>): Promise<{ off: T[]; on: T[] }> {
  const off: T[] = [];
  const on: T[] = [];
  for (let round = 1; round <= ROUNDS; round++) {
    process.stdout.write(`${label} round ${round}/${ROUNDS} …\n`);
    off.push(await run('off'));
    on.push(await run('on'));
  }
  return { off, on };
}

interface Side { api: Platform; dispatch: Platform; dispatchRun: (rate: number) => Promise<Level>; stop(): Promise<void> }

async function startSide(env: Record<string, string>): Promise<Side> {
  const api = await startPlatform({ env: { LOG_LEVEL: 'warn', ...env } });
  const dispatch = await startPlatform({
    scheduler: true, runner: false, env: { LOG_LEVEL: 'warn', RUNNER_HEARTBEAT_INTERVAL_MS: '5000', PAIRING_REDEEM_PER_MINUTE: '100000', ...env },
  });
  const { api: client, principal, secrets, newSession } = await setup(dispatch);
  const sims = await startSimulatedRunners(dispatch, secrets);
  return {
    api, dispatch,
    dispatchRun: (rate) => level(client, principal, newSession, rate, sims.leased),
    async stop() {
      sims.stop();
      await Promise.all([api.stop(), dispatch.stop()]);
    },
  };
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
  process.stdout.write(`bench:observability  api: ${CONNECTIONS} connections, ${DURATION}s; dispatch: ${RATE} Runs/s; ${ROUNDS} alternating rounds\n`);
  const offPath = await offPathCost();
  const sink = await startSink();
  const sides: { off?: Side; on?: Side } = {};
  try {
    process.stdout.write('starting a platform with tracing off and one with tracing on (100% sampling, OTLP/HTTP to a local sink) …\n');
    sides.off = await startSide({});
    sides.on = await startSide({ OTEL_TRACES_EXPORTER: 'otlp', OTEL_EXPORTER_OTLP_ENDPOINT: sink.url, OTEL_TRACES_SAMPLER: 'always_on' });
    const both = sides as Required<typeof sides>;
    const targets = { off: await principalUrl(both.off.api), on: await principalUrl(both.on.api) };
    for (const side of ['off', 'on'] as const) await httpLoad(targets[side].url, targets[side].headers, 2); // warm-up
    const api = await compare('api', (side) => httpLoad(targets[side].url, targets[side].headers, DURATION));
    for (const side of ['off', 'on'] as const) await both[side].dispatchRun(RATE); // warm-up
    const dispatch = await compare('dispatch', (side) => both[side].dispatchRun(RATE));
    const m = <T>(xs: T[], f: (x: T) => number): number => median(xs.map(f));
    const rows: Row[] = [
      { metric: 'api GET latency p50', ours: m(api.on, (x: HttpLoad) => x.p50), floor: m(api.off, (x: HttpLoad) => x.p50), unit: 'ms' },
      { metric: 'api GET latency p99', ours: m(api.on, (x: HttpLoad) => x.p99), floor: m(api.off, (x: HttpLoad) => x.p99), unit: 'ms' },
      { metric: 'api GET throughput', ours: m(api.on, (x: HttpLoad) => x.rps), floor: m(api.off, (x: HttpLoad) => x.rps), unit: 'req/s', higherIsBetter: true },
      { metric: `dispatch ${RATE}/s message→lease p50`, ours: m(dispatch.on, (x: Level) => x.lease.p50), floor: m(dispatch.off, (x: Level) => x.lease.p50), unit: 'ms' },
      { metric: `dispatch ${RATE}/s message→lease p99`, ours: m(dispatch.on, (x: Level) => x.lease.p99), floor: m(dispatch.off, (x: Level) => x.lease.p99), unit: 'ms' },
      { metric: `dispatch ${RATE}/s message→first event p50`, ours: m(dispatch.on, (x: Level) => x.visible.p50), floor: m(dispatch.off, (x: Level) => x.visible.p50), unit: 'ms' },
      { metric: `dispatch ${RATE}/s message→first event p99`, ours: m(dispatch.on, (x: Level) => x.visible.p99), floor: m(dispatch.off, (x: Level) => x.visible.p99), unit: 'ms' },
      { metric: `dispatch ${RATE}/s Runs completed`, ours: m(dispatch.on, (x: Level) => x.done), floor: m(dispatch.off, (x: Level) => x.done), unit: 'Runs', higherIsBetter: true },
    ];
    printTable(`tracing on (agentplane column) vs tracing off (floor column): medians of ${ROUNDS} alternating rounds`, rows);
    const { requests, bytes } = sink.exports();
    process.stdout.write(`OTLP exports received by the sink: ${requests} requests, ${(bytes / 1024 / 1024).toFixed(1)} MiB\n`);
    const errs = (xs: HttpLoad[]) => xs.reduce((a, x) => a + x.errors + x.non2xx, 0);
    process.stdout.write(`api errors: off ${errs(api.off)}, on ${errs(api.on)}\n`);
  } finally {
    await sides.off?.stop();
    await sides.on?.stop();
    await sink.close();
  }
  printTable('tracing off: the tracing calls of a hot path (span + context injection) vs a plain async call', [
    { metric: 'per call', ours: offPath.traced, floor: offPath.plain, unit: 'ns' },
  ]);
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
