/** Small helpers shared by the benchmarks: percentiles and a two-column "ours vs floor" table. */

/**
 * Wall-clock milliseconds with sub-millisecond resolution, comparable across the processes of
 * one machine (each process's time origin is read off the same clock): latencies of a few
 * milliseconds measured with Date.now() are rounded to whole milliseconds, ratios with them too.
 */
export function wallMs(): number {
  return performance.timeOrigin + performance.now();
}
export function percentile(sorted: readonly number[], p: number): number {
  if (sorted.length === 0) return Number.NaN;
  const i = Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1));
  return sorted[i] as number;
}

export function summarize(samples: number[]): { p50: number; p99: number; mean: number; n: number } {
  const s = [...samples].sort((a, b) => a - b);
  const mean = s.reduce((a, b) => a + b, 0) / Math.max(1, s.length);
  return { p50: percentile(s, 50), p99: percentile(s, 99), mean, n: s.length };
}

export interface Row {
  metric: string;
  ours: number;
  floor: number;
  unit: string;
  /** true when bigger is better (throughput): the ratio is floor/ours then. */
  higherIsBetter?: boolean;
}

const fmt = (n: number): string => (Number.isFinite(n) ? (Math.abs(n) >= 100 ? n.toFixed(0) : n.toFixed(2)) : 'n/a');

export function printTable(title: string, rows: Row[]): void {
  const lines = rows.map((r) => {
    const ratio = r.higherIsBetter ? r.floor / r.ours : r.ours / r.floor;
    return [r.metric, `${fmt(r.ours)} ${r.unit}`, `${fmt(r.floor)} ${r.unit}`, `${fmt(ratio)}x`];
  });
  const head = ['metric', 'agentplane', 'floor', 'cost ratio'];
  const widths = head.map((h, i) => Math.max(h.length, ...lines.map((l) => (l[i] as string).length)));
  const row = (cells: string[]) => cells.map((c, i) => c.padEnd(widths[i] as number)).join('  ');
  process.stdout.write(`\n${title}\n${row(head)}\n${widths.map((w) => '-'.repeat(w)).join('  ')}\n`);
  for (const l of lines) process.stdout.write(`${row(l)}\n`);
  process.stdout.write('(cost ratio: how many times the floor our figure costs; 1.00x = no overhead)\n');
}

/** What an HTTP load run reports (autocannon's figures we print). */
export interface HttpLoad {
  p50: number;
  p99: number;
  rps: number;
  errors: number;
  non2xx: number;
}
