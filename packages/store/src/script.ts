import { createHash } from 'node:crypto';
import type { Redis } from 'ioredis';
import { forgetWritten } from './read-cache.js';

/**
 * A Lua script run by SHA (EVALSHA), loaded on first NOSCRIPT. All keys a script touches are
 * passed in KEYS and share one hash tag, so scripts are Redis Cluster-safe.
 */
export class LuaScript {
  readonly sha: string;

  constructor(readonly name: string, readonly source: string) {
    this.sha = createHash('sha1').update(source).digest('hex');
  }

  /**
   * `reload: false`: a script the server does not hold (NOSCRIPT: a restart, SCRIPT FLUSH) is
   * not sent again in full: the error is the caller's (`isNoScript`). For a caller that sent
   * commands behind this one, which a resend would come after.
   */
  async run(redis: Redis, keyList: readonly string[], args: readonly (string | number | Buffer)[], options: { reload?: boolean } = {}): Promise<unknown> {
    try {
      return await redis.evalsha(this.sha, keyList.length, ...keyList, ...args);
    } catch (err) {
      if (options.reload !== false && isNoScript(err)) {
        return await redis.eval(this.source, keyList.length, ...keyList, ...args);
      }
      throw err;
    } finally {
      // Whatever the script wrote, this process's read cache does not serve the old value.
      forgetWritten(redis, keyList);
    }
  }

  /**
   * Run the script, then `WAIT replicas timeoutMs` on the same connection (one pipeline: on a
   * cluster both go to the master of the keys' slot). Returns the script's result and how many
   * replicas acknowledged every write made so far on that connection.
   */
  async runAndWait(redis: Redis, keyList: readonly string[], args: readonly (string | number | Buffer)[], replicas: number, timeoutMs: number, options: { reload?: boolean } = {}): Promise<{ result: unknown; acked: number }> {
    const once = async (bySha: boolean): Promise<{ result: unknown; acked: number }> => {
      const p = redis.pipeline();
      if (bySha) p.evalsha(this.sha, keyList.length, ...keyList, ...args);
      else p.eval(this.source, keyList.length, ...keyList, ...args);
      p.call('WAIT', replicas, timeoutMs);
      const res = (await p.exec()) ?? [];
      const [scriptErr, result] = res[0] ?? [new Error('pipeline returned nothing'), null];
      if (scriptErr) throw scriptErr;
      const [waitErr, acked] = res[1] ?? [new Error('pipeline returned nothing'), 0];
      if (waitErr) throw waitErr;
      return { result, acked: Number(acked) };
    };
    try {
      return await once(true);
    } catch (err) {
      if (options.reload !== false && isNoScript(err)) return await once(false);
      throw err;
    } finally {
      forgetWritten(redis, keyList);
    }
  }
}

/** The server does not hold the script (it restarted, or its scripts were flushed). */
export function isNoScript(err: unknown): boolean {
  return err instanceof Error && err.message.startsWith('NOSCRIPT');
}
