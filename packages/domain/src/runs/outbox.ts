import * as crypto from 'node:crypto';
import { keys, type Redis } from '@agentplane/store';

/**
 * SHA-1 of a Run id: the one-shot `crypto.hash` where Node has it (20.12 and later; a quarter of
 * `createHash`'s cost, which was 0.6% of the API's CPU at 300 Runs/s: two calls a Run), the same
 * digest, so an entry's bucket never depends on the Node version that wrote it.
 */
const sha1: (data: string) => Buffer = typeof (crypto as { hash?: unknown }).hash === 'function'
  ? (data) => crypto.hash('sha1', data, 'buffer')
  : (data) => crypto.createHash('sha1').update(data).digest();

/** Spread over this many keys (each its own hash tag) so no one Redis Cluster slot takes every Run. */
const BUCKETS = 16;

export interface PendingEnqueue {
  session_id: string;
  run_id: string;
  since_ms: number;
}

/**
 * Runs about to start whose BullMQ job may not exist yet: written before the turn start commits
 * the Run, removed once the job exists. A process that dies in between (API, scheduler) leaves
 * the entry, and the scheduler's sweep enqueues the Run (`RunEngine.repairUnqueued`), so an
 * accepted `user.message` is never stuck on a Run that nothing will lease.
 *
 * `ap:{g:enqueue_outbox:<n>}:enqueue_outbox:<n>`: zset, member `<session>/<run>`, score = ms.
 */
export class EnqueueOutbox {
  constructor(private readonly redis: Redis) {}

  private static key(bucket: number): string {
    return keys.global(`enqueue_outbox:${bucket}`);
  }

  private static bucketOf(runId: string): number {
    return sha1(runId).readUInt16BE(0) % BUCKETS;
  }

  async add(sessionId: string, runId: string, now = Date.now()): Promise<void> {
    await this.redis.zadd(EnqueueOutbox.key(EnqueueOutbox.bucketOf(runId)), now, `${sessionId}/${runId}`);
  }

  async remove(sessionId: string, runId: string): Promise<void> {
    await this.redis.zrem(EnqueueOutbox.key(EnqueueOutbox.bucketOf(runId)), `${sessionId}/${runId}`);
  }

  /** Entries older than `olderThanMs`, oldest first, at most `limit` per bucket. */
  async due(olderThanMs: number, limit = 100, now = Date.now()): Promise<PendingEnqueue[]> {
    const out: PendingEnqueue[] = [];
    for (let b = 0; b < BUCKETS; b++) {
      const raw = await this.redis.zrangebyscore(EnqueueOutbox.key(b), '-inf', now - olderThanMs, 'WITHSCORES', 'LIMIT', 0, limit);
      for (let i = 0; i + 1 < raw.length; i += 2) {
        const [session_id, run_id] = (raw[i] as string).split('/');
        if (session_id && run_id) out.push({ session_id, run_id, since_ms: Number(raw[i + 1]) });
      }
    }
    return out;
  }
}
