import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';

/**
 * A Lua script run by SHA (EVALSHA), loaded on first NOSCRIPT. All keys a script touches are
 * passed in KEYS and share one hash tag, so scripts are Redis Cluster-safe.
 */
export class LuaScript {
  readonly sha: string;

  constructor(readonly name: string, readonly source: string) {
    this.sha = createHash('sha1').update(source).digest('hex');
  }

  async run(redis: Redis, keyList: readonly string[], args: readonly (string | number | Buffer)[]): Promise<unknown> {
    try {
      return await redis.evalsha(this.sha, keyList.length, ...keyList, ...args);
    } catch (err) {
      if (err instanceof Error && err.message.startsWith('NOSCRIPT')) {
        return redis.eval(this.source, keyList.length, ...keyList, ...args);
      }
      throw err;
    }
  }
}
