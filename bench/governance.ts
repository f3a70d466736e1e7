// bench:governance — ActionPolicy evaluation per tool call, with 1, 100 and 10,000 rules in the
// Workspace, beside the floor (an empty policy set) measured in the same run:
//
//  1. in process: PolicySet.evaluate for one bash call (the compiled set, no I/O);
//  2. the control plane's decision path: PolicyStore.decide against a real Redis (reads the
//     policy-set version, evaluates the cached compiled set, appends the audit record when a rule
//     decided) — what each `tool.check` frame costs the control plane.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { createLogger, newId } from '@agentplane/core';
import { DocumentStore, startEmbeddedRedis } from '@agentplane/store';
import { AuditLog, PolicySet, PolicyStore, type ActionPolicyInput, type PolicyRule, type ToolCall } from '@agentplane/api';
import { printTable, summarize, type Row } from './lib/report.js';

const ITER = Number(process.env.BENCH_ITERATIONS ?? 20_000);
const SIZES = [1, 100, 10_000];
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
    await store.decide(emptyWs, CALL, ctx);
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

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
