/**
 * A per-process map with a bounded number of entries (least recently used go first, by second
 * chance: a hit only marks its entry, and eviction moves a marked entry to the young end once
 * instead of dropping it, so a hit costs no map writes), an
 * optional total weight (e.g. string lengths) and an optional maximum age. For values that
 * never change once written (immutable versions, write-once claims) or that are only ever used
 * as a guess checked against Redis.
 */
export class BoundedCache<K, V> {
  private readonly entries = new Map<K, { value: V; at: number; weight: number; used: boolean }>();
  private weight = 0;

  constructor(
    readonly maxEntries: number,
    readonly options: {
      /** Entries older than this are not returned. */
      maxAgeMs?: number;
      /** Most total weight kept; a single value heavier than this is not kept at all. */
      maxWeight?: number;
      weigh?: (value: V) => number;
    } = {},
  ) {
    if (!Number.isInteger(maxEntries) || maxEntries < 1) throw new RangeError('maxEntries must be a positive integer');
  }

  get size(): number {
    return this.entries.size;
  }

  get(key: K): V | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    if (this.expired(e.at)) {
      this.remove(key);
      return undefined;
    }
    e.used = true;
    return e.value;
  }

  /** Like get, but the entry is removed. */
  take(key: K): V | undefined {
    const e = this.entries.get(key);
    if (!e) return undefined;
    this.remove(key);
    return this.expired(e.at) ? undefined : e.value;
  }

  set(key: K, value: V): void {
    this.remove(key);
    const weight = this.options.weigh?.(value) ?? 0;
    if (this.options.maxWeight !== undefined && weight > this.options.maxWeight) return;
    this.entries.set(key, { value, at: Date.now(), weight, used: false });
    this.weight += weight;
    while (this.entries.size > this.maxEntries || (this.options.maxWeight !== undefined && this.weight > this.options.maxWeight)) {
      const oldest = this.entries.entries().next();
      if (oldest.done) break;
      const [k, e] = oldest.value;
      if (k === key && this.entries.size === 1) break;
      if (e.used || k === key) {
        // Read since it was last moved (or the value just set): a second chance at the young end.
        e.used = false;
        this.entries.delete(k);
        this.entries.set(k, e);
        continue;
      }
      this.remove(k);
    }
  }

  delete(key: K): void {
    this.remove(key);
  }

  clear(): void {
    this.entries.clear();
    this.weight = 0;
  }

  private remove(key: K): void {
    const e = this.entries.get(key);
    if (!e) return;
    this.entries.delete(key);
    this.weight -= e.weight;
  }

  private expired(at: number): boolean {
    return this.options.maxAgeMs !== undefined && Date.now() - at > this.options.maxAgeMs;
  }
}
