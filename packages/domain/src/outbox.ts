import * as crypto from 'node:crypto';
import { keys, type Redis } from '@agentplane/store';

/**
 * SHA-1 of a member's bucket id: the one-shot `crypto.hash` where Node has it (20.12 and later;
 * a quarter of `createHash`'s cost, which was 0.6% of the API's CPU at 300 Runs/s: two calls a
 * Run), the same digest, so an entry's bucket never depends on the Node version that wrote it.
 */
const sha1: (data: string) => Buffer = typeof (crypto as { hash?: unknown }).hash === 'function'
  ? (data) => crypto.hash('sha1', data, 'buffer')
  : (data) => crypto.createHash('sha1').update(data).digest();

/** Spread over this many keys (each its own hash tag) so no one Redis Cluster slot takes every entry. */
const BUCKETS = 16;

/**
 * Work written down before it is done and struck out once done, so that a sweep finds what a
 * process that died in between left: `ap:{g:<name>:<n>}:<name>:<n>`, zsets of members scored by
 * the time they were written (ms), a member's bucket chosen by its `bucketId`.
 */
export class Outbox {
  constructor(private readonly redis: Redis, private readonly name: string) {}

  private key(bucket: number): string {
    return keys.global(`${this.name}:${bucket}`);
  }

  private keyOf(bucketId: string): string {
    return this.key(sha1(bucketId).readUInt16BE(0) % BUCKETS);
  }

  async add(member: string, bucketId: string, now = Date.now()): Promise<void> {
    await this.redis.zadd(this.keyOf(bucketId), now, member);
  }

  async remove(member: string, bucketId: string): Promise<void> {
    await this.redis.zrem(this.keyOf(bucketId), member);
  }

  /** Members written more than `olderThanMs` ago, oldest first, at most `limit` per bucket. */
  async due(olderThanMs: number, limit = 100, now = Date.now()): Promise<{ member: string; since_ms: number }[]> {
    const out: { member: string; since_ms: number }[] = [];
    // Every bucket at once: one round trip (they are read together), whatever their number.
    const all = await Promise.all(Array.from({ length: BUCKETS }, (_, b) => this.redis.zrangebyscore(this.key(b), '-inf', now - olderThanMs, 'WITHSCORES', 'LIMIT', 0, limit)));
    for (const raw of all) {
      for (let i = 0; i + 1 < raw.length; i += 2) out.push({ member: raw[i] as string, since_ms: Number(raw[i + 1]) });
    }
    return out.sort((a, b) => a.since_ms - b.since_ms);
  }
}
