// bench:dispatch — user.message accepted → lease offer received by a runner, and → first runner
// event visible on the Session's SSE stream, at fixed arrival rates across 100 simulated runners
// (real WebSocket clients in a separate process), beside the floor measured in the same run:
// raw BullMQ add() → Worker processing on the same Redis. A warm-up level runs first; times are
// read with sub-millisecond resolution on both sides. The 50 Runs/s level (the latency goal's)
// runs in BENCH_LATENCY_ROUNDS rounds (3), ours and the floor in turn, each side's samples pooled.
import { fork } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import type { HttpClient } from '@agentplane/client';
import { singleRedis } from '@agentplane/store';
import { startPlatform, ROOT_DIR, type Platform } from '../test/harness/platform.js';
import { LightClient } from './lib/light-client.js';
import { printTable, summarize, wallMs } from './lib/report.js';
import { benchHelp } from './lib/help.js';

const RUNNERS = Number(process.env.BENCH_RUNNERS ?? 100);
const RATES = (process.env.BENCH_RATES ?? '50,200,500,1000').split(',').map(Number).filter((r) => r > 0);
const SECONDS = Number(process.env.BENCH_SECONDS ?? 4);
/** `deployment`: every Session is created against an AgentDeployment revision pinned to the runners' pool. */
const SESSIONS = process.env.BENCH_SESSIONS === 'deployment' ? 'deployment' : 'plain';
/**
 * `BENCH_STREAM_FIRST=1`: each Run's SSE stream is open before its message is sent (a client
 * that watches before it speaks). Default: the stream opens as the message is sent, so the API
 * serves both at once.
 */
const STREAM_FIRST = process.env.BENCH_STREAM_FIRST === '1';
/** Levels up to this rate are about latency: run in rounds, ours and the floor in turn. */
const LATENCY_RATE = 50;
const LATENCY_ROUNDS = Math.max(1, Number(process.env.BENCH_LATENCY_ROUNDS ?? 3));

/** A deployment whose revision pins the default pool (where the simulated runners are) and the split topology. */
async function deployment(api: HttpClient, ws: string): Promise<string> {
  const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'b', model: 'default' })).id;
  const hprof = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/harness-profiles`, { key: 'bench', kind: 'builtin' })).id;
  const sprof = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/sandbox-profiles`, { key: 'bench', image: 'agentplane/sandbox:latest' })).id;
  const mrp = (await api.get<{ data: { id: string }[] }>(`/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key: 'default' })).data[0]?.id;
  const pool = (await api.get<{ data: { id: string; name: string }[] }>('/v1/runner-pools')).data.find((x) => x.name === 'default')?.id;
  const head = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: agent, key: 'bench' })).id;
  await api.post(`/v1/agent-deployments/${head}/revisions`, {
    expected_resource_version: 1, agent_release_number: 1, model_routing: { model_routing_profile_id: mrp, model_routing_profile_revision_number: 1 },
    execution_target: { type: 'managed', harness_profile_id: hprof, harness_profile_revision_number: 1, sandbox_profile_id: sprof, sandbox_profile_revision_number: 1, runner_pool_id: pool, harness_topology: 'split' },
    skill_selections: [], connection_binding_selections: [],
  });
  return head;
}

export async function setup(p: Platform): Promise<{ api: HttpClient; principal: string; envId: string; secrets: string[]; newSession: () => Promise<{ id: string }> }> {
  const ws = p.bootstrap.workspace_id;
  const api = p.root;
  const principal = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, { external_subject_id: 'bench', principal_type: 'service', display_name: 'Bench' })).id;
  const envId = (await api.post<{ id: string }>('/v1/environments', { name: 'bench', image: 'agentplane/sandbox:latest' })).id;
  // Runs go to the workspace's default (BYOC) pool: pair the simulated machines into it.
  const secrets: string[] = [];
  for (let i = 0; i < RUNNERS; i++) {
    const pairing = await api.post<{ code: string }>('/v1/runner-pairings', { principal_id: principal, machine_label: `sim-${i}`, expires_in_seconds: 600 }, { idempotencyKey: `pair-${i}` });
    const r = await p.anon.post<{ secret: string }>('/v1/runner-pairings/redeem', { code: pairing.code });
    secrets.push(r.secret);
  }
  if (SESSIONS === 'deployment') {
    const head = await deployment(api, ws);
    return { api, principal, envId, secrets, newSession: () => api.post<{ id: string }>(`/v1/agent-deployments/${head}/sessions`, {}) };
  }
  return { api, principal, envId, secrets, newSession: () => api.post<{ id: string }>('/v1/sessions', { agent: { name: 'b', model: 'default' }, environment_id: envId }) };
}

export interface Level {
  rate: number; lease: ReturnType<typeof summarize>; visible: ReturnType<typeof summarize>;
  /** message sent → the POST's answer read (the job exists by then; the Run's own record follows). */
  answered: ReturnType<typeof summarize>; done: number; sent: number;
  /** The samples of each figure (ms), for pooling the rounds of a level. */
  samples: { lease: number[]; visible: number[]; answered: number[] };
  /** Runs not done: the Session and what the bench's client saw (a refused POST, a stream that failed or timed out). */
  missed: { session: string; why: string }[];
}

/** CPU time (user + system, ms) a process has used so far, from /proc (Linux). */
export function cpuMs(pid: number | undefined): number {
  if (!pid) return Number.NaN;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return ((Number(fields[11]) + Number(fields[12])) * 1000) / 100; // utime, stime in clock ticks (USER_HZ = 100)
  } catch {
    return Number.NaN;
  }
}

/**
 * Write system calls (`write`, `writev`, `sendmsg`, …) a process has made so far, from /proc
 * (Linux): every frame, answer and Redis command batch that leaves a process is one, and unlike
 * CPU time the count does not move with the machine's speed.
 */
export function writeCalls(pid: number | undefined): number {
  if (!pid) return Number.NaN;
  try {
    return Number(/^syscw: (\d+)$/m.exec(readFileSync(`/proc/${pid}/io`, 'utf8'))?.[1] ?? Number.NaN);
  } catch {
    return Number.NaN;
  }
}

/** CPU ms (or another counter) per Run of each process over one level: where a Run's cost goes. */
export function perRun(before: Record<string, number>, after: Record<string, number>, runs: number): string {
  return Object.keys(after).map((k) => `${k} ${((after[k] as number) - (before[k] as number)) / runs >= 0 ? (((after[k] as number) - (before[k] as number)) / runs).toFixed(2) : '?'}`).join(', ');
}

/** Each of `names`' counter growth over one level as a multiple of `reference`'s. */
export function relativeTo(reference: string, before: Record<string, number>, after: Record<string, number>, names: string[]): string {
  const base = (after[reference] as number) - (before[reference] as number);
  return names.map((k) => {
    const x = ((after[k] as number) - (before[k] as number)) / base;
    return `${k} ${Number.isFinite(x) && x >= 0 ? x.toFixed(2) : '?'}`;
  }).join(', ');
}

export async function level(api: HttpClient, principal: string, newSession: () => Promise<{ id: string }>, rate: number, leased: Map<string, number>, onSending?: () => void): Promise<Level> {
  const total = Math.max(1, Math.round(rate * SECONDS));
  // Sessions first (not measured). A keep-alive socket the server closed while idle is retried once.
  const create = () => newSession().catch((err: unknown) => (err instanceof TypeError ? newSession() : Promise.reject(err)));
  const sessions: string[] = [];
  for (let i = 0; i < total; i += 50) {
    const batch = await Promise.all(Array.from({ length: Math.min(50, total - i) }, create));
    sessions.push(...batch.map((s) => s.id));
  }
  // One real SSE viewer and one real drive POST per Run, through a cheap client (node:http, a
  // bare SSE reader): the bench's own CPU should not be what limits the rate it can drive.
  const client = new LightClient(api.options);
  onSending?.();
  const t0 = new Map<string, number>();
  const visible: number[] = [];
  const acks: number[] = [];
  const waits: Promise<void>[] = [];
  const missed: Level['missed'] = [];
  const started = Date.now();
  const body = { type: 'user.message', payload: { content: 'go', authored_by: principal, caused_by: { kind: 'api' } } };
  for (let i = 0; i < total; i++) {
    const due = started + (i * 1000) / rate;
    const delay = due - Date.now();
    if (delay > 0) await new Promise((r) => setTimeout(r, delay));
    const id = sessions[i] as string;
    waits.push((async () => {
      const ac = new AbortController();
      const timer = setTimeout(() => ac.abort(), 30_000);
      let opened: () => void = () => undefined;
      const open = new Promise<void>((r) => (opened = r));
      const first = client.firstOf(`/v1/sessions/${id}/events/stream`, 'agent.message', ac.signal, opened);
      // A stream refused while the message is being sent is counted as not done, not a crash.
      first.catch(() => undefined);
      // A client that watches before it speaks: the message goes once its stream is open.
      if (STREAM_FIRST) await Promise.race([open, first.catch(() => undefined)]);
      const sentAt = wallMs();
      t0.set(id, sentAt);
      let stage = 'the message';
      try {
        await client.post(`/v1/sessions/${id}/events`, body);
        acks.push(wallMs() - sentAt);
        stage = 'the stream';
        visible.push((await first) - sentAt);
      } catch (err) {
        // refused or timed out: counted as not done, and said why
        missed.push({ session: id, why: `${stage}: ${ac.signal.aborted ? 'no agent.message within 30 s' : err instanceof Error ? err.message : String(err)}` });
      } finally {
        clearTimeout(timer);
        ac.abort();
      }
    })());
  }
  await Promise.all(waits);
  client.close();
  const leaseLat = sessions.filter((s) => leased.has(s) && t0.has(s)).map((s) => (leased.get(s) as number) - (t0.get(s) as number));
  return {
    rate, lease: summarize(leaseLat), visible: summarize(visible), answered: summarize(acks), done: visible.length, sent: total,
    samples: { lease: leaseLat, visible, answered: acks }, missed,
  };
}

/** Runs a level did not see done (a few of them): what the client saw, and the Run's status on the platform. */
async function reportMissed(api: HttpClient, missed: Level['missed']): Promise<void> {
  for (const m of missed.slice(0, 5)) {
    const runs = await api.get<{ data: { id: string; status: string }[] }>(`/v1/sessions/${m.session}/runs`).then((r) => r.data.map((x) => `${x.id} ${x.status}`).join(', ') || 'no Run', (err: unknown) => `Runs not read: ${String(err)}`);
    process.stdout.write(`  not done: ${m.session} (${m.why}); on the platform: ${runs}\n`);
  }
  if (missed.length > 5) process.stdout.write(`  … and ${missed.length - 5} more not done\n`);
}

/**
 * Redis commands sent per Run by each process while `run` drives a level (MONITOR, attributed
 * by connection name): background work (heartbeats, presence, pool scans) is included, so the
 * figures are upper bounds. Use at low rates only: MONITOR itself costs Redis a lot.
 */
export async function commandsPerRun(redisUrl: string, runs: (start: () => void) => Promise<number>): Promise<string> {
  const mon = new Redis(redisUrl);
  const counts = new Map<string, Map<string, number>>();
  const monitor = await mon.monitor();
  let on = false;
  monitor.on('monitor', (_time: string, args: string[], source: string) => {
    if (!on) return;
    let c = counts.get(source);
    if (!c) counts.set(source, (c = new Map()));
    const cmd = String(args[0]).toUpperCase();
    c.set(cmd, (c.get(cmd) ?? 0) + 1);
  });
  // Socket reads Redis made (INFO's total_reads_processed): commands that reached it in one
  // client write count once, so this is how many writes the clients spent on the Runs.
  const stats = new Redis(redisUrl);
  const reads = async () => Number(/total_reads_processed:(\d+)/.exec(await stats.info('stats'))?.[1] ?? Number.NaN);
  let readsAtStart: Promise<number> = Promise.resolve(Number.NaN);
  // Sessions are created before the level starts sending: only the Runs are counted.
  const n = await runs(() => {
    on = true;
    readsAtStart = reads();
  });
  await new Promise((r) => setTimeout(r, 200));
  const readsPerRun = ((await reads()) - (await readsAtStart)) / n;
  stats.disconnect();
  monitor.disconnect();
  const names = new Map<string, string>();
  const list = (await mon.client('LIST')) as string;
  for (const line of list.split('\n')) {
    const addr = /addr=(\S+)/.exec(line)?.[1];
    const name = /name=(\S*)/.exec(line)?.[1];
    if (addr) names.set(addr, name || '(unnamed)');
  }
  mon.disconnect();
  const byName = new Map<string, Map<string, number>>();
  for (const [source, c] of counts) {
    // Commands a Lua script ran show as `lua`: work inside one round trip, not round trips.
    const name = source.endsWith('lua') ? '(inside scripts)' : (names.get(source) ?? '(closed)').replace(/^agentplane:/, '');
    let t = byName.get(name);
    if (!t) byName.set(name, (t = new Map()));
    for (const [cmd, k] of c) t.set(cmd, (t.get(cmd) ?? 0) + k);
  }
  return [...byName].sort(([a], [b]) => a.localeCompare(b)).map(([name, c]) => {
    const total = [...c.values()].reduce((a, b) => a + b, 0);
    const top = [...c].sort((a, b) => b[1] - a[1]).slice(0, 8).map(([cmd, k]) => `${cmd} ${(k / n).toFixed(1)}`).join(', ');
    return `  ${name}: ${(total / n).toFixed(1)} per Run (${top})`;
  }).concat(`  socket reads Redis made per Run (client writes; every client, MONITOR's own excluded): ${readsPerRun.toFixed(1)}`).join('\n');
}

async function floor(redisUrl: string, rate: number): Promise<number[]> {
  const conn = singleRedis(redisUrl, { maxRetriesPerRequest: null });
  const q = new Queue('bench-floor', { connection: conn, prefix: '{bench}' });
  const lat: number[] = [];
  const workerConn = singleRedis(redisUrl, { maxRetriesPerRequest: null });
  const worker = new Worker('bench-floor', async (job) => void lat.push(wallMs() - (job.data as { at: number }).at), { connection: workerConn, prefix: '{bench}', concurrency: 50 });
  const total = Math.round(rate * SECONDS);
  const started = Date.now();
  for (let i = 0; i < total; i++) {
    const delay = started + (i * 1000) / rate - Date.now();
    if (delay > 0) await new Promise((r) => setTimeout(r, delay));
    await q.add('j', { at: wallMs() }, { removeOnComplete: true });
  }
  while (lat.length < total && Date.now() - started < SECONDS * 1000 + 10_000) await new Promise((r) => setTimeout(r, 20));
  await worker.close();
  await q.obliterate({ force: true }).catch(() => undefined);
  await q.close();
  conn.disconnect();
  workerConn.disconnect();
  return lat;
}

async function main(): Promise<void> {
  process.stdout.write(`bench:dispatch  ${RUNNERS} simulated runners, rates ${RATES.join('/')} Runs/s, ${SECONDS}s each, ${SESSIONS} Sessions${STREAM_FIRST ? ', each stream open before its message' : ''}\n`);
  const p = await startPlatform({
    scheduler: true, runner: false,
    // MONITOR tells connections apart by their address: over the Unix socket every client has the same.
    env: { LOG_LEVEL: 'warn', RUNNER_HEARTBEAT_INTERVAL_MS: '5000', PAIRING_REDEEM_PER_MINUTE: '100000', ...(process.env.BENCH_MONITOR ? { REDIS_SOCKET: 'false' } : {}) },
  });
  try {
    const { api, principal, secrets, newSession } = await setup(p);
    const { leased, stop: stopRunners, pid: simPid } = await startSimulatedRunners(p, secrets);
    if (process.env.BENCH_MONITOR) {
      // Redis commands per Run at a low rate, by connection: where the round trips go.
      const rate = Number(process.env.BENCH_MONITOR) || 5;
      process.stdout.write(`Redis commands per Run at ${rate} Runs/s (MONITOR):\n`);
      process.stdout.write(`${await commandsPerRun(p.redisUrl(), async (start) => (await level(api, principal, newSession, rate, leased, start)).sent)}\n`);
    }
    // The first Runs after a start meet cold code (JIT) and connections, caches and the pool's
    // discovery still to be made: a warm-up level, reported but not in the table.
    const warm = await level(api, principal, newSession, 50, leased);
    process.stdout.write(`warm-up at 50 Runs/s (not in the table): message→lease p50 ${warm.lease.p50.toFixed(1)} ms, p99 ${warm.lease.p99.toFixed(1)} ms, ${warm.done}/${warm.sent} done\n`);
    await reportMissed(api, warm.missed);
    const rows = [];
    let sustainable = 0;
    for (const rate of RATES) {
      // The latency level runs in rounds, ours and the floor in turn: the floor moves by a third
      // from one minute to the next on this kind of machine, so each side's samples are pooled
      // over the same minutes. Rates above it run once (they are about throughput, and long).
      const rounds = rate <= LATENCY_RATE ? LATENCY_ROUNDS : 1;
      process.stdout.write(`rate ${rate}/s${rounds > 1 ? ` (${rounds} rounds, ours and the floor in turn)` : ''} …\n`);
      const pids: Record<string, number | undefined> = { ...(p.pids() as Record<string, number | undefined>), 'sim runners': simPid, bench: process.pid };
      const names = ['api', 'scheduler', 'redis', 'sim runners', 'bench'];
      const snap = () => Object.fromEntries(names.map((k) => [k, cpuMs(pids[k])]));
      const writes = () => Object.fromEntries(names.map((k) => [k, writeCalls(pids[k])]));
      const levels: Level[] = [];
      const floorSamples: number[] = [];
      for (let round = 0; round < rounds; round++) {
        let before = snap();
        let writesBefore = writes();
        const one = await level(api, principal, newSession, rate, leased, () => {
          before = snap();
          writesBefore = writes();
        });
        const after = snap();
        process.stdout.write(`  CPU ms per Run: ${perRun(before, after, one.sent)}\n`);
        // The simulated runners' code is the same whatever the platform's build: the platform's
        // CPU as a multiple of theirs, in the same minutes, compares builds across the machine's
        // changes of speed better than milliseconds do.
        process.stdout.write(`  CPU per Run as a multiple of the simulated runners': ${relativeTo('sim runners', before, after, ['api', 'scheduler', 'redis'])}\n`);
        process.stdout.write(`  write system calls per Run: ${perRun(writesBefore, writes(), one.sent)}\n`);
        levels.push(one);
        // The floor's own CPU per job (its Queue and Worker run in this process): what a job
        // costs BullMQ alone, against what a Run costs the platform.
        const floorPids = { 'bench (Queue and Worker)': process.pid, redis: pids.redis };
        const floorBefore = Object.fromEntries(Object.entries(floorPids).map(([k, pid]) => [k, cpuMs(pid)]));
        const lat = await floor(p.redisSocketUrl(), rate);
        const floorAfter = Object.fromEntries(Object.entries(floorPids).map(([k, pid]) => [k, cpuMs(pid)]));
        process.stdout.write(`  the floor's CPU ms per job: ${perRun(floorBefore, floorAfter, Math.max(1, lat.length))}\n`);
        floorSamples.push(...lat);
      }
      const pooled = (pick: (l: Level) => number[]) => summarize(levels.flatMap(pick));
      const ours = {
        lease: pooled((l) => l.samples.lease), visible: pooled((l) => l.samples.visible), answered: pooled((l) => l.samples.answered),
        done: levels.reduce((a, l) => a + l.done, 0), sent: levels.reduce((a, l) => a + l.sent, 0),
      };
      const fl = summarize(floorSamples);
      process.stdout.write(`  completed ${ours.done}/${ours.sent}; message→POST answered p50 ${ours.answered.p50.toFixed(2)} ms, p99 ${ours.answered.p99.toFixed(2)} ms\n`);
      await reportMissed(api, levels.flatMap((l) => l.missed));
      if (rounds > 1) {
        process.stdout.write(`  message→lease p50 per round: ${levels.map((l) => l.lease.p50.toFixed(2)).join(', ')} ms\n`);
      }
      if (ours.done === ours.sent && ours.lease.p99 < 1000) sustainable = rate;
      rows.push(
        { metric: `${rate}/s message→lease p50`, ours: ours.lease.p50, floor: fl.p50, unit: 'ms' },
        { metric: `${rate}/s message→lease p99`, ours: ours.lease.p99, floor: fl.p99, unit: 'ms' },
        { metric: `${rate}/s message→first event p50`, ours: ours.visible.p50, floor: fl.p50, unit: 'ms' },
        { metric: `${rate}/s message→first event p99`, ours: ours.visible.p99, floor: fl.p99, unit: 'ms' },
      );
    }
    printTable('dispatch latency (floor: raw BullMQ add → Worker processing at the same rate)', rows);
    process.stdout.write(`highest sustained rate tried with every Run done and lease p99 < 1 s: ${sustainable || 'none'} Runs/s\n`);
    stopRunners();
  } finally {
    await p.stop();
  }
}

/** Simulated runners paired into the platform, forked; resolves once they are connected. */
export async function startSimulatedRunners(p: Platform, secrets: string[]): Promise<{ leased: Map<string, number>; stop(): void; pid: number | undefined }> {
  const runners = fork(join(ROOT_DIR, 'bench/sim/runners.ts'), [p.baseUrl, JSON.stringify(secrets)], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  const leased = new Map<string, number>();
  await new Promise<void>((resolve) => runners.on('message', (m: { kind: string; session_id?: string; at?: number }) => {
    if (m.kind === 'ready') resolve();
    else if (m.kind === 'leased' && m.session_id && m.at && !leased.has(m.session_id)) leased.set(m.session_id, m.at);
  }));
  await new Promise((r) => setTimeout(r, 1500)); // presences written
  return { leased, stop: () => void runners.kill(), pid: runners.pid };
}

// Run as a script (bench:dispatch); other benches import the pieces above.
if (process.argv[1] && import.meta.url === pathToFileURL(resolve(process.argv[1])).href) {
  benchHelp(import.meta.url);
  main().catch((err: unknown) => {
    process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
    process.exit(1);
  });
}
