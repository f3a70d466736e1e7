// bench:fanout — one coordinator turn fanning out to N child threads (scripted model, one bash call
// each: start_thread ×N and wait_threads in one step, then the combined reply) beside its floor
// measured in the same run: the same N single-agent turns (the member alone, same script, one bash
// call each) run one after another in one Session. Wall time from user.message accepted to the
// turn's end_turn on the Session stream, on 100 simulated runners that run the real harness loop
// with the scripted model in-process (bench/sim/harness-runners.ts).
import { fork } from 'node:child_process';
import { join } from 'node:path';
import { streamEvents, type HttpClient, type SseFrame } from '@agentplane/client';
import { startPlatform, ROOT_DIR, type Platform } from '../test/harness/platform.js';
import { printTable, type Row } from './lib/report.js';
import { setup } from './dispatch.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const SIZES = (process.env.BENCH_FANOUT ?? '1,4,16').split(',').map(Number);
const REPS = Number(process.env.BENCH_REPS ?? 5);
const SCRIPT = (rules: unknown[]) => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;

interface Ev { seq: number; type: string; session_thread_id: string | null; payload: { stop_reason?: { type: string } } }

async function startHarnessRunners(p: Platform, secrets: string[]): Promise<() => void> {
  const proc = fork(join(ROOT_DIR, 'bench/sim/harness-runners.ts'), [p.baseUrl, JSON.stringify(secrets)], { execArgv: ['--import', 'tsx'], stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  await new Promise<void>((resolve) => proc.on('message', (m: { kind: string }) => m.kind === 'ready' && resolve()));
  await new Promise((r) => setTimeout(r, 1500)); // presences written
  return () => void proc.kill();
}

/** ms from posting `text` until the primary thread's turn ends `end_turn` (seen on the Session stream). */
async function timedTurn(api: HttpClient, principal: string, session: string, primary: string, text: string, afterSeq: number): Promise<{ ms: number; seq: number }> {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), 120_000);
  const stream = streamEvents(api, `/v1/sessions/${session}/events/stream`, { signal: ac.signal, ...(afterSeq > 0 ? { lastEventId: String(afterSeq) } : {}) }) as AsyncGenerator<SseFrame>;
  const first = stream.next();
  const t0 = performance.now();
  await api.post(`/v1/sessions/${session}/events`, { type: 'user.message', payload: { content: text, authored_by: principal, caused_by: { kind: 'api' } } });
  try {
    for (let f = await first; !f.done; f = await stream.next()) {
      if (!f.value.id) continue;
      const e = JSON.parse(f.value.data) as Ev;
      if (e.type === 'session.status_idle' && e.session_thread_id === primary && e.payload.stop_reason?.type !== 'requires_action') {
        if (e.payload.stop_reason?.type !== 'end_turn') throw new Error(`turn ended ${e.payload.stop_reason?.type}`);
        return { ms: performance.now() - t0, seq: e.seq };
      }
    }
    throw new Error('stream ended before the turn did');
  } finally {
    clearTimeout(timer);
    ac.abort();
  }
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)] as number;

async function main(): Promise<void> {
  process.stdout.write(`bench:fanout  N = ${SIZES.join('/')} children, ${REPS} repetitions each (median), 100 simulated runners\n`);
  const p = await startPlatform({ scheduler: true, runner: false, env: { LOG_LEVEL: 'warn', RUNNER_HEARTBEAT_INTERVAL_MS: '5000', PAIRING_REDEEM_PER_MINUTE: '100000' } });
  try {
    const { api, principal, envId, secrets } = await setup(p);
    const stop = await startHarnessRunners(p, secrets);
    const member = await api.post<{ id: string; version: number }>('/v1/agents', {
      name: 'worker', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
      system: SCRIPT([
        { when: { on: 'user' }, then: [{ tool: 'bash', input: { command: 'echo done-{{user}}' } }] },
        { when: { after_tool: 'bash' }, then: [{ reply: 'answer {{tool_result}}' }] },
      ]),
    });
    const primaryOf = async (session: string) => (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${session}/threads`)).data[0]?.id ?? '';
    // Warm-up (not measured): the first turns of a fresh platform pay for cold caches and connections.
    for (let i = 0; i < 3; i++) {
      const s = await api.post<{ id: string }>('/v1/sessions', { agent: member.id, environment_id: envId });
      await timedTurn(api, principal, s.id, await primaryOf(s.id), 'warm-up', 0);
    }
    const rows: Row[] = [];
    for (const n of SIZES) {
      const lead = await api.post<{ id: string }>('/v1/agents', {
        name: `lead-${n}`, model: 'default',
        multiagent: { roster: [{ agent_id: member.id, version: member.version }], max_concurrent_threads: Math.min(32, Math.max(1, n)) },
        system: SCRIPT([
          { when: { on: 'user' }, then: [...Array.from({ length: n }, (_, i) => ({ tool: 'start_thread', input: { agent: 'worker', task: `part-${i}` } })), { tool: 'wait_threads', input: {} }] },
          { when: { after_tool: 'wait_threads' }, then: [{ reply: 'combined {{tool_result}}' }] },
        ]),
      });
      const fan: number[] = [];
      const seq: number[] = [];
      for (let r = 0; r < REPS; r++) {
        const s = await api.post<{ id: string }>('/v1/sessions', { agent: lead.id, environment_id: envId });
        fan.push((await timedTurn(api, principal, s.id, await primaryOf(s.id), 'go', 0)).ms);
        const single = await api.post<{ id: string }>('/v1/sessions', { agent: member.id, environment_id: envId });
        const primary = await primaryOf(single.id);
        let at = 0;
        let total = 0;
        for (let i = 0; i < n; i++) {
          const t = await timedTurn(api, principal, single.id, primary, `part-${i}`, at);
          total += t.ms;
          at = t.seq;
        }
        seq.push(total);
      }
      process.stdout.write(`  N=${n}: fan-out ${fan.map((x) => x.toFixed(0)).join('/')} ms, sequential ${seq.map((x) => x.toFixed(0)).join('/')} ms\n`);
      rows.push({ metric: `N=${n} coordinator turn vs N sequential turns`, ours: median(fan), floor: median(seq), unit: 'ms' });
    }
    printTable('fan-out wall time (floor: the same N single-agent turns one after another, same run)', rows);
    stop();
  } finally {
    await p.stop();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  process.exit(1);
});
