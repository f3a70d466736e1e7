import type { Redis } from 'ioredis';
import { keys, type Tag } from './keys.js';

/**
 * A keyed request (one sent with an Idempotency-Key) whose write must happen once across a crash:
 * `token`, derived from the key and the request (the same for every attempt of the request,
 * another for any other request or key), and `keptMs`, how long keys are kept.
 */
export interface KeyedWrite {
  token: string;
  keptMs: number;
}

/**
 * The record of what a keyed request wrote (the id or revision number it made), for the writes
 * whose retry cannot tell their own earlier attempt's result from the resource alone (a File,
 * a revision: each attempt would make a new one). The write's own script records it in the same
 * step (`RECORD_KEYED_LUA`), so a write is never without its record; a later attempt of the
 * request (its first died before its answer was kept, and the key's pending record lapsed) reads
 * it first (`find`) and is answered what it names, nothing written again.
 *
 * One string key per request, `ap:{<tag>}:<kind>:<token>`, under the written resource's hash tag
 * (the script's other keys' slot on a Redis Cluster), expiring `keptMs` after the write: as long
 * as the request's key is kept, then gone with no sweep.
 */
export class KeyedWrites {
  constructor(
    private readonly redis: Redis,
    /** What the record is of, part of its key: `file_req`, `mrp_req`, `rev_req`. */
    private readonly kind: string,
  ) {}

  key(tag: Tag, keyed: KeyedWrite): string {
    return keys.scoped(tag, `${this.kind}:${keyed.token}`);
  }

  /** What an attempt of this request wrote, or null when none did (or its record expired). */
  find(tag: Tag, keyed: KeyedWrite): Promise<string | null> {
    return this.redis.get(this.key(tag, keyed));
  }
}

/**
 * The Lua half of `KeyedWrites`: `record_keyed(key, value, kept_ms)` records `value` under
 * `key` (a `KeyedWrites.key`) for `kept_ms`, and `recorded_keyed(key)` reads it (false when
 * none); a script that writes for a keyed request defines them by starting with this text,
 * looks the request up before it writes and records it in the same step.
 */
export const KEYED_WRITES_LUA = `
local function recorded_keyed(key) return redis.call('GET', key) end
local function record_keyed(key, value, kept_ms) redis.call('SET', key, value, 'PX', kept_ms) end
`;
