import { Gauge, type Logger, type Metrics } from '@agentplane/core';
import type { Redis } from '@agentplane/store';

/** The fields of one `INFO` answer (`name:value` lines). */
export function parseInfo(text: string): Map<string, string> {
  const out = new Map<string, string>();
  for (const line of text.split(/\r?\n/)) {
    const i = line.indexOf(':');
    if (i > 0 && !line.startsWith('#')) out.set(line.slice(0, i), line.slice(i + 1).trim());
  }
  return out;
}

/**
 * How long a scrape waits for Redis INFO: past it the scrape answers at once with
 * `agentplane_redis_up` 0 (and no other Redis gauge), so a Redis that does not answer (stopped,
 * partitioned) neither hangs `/metrics` nor loses the scrape that would report it.
 */
export const REDIS_INFO_TIMEOUT_MS = 1_500;

/** `promise`, or `null` when it has not settled within `ms` (the timer never holds the process open). */
export function within<T>(promise: Promise<T>, ms: number): Promise<T | null> {
  let timer: ReturnType<typeof setTimeout> | undefined;
  const late = new Promise<null>((resolve) => {
    timer = setTimeout(() => resolve(null), ms);
    timer.unref();
  });
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/**
 * Redis health as the API sees it, read with one `INFO memory` + `INFO persistence` per scrape:
 * memory use against `maxmemory`, and whether the append-only file is on and its last write and
 * rewrite succeeded (the platform's durability rests on AOF). No exporter needed.
 */
export function registerRedisMetrics(registry: Metrics, redis: Redis, log: Logger, timeoutMs = REDIS_INFO_TIMEOUT_MS): void {
  let pending: Promise<Map<string, string> | null> | null = null;
  /** One INFO round trip per scrape, shared by the gauges below; `null` when it failed or took too long. */
  const info = (): Promise<Map<string, string> | null> => {
    if (pending) return pending;
    const read = Promise.all([redis.info('memory'), redis.info('persistence')]).then(([m, p]) => parseInfo(`${m}\n${p}`));
    // A late answer is not waited for (a later scrape asks again); its failure is not unhandled.
    read.catch(() => undefined);
    const current: Promise<Map<string, string> | null> = within(read, timeoutMs)
      .then((f) => {
        if (f === null) log.debug({ timeout_ms: timeoutMs }, 'redis INFO for metrics did not answer in time');
        return f;
      }, (err: unknown) => {
        log.debug({ err: err instanceof Error ? err.message : String(err) }, 'redis INFO for metrics failed');
        return null;
      })
      .finally(() => setImmediate(() => {
        if (pending === current) pending = null;
      }));
    pending = current;
    return current;
  };
  const gauge = (name: string, help: string, read: (f: Map<string, string>) => number | undefined) =>
    new Gauge({
      name, help, registers: [registry],
      async collect() {
        const f = await info();
        const v = f ? read(f) : undefined;
        if (v === undefined || Number.isNaN(v)) this.reset();
        else this.set(v);
      },
    });
  new Gauge({
    name: 'agentplane_redis_up', help: '1 when the API could read Redis INFO at this scrape, else 0', registers: [registry],
    async collect() {
      this.set((await info()) ? 1 : 0);
    },
  });
  gauge('agentplane_redis_used_memory_bytes', 'Redis used_memory', (f) => Number(f.get('used_memory')));
  gauge('agentplane_redis_maxmemory_bytes', 'Redis maxmemory (0: no limit)', (f) => Number(f.get('maxmemory')));
  gauge('agentplane_redis_aof_enabled', '1 when Redis has its append-only file on', (f) => Number(f.get('aof_enabled')));
  gauge('agentplane_redis_aof_last_write_ok', '1 when the last AOF write succeeded, 0 after a write error', (f) => (f.has('aof_last_write_status') ? Number(f.get('aof_last_write_status') === 'ok') : undefined));
  gauge('agentplane_redis_aof_last_rewrite_ok', '1 when the last AOF rewrite succeeded, 0 after a failed one', (f) => (f.has('aof_last_bgrewrite_status') ? Number(f.get('aof_last_bgrewrite_status') === 'ok') : undefined));
}
