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
  /** How many entries the log had ever been given at `lastId` (`XINFO STREAM` `entries-added`). */
  added: number;
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

/**
 * Full-text search over MemoryStores with MiniSearch. Redis is the truth; an index is a cache in
 * the API process, built from the store's documents and kept current from the store's change
 * log (`{m:<id>}:changes`, one entry per write): before each search the process reads the log
 * after the position its index reflects and re-indexes those paths, so every process answers
 * from the same data and a search sees every write acknowledged before it. An index whose
 * position the log no longer holds (trimmed past it, or gone back past it) or that was evicted
 * is rebuilt from the documents. At most `maxStores` indexes are kept (least recently used
 * evicted). docs/MEMORY.md.
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
      entry = { index: newIndex(), lastId: '', added: 0, busy: Promise.resolve() };
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
    if (e.lastId !== '') {
      const log = await this.position(k.changes);
      if (log.added === e.added && log.added >= 0 && log.lastId === e.lastId) return;
      // Every entry after ours, up to the position just read. Fewer than were added since means
      // the log was trimmed past our position: some writes are no longer in it, so rebuild. More
      // (or a count that went down) means the log went back past our position (a replica
      // promoted without the last writes): what we indexed from it may be gone, so rebuild too.
      const paths = new Set<string>();
      let from = `(${e.lastId}`;
      let read = 0;
      for (;;) {
        const entries = await this.redis.xrange(k.changes, from, log.lastId, 'COUNT', 1000);
        for (const [, fields] of entries) paths.add(fields[1] ?? '');
        read += entries.length;
        if (entries.length < 1000) break;
        from = `(${entries.at(-1)?.[0] ?? log.lastId}`;
      }
      if (log.added < 0 || read === log.added - e.added) {
        const list = [...paths];
        for (let i = 0; i < list.length; i += 1000) {
          const slice = list.slice(i, i + 1000);
          const raws = await this.redis.hmget(k.docs, ...slice);
          slice.forEach((path, j) => {
            if (e.index.has(path)) e.index.discard(path);
            const raw = raws[j];
            if (raw) e.index.add(asIndexed(JSON.parse(raw) as MemoryDocument));
          });
        }
        e.lastId = log.lastId;
        e.added = log.added;
        return;
      }
    }
    await this.rebuild(storeId, e);
  }

  /** The log's last id and how many entries were ever added to it (one `XINFO STREAM`, so the two agree). */
  private async position(stream: string): Promise<{ lastId: string; added: number }> {
    let info: unknown[];
    try {
      info = (await this.redis.xinfo('STREAM', stream)) as unknown[];
    } catch {
      return { lastId: '0-0', added: 0 }; // no write yet
    }
    const field = (name: string): unknown => {
      const at = info.indexOf(name);
      return at >= 0 ? info[at + 1] : undefined;
    };
    // `entries-added` is Redis 7's; without it (-1) trimming cannot be detected and the log is trusted.
    const added = Number(field('entries-added') ?? -1);
    return { lastId: String(field('last-generated-id') ?? '0-0'), added: Number.isFinite(added) ? added : -1 };
  }

  /**
   * Position first, then the documents: a write between the two is both in the scan and in the
   * log after the position, and re-indexing a path is idempotent.
   */
  private async rebuild(storeId: string, e: Entry): Promise<void> {
    const k = memoryKeys(storeId);
    const log = await this.position(k.changes);
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
    e.lastId = log.lastId;
    e.added = log.added;
  }
}
