import MiniSearch from 'minisearch';
import type { Redis } from '@agentplane/store';
import { memoryKeys } from './store.js';
import type { MemoryDocument } from './model.js';

interface Indexed {
  id: string;
  path: string;
  content: string;
  meta: string;
}

interface Entry {
  index: MiniSearch<Indexed>;
  /** The change-log entry id this index reflects (everything up to and including it). */
  lastId: string;
  /** Serialises catch-ups of one store in this process. */
  busy: Promise<void>;
}

export interface SearchHit {
  path: string;
  score: number;
  /** The query terms that matched, for the snippet. */
  terms: string[];
}

const newIndex = (): MiniSearch<Indexed> =>
  new MiniSearch<Indexed>({
    fields: ['path', 'content', 'meta'],
    idField: 'id',
    // Paths split on `/`, `.`, `-` and `_` too, so `notes/plan-2026.md` is found by `plan` or `2026`.
    tokenize: (text) => text.split(/[\s\p{P}\p{S}]+/u).filter((t) => t !== ''),
    searchOptions: { boost: { path: 2 }, prefix: true, fuzzy: 0.15, combineWith: 'AND' },
  });

const asIndexed = (d: MemoryDocument): Indexed => ({
  id: d.path, path: d.path, content: d.content, meta: Object.entries(d.metadata).map(([k, v]) => `${k} ${v}`).join(' '),
});

/** Compares stream ids `<ms>-<seq>`. */
function idAfter(a: string, b: string): boolean {
  const [am = 0, as = 0] = a.split('-').map(Number);
  const [bm = 0, bs = 0] = b.split('-').map(Number);
  return am !== bm ? am > bm : as > bs;
}

/**
 * Full-text search over MemoryStores with MiniSearch. Redis is the truth; an index is a cache in
 * the API process, built from the store's documents and kept current from the store's change
 * log (`{m:<id>}:changes`, one entry per write): before each search the process reads the log
 * after the position its index reflects and re-indexes those paths, so every process answers
 * from the same data and a search sees every write acknowledged before it. An index whose
 * position the log no longer holds (trimmed past it) or that was evicted is rebuilt from the
 * documents. At most `maxStores` indexes are kept (least recently used evicted). docs/MEMORY.md.
 */
export class MemorySearch {
  private readonly cache = new Map<string, Entry>();

  constructor(
    private readonly redis: Redis,
    private readonly maxStores = 32,
  ) {}

  async search(storeId: string, query: string): Promise<SearchHit[]> {
    const entry = await this.current(storeId);
    return entry.index.search(query).map((r) => ({ path: String(r.id), score: r.score, terms: r.terms }));
  }

  /** Drops a store's index (the store was deleted). */
  forget(storeId: string): void {
    this.cache.delete(storeId);
  }

  private async current(storeId: string): Promise<Entry> {
    let entry = this.cache.get(storeId);
    if (entry) {
      // Most recently used last.
      this.cache.delete(storeId);
      this.cache.set(storeId, entry);
    } else {
      entry = { index: newIndex(), lastId: '', busy: Promise.resolve() };
      this.cache.set(storeId, entry);
      while (this.cache.size > this.maxStores) this.cache.delete(this.cache.keys().next().value as string);
    }
    const e = entry;
    const run = e.busy.then(() => this.catchUp(storeId, e));
    e.busy = run.catch(() => undefined);
    await run;
    return e;
  }

  private async catchUp(storeId: string, e: Entry): Promise<void> {
    const k = memoryKeys(storeId);
    if (e.lastId !== '' && !(await this.trimmedPast(k.changes, e.lastId))) {
      for (;;) {
        const entries = await this.redis.xrange(k.changes, `(${e.lastId}`, '+', 'COUNT', 1000);
        if (entries.length === 0) return;
        const paths = [...new Set(entries.map(([, fields]) => fields[1] ?? ''))];
        const raws = await this.redis.hmget(k.docs, ...paths);
        paths.forEach((path, i) => {
          if (e.index.has(path)) e.index.discard(path);
          const raw = raws[i];
          if (raw) e.index.add(asIndexed(JSON.parse(raw) as MemoryDocument));
        });
        e.lastId = entries.at(-1)?.[0] ?? e.lastId;
        if (entries.length < 1000) return;
      }
    }
    await this.rebuild(storeId, e);
  }

  /** Whether the log dropped (trimmed) an entry after `lastId`: then the index must be rebuilt. */
  private async trimmedPast(stream: string, lastId: string): Promise<boolean> {
    let info: unknown[];
    try {
      info = (await this.redis.xinfo('STREAM', stream)) as unknown[];
    } catch {
      return false; // no log yet
    }
    const at = info.indexOf('max-deleted-entry-id');
    const deleted = at >= 0 ? String(info[at + 1]) : '0-0';
    return idAfter(deleted, lastId);
  }

  /**
   * Position first, then the documents: a write between the two is both in the scan and in the
   * log after the position, and re-indexing a path is idempotent.
   */
  private async rebuild(storeId: string, e: Entry): Promise<void> {
    const k = memoryKeys(storeId);
    const last = await this.redis.xrevrange(k.changes, '+', '-', 'COUNT', 1);
    const index = newIndex();
    let cursor = '0';
    do {
      const [next, flat] = await this.redis.hscan(k.docs, cursor, 'COUNT', 1000);
      cursor = next;
      const batch: Indexed[] = [];
      for (let i = 1; i < flat.length; i += 2) {
        const path = flat[i - 1] as string;
        if (!index.has(path)) batch.push(asIndexed(JSON.parse(flat[i] as string) as MemoryDocument));
      }
      index.addAll(batch);
    } while (cursor !== '0');
    e.index = index;
    e.lastId = last[0]?.[0] ?? '0-0';
  }
}
