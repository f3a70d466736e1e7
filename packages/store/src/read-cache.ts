import type { Redis } from 'ioredis';
import { BoundedCache } from './cache.js';

/** Redis's channel for client-side caching invalidations (RESP2, `CLIENT TRACKING … REDIRECT`). */
const INVALIDATE_CHANNEL = '__redis__:invalidate';

export interface ReadCacheOptions {
  /** Most values kept (least recently used go first). */
  maxEntries?: number;
  /** Safety net: a value older than this is read again even if no invalidation came. */
  maxAgeMs?: number;
  /** Most total characters kept. */
  maxChars?: number;
  /** Told when the cache stops serving (a connection dropped, tracking refused) and why. */
  onError?: (err: Error) => void;
}

interface Flight {
  promise: Promise<string | null>;
  /** An invalidation (or a local write) came while the read was under way: its value is not kept. */
  dirty: boolean;
}

/** The cache a connection's writers forget their keys in (see `forgetWritten`). */
const attached = new WeakMap<Redis, ReadCache>();

/**
 * The JSON text each shared parsed value (`peekShared`) was parsed from: the very text the
 * document was stored as, so a reader that answers the value unchanged can send it as it is
 * (`storedJsonOf`) instead of serialising it again.
 */
const storedText = new WeakMap<object, string>();

/**
 * The stored JSON text of a value `peekShared` handed out, when `value` is one: byte for byte
 * what `JSON.stringify(value)` gives, for documents written with `JSON.stringify` (as the
 * document store writes them) and never changed since (shared values are read-only).
 */
export function storedJsonOf(value: object): string | undefined {
  return storedText.get(value);
}

/**
 * A per-process cache of hot string keys (credential records, tenancy and Principal documents,
 * policy versions …) kept correct by Redis server-assisted client-side caching: the reader
 * connection has `CLIENT TRACKING ON REDIRECT <subscriber>`, so Redis itself sends an
 * invalidation for every key this process has read whenever anything (any process, any script,
 * an expiry, a FLUSHALL) changes it. Redis queues that invalidation before it answers the write,
 * so by the time a writer's caller hears "done", the invalidation is already on its way to every
 * reading process.
 *
 * - A read under way when its key is invalidated is answered but not kept (no stale fill), and a
 *   later reader does not join it.
 * - Writes this process makes through `LuaScript`, `DocumentStore` or `forgetWritten` drop their
 *   keys locally as soon as Redis answered them, so this process reads its own writes without
 *   waiting for the invalidation to arrive.
 * - While either connection is down, or tracking could not be turned on, nothing is served from
 *   the cache (every read goes to Redis) and everything kept is dropped; values older than
 *   `maxAgeMs` are read again regardless.
 * - An absent key is cached as absent too (Redis tracks a key read whether or not it exists), so
 *   an unset policy version or budget costs no read either.
 *
 * One Redis only: on a Redis Cluster tracking would be per node, so `start` leaves the cache off
 * there and every read goes to the cluster.
 */
export class ReadCache {
  private readonly values: BoundedCache<string, string | null>;
  /**
   * The lengths of the keys `values` has held since it was last emptied (a superset of those it
   * holds). Every script drops each key it wrote (`forget`), and most of them are never held here
   * (streams, indexes, hashes); a key whose length no held key had is told apart without looking
   * it up, which would first hash the key: a string just built by concatenation costs about
   * 0.4 µs to hash and look up, against the few nanoseconds of its length (docs/RUNS.md).
   */
  private readonly heldLengths = new Set<number>();
  private readonly flights = new Map<string, Flight>();
  /** Parsed values for `peekShared`, each valid only while the cache holds the very text it came from. */
  private readonly parsed: BoundedCache<string, { raw: string; value: unknown }>;
  private reader: Redis | null = null;
  private subscriber: Redis | null = null;
  private serving = false;
  /** Bumped whenever serving stops: a read begun before cannot fill the cache after. */
  private epoch = 0;
  private setupChain: Promise<void> = Promise.resolve();
  private closed = false;
  hits = 0;
  misses = 0;

  constructor(private readonly redis: Redis, private readonly options: ReadCacheOptions = {}) {
    this.values = new BoundedCache(options.maxEntries ?? 20_000, {
      maxAgeMs: options.maxAgeMs ?? 10_000,
      maxWeight: options.maxChars ?? 64 * 1024 * 1024,
      weigh: (v) => (v === null ? 16 : v.length),
    });
    this.parsed = new BoundedCache(Math.min(options.maxEntries ?? 20_000, 4_096));
  }

  /** Is the cache serving reads now? */
  get active(): boolean {
    return this.serving;
  }

  get size(): number {
    return this.values.size;
  }

  /**
   * Opens the two connections and turns tracking on (again after every reconnection). Writers on
   * `redis` forget their keys here from now on. Resolves once the first attempt is done (the
   * cache serves only if it succeeded).
   */
  start(): Promise<void> {
    attached.set(this.redis, this);
    if ((this.redis as unknown as { isCluster?: boolean }).isCluster) return Promise.resolve();
    const reader = this.redis.duplicate({ connectionName: 'agentplane:api:cache' });
    const subscriber = this.redis.duplicate({ connectionName: 'agentplane:api:cache-invalidations', autoResubscribe: false, maxRetriesPerRequest: null });
    this.reader = reader;
    this.subscriber = subscriber;
    const down = (what: string) => () => this.stopServing(new Error(`read cache: ${what} connection lost`));
    for (const c of [reader, subscriber]) {
      c.on('error', () => undefined); // reported through 'close' and the owner's own connection
      c.on('close', down(c === reader ? 'reader' : 'invalidation'));
      c.on('ready', () => void this.setup());
    }
    subscriber.on('messageBuffer', (channel: Buffer, message: unknown) => {
      if (channel.toString() !== INVALIDATE_CHANNEL) return;
      if (!Array.isArray(message)) {
        this.dropAll(); // a null payload: the whole database was flushed
        return;
      }
      for (const key of message as (Buffer | string)[]) this.drop(String(key));
    });
    return this.setup();
  }

  /** Serialised: a reconnection of either side redoes the whole handshake. */
  private setup(): Promise<void> {
    this.setupChain = this.setupChain.then(() => this.handshake()).catch((err: unknown) => {
      this.stopServing(err instanceof Error ? err : new Error(String(err)));
    });
    return this.setupChain;
  }

  private async handshake(): Promise<void> {
    const { reader, subscriber } = this;
    if (this.closed || !reader || !subscriber) return;
    if (reader.status !== 'ready' || subscriber.status !== 'ready') return;
    this.stopServing();
    // A fresh subscriber connection (autoResubscribe is off) may still run CLIENT ID.
    const id = Number(await subscriber.call('CLIENT', 'ID'));
    await subscriber.subscribe(INVALIDATE_CHANNEL);
    await reader.call('CLIENT', 'TRACKING', 'ON', 'REDIRECT', String(id));
    if (this.closed || reader.status !== 'ready' || subscriber.status !== 'ready') return;
    this.serving = true;
  }

  private stopServing(err?: Error): void {
    const was = this.serving;
    this.serving = false;
    this.epoch++;
    this.dropAll();
    if (err && was && !this.closed) this.options.onError?.(err);
  }

  /**
   * The value of a string key when the cache holds it now (null: the key is known absent);
   * undefined when it does not, or while the cache is not serving (then read with `get`).
   */
  peek(key: string): string | null | undefined {
    if (!this.serving || !this.reader) return undefined;
    const hit = this.values.get(key);
    if (hit !== undefined) this.hits++;
    return hit;
  }

  /**
   * Like `peek`, parsed as JSON, and the parsed value shared by every reader until the key's text
   * changes (frozen at its top level): for values read and never changed, such as a bearer's
   * credential record and the tenancy it names, parsed once instead of on every request.
   */
  peekShared<T>(key: string): Readonly<T> | null | undefined {
    const raw = this.peek(key);
    if (raw === undefined || raw === null) return raw;
    const known = this.parsed.get(key);
    if (known !== undefined && known.raw === raw) return known.value as Readonly<T>;
    const value = Object.freeze(JSON.parse(raw) as T);
    this.parsed.set(key, { raw, value });
    if (typeof value === 'object' && value !== null) storedText.set(value, raw);
    return value;
  }

  /** The value of a string key: from the cache when it holds it, else read (and kept). */
  get(key: string): Promise<string | null> {
    if (!this.serving || !this.reader) return this.redis.get(key);
    const hit = this.values.get(key);
    if (hit !== undefined) {
      this.hits++;
      return Promise.resolve(hit);
    }
    const joined = this.flights.get(key);
    if (joined) return joined.promise;
    this.misses++;
    const epoch = this.epoch;
    const flight: Flight = { dirty: false, promise: Promise.resolve(null) };
    flight.promise = this.reader.get(key).then(
      (v) => {
        if (this.flights.get(key) === flight) this.flights.delete(key);
        if (!flight.dirty && epoch === this.epoch && this.serving) {
          this.heldLengths.add(key.length);
          this.values.set(key, v);
        }
        return v;
      },
      (err: unknown) => {
        if (this.flights.get(key) === flight) this.flights.delete(key);
        throw err;
      },
    );
    this.flights.set(key, flight);
    return flight.promise;
  }

  /** Drops keys this process just wrote (its own reads see the write at once). */
  forget(keyList: readonly string[]): void {
    for (const k of keyList) this.drop(k);
  }

  private drop(key: string): void {
    if (this.heldLengths.has(key.length)) this.values.delete(key);
    // Every script run drops each of its keys (a profile at 200 Runs/s put these lookups at about
    // 1% of the API's CPU); reads in flight are few, often none.
    if (this.flights.size === 0) return;
    const f = this.flights.get(key);
    if (f) {
      f.dirty = true;
      this.flights.delete(key);
    }
  }

  private dropAll(): void {
    this.values.clear();
    this.heldLengths.clear();
    for (const f of this.flights.values()) f.dirty = true;
    this.flights.clear();
  }

  async close(): Promise<void> {
    this.closed = true;
    this.stopServing();
    if (attached.get(this.redis) === this) attached.delete(this.redis);
    for (const c of [this.reader, this.subscriber]) {
      if (c) await c.quit().catch(() => c.disconnect());
    }
  }
}

/** Reads `key` through the cache started on `redis`, or straight from Redis when there is none. */
export function cachedGet(redis: Redis, key: string): Promise<string | null> {
  const cache = attached.get(redis);
  return cache ? cache.get(key) : redis.get(key);
}

/** `key`'s value if the cache started on `redis` holds it now (see ReadCache.peek), else undefined. */
export function cachedPeek(redis: Redis, key: string): string | null | undefined {
  return attached.get(redis)?.peek(key);
}

/** `key`'s value parsed and shared (see ReadCache.peekShared) if the cache started on `redis` holds it now. */
export function cachedPeekShared<T>(redis: Redis, key: string): Readonly<T> | null | undefined {
  return attached.get(redis)?.peekShared<T>(key);
}

/**
 * Reads these keys through the cache started on `redis` (when there is one) without waiting: for
 * a document this process has just written and is about to read again (a new Session, read by its
 * stream's open and its first message a moment later), so that later read is a hit instead of a
 * round trip. Call after the write was answered. It is a tracked read like any other: a change by
 * anyone afterwards invalidates it.
 */
export function primeCache(redis: Redis, keyList: readonly string[]): void {
  const cache = attached.get(redis);
  if (!cache) return;
  for (const k of keyList) cache.get(k).catch(() => undefined);
}

/** Call after a write on `redis` to these keys was answered: this process's cache drops them. */
export function forgetWritten(redis: Redis, keyList: readonly string[]): void {
  attached.get(redis)?.forget(keyList);
}
