import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll } from 'vitest';
import { startEmbeddedRedis, type EmbeddedRedis, type EmbeddedRedisOptions } from './embedded-redis.js';
import { connectRedis, type Redis, type RedisConnectOptions } from './redis.js';

/**
 * The test Redis of one test file: `redis()` its main connection, `server()` the process (its
 * `url` for connections of a test's own), `connect(name, options)` another connection, closed with the rest.
 */
export interface TestRedis {
  (): Redis;
  server(): EmbeddedRedis;
  connect(name: string, options?: Omit<RedisConnectOptions, 'name'>): Redis;
}

/**
 * For unit tests (the package's `./testing` entry, never loaded by a process): a private embedded
 * Redis for the calling test file, started before its tests and torn down after them with its
 * directory and every connection made through it. Register it before hooks that use it.
 */
export function useEmbeddedRedis(name: string, options: Omit<EmbeddedRedisOptions, 'dir'> = {}): TestRedis {
  let server: EmbeddedRedis | undefined;
  let dir: string | undefined;
  const connections: Redis[] = [];
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), `${name}-`));
    server = await startEmbeddedRedis({ ...options, dir });
    connections.push(connectRedis(server.url, { name: 'test' }));
  });
  afterAll(async () => {
    for (const c of connections.splice(0)) c.disconnect();
    await server?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });
  const started = (): EmbeddedRedis => {
    if (!server) throw new Error('the test Redis is not started yet');
    return server;
  };
  return Object.assign(
    (): Redis => {
      started();
      return connections[0]!;
    },
    {
      server: started,
      connect: (connName: string, connOptions: Omit<RedisConnectOptions, 'name'> = {}): Redis => {
        const c = connectRedis(started().url, { ...connOptions, name: connName });
        connections.push(c);
        return c;
      },
    },
  );
}
