// bench:outcomes — an outcome with one revision (define → turn → grader Run → revision turn →
// grader Run → satisfied) against its floor measured in the same run: the same two agent turns
// driven by hand (a user.message, then the revision text as a second user.message). Wall time
// from the first drive event to the end (outcome_ended / the second idle) and tokens metered for
// the Session (model gateway usage, grader Runs included), p50/p99 over BENCH_OUTCOMES pairs,
// interleaved so machine drift hits both alike. The cost ratio is the grader's overhead.
// BENCH_DEBUG=1 prints each Run's dispatch timestamps (ms after it was accepted).
// BENCH_HEARTBEAT_MS sets the runner heartbeat (default: the platform's, 5000): the dispatcher
// counts leases granted since a runner's last presence write against its slots, so Runs started
// back to back (an outcome starts four) can wait for the next heartbeat.
import { streamEvents, type HttpClient, type SseFrame } from '@agentplane/client';
import { startPlatform, waitFor } from '../test/harness/platform.js';
import { progress } from './lib/progress.js';
import { printTable, summarize } from './lib/report.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const N = Number(process.env.BENCH_OUTCOMES ?? 50);
const SCRIPT = (rules: unknown[]): string => `Be brief.\n\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;
const AGENT = SCRIPT([
  { when: { user_contains: 'asks for a revision' }, then: [{ tool: 'bash', input: { command: 'echo report-v2-body > /workspace/report.md' } }] },
  { when: { after_tool: 'bash' }, then: [{ reply: 'Done: see `report.md`.' }] },
  { then: [{ tool: 'bash', input: { command: 'echo report-v1-body > /workspace/report.md' } }] },
]);
const EXPLANATION = 'Bring the report to version 2.';
const RUBRIC = `- The report exists\n- The report is version 2\n\n\`\`\`scripted\n${JSON.stringify({
  rules: [
    { when: { user_contains: 'report-v2-body' }, then: [{ verdict: 'satisfied' }] },
    { then: [{ verdict: 'needs_revision', explanation: EXPLANATION }] },
  ],
})}\n\`\`\`\n`;
const DESCRIPTION = 'Write the quarterly report.';

interface Ev { type: string; payload: Record<string, unknown> }

/** Opens the Session's stream, runs `drive`, and resolves with the time until `done` holds. */
async function timed(api: HttpClient, id: string, drive: (seen: Ev[]) => Promise<void>, done: (seen: Ev[]) => boolean): Promise<number> {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), 120_000);
  const seen: Ev[] = [];
  const it = streamEvents(api, `/v1/sessions/${id}/events/stream`, { signal: ac.signal }) as AsyncGenerator<SseFrame>;
  const first = it.next();
  await new Promise((r) => setTimeout(r, 50));
  const t0 = performance.now();
  try {
    await drive(seen);
    let f = await first;
    while (!f.done) {
      if (f.value.id) {
        seen.push(JSON.parse(f.value.data) as Ev);
        if (done(seen)) return performance.now() - t0;
        await drive(seen);
      }
      f = await it.next();
    }
    throw new Error(`session ${id}: the stream ended before the run finished`);
  } finally {
    clearTimeout(timer);
    ac.abort();
  }
}

async function main(): Promise<void> {
  const hb = process.env.BENCH_HEARTBEAT_MS;
  const p = await startPlatform({ runner: true, scheduler: true, ...(hb ? { env: { RUNNER_HEARTBEAT_INTERVAL_MS: hb, RUNNER_PRESENCE_TTL_MS: String(Number(hb) * 4) } } : {}) });
  try {
    const api = p.root;
    const ws = p.bootstrap.workspace_id;
    const principal = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, { external_subject_id: 'bench', principal_type: 'service', display_name: 'Bench' })).id;
    const envId = (await api.post<{ id: string }>('/v1/environments', {
      name: 'bench', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    })).id;
    await waitFor('a ready runner', async () => ((await api.get<{ data: { status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.status === 'ready') ? true : undefined), 90_000);
    const newSession = async () => (await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'bench', model: 'default', system: AGENT, tools: [{ type: 'builtin', name: 'bash' }] }, environment_id: envId })).id;
    const by = { authored_by: principal, caused_by: { kind: 'api' } };
    const tokens = async (id: string) => {
      const u = (await api.get<{ usage: { input_tokens: number; output_tokens: number } }>(`/v1/sessions/${id}`)).usage;
      return u.input_tokens + u.output_tokens;
    };

    const ours = { ms: [] as number[], tokens: [] as number[] };
    const floor = { ms: [] as number[], tokens: [] as number[] };
    const bar = progress('outcome + by-hand pairs', N);
    for (let i = 0; i < N; i++) {
      // The outcome: one drive event; the platform grades, revises and grades again.
      const a = await newSession();
      let sent = false;
      ours.ms.push(await timed(api, a, async () => {
        if (sent) return;
        sent = true;
        await api.post(`/v1/sessions/${a}/events`, { type: 'user.define_outcome', payload: { description: DESCRIPTION, rubric: RUBRIC, ...by } });
      }, (seen) => {
        const end = seen.find((e) => e.type === 'session.outcome_ended');
        if (end && end.payload.result !== 'satisfied') throw new Error(`outcome ended ${String(end.payload.result)}`);
        return end !== undefined;
      }));
      ours.tokens.push(await tokens(a));

      // The floor: the same two turns, the second driven by hand with the same revision text.
      const b = await newSession();
      let step = 0;
      const idles = (seen: Ev[]) => seen.filter((e) => e.type === 'session.status_idle').length;
      floor.ms.push(await timed(api, b, async (seen) => {
        if (step === 0) {
          step = 1;
          await api.post(`/v1/sessions/${b}/events`, { type: 'user.message', payload: { content: DESCRIPTION, ...by } });
        } else if (step === 1 && idles(seen) >= 1) {
          step = 2;
          await api.post(`/v1/sessions/${b}/events`, { type: 'user.message', payload: { content: `The outcome grader asks for a revision (evaluation 1):\n${EXPLANATION}`, ...by } });
        }
      }, (seen) => idles(seen) >= 2));
      floor.tokens.push(await tokens(b));
      if (process.env.BENCH_DEBUG) {
        for (const sid of [a, b]) {
          const runs = await api.get<{ data: { grader?: unknown; timestamps: Record<string, string> }[] }>(`/v1/sessions/${sid}/runs`);
          for (const r of runs.data.reverse()) {
            const t = r.timestamps;
            const at = (k: string) => (t[k] ? Date.parse(t[k]) - Date.parse(t.accepted_at ?? '') : -1);
            process.stdout.write(`${sid.slice(-4)} ${r.grader ? 'grader' : 'turn  '} enq ${at('enqueued_at')} leased ${at('leased_at')} started ${at('started_at')} first ${at('first_event_at')} ended ${at('ended_at')}\n`);
          }
        }
      }
      bar.tick(i + 1);
    }
    bar.end();
    const o = summarize(ours.ms);
    const f = summarize(floor.ms);
    const ot = summarize(ours.tokens);
    const ft = summarize(floor.tokens);
    printTable(`outcome with one revision (2 agent turns + 2 grader Runs) vs the same 2 turns by hand, ${N} each`, [
      { metric: 'wall time p50', ours: o.p50, floor: f.p50, unit: 'ms' },
      { metric: 'wall time p99', ours: o.p99, floor: f.p99, unit: 'ms' },
      { metric: 'tokens p50', ours: ot.p50, floor: ft.p50, unit: 'tok' },
      { metric: 'tokens p99', ours: ot.p99, floor: ft.p99, unit: 'tok' },
    ]);
  } finally {
    await p.stop();
  }
}

main().catch((err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exit(1);
});
