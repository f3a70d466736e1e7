// bench:api — an authenticated GET of a small resource through the full middleware stack
// (auth, version header, rate limit, validation, Redis read) vs a bare Koa handler serving the
// same body, one server process each, 64 concurrent connections from a separate process.
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import autocannon from 'autocannon';
import { startPlatform, ROOT_DIR } from '../test/harness/platform.js';
import { loadHttp } from './lib/http-load.js';
import { printTable, type HttpLoad } from './lib/report.js';
import { costMeter, cpuMicros, formatCost } from './lib/cost.js';

const CONNECTIONS = Number(process.env.BENCH_CONNECTIONS ?? 64);
const DURATION = Number(process.env.BENCH_SECONDS ?? 10);
/** Requests of the fixed-size run that measures CPU µs per request (less disturbed than req/s). */
const COST_REQUESTS = Number(process.env.BENCH_COST_REQUESTS ?? 20_000);

type Load = HttpLoad & { cpuMicros: number };

/** Warm-up, then a fixed number of requests for the server's CPU per request, then the timed run. */
async function load(url: string, headers: Record<string, string>, pid: number, onCost?: () => Promise<{ end(n: number): Promise<unknown> }>): Promise<Load> {
  await autocannon({ url, headers, connections: CONNECTIONS, duration: 2 });
  const meter = await onCost?.();
  const cpu0 = cpuMicros(pid);
  const fixed = await autocannon({ url, headers, connections: CONNECTIONS, amount: COST_REQUESTS });
  const cpu = (cpuMicros(pid) - cpu0) / fixed.requests.total;
  await meter?.end(fixed.requests.total);
  const { result: r, p50, p99 } = await loadHttp({ url, headers, connections: CONNECTIONS, duration: DURATION });
  return { p50, p99, rps: r.requests.average, errors: r.errors, non2xx: r.non2xx, cpuMicros: cpu };
}

async function main(): Promise<void> {
  process.stdout.write(`bench:api  ${CONNECTIONS} connections, ${DURATION}s per target\n`);
  const p = await startPlatform({ env: { LOG_LEVEL: 'warn' } });
  try {
    const ws = p.bootstrap.workspace_id;
    const principal = await p.root.post<Record<string, unknown> & { id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
      external_subject_id: 'bench', principal_type: 'service', display_name: 'Bench',
    });
    const url = `${p.baseUrl}/v1/principals/${principal.id}`;
    process.stdout.write('loading agentplane (GET /v1/principals/{id}) …\n');
    const apiPid = p.pids().api as number;
    let commands = '';
    const ours = await load(url, { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27' }, apiPid, async () => {
      const meter = await costMeter(apiPid, p.redisUrl());
      return { end: async (n: number) => { commands = formatCost('agentplane', await meter.end(n)); } };
    });

    const floorProc = spawn(process.execPath, ['--import', 'tsx', join(ROOT_DIR, 'bench/floors/bare-koa.ts'), JSON.stringify(principal), '0'], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const port = await new Promise<number>((resolve) => floorProc.stdout.once('data', (d: Buffer) => resolve(Number(d.toString().trim()))));
    process.stdout.write('loading the floor (bare Koa handler) …\n');
    const floor = await load(`http://127.0.0.1:${port}/`, {}, floorProc.pid as number);
    floorProc.kill('SIGTERM');

    printTable('authenticated GET through the full stack vs bare Koa', [
      { metric: 'latency p50', ours: ours.p50, floor: floor.p50, unit: 'ms' },
      { metric: 'latency p99', ours: ours.p99, floor: floor.p99, unit: 'ms' },
      { metric: 'throughput', ours: ours.rps, floor: floor.rps, unit: 'req/s', higherIsBetter: true },
      { metric: 'server CPU per request', ours: ours.cpuMicros, floor: floor.cpuMicros, unit: 'µs' },
    ]);
    process.stdout.write(`${commands}\n`);
    process.stdout.write(`errors: ours ${ours.errors + ours.non2xx}, floor ${floor.errors + floor.non2xx}\n`);
  } finally {
    await p.stop();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
