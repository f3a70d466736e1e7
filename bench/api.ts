// bench:api — an authenticated GET of a small resource through the full middleware stack
// (auth, version header, rate limit, validation, Redis read) vs a bare Koa handler serving the
// same body, one server process each, 64 concurrent connections from a separate process. Both
// servers run at once and are loaded in turn, ROUNDS times each, the first in each round
// alternating (ours, floor; floor, ours; …): this machine's speed drifts by a third within
// minutes, and a floor measured once, minutes after ours, moved the ratio more than any change
// did. Each figure is the median of its rounds.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { startPlatform, ROOT_DIR } from '../test/harness/platform.js';
import { loadHttp } from './lib/http-load.js';
import { printTable, type HttpLoad } from './lib/report.js';
import { costMeter, cpuMicros, formatCost } from './lib/cost.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 64);
const DURATION = Number(process.env.BENCH_SECONDS ?? 5);
const ROUNDS = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 5));
/** Requests of the fixed-size run that measures CPU µs per request (less disturbed than req/s). */
const COST_REQUESTS = Number(process.env.BENCH_COST_REQUESTS ?? 20_000);

type Load = HttpLoad & { cpuMicros: number };
interface Target { url: string; headers: Record<string, string>; pid: number }

/** A fixed number of requests for the server's CPU per request, then the timed run. */
async function load(t: Target): Promise<Load> {
  const cpu0 = cpuMicros(t.pid);
  const fixed = await autocannon({ url: t.url, headers: t.headers, connections: CONNECTIONS, amount: COST_REQUESTS });
  const cpu = (cpuMicros(t.pid) - cpu0) / fixed.requests.total;
  const { result: r, p50, p99 } = await loadHttp({ url: t.url, headers: t.headers, connections: CONNECTIONS, duration: DURATION });
  return { p50, p99, rps: r.requests.average, errors: r.errors + fixed.errors, non2xx: r.non2xx + fixed.non2xx, cpuMicros: cpu };
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

async function main(): Promise<void> {
  process.stdout.write(`bench:api  ${CONNECTIONS} connections, ${DURATION}s per target per round, ${ROUNDS} alternating rounds\n`);
  const p = await startPlatform({ env: { LOG_LEVEL: 'warn' } });
  let floorProc: ReturnType<typeof spawn> | undefined;
  try {
    const ws = p.bootstrap.workspace_id;
    const principal = await p.root.post<Record<string, unknown> & { id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
      external_subject_id: 'bench', principal_type: 'service', display_name: 'Bench',
    });
    const ours: Target = {
      url: `${p.baseUrl}/v1/principals/${principal.id}`,
      headers: { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27' },
      pid: p.pids().api as number,
    };
    const proc = (floorProc = spawn(process.execPath, ['--import', 'tsx', join(ROOT_DIR, 'bench/floors/bare-koa.ts'), JSON.stringify(principal), '0'], {
      stdio: ['ignore', 'pipe', 'inherit'],
    }));
    const port = await new Promise<number>((resolve) => proc.stdout?.once('data', (d: Buffer) => resolve(Number(d.toString().trim()))));
    const floor: Target = { url: `http://127.0.0.1:${port}/`, headers: {}, pid: proc.pid as number };

    // Warm-up (connections, JIT), then what one request costs the API in Redis commands.
    for (const t of [ours, floor]) await autocannon({ url: t.url, headers: t.headers, connections: CONNECTIONS, duration: 2 });
    const meter = await costMeter(ours.pid, p.redisUrl());
    const metered = await autocannon({ url: ours.url, headers: ours.headers, connections: CONNECTIONS, amount: COST_REQUESTS });
    const commands = formatCost('agentplane', await meter.end(metered.requests.total));

    const runs: { ours: Load[]; floor: Load[] } = { ours: [], floor: [] };
    for (let round = 1; round <= ROUNDS; round++) {
      const order = round % 2 === 1 ? (['ours', 'floor'] as const) : (['floor', 'ours'] as const);
      process.stdout.write(`round ${round}/${ROUNDS}: ${order.join(', ')} …\n`);
      for (const side of order) runs[side].push(await load(side === 'ours' ? ours : floor));
      const [o, f] = [runs.ours.at(-1) as Load, runs.floor.at(-1) as Load];
      process.stdout.write(`  ours ${o.rps.toFixed(0)} req/s, floor ${f.rps.toFixed(0)} req/s (${((100 * o.rps) / f.rps).toFixed(0)}%)\n`);
    }

    const pick = (side: 'ours' | 'floor', f: (l: Load) => number): number => median(runs[side].map(f));
    printTable(`authenticated GET through the full stack vs bare Koa (medians of ${ROUNDS} alternating rounds)`, [
      { metric: 'latency p50', ours: pick('ours', (l) => l.p50), floor: pick('floor', (l) => l.p50), unit: 'ms' },
      { metric: 'latency p99', ours: pick('ours', (l) => l.p99), floor: pick('floor', (l) => l.p99), unit: 'ms' },
      { metric: 'throughput', ours: pick('ours', (l) => l.rps), floor: pick('floor', (l) => l.rps), unit: 'req/s', higherIsBetter: true },
      { metric: 'server CPU per request', ours: pick('ours', (l) => l.cpuMicros), floor: pick('floor', (l) => l.cpuMicros), unit: 'µs' },
    ]);
    const shares = runs.ours.map((o, i) => o.rps / (runs.floor[i] as Load).rps);
    process.stdout.write(`throughput, ours as a share of the floor per round: ${shares.map((x) => `${(100 * x).toFixed(0)}%`).join(', ')}; median ${(100 * median(shares)).toFixed(0)}%\n`);
    process.stdout.write(`${commands}\n`);
    const errs = (side: 'ours' | 'floor') => runs[side].reduce((a, l) => a + l.errors + l.non2xx, 0);
    process.stdout.write(`errors: ours ${errs('ours')}, floor ${errs('floor')}\n`);
  } finally {
    floorProc?.kill('SIGTERM');
    await p.stop();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
