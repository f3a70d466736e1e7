// bench:memory — MemoryStore search and document writes against raw Redis floors, same run, same
// Redis, loopback only (about a minute and a half):
//
//  1. search p50/p99 over 100,000 documents through the API (`GET …/search`, MiniSearch index
//     kept current from the store's change log), vs the Redis part of one result page issued
//     directly (HMGET of 10 documents), and vs MiniSearch in this process over the same documents
//     (the library with no HTTP and no Redis);
//  2. the first search of a cold store (the index built from Redis) vs HSCAN of every document;
//  3. document write throughput: `PUT …/document` through the API and the store's compare-and-swap
//     script without HTTP, vs HSET of the same documents straight to Redis (and the API write vs
//     the API's lightest read, to tell the memory work from the HTTP pipeline's).
import { readFileSync } from 'node:fs';
import { performance } from 'node:perf_hooks';
import MiniSearch from 'minisearch';
import { Redis } from 'ioredis';
import { MEMORY_INDEX_OPTIONS, MemoryStores } from '@agentplane/api';
import { DocumentStore } from '@agentplane/store';
import { startPlatform } from '../test/harness/platform.js';
import { printTable, summarize } from './lib/report.js';
import { progress } from './lib/progress.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const DOCS = Number(process.env.BENCH_MEMORY_DOCS ?? 100_000);
const SEARCHES = Number(process.env.BENCH_MEMORY_SEARCHES ?? 1_000);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 3);
const CONCURRENCY = 32;
const out = (s: string) => process.stdout.write(`${s}\n`);
const rssMiB = (pid: number | undefined): string => {
  if (pid === undefined) return 'n/a';
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return (Number(m?.[1] ?? 0) / 1024).toFixed(0);
};

// A deterministic vocabulary and documents of 40 to 90 words (about 300 to 700 bytes).
let seed = 42;
const rand = () => ((seed = (seed * 1_103_515_245 + 12_345) % 2 ** 31) / 2 ** 31);
const SYLLABLES = ['ka', 'lo', 'mi', 'ne', 'ru', 'sa', 'ti', 'vo', 'xe', 'zu', 'pa', 'de', 'fi', 'go', 'hu', 'je'];
const VOCAB = Array.from({ length: 5_000 }, () => Array.from({ length: 2 + Math.floor(rand() * 3) }, () => SYLLABLES[Math.floor(rand() * SYLLABLES.length)]).join(''));
const word = () => VOCAB[Math.floor(rand() * VOCAB.length)] as string;
const text = () => Array.from({ length: 40 + Math.floor(rand() * 50) }, word).join(' ');
const pathOf = (i: number) => `notes/${Math.floor(i / 1000)}/doc-${i}.md`;

async function timeAsync(fn: () => Promise<unknown>, n: number): Promise<number[]> {
  const samples: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await fn();
    samples.push(performance.now() - t);
  }
  return samples;
}

/** Operations per second, CONCURRENCY at a time; failures are counted, printed and not counted as done. */
async function throughput(what: string, op: (i: number) => Promise<unknown>): Promise<number> {
  const end = performance.now() + SECONDS * 1000;
  let count = 0;
  let failed = 0;
  let firstError = '';
  let next = 0;
  await Promise.all(Array.from({ length: CONCURRENCY }, async () => {
    while (performance.now() < end) {
      try {
        await op(next++);
        count += 1;
      } catch (err) {
        failed += 1;
        firstError ||= err instanceof Error ? `${err.message}${err.cause instanceof Error ? `: ${err.cause.message}` : ''}` : String(err);
      }
    }
  }));
  if (failed > 0) out(`  (${what}: ${failed} failed; first: ${firstError})`);
  return count / SECONDS;
}

async function main(): Promise<void> {
  const p = await startPlatform({ env: { LOG_LEVEL: 'warn' } });
  const redis = new Redis(p.redisUrl());
  const auth = { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27' };
  try {
    const create = await fetch(`${p.baseUrl}/v1/memory-stores`, { method: 'POST', headers: { ...auth, 'content-type': 'application/json' }, body: JSON.stringify({ name: 'bench' }) });
    const store = ((await create.json()) as { id: string }).id;
    const stores = new MemoryStores(redis, new DocumentStore(redis));
    const author = { kind: 'api_key' as const, id: 'key_bench', principal_id: null };

    // Load through the store's own write path (the same script the API runs), in parallel.
    const contents: string[] = [];
    const load = progress(`loading ${DOCS} documents`, DOCS);
    const loadStart = performance.now();
    for (let i = 0; i < DOCS; i += 1000) {
      await Promise.all(Array.from({ length: Math.min(1000, DOCS - i) }, (_, k) => {
        const content = text();
        contents[i + k] = content;
        return stores.write(store, { path: pathOf(i + k), content }, author);
      }));
      load.tick(Math.min(i + 1000, DOCS));
    }
    load.end();
    out(`  (loaded in ${((performance.now() - loadStart) / 1000).toFixed(1)} s)`);

    const search = async (q: string) => {
      const r = await fetch(`${p.baseUrl}/v1/memory-stores/${store}/search?query=${encodeURIComponent(q)}&limit=10`, { headers: auth });
      if (r.status !== 200) throw new Error(`search answered ${r.status}`);
      return (await r.json()) as { results: { path: string }[] };
    };

    // 2. Cold: the first search builds the index from Redis.
    const cold = performance.now();
    await search(word());
    const coldMs = performance.now() - cold;
    const scan = performance.now();
    let cursor = '0';
    let scanned = 0;
    do {
      const [next, flat] = await redis.hscan(`ap:{m:${store}}:docs`, cursor, 'COUNT', 1000);
      cursor = next;
      scanned += flat.length / 2;
    } while (cursor !== '0');
    const scanMs = performance.now() - scan;
    if (scanned < DOCS) throw new Error(`scanned ${scanned} of ${DOCS}`);

    // 1. Warm searches: one and two random words.
    const queries = Array.from({ length: SEARCHES }, (_, i) => (i % 2 === 0 ? word() : `${word()} ${word()}`));
    let qi = 0;
    await timeAsync(() => search(queries[qi++ % queries.length] as string), 100);
    qi = 0;
    let hits = 0;
    const api = summarize(await timeAsync(async () => {
      hits += (await search(queries[qi++ % queries.length] as string)).results.length;
    }, SEARCHES));
    const pagePaths = Array.from({ length: 10 }, (_, i) => pathOf(Math.floor((i * DOCS) / 10)));
    const hmget = summarize(await timeAsync(() => redis.hmget(`ap:{m:${store}}:docs`, ...pagePaths), SEARCHES));

    // The same index options as the API's, over the same documents.
    const mini = new MiniSearch<{ id: string; path: string; content: string; meta: string }>({ ...MEMORY_INDEX_OPTIONS, fields: [...MEMORY_INDEX_OPTIONS.fields] });
    mini.addAll(contents.map((content, i) => ({ id: pathOf(i), path: pathOf(i), content, meta: '' })));
    qi = 0;
    const local = summarize(await timeAsync(async () => {
      mini.search(queries[qi++ % queries.length] as string).slice(0, 10);
    }, SEARCHES));

    printTable(`Memory search over ${DOCS} documents (${SEARCHES} queries, 10 results; ${(hits / SEARCHES).toFixed(1)} results per query on average)`, [
      { metric: 'search via API, p50', ours: api.p50, floor: hmget.p50, unit: 'ms' },
      { metric: 'search via API, p99', ours: api.p99, floor: hmget.p99, unit: 'ms' },
    ]);
    out('(floor: HMGET of one page of 10 documents straight to Redis, the Redis work of a result page)');
    printTable('The same searches without HTTP or Redis', [
      { metric: 'search via API, p50', ours: api.p50, floor: local.p50, unit: 'ms' },
      { metric: 'search via API, p99', ours: api.p99, floor: local.p99, unit: 'ms' },
    ]);
    out('(floor: MiniSearch in this process over the same documents)');
    out(`  (API process resident memory after indexing: ${rssMiB(p.pids().api)} MiB)`);
    printTable('Cold store: the first search builds its index from Redis', [
      { metric: `first search, ${DOCS} documents`, ours: coldMs, floor: scanMs, unit: 'ms' },
    ]);
    out('(floor: HSCAN of every document straight to Redis)');

    // 3. Writes of ~500-byte documents, CONCURRENCY at a time, to new paths.
    const body = text();
    const apiWrites = await throughput('PUT …/document', (i) => fetch(`${p.baseUrl}/v1/memory-stores/${store}/document`, {
      method: 'PUT', headers: { ...auth, 'content-type': 'application/json' }, body: JSON.stringify({ path: `w/api-${i}.md`, content: body }),
    }).then(async (r) => {
      if (r.status !== 201 && r.status !== 200) throw new Error(`write answered ${r.status}`);
      await r.arrayBuffer();
    }));
    const apiReads = await throughput('GET memory store', () => fetch(`${p.baseUrl}/v1/memory-stores/${store}`, { headers: auth }).then((r) => r.arrayBuffer()));
    const storeWrites = await throughput('store write', (i) => stores.write(store, { path: `w/store-${i}.md`, content: body }, author));
    const hsetWrites = await throughput('HSET', (i) => redis.hset(`bench:{m:floor}:docs`, `w/raw-${i}.md`, JSON.stringify({ path: `w/raw-${i}.md`, content: body })));
    await redis.unlink('bench:{m:floor}:docs');
    printTable(`Document writes (${CONCURRENCY} concurrent, ${Buffer.byteLength(body)}-byte documents, new paths)`, [
      { metric: 'PUT …/document via API', ours: apiWrites, floor: hsetWrites, unit: 'docs/s', higherIsBetter: true },
      { metric: 'store write script, no HTTP', ours: storeWrites, floor: hsetWrites, unit: 'docs/s', higherIsBetter: true },
    ]);
    out('(floor: HSET of the same document JSON straight to Redis; the store also checks the version and writes history and the change log)');
    printTable('The API pipeline alone, same run', [
      { metric: 'PUT …/document via API', ours: apiWrites, floor: apiReads, unit: 'req/s', higherIsBetter: true },
    ]);
    out('(floor: GET of the MemoryStore head through the same API: authentication, rate limit, one document read)');
  } finally {
    redis.disconnect();
    await p.stop();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
