import { Redis, type RedisOptions } from 'ioredis';

export type { Redis };

export interface RedisConnectOptions {
  /** Connection name shown by CLIENT LIST, e.g. `api`, `scheduler:bullmq`. */
  name: string;
  /**
   * BullMQ's blocking connections need `null` (never give up on a command);
   * request-path connections fail fast so that an outage becomes a 503, not a hang.
   */
  blocking?: boolean;
}

/** One place that turns REDIS_URL into an ioredis client with the platform's defaults. */
export function connectRedis(url: string, options: RedisConnectOptions): Redis {
  const base: RedisOptions = {
    connectionName: `agentplane:${options.name}`,
    // Commands issued in the same tick (many requests' lookups under load) share one socket write:
    // one syscall instead of one per command. Not for BullMQ's blocking connections.
    enableAutoPipelining: !options.blocking,
    lazyConnect: false,
    retryStrategy: (times) => Math.min(50 * 2 ** Math.min(times, 6), 2000),
    maxRetriesPerRequest: options.blocking ? null : 3,
    enableOfflineQueue: true,
  };
  return new Redis(url, base);
}

/** Wait until PING answers (or give up after `timeoutMs`). */
export async function waitForRedis(redis: Redis, timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      await redis.ping();
      return;
    } catch (err) {
      if (Date.now() > deadline) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}
