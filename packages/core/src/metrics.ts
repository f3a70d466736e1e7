/**
 * Prometheus metrics for every process, on prom-client: one registry per process (the embedded
 * runner gateway shares the API's), Node process and runtime metrics included, buckets chosen per
 * measure, and labels only ever taken from closed sets (see `closedLabel`). Catalogue and alerts:
 * docs/OPERATIONS.md.
 */
import { collectDefaultMetrics, Counter, Gauge, Histogram, Registry } from 'prom-client';

export { Counter, Gauge, Histogram, Registry };

/** The registry type every process hands to the code that defines its metrics. */
export type Metrics = Registry;

/** Content type of the text exposition format served at GET /metrics. */
export const METRICS_CONTENT_TYPE: string = Registry.PROMETHEUS_CONTENT_TYPE;

/**
 * A registry for one process, with prom-client's default process and Node runtime metrics
 * (CPU, resident memory, heap, event-loop lag, GC, open file descriptors, active handles).
 * `runtime: false` leaves those out, for a registry nobody scrapes: the event-loop lag monitor
 * behind them wakes the process every 10 ms (6–7 ms of CPU a second on an idle process here).
 */
export function createMetrics(options: { runtime?: boolean } = {}): Metrics {
  const registry = new Registry();
  if (options.runtime === false) return registry;
  collectDefaultMetrics({ register: registry, eventLoopMonitoringPrecision: 10 });
  // Gauges named like counters (promtool flags them); the per-type gauges without `_total` stay.
  for (const name of ['nodejs_active_handles_total', 'nodejs_active_requests_total', 'nodejs_active_resources_total']) registry.removeSingleMetric(name);
  return registry;
}

/**
 * Histogram buckets per measure (seconds). One set for everything put model time-to-first-token
 * and queue waits in `+Inf`; each measure gets the range it actually spans.
 */
export const BUCKETS = {
  /** API request handling: 1 ms … 10 s. */
  http: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
  /** Run accepted → leased: 5 ms … 10 min (a busy pool queues for minutes). */
  queueWait: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600],
  /** Run accepted → enqueued: 1 ms … 10 s. */
  enqueue: [0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10],
  /** How long a lease is held (a whole turn): 100 ms … 1 h. */
  lease: [0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600],
  /** Turn start → its first session event: 10 ms … 2 min. */
  firstEvent: [0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120],
  /** Model provider call → first streamed token: 50 ms … 2 min. */
  modelTtft: [0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 20, 30, 60, 120],
  /** Sandbox create/resume: 50 ms … 2 min (image pulls are slow). */
  sandboxStart: [0.05, 0.1, 0.25, 0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120],
  /** One tool exec inside a sandbox: 5 ms … 10 min. */
  sandboxExec: [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600],
  /** One session event append (Redis round trip): 0.1 ms … 1 s. */
  append: [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1],
} as const satisfies Record<string, readonly number[]>;

/**
 * A label value from a closed set: `value` when it is one of `allowed`, else `other`. Every label
 * fed from outside the process (a client's JSON-RPC method, a peer's close code) goes through
 * this, so no caller can grow the series count.
 */
export function closedLabel<T extends string>(value: string | number | undefined | null, allowed: ReadonlySet<T> | readonly T[]): T | 'other' {
  const v = String(value ?? '');
  const set = allowed instanceof Set ? allowed : new Set(allowed as readonly T[]);
  return set.has(v as T) ? (v as T) : 'other';
}

/** The HTTP status label: the status as a number string for statuses we answer, else `other`. */
export function statusLabel(status: number): string {
  return Number.isInteger(status) && status >= 100 && status <= 599 ? String(status) : 'other';
}
