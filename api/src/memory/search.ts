import { setImmediate as yieldToLoop } from 'node:timers/promises';
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

/**
 * How memory is indexed and searched. Terms split on white space, punctuation and symbols (so
 * `notes/plan-2026.md` is found by `plan` or `2026`); every query term must match (`AND`); a term
 * of 4 characters or more also matches as a prefix, one of 6 or more within one edit; the path
 * counts twice. Short terms match exactly: prefix and fuzzy expansion of 2-3 letters would walk
 * much of the index for little use (measured by `npm run bench:memory`).
 */
export const MEMORY_INDEX_OPTIONS = {
  fields: ['path', 'content', 'meta'],
  idField: 'id',
  tokenize: (text: string): string[] => text.split(/[\s\p{P}\p{S}]+/u).filter((t) => t !== ''),
  searchOptions: {
    boost: { path: 2 },
    prefix: (term: string) => term.length >= 4,
    fuzzy: (term: string) => (term.length >= 6 ? 0.2 : false),
    combineWith: 'AND',
  },
} as const;

const newIndex = (): MiniSearch<Indexed> => new MiniSearch<Indexed>({ ...MEMORY_INDEX_OPTIONS, fields: [...MEMORY_INDEX_OPTIONS.fields] });

const asIndexed = (d: MemoryDocument): Indexed => ({
  id: d.path, path: d.path, content: d.content, meta: Object.entries(d.metadata).map(([k, v]) => `${k} ${v}`).join(' '),
});

/** Documents indexed between two turns of the event loop during a rebuild. */
const REBUILD_SLICE = 100;

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
      // Small slices with a turn of the event loop between them: a large rebuild never holds the
      // process's other requests for long.
      for (let start = 1; start < flat.length; start += 2 * REBUILD_SLICE) {
        for (let i = start; i < Math.min(flat.length, start + 2 * REBUILD_SLICE); i += 2) {
          const path = flat[i - 1] as string;
          if (!index.has(path)) index.add(asIndexed(JSON.parse(flat[i] as string) as MemoryDocument));
        }
        await yieldToLoop();
      }
    } while (cursor !== '0');
    e.index = index;
    e.lastId = last[0]?.[0] ?? '0-0';
  }
}
