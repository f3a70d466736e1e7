// bench:governance — ActionPolicy evaluation per tool call, with 1, 100 and 10,000 rules in the
// Workspace, beside the floor (an empty policy set) measured in the same run:
//
//  1. in process: PolicySet.evaluate for one bash call (the compiled set, no I/O);
//  2. the control plane's decision path: PolicyStore.decide against a real Redis (reads the
//     policy-set version, evaluates the cached compiled set, appends the audit record when a rule
//     decided) — what each `tool.check` frame costs the control plane;
//  3. the drive path over HTTP (`POST /v1/sessions/{id}/events`, a Principal credential sending
//     `user.message`: live PermissionAssignment check, the drive ActionPolicy decision and its
//     audit record) at one fixed request rate, with governance on (100 and 10,000 rules, one of
//     which allows the Principal's messages) beside the floor: the same path, same rate, in a
//     Workspace with an empty policy set (phases alternate floor / governed).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { createLogger, newId } from '@agentplane/core';
import { DocumentStore, startEmbeddedRedis } from '@agentplane/store';
import { AuditLog, PolicySet, PolicyStore, type ActionPolicyInput, type PolicyRule, type ToolCall } from '@agentplane/api';
import autocannon from 'autocannon';
import { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from '../test/harness/platform.js';
import { printTable, summarize, type Row } from './lib/report.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const ITER = Number(process.env.BENCH_ITERATIONS ?? 20_000);
const SIZES = [1, 100, 10_000];
const DRIVE_RATE = Number(process.env.BENCH_DRIVE_RATE ?? 50);
const DRIVE_SECONDS = Number(process.env.BENCH_SECONDS ?? 10);
const out = (s: string) => process.stdout.write(`${s}\n`);

/** A realistic mix: exact tool names, name patterns, bash prefixes, file globs, Principal rules. */
function ruleInput(i: number): ActionPolicyInput {
  const effect = (['allow', 'require_approval', 'deny'] as const)[i % 3] as ActionPolicyInput['effect'];
  switch (i % 5) {
    case 0: return { effect, tool: { kind: 'builtin', name: 'bash', connection_id: null }, arguments: { command_prefix: `tool-${i}`, path_glob: null }, principal_id: null, description: null };
    case 1: return { effect, tool: { kind: 'mcp', name: `server${i}_*`, connection_id: null }, arguments: { command_prefix: null, path_glob: null }, principal_id: null, description: null };
    case 2: return { effect, tool: { kind: 'builtin', name: 'write', connection_id: null }, arguments: { command_prefix: null, path_glob: `/workspace/dir${i}/**/*.{ts,js}` }, principal_id: null, description: null };
    case 3: return { effect, tool: { kind: 'custom', name: `custom_tool_${i}`, connection_id: null }, arguments: { command_prefix: null, path_glob: null }, principal_id: null, description: null };
    default: return { effect, tool: { kind: 'any', name: `*_${i}`, connection_id: null }, arguments: { command_prefix: null, path_glob: null }, principal_id: `prin_${i.toString(16).padStart(32, '0')}`, description: null };
  }
}
const asRule = (i: number): PolicyRule => {
  const r = ruleInput(i);
  return {
    id: `apol_${i.toString(16).padStart(32, '0')}`, effect: r.effect, tool_kind: r.tool.kind, tool_name: r.tool.name,
    command_prefix: r.arguments.command_prefix, path_glob: r.arguments.path_glob, principal_id: r.principal_id,
    created_at: new Date(1_700_000_000_000 + i).toISOString(),
  };
};
/** The call: a bash command no rule allows or denies (every rule is examined, none decides). */
const CALL: ToolCall = { kind: 'builtin', name: 'bash', input: { command: 'ls -la /workspace && git status' } };

function timeSync(fn: () => void, n: number): number[] {
  const samples: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    fn();
    samples.push((performance.now() - t) * 1000);
  }
  return samples;
}
async function timeAsync(fn: () => Promise<unknown>, n: number): Promise<number[]> {
  const samples: number[] = [];
  for (let i = 0; i < n; i++) {
    const t = performance.now();
    await fn();
    samples.push((performance.now() - t) * 1000);
  }
  return samples;
}

async function main(): Promise<void> {
  // 1. In process.
  const floorSet = new PolicySet([]);
  timeSync(() => floorSet.evaluate(CALL), 2000);
  const floor = summarize(timeSync(() => floorSet.evaluate(CALL), ITER));
  const rows: Row[] = [];
  for (const size of SIZES) {
    const set = new PolicySet(Array.from({ length: size }, (_, i) => asRule(i)));
    const n = size >= 10_000 ? Math.max(200, Math.floor(ITER / 50)) : ITER;
    timeSync(() => set.evaluate(CALL), Math.min(n, 500));
    const s = summarize(timeSync(() => set.evaluate(CALL), n));
    rows.push({ metric: `evaluate, ${size} rules, p50`, ours: s.p50, floor: floor.p50, unit: 'µs' });
    rows.push({ metric: `evaluate, ${size} rules, p99`, ours: s.p99, floor: floor.p99, unit: 'µs' });
  }
  printTable(`ActionPolicy evaluation per tool call, in process (${ITER} calls; floor = empty policy set)`, rows);

  // 2. The decision path with Redis.
  const dir = mkdtempSync(join(tmpdir(), 'bench-gov-'));
  const server = await startEmbeddedRedis({ dir });
  const redis = new Redis(server.url);
  try {
    const docs = new DocumentStore(redis);
    const log = createLogger({ name: 'bench', level: 'silent' });
    const store = new PolicyStore(redis, docs, new AuditLog(redis, 24 * 3600 * 1000), log);
    const ctx = { actor: { id: 'run_bench', credential_id: null }, target: 'sess_bench' };
    const n = Math.max(500, Math.floor(ITER / 10));
    const emptyWs = newId('workspace');
    // Warm up (JIT, connection) so the floor measured first is not charged for it.
    await timeAsync(() => store.decide(emptyWs, CALL, ctx), n);
    const floorDecide = summarize(await timeAsync(() => store.decide(emptyWs, CALL, ctx), n));
    const decideRows: Row[] = [];
    for (const size of SIZES) {
      const ws = newId('workspace');
      for (let i = 0; i < size; i += 500) {
        await Promise.all(Array.from({ length: Math.min(500, size - i) }, (_, k) => store.create(ws, ruleInput(i + k))));
      }
      const first = performance.now();
      await store.decide(ws, CALL, ctx);
      const compileMs = performance.now() - first;
      const m = size >= 10_000 ? Math.max(200, Math.floor(n / 10)) : n;
      const s = summarize(await timeAsync(() => store.decide(ws, CALL, ctx), m));
      decideRows.push({ metric: `decide, ${size} rules, p50`, ours: s.p50, floor: floorDecide.p50, unit: 'µs' });
      decideRows.push({ metric: `decide, ${size} rules, p99`, ours: s.p99, floor: floorDecide.p99, unit: 'µs' });
      out(`  (${size} rules: first decision after a change, loading and compiling the set: ${compileMs.toFixed(1)} ms)`);
    }
    printTable('The control plane\'s tool.check decision (Redis version read + cached compiled set; floor = empty policy set)', decideRows);
  } finally {
    redis.disconnect();
    await server.stop();
    rmSync(dir, { recursive: true, force: true });
  }
}

/** One drive phase: a fresh Session, `user.message` at DRIVE_RATE for DRIVE_SECONDS (after a short warm-up). */
async function drivePhase(p: Platform, d: Driver): Promise<{ p50: number; p99: number; rps: number; bad: number }> {
  const session = await d.admin.post<{ id: string }>('/v1/sessions', { agent: { name: 'bench', model: 'default', tools: [] }, environment_id: d.envId });
  const opts = {
    url: `${p.baseUrl}/v1/sessions/${session.id}/events`, method: 'POST' as const,
    headers: { authorization: `Bearer ${d.token}`, 'service-version': '2026-08-27', 'content-type': 'application/json' },
    body: JSON.stringify({ type: 'user.message', payload: { content: 'hello', authored_by: d.principal, caused_by: { kind: 'api' } } }),
    connections: 8, overallRate: DRIVE_RATE,
  };
  await autocannon({ ...opts, duration: 2 });
  const r = await autocannon({ ...opts, duration: DRIVE_SECONDS });
  return { p50: r.latency.p50, p99: r.latency.p99, rps: r.requests.average, bad: r.errors + r.non2xx };
}

interface Driver {
  admin: HttpClient;
  token: string;
  principal: string;
  envId: string;
}

/** A Principal credential allowed to drive every Session of the Workspace, and an Environment. */
async function driver(p: Platform, ws: string): Promise<Driver> {
  const admin = new HttpClient({ baseUrl: p.baseUrl, token: p.bootstrap.root_key, workspaceId: ws });
  const principal = (await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
    external_subject_id: `bench-driver-${ws}`, principal_type: 'service', display_name: 'Bench driver',
  })).id;
  const cred = await admin.post<{ secret: string }>(`/v1/principals/${principal}/access-credentials`, { audience: 'api_mcp' }, { idempotencyKey: `bench-cred-${ws}` });
  await admin.post('/v1/permission-assignments', { principal_id: principal, target: { type: 'workspace', id: ws }, actions: ['invoke', 'steer', 'observe'] });
  const envId = (await admin.post<{ id: string }>('/v1/environments', {
    name: 'bench', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 60 },
  })).id;
  return { admin, token: cred.secret, principal, envId };
}

async function drivePath(): Promise<void> {
  const p = await startPlatform({ env: { LOG_LEVEL: 'warn' } });
  try {
    // The floor's Workspace keeps an empty policy set; the governed one gets the rules. Phases
    // alternate (floor, governed, floor, governed) and each governed phase is set beside the floor
    // phase just before it, so drift on a shared machine hits both alike.
    const floorDriver = await driver(p, p.bootstrap.workspace_id);
    const other = (await p.root.post<{ id: string }>(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'governed' })).id;
    const gov = await driver(p, other);

    out(`\nloading the drive path: ${DRIVE_RATE} req/s for ${DRIVE_SECONDS}s per phase …`);
    const rows: Row[] = [];
    const bad: string[] = [];
    // The rule that decides the Principal's messages (an allow: the decision is recorded in the audit
    // log); the rest are the mix above (over REST, without the made-up Principals).
    await gov.admin.post('/v1/action-policies', { effect: 'allow', tool: { kind: 'drive', name: 'user.message' }, principal_id: gov.principal });
    let created = 1;
    for (const size of [100, 10_000]) {
      for (; created < size; created += 100) {
        await Promise.all(Array.from({ length: Math.min(100, size - created) }, (_, k) => gov.admin.post('/v1/action-policies', { ...ruleInput(created + k), principal_id: null })));
      }
      const floor = await drivePhase(p, floorDriver);
      const ours = await drivePhase(p, gov);
      rows.push({ metric: `drive, ${size} rules, p50`, ours: ours.p50, floor: floor.p50, unit: 'ms' });
      rows.push({ metric: `drive, ${size} rules, p99`, ours: ours.p99, floor: floor.p99, unit: 'ms' });
      rows.push({ metric: `drive, ${size} rules, served`, ours: ours.rps, floor: floor.rps, unit: 'req/s', higherIsBetter: true });
      bad.push(`${size} rules: ours ${ours.bad}, floor ${floor.bad}`);
    }
    printTable(`The drive path at ${DRIVE_RATE} req/s, governance on vs the same path with an empty policy set (floor)`, rows);
    out(`non-2xx or errors: ${bad.join('; ')}`);
  } finally {
    await p.stop();
  }
}

main().then(drivePath).catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
