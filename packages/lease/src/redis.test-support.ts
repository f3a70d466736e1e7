import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll } from 'vitest';
import { connectRedis, startEmbeddedRedis, type EmbeddedRedis, type Redis } from '@agentplane/store';

/** For this package's unit tests: a private embedded Redis for the calling file, torn down after it. */
export function useEmbeddedRedis(name: string): () => Redis {
  let server: EmbeddedRedis | undefined;
  let redis: Redis | undefined;
  let dir: string | undefined;
  beforeAll(async () => {
    dir = mkdtempSync(join(tmpdir(), `${name}-`));
    server = await startEmbeddedRedis({ dir });
    redis = connectRedis(server.url, { name: 'test' });
  });
  afterAll(async () => {
    redis?.disconnect();
    await server?.stop();
    if (dir) rmSync(dir, { recursive: true, force: true });
  });
  return () => {
    if (!redis) throw new Error('the test Redis is not started yet');
    return redis;
  };
}
