// bench:events — the session event log and its SSE fan-out against raw Redis floors, same run,
// same Redis, loopback only, bounded in time (about a minute).
//
//  1. append throughput: EventLog.append (one Lua script: dedupe, seq, counters, PUBLISH) vs
//     raw ioredis XADD, one event per call and in batches of 100;
//  2. append -> SSE delivery latency p50/p99 with 1, 100, 1,000 SSE viewers of one session and
//     one viewer on each of 1,000 sessions, vs raw XADD -> XREAD BLOCK with one blocking
//     connection per reader (the design the fan-out hub replaces);
//  3. resident memory per idle SSE connection of the API process vs a bare node:http SSE server.
import { spawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { request, Agent, type IncomingMessage } from 'node:http';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import autocannon from 'autocannon';
import { EventLog, singleRedis } from '@agentplane/store';
import { startPlatform, ROOT_DIR, type Platform } from '../test/harness/platform.js';
import { printTable, summarize, type Row } from './lib/report.js';
import { costMeter, formatCost } from './lib/cost.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const SECONDS = Number(process.env.BENCH_SECONDS ?? 2);
/** Timed runs of the drive events over HTTP; their median is reported. */
const DRIVE_ROUNDS = Math.max(1, Number(process.env.BENCH_DRIVE_ROUNDS ?? 3));
const agent = new Agent({ keepAlive: false, maxSockets: Infinity });
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
const out = (s: string) => process.stdout.write(`${s}\n`);

function rssKiB(pid: number): number {
  const m = /VmRSS:\s+(\d+) kB/.exec(readFileSync(`/proc/${pid}/status`, 'utf8'));
  return Number(m?.[1] ?? 0);
}

// ---- throughput ---------------------------------------------------------------------------------

async function throughput(concurrency: number, op: () => Promise<number>): Promise<number> {
  const end = performance.now() + SECONDS * 1000;
  let count = 0;
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (performance.now() < end) {
      const done = await op(); // not `count += await op()`: that reads count before the await
      count += done;
    }
  }));
  return count / SECONDS;
}

// ---- SSE viewers --------------------------------------------------------------------------------

interface Viewer {
  res: IncomingMessage;
  close(): void;
}

/** A minimal SSE reader: calls onFrame(t) with the `t` stamped in each event payload. */
function openViewer(url: string, headers: Record<string, string>, onFrame: (t: number) => void): Promise<Viewer> {
  return new Promise((resolve, reject) => {
    const req = request(url, { headers: { ...headers, accept: 'text/event-stream' }, agent }, (res) => {
      if (res.statusCode !== 200) {
        reject(new Error(`stream answered ${res.statusCode}`));
        return;
      }
      let buf = '';
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => {
        buf += chunk;
        let i: number;
        while ((i = buf.indexOf('\n\n')) >= 0) {
          const frame = buf.slice(0, i);
          buf = buf.slice(i + 2);
          const m = /"t":(-?[0-9.]+)/.exec(frame);
          if (m?.[1]) onFrame(Number(m[1]));
        }
      });
      res.on('error', () => undefined);
      resolve({ res, close: () => req.destroy() });
    });
    req.on('error', reject);
    req.end();
  });
}

async function openMany<T>(n: number, open: (i: number) => Promise<T>): Promise<T[]> {
  const all: T[] = [];
  for (let i = 0; i < n; i += 100) all.push(...(await Promise.all(Array.from({ length: Math.min(100, n - i) }, (_, k) => open(i + k)))));
  return all;
}

interface Scenario {
  name: string;
  /** session index of each viewer */
  viewers: number;
  sessions: number;
  appends: number;
  intervalMs: number;
}

async function waitUntil(pred: () => boolean, ms: number): Promise<boolean> {
  const end = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > end) return false;
    await sleep(10);
  }
  return true;
}

/** Ours: EventLog.append -> PUBLISH -> API hub -> SSE -> this process. */
async function oursLatency(p: Platform, log: EventLog, token: string, sc: Scenario, sessionIds: string[], memory?: { pid: number; before: number }): Promise<{ lat: number[]; perConnKiB?: number }> {
  const lat: number[] = [];
  let warm = 0;
  // Each viewer resumes from the session's current end: only this scenario's events arrive.
  const cursors = await Promise.all(sessionIds.slice(0, sc.sessions).map(async (id) => (await log.state(id)).seq));
  const viewers = await openMany(sc.viewers, (i) => openViewer(
    `${p.baseUrl}/v1/sessions/${sessionIds[i % sc.sessions]}/events/stream?last_event_id=${cursors[i % sc.sessions] ?? 0}`,
    { authorization: `Bearer ${token}`, 'service-version': '2026-08-27' },
    (t) => (t < 0 ? warm++ : lat.push(performance.now() - t)),
  ));
  let perConnKiB: number | undefined;
  // Warm-up append per session: proves every viewer is subscribed before measuring.
  for (let s = 0; s < sc.sessions; s++) await log.append(sessionIds[s] as string, [{ type: 'bench', payload: { t: -1 } }]);
  if (!(await waitUntil(() => warm >= sc.viewers, 30_000))) out(`  (warm-up: only ${warm}/${sc.viewers} viewers subscribed)`);
  if (memory) perConnKiB = (rssKiB(memory.pid) - memory.before) / sc.viewers;
  for (let i = 0; i < sc.appends; i++) {
    await log.append(sessionIds[i % sc.sessions] as string, [{ type: 'bench', payload: { t: performance.now() } }]);
    await sleep(sc.intervalMs);
  }
  const expected = sc.appends * (sc.viewers / sc.sessions);
  await waitUntil(() => lat.length >= expected, 10_000);
  for (const v of viewers) v.close();
  return { lat, ...(perConnKiB !== undefined ? { perConnKiB } : {}) };
}

/** Floor: XADD -> XREAD BLOCK, one blocking connection per reader. */
async function floorLatency(url: string, sc: Scenario, tag: string): Promise<number[]> {
  const lat: number[] = [];
  const writer = singleRedis(url);
  const keysList = Array.from({ length: sc.sessions }, (_, i) => `bench:floor:{${tag}:${i}}`);
  for (const k of keysList) await writer.xadd(k, '*', 'e', '{"t":-1}');
  let stop = false;
  let warm = 0;
  const readers = await openMany(sc.viewers, async (i) => {
    const r = singleRedis(url, { maxRetriesPerRequest: null });
    // Connected before the next hundred start: a Unix socket refuses connections past its listen
    // backlog at once (EAGAIN) where loopback TCP only delays them.
    await new Promise((resolve) => r.once('ready', resolve));
    const key = keysList[i % sc.sessions] as string;
    let last = '0-0';
    void (async () => {
      while (!stop) {
        const res = (await r.xread('BLOCK', 1000, 'STREAMS', key, last).catch(() => null)) as [string, [string, string[]][]][] | null;
        for (const [, entries] of res ?? []) for (const [id, fields] of entries) {
          last = id;
          const t = Number(/"t":([0-9.-]+)/.exec(fields[1] ?? '')?.[1]);
          if (t < 0) warm++;
          else lat.push(performance.now() - t);
        }
      }
    })();
    return r;
  });
  await waitUntil(() => warm >= sc.viewers, 30_000);
  for (let i = 0; i < sc.appends; i++) {
    await writer.xadd(keysList[i % sc.sessions] as string, '*', 'e', JSON.stringify({ t: performance.now() }));
    await sleep(sc.intervalMs);
  }
  await waitUntil(() => lat.length >= sc.appends * (sc.viewers / sc.sessions), 10_000);
  stop = true;
  await sleep(50);
  for (const r of readers) r.disconnect();
  for (const k of keysList) await writer.del(k);
  writer.disconnect();
  return lat;
}

async function floorMemory(n: number): Promise<number> {
  const proc = spawn(process.execPath, ['--import', 'tsx', join(ROOT_DIR, 'bench/floors/bare-sse.ts')], { stdio: ['ignore', 'pipe', 'inherit'] });
  const port = await new Promise<number>((resolve) => proc.stdout.once('data', (d: Buffer) => resolve(Number(d.toString().trim()))));
  await sleep(300);
  const before = rssKiB(proc.pid as number);
  let opened = 0;
  const viewers = await openMany(n, async () => {
    const v = await openViewer(`http://127.0.0.1:${port}/`, {}, () => undefined);
    opened++;
    return v;
  });
  await sleep(500);
  const perConn = (rssKiB(proc.pid as number) - before) / opened;
  for (const v of viewers) v.close();
  proc.kill('SIGTERM');
  return perConn;
}

/**
 * The append phase writes a few hundred MB (ours and the floor's) that the later phases never
 * read: drop it and have Redis rewrite its append-only file now, waiting until that is done, so
 * the rewrite Redis would otherwise start on its own (at twice the last rewrite's size) does not
 * fork and copy that history on the same two cores while a later phase is timed.
 */
async function settlePersistence(redis: ReturnType<typeof singleRedis>, session: string): Promise<void> {
  let cursor = '0';
  do {
    const [next, found] = await redis.scan(cursor, 'MATCH', `*${session}*`, 'COUNT', 1000);
    if (found.length) await redis.del(...found);
    cursor = next;
  } while (cursor !== '0');
  const busy = async () => /aof_rewrite_in_progress:1|aof_rewrite_scheduled:1|rdb_bgsave_in_progress:1/.test(await redis.info('persistence'));
  while (await busy()) await sleep(100);
  await redis.bgrewriteaof().catch(() => undefined); // refused when the server runs without AOF
  while (await busy()) await sleep(100);
}

async function main(): Promise<void> {
  out(`bench:events  (${SECONDS}s per throughput run; loopback; shared machine, so expect noise)`);
  const p = await startPlatform({ runner: false, env: { LOG_LEVEL: 'warn' } });
  // The same way to Redis as the platform's processes (its Unix socket): the floors use it too.
  const url = p.redisSocketUrl();
  const redis = singleRedis(url);
  const log = new EventLog(redis);
  const rows: Row[] = [];
  try {
    // ---- 1. append throughput ----
    const body = JSON.stringify({ content: 'x'.repeat(200) });
    const tput = `sess_${'a'.repeat(32)}`;
    out('append throughput …');
    const batch = Array.from({ length: 100 }, () => ({ type: 'agent.message', payload: { content: 'x'.repeat(200) } }));
    // Alternate ours and the floor twice and keep each side's best run: the machine is shared.
    let oursOne = 0;
    let floorOne = 0;
    let oursBatch = 0;
    let floorBatch = 0;
    for (let round = 0; round < 2; round++) {
      oursOne = Math.max(oursOne, await throughput(32, async () => ((await log.append(tput, [{ type: 'agent.message', payload: { content: 'x'.repeat(200) } }])).ok ? 1 : 0)));
      floorOne = Math.max(floorOne, await throughput(32, async () => ((await redis.xadd('bench:floor:{tput}', '*', 'e', body)) ? 1 : 0)));
      oursBatch = Math.max(oursBatch, await throughput(8, async () => ((await log.append(tput, batch)).ok ? 100 : 0)));
      floorBatch = Math.max(floorBatch, await throughput(8, async () => {
        const pipe = redis.pipeline();
        for (let i = 0; i < 100; i++) pipe.xadd('bench:floor:{tput}', '*', 'e', body);
        await pipe.exec();
        return 100;
      }));
    }
    await redis.del('bench:floor:{tput}');
    await settlePersistence(redis, tput);
    rows.push(
      { metric: 'append, 1 event/call (32 in flight)', ours: oursOne, floor: floorOne, unit: 'ev/s', higherIsBetter: true },
      { metric: 'append, 100 events/call (8 in flight)', ours: oursBatch, floor: floorBatch, unit: 'ev/s', higherIsBetter: true },
    );

    const env = await p.root.post<{ id: string }>('/v1/environments', { name: 'bench', image: 'bench:1' });
    const ag = await p.root.post<{ id: string }>('/v1/agents', { name: 'bench', model: 'default' });
    const mk = async () => (await p.root.post<{ id: string }>('/v1/sessions', { agent: ag.id, environment_id: env.id })).id;

    // ---- 3. memory per idle SSE connection, measured before the API carries any load: after the
    // loads below its heap shrinks and grows by more than a thousand idle streams weigh ----
    out('memory per idle SSE connection (1,000 connections) …');
    const apiPid = (p.pids() as Record<string, number | undefined>).api;
    const idle = await mk();
    let perConnKiB = Number.NaN;
    if (apiPid) {
      // A first, smaller round warms the code the streams run, so the figure is the streams' own.
      await oursLatency(p, log, p.bootstrap.root_key, { name: 'warm-up', viewers: 50, sessions: 1, appends: 0, intervalMs: 0 }, [idle]);
      await sleep(500);
      const measured = await oursLatency(p, log, p.bootstrap.root_key, { name: 'idle', viewers: 1000, sessions: 1, appends: 0, intervalMs: 0 }, [idle], { pid: apiPid, before: rssKiB(apiPid) });
      perConnKiB = measured.perConnKiB ?? Number.NaN;
    }

    // The same append through the whole HTTP stack (auth, validation, Principal check, script).
    const principal = await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
      external_subject_id: 'bench', principal_type: 'service', display_name: 'Bench',
    });
    const driveSession = await mk();
    // user.message: the first starts a turn (its Run waits: no runner here), every later one is
    // queued behind it, so each request is one validated, authorised, fenced append.
    const driveBody = JSON.stringify({ type: 'user.message', payload: { content: 'x'.repeat(200), authored_by: principal.id, caused_by: { kind: 'api' } } });
    const driveUrl = `${p.baseUrl}/v1/sessions/${driveSession}/events`;
    const driveHeaders = { authorization: `Bearer ${p.bootstrap.root_key}`, 'service-version': '2026-08-27', 'content-type': 'application/json' };
    out('drive events over HTTP …');
    // autocannon keeps the client's cost per request small (fetch's would bound the figure on 2 cores).
    const drive = (duration: number) => autocannon({ url: driveUrl, method: 'POST', headers: driveHeaders, body: driveBody, connections: 16, duration });
    await drive(2); // warm-up: connections, JIT
    // What one drive event costs the API process (CPU) and Redis (commands sent), over a fixed
    // number of requests: steadier than events/s on a shared machine.
    const costPid = (p.pids() as Record<string, number | undefined>).api;
    let driveCost = '';
    if (costPid) {
      const meter = await costMeter(costPid, url);
      const n = Number(process.env.BENCH_COST_REQUESTS ?? 3000);
      await autocannon({ url: driveUrl, method: 'POST', headers: driveHeaders, body: driveBody, connections: 16, amount: n });
      driveCost = formatCost('POST /events', await meter.end(n));
    }
    // Several timed runs, their median reported: one run's figure moved by half from one minute to
    // the next on this kind of machine.
    const perRound: number[] = [];
    for (let round = 0; round < DRIVE_ROUNDS; round++) {
      const driven = await drive(SECONDS);
      if (driven.non2xx > 0 || driven.errors > 0) out(`  (${driven.non2xx} drive events refused, ${driven.errors} errors)`);
      perRound.push((driven.requests.total - driven.non2xx) / SECONDS);
    }
    const oursHttp = [...perRound].sort((a, b) => a - b)[Math.floor(perRound.length / 2)] as number;
    out(`  drive events/s per run: ${perRound.map((x) => x.toFixed(0)).join(', ')}; median ${oursHttp.toFixed(0)}`);
    rows.push({ metric: 'POST /events over HTTP (16 in flight)', ours: oursHttp, floor: floorOne, unit: 'ev/s', higherIsBetter: true });

    // ---- 2. delivery latency ----
    const one = [await mk()];
    const many: string[] = [];
    for (let i = 0; i < 1000; i += 50) many.push(...(await Promise.all(Array.from({ length: 50 }, mk))));
    const scenarios: (Scenario & { ids: string[] })[] = [
      { name: '1 viewer, 1 session', viewers: 1, sessions: 1, appends: 300, intervalMs: 5, ids: one },
      { name: '100 viewers, 1 session', viewers: 100, sessions: 1, appends: 100, intervalMs: 10, ids: one },
      { name: '1,000 viewers, 1 session', viewers: 1000, sessions: 1, appends: 40, intervalMs: 40, ids: one },
      { name: '1,000 viewers, 1,000 sessions', viewers: 1000, sessions: 1000, appends: 500, intervalMs: 2, ids: many },
    ];
    for (const sc of scenarios) {
      out(`delivery latency: ${sc.name} …`);
      const ours = await oursLatency(p, log, p.bootstrap.root_key, sc, sc.ids);
      await sleep(300);
      const floor = await floorLatency(url, sc, sc.name.replace(/[^a-z0-9]/gi, ''));
      const o = summarize(ours.lat);
      const f = summarize(floor);
      const want = sc.appends * (sc.viewers / sc.sessions);
      rows.push(
        { metric: `${sc.name}: p50`, ours: o.p50, floor: f.p50, unit: 'ms' },
        { metric: `${sc.name}: p99`, ours: o.p99, floor: f.p99, unit: 'ms' },
      );
      if (o.n < want || f.n < want) out(`  (delivered ours ${o.n}/${want}, floor ${f.n}/${want})`);
      await sleep(300);
    }

    out('memory per idle SSE connection, the floor (1,000 connections) …');
    const floorKiB = await floorMemory(1000);
    rows.push({ metric: 'RSS per idle SSE connection', ours: perConnKiB, floor: floorKiB, unit: 'KiB' });

    printTable('session event log and SSE fan-out vs raw Redis / bare node:http', rows);
    if (driveCost) out(driveCost);
  } finally {
    redis.disconnect();
    await p.stop();
  }
}

main().then(
  () => process.exit(0),
  (err: unknown) => {
    process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  },
);
