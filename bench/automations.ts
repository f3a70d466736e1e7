// bench:automations — signed webhook ingest → firing receipt → Session created, paced at 100
// deliveries/s (p50/p99), and outbound webhook delivery throughput to a local receiver; beside
// floors measured in the same run: a bare Koa handler doing the same HMAC check, raw BullMQ
// add → worker start, and raw BullMQ jobs POSTing to the same receiver.
import { spawn } from 'node:child_process';
import { createServer } from 'node:http';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Queue, Worker } from 'bullmq';
import { singleRedis } from '@agentplane/store';
import { Webhook } from 'standardwebhooks';
import { startPlatform, waitFor, ROOT_DIR } from '../test/harness/platform.js';
import { printTable, summarize } from './lib/report.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const RATE = Number(process.env.BENCH_RATE ?? 100);
const COUNT = Number(process.env.BENCH_DELIVERIES ?? 300);
const OUT_SESSIONS = Number(process.env.BENCH_OUT_SESSIONS ?? 20);
const OUT_PER_SESSION = Number(process.env.BENCH_OUT_PER_SESSION ?? 25);
const out = (s: string) => process.stdout.write(`${s}\n`);
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** Sends `COUNT` requests paced at `RATE`/s; returns each one's latency (ms) and send time. */
async function paced(send: (i: number) => Promise<void>): Promise<{ lat: number[] }> {
  const lat: number[] = [];
  const start = performance.now();
  const inflight: Promise<void>[] = [];
  for (let i = 0; i < COUNT; i++) {
    const due = start + (i * 1000) / RATE;
    const wait = due - performance.now();
    if (wait > 0) await sleep(wait);
    const t = performance.now();
    inflight.push(send(i).then(() => void lat.push(performance.now() - t)));
  }
  await Promise.all(inflight);
  return { lat };
}

function signed(secret: string, body: string): Record<string, string> {
  const id = `msg_${Math.random().toString(36).slice(2)}${Date.now()}`;
  const at = new Date();
  return { 'content-type': 'application/json', 'webhook-id': id, 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)), 'webhook-signature': new Webhook(secret).sign(id, at, body) };
}

async function main(): Promise<void> {
  out(`bench:automations  ${COUNT} signed deliveries at ${RATE}/s; outbound ${OUT_SESSIONS} Sessions × ${OUT_PER_SESSION} events`);
  let received = 0;
  const receiver = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      received++;
      res.writeHead(200).end();
    });
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', () => r()));
  const rport = (receiver.address() as { port: number }).port;
  const p = await startPlatform({ env: { LOG_LEVEL: 'warn', AGENTPLANE_MODE: 'development' } });
  try {
    const ws = p.bootstrap.workspace_id;
    const api = p.root.with({ workspaceId: ws });
    const service = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, { external_subject_id: 'bench-bot', principal_type: 'service', display_name: 'Bench bot' })).id;
    await api.post('/v1/permission-assignments', { principal_id: service, target: { type: 'workspace', id: ws }, actions: ['invoke'] });
    const envId = (await api.post<{ id: string }>('/v1/environments', { name: 'bench', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 60 } })).id;
    const agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'bench', model: 'default' })).id;
    // No scheduler runs here: turns stay queued, so each firing holds a concurrency slot; spread them.
    const autos: { id: string; secret: string }[] = [];
    for (let i = 0; i < Math.ceil(COUNT / 100); i++) {
      const a = await api.post<{ id: string; signing_secret: string }>('/v1/automations', {
        name: `bench-${i}`, principal_id: service, agent: agentId, environment_id: envId, prompt: 'Handle {{event}}', max_concurrent_firings: 100, trigger: { type: 'webhook' },
      });
      autos.push({ id: a.id, secret: a.signing_secret });
    }
    const body = JSON.stringify({ alert: 'disk full', host: 'db-1', value: 97.5 });

    out('ingest: signed deliveries through the platform …');
    const sentAt = new Map<string, number>();
    const firings: { id: string; auto: number }[] = [];
    const ingest = await paced(async (i) => {
      const a = autos[i % autos.length]!;
      const wall = Date.now();
      const res = await fetch(`${p.baseUrl}/v1/ingest/automations/${a.id}`, { method: 'POST', headers: signed(a.secret, body), body });
      const f = (await res.json()) as { id: string };
      if (res.status !== 202) throw new Error(`ingest answered ${res.status}`);
      sentAt.set(f.id, wall);
      firings.push({ id: f.id, auto: i });
    });
    const created: number[] = [];
    await waitFor('every firing running', async () => {
      for (const f of firings) {
        if (created.length >= firings.length) break;
        if (!sentAt.has(f.id)) continue;
        const r = await api.get<{ status: string; started_at: string | null }>(`/v1/automation-firings/${f.id}`);
        if (r.started_at) {
          created.push(Date.parse(r.started_at) - (sentAt.get(f.id) ?? 0));
          sentAt.delete(f.id);
        } else if (r.status !== 'pending') throw new Error(`firing ${f.id} is ${r.status}`);
      }
      return created.length >= firings.length ? true : undefined;
    }, 120_000);

    out('floor: bare Koa handler with the same HMAC check …');
    const secret = autos[0]!.secret;
    const floorProc = spawn(process.execPath, ['--import', 'tsx', join(ROOT_DIR, 'bench/floors/bare-webhook.ts'), secret, '0'], { stdio: ['ignore', 'pipe', 'inherit'] });
    const fport = await new Promise<number>((resolve) => floorProc.stdout.once('data', (d: Buffer) => resolve(Number(d.toString().trim()))));
    const bare = await paced(async () => {
      const res = await fetch(`http://127.0.0.1:${fport}/`, { method: 'POST', headers: signed(secret, body), body });
      await res.arrayBuffer();
      if (res.status !== 202) throw new Error(`floor answered ${res.status}`);
    });
    floorProc.kill('SIGTERM');

    out('floor: raw BullMQ add → worker start …');
    const conn = singleRedis(p.redisSocketUrl(), { maxRetriesPerRequest: null });
    const queue = new Queue('bench-floor', { connection: conn, prefix: 'bench:{q:floor}' });
    const started = new Map<string, number>();
    const pickups: number[] = [];
    const workerConn = conn.duplicate();
    const worker = new Worker('bench-floor', async (job) => {
      const t = started.get(String(job.id));
      if (t !== undefined) pickups.push(performance.now() - t);
    }, { connection: workerConn, prefix: 'bench:{q:floor}', concurrency: 16 });
    await worker.waitUntilReady();
    await paced(async (i) => {
      started.set(`j${i}`, performance.now());
      await queue.add('j', { i }, { jobId: `j${i}`, removeOnComplete: true });
    });
    await waitFor('floor jobs', () => (pickups.length >= COUNT ? true : undefined), 60_000);

    out('outbound: Session events to a local receiver …');
    await api.post('/v1/webhook-endpoints', { url: `http://127.0.0.1:${rport}/hook`, event_types: ['user.message'] });
    const person = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, { external_subject_id: 'bench-user', principal_type: 'person', display_name: 'Bench user' })).id;
    const msg = (content: string) => ({ type: 'user.message', payload: { content, authored_by: person, caused_by: { kind: 'api' } } });
    const total = OUT_SESSIONS * OUT_PER_SESSION;
    received = 0;
    const t0 = performance.now();
    await Promise.all(Array.from({ length: OUT_SESSIONS }, async (_, s) => {
      const id = (await api.post<{ id: string }>('/v1/sessions', { agent: agentId, environment_id: envId, initial_events: [msg(`s${s}-0`)] })).id;
      for (let m = 1; m < OUT_PER_SESSION; m++) await api.post(`/v1/sessions/${id}/events`, msg(`s${s}-${m}`));
    }));
    const driven = performance.now() - t0;
    await waitFor('every delivery', () => (received >= total ? true : undefined), 120_000);
    const oursOut = total / ((performance.now() - t0) / 1000);

    received = 0;
    const postQueue = new Queue('bench-post', { connection: conn, prefix: 'bench:{q:post}' });
    const posterConn = conn.duplicate();
    const poster = new Worker('bench-post', async () => {
      const res = await fetch(`http://127.0.0.1:${rport}/hook`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
      await res.arrayBuffer();
    }, { connection: posterConn, prefix: 'bench:{q:post}', concurrency: OUT_SESSIONS });
    await poster.waitUntilReady();
    const t1 = performance.now();
    await postQueue.addBulk(Array.from({ length: total }, (_, i) => ({ name: 'p', data: { i }, opts: { removeOnComplete: true } })));
    await waitFor('floor posts', () => (received >= total ? true : undefined), 120_000);
    const floorOut = total / ((performance.now() - t1) / 1000);
    await Promise.all([worker.close(), poster.close(), queue.close(), postQueue.close()]);
    await Promise.all([conn.quit(), workerConn.quit(), posterConn.quit()]);

    const ing = summarize(ingest.lat);
    const cre = summarize(created);
    const fl = summarize(bare.lat);
    const bq = summarize(pickups);
    printTable(`signed webhook ingest at ${RATE}/s (${COUNT} deliveries) vs floors`, [
      { metric: 'delivery → receipt (HTTP 202) p50', ours: ing.p50, floor: fl.p50, unit: 'ms' },
      { metric: 'delivery → receipt (HTTP 202) p99', ours: ing.p99, floor: fl.p99, unit: 'ms' },
      { metric: 'delivery → Session created p50', ours: cre.p50, floor: fl.p50 + bq.p50, unit: 'ms' },
      { metric: 'delivery → Session created p99', ours: cre.p99, floor: fl.p99 + bq.p99, unit: 'ms' },
    ]);
    out(`floors: bare Koa + HMAC p50 ${fl.p50.toFixed(2)} ms / p99 ${fl.p99.toFixed(2)} ms; raw BullMQ add → worker p50 ${bq.p50.toFixed(2)} ms / p99 ${bq.p99.toFixed(2)} ms (the Session floor is their sum)`);
    printTable(`outbound deliveries (${total} events over ${OUT_SESSIONS} Sessions, ordered per Session) vs raw BullMQ → POST`, [
      { metric: 'throughput', ours: oursOut, floor: floorOut, unit: 'deliveries/s', higherIsBetter: true },
    ]);
    out(`(our figure includes driving the events through the API: ${(total / (driven / 1000)).toFixed(0)} events/s appended)`);
  } finally {
    await p.stop();
    receiver.close();
  }
  process.exit(0);
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
