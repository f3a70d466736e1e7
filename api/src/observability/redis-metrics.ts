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
 * Redis health as the API sees it, read with one `INFO memory` + `INFO persistence` per scrape:
 * memory use against `maxmemory`, and whether the append-only file is on and its last write and
 * rewrite succeeded (the platform's durability rests on AOF). No exporter needed.
 */
export function registerRedisMetrics(registry: Metrics, redis: Redis, log: Logger): void {
  let pending: Promise<Map<string, string> | null> | null = null;
  /** One INFO round trip per scrape, shared by the gauges below. */
  const info = (): Promise<Map<string, string> | null> => {
    pending ??= Promise.all([redis.info('memory'), redis.info('persistence')])
      .then(([m, p]) => parseInfo(`${m}\n${p}`))
      .catch((err: unknown) => {
        log.debug({ err: err instanceof Error ? err.message : String(err) }, 'redis INFO for metrics failed');
        return null;
      })
      .finally(() => setImmediate(() => (pending = null)));
    return pending;
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
