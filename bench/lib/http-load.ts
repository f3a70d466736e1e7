/**
 * An autocannon run whose latency percentiles come from each 2xx response's own duration, to the
 * microsecond. autocannon's own histogram keeps whole milliseconds: at a p50 of 4 to 9 ms its
 * steps are 11% to 25% wide, coarser than the differences the benches compare.
 */
import autocannon from 'autocannon';
import { summarize } from './report.js';

export interface FineLoad {
  result: autocannon.Result;
  /** Median and 99th percentile of the 2xx responses' durations (ms, sub-millisecond). */
  p50: number;
  p99: number;
}

export function loadHttp(options: autocannon.Options): Promise<FineLoad> {
  return new Promise((resolve, reject) => {
    const times: number[] = [];
    const instance = autocannon(options, (err: unknown, result: autocannon.Result) => {
      if (err) return reject(err instanceof Error ? err : new Error(String(err)));
      const { p50, p99 } = summarize(times);
      resolve({ result, p50, p99 });
    });
    instance.on('response', (_client, status, _bytes, ms) => {
      if (status >= 200 && status < 300) times.push(ms);
    });
  });
}
