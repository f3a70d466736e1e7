/**
 * `npm run bench:acp`: what the ACP harness costs (docs/ACP.md), each figure beside its floor
 * measured in the same run, on one runner with Docker sandboxes and the `scripted` model:
 *
 * - turn: one user message → one tool use (a terminal command `true`) → one reply, from the
 *   POST of the message to `session.status_idle` on the Session's stream. Ours: the fixture ACP
 *   agent (a new agent process per turn, ACP over stdio, the model through the sandbox loopback
 *   endpoint, the permission request through the policy check, the command in an ACP terminal).
 *   Floor: the built-in loop in the same sandbox (`harness_topology: colocated`), same turn.
 * - model time to first token: ours, as the agent inside the sandbox sees it (HTTP to the
 *   loopback forwarder → runner → WebSocket → gateway → scripted model, to the first text delta);
 *   floor, the same steps measured in the runner at the relay (model client call on the runner
 *   WebSocket → first event), read from the runner's debug log.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { HttpClient, streamEvents, type SseFrame } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from '../test/harness/platform.js';
import { pairDaemon, RUNNER_CLI } from '../test/harness/daemon.js';
import { FIXTURE_COMMAND, FIXTURE_PACKAGE, packFixtureAgent } from '../test/harness/acp-fixture.js';
import { printTable, summarize, type Row } from './lib/report.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const TURNS = Number(process.env.BENCH_TURNS ?? 30);
const STEPS = Number(process.env.BENCH_STEPS ?? 50);
const SCRIPT = (rules: unknown[]): string => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;

type Ev = { seq: number; type: string; payload: Record<string, unknown> };

/** One long-lived stream of a Session: waits for the n-th event of a type. */
class Watch {
  private readonly seen: Ev[] = [];
  private wake: (() => void) | null = null;
  private readonly ac = new AbortController();
  constructor(api: HttpClient, id: string) {
    void (async () => {
      try {
        for await (const f of streamEvents(api, `/v1/sessions/${id}/events/stream`, { signal: this.ac.signal }) as AsyncGenerator<SseFrame>) {
          if (!f.id) continue;
          this.seen.push(JSON.parse(f.data) as Ev);
          this.wake?.();
        }
      } catch {
        /* closed */
      }
    })();
  }
  async nth(type: string, n: number): Promise<Ev> {
    for (;;) {
      const hits = this.seen.filter((e) => e.type === type);
      if (hits.length >= n) return hits[n - 1] as Ev;
      await new Promise<void>((r) => (this.wake = r));
    }
  }
  close(): void {
    this.ac.abort();
  }
}

async function turns(api: HttpClient, principal: string, envId: string, tool: string, input: Record<string, unknown>): Promise<number[]> {
  const id = (await api.post<{ id: string }>('/v1/sessions', {
    agent: { name: 'bench', model: 'default', tools: tool === 'bash' ? [{ type: 'builtin', name: 'bash' }] : [], system: SCRIPT([
      { when: { user_contains: 'go' }, then: [{ tool, input }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'done' }] },
    ]) },
    environment_id: envId,
  })).id;
  const w = new Watch(api, id);
  const times: number[] = [];
  try {
    // One warm-up turn (creates the sandbox), then the measured ones.
    for (let i = 0; i <= TURNS; i++) {
      const t = performance.now();
      await api.post(`/v1/sessions/${id}/events`, { type: 'user.message', payload: { content: `go ${i}`, authored_by: principal, caused_by: { kind: 'api' } } });
      const idle = await w.nth('session.status_idle', i + 1);
      if ((idle.payload.stop_reason as { type: string }).type !== 'end_turn') throw new Error(`turn ended ${JSON.stringify(idle.payload.stop_reason)}`);
      if (i > 0) times.push(performance.now() - t);
      process.stderr.write(`\r${tool === 'bash' ? 'colocated' : 'acp'} turns ${i}/${TURNS}`);
    }
    process.stderr.write('\n');
  } finally {
    w.close();
  }
  return times;
}

async function main(): Promise<void> {
  const tarball = await packFixtureAgent();
  const p: Platform = await startPlatform({ runner: false, scheduler: true, env: { LOG_LEVEL: 'warn' } });
  let daemon: ChildProcess | undefined;
  try {
    const api = p.root;
    const principal = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
      external_subject_id: 'bench', principal_type: 'person', display_name: 'Bench',
    })).id;
    const { dir, runnerId } = await pairDaemon(p, principal, 'bench-acp');
    daemon = spawn(process.execPath, [RUNNER_CLI, 'start', '--config-dir', dir, '--acp-harness', tarball, '--log-level', 'debug'], { stdio: ['ignore', 'pipe', 'pipe'] });
    const relay: number[] = [];
    for (const s of [daemon.stdout, daemon.stderr]) {
      if (!s) continue;
      createInterface({ input: s }).on('line', (line) => {
        if (process.env.BENCH_TRACE && (line.includes('acp phase') || line.includes('acp model step'))) process.stderr.write(`${line}\n`);
        if (!line.includes('acp model step')) return;
        try {
          relay.push((JSON.parse(line) as { first_event_ms: number }).first_event_ms);
        } catch {
          /* not a log line */
        }
      });
    }
    await waitFor('the runner with the ACP harness', async () => {
      const r = await api.get<{ data: Array<{ runner: string; status: string; capabilities: { providers: Array<{ acp_harnesses?: unknown[] }> } }> }>('/v1/runner-pools/presences');
      return r.data.some((x) => x.runner === runnerId && x.status === 'ready' && x.capabilities.providers.some((pr) => (pr.acp_harnesses ?? []).length > 0)) ? true : undefined;
    }, 180_000);
    const resources = { cpu_millis: 1000, memory_mib: 512, disk_mib: 512, max_duration_seconds: 120 };
    const colocated = (await api.post<{ id: string }>('/v1/environments', { name: 'colocated', image: 'agentplane/sandbox:latest', resources, harness_topology: 'colocated' })).id;
    const acp = (await api.post<{ id: string }>('/v1/environments', { name: 'acp', image: 'agentplane/sandbox:latest', resources, harness: { kind: 'acp', package: FIXTURE_PACKAGE, command: FIXTURE_COMMAND } })).id;

    const floorTurns = await turns(api, principal, colocated, 'bash', { command: 'true' });
    const acpTurns = await turns(api, principal, acp, 'run', { command: 'true' });

    // Time to first token: the fixture agent times STEPS model steps inside the sandbox.
    const id = (await api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'ttft', model: 'default', tools: [], system: SCRIPT([{ when: { user_contains: 'ttft' }, then: [{ reply: 'tick tock' }] }]) },
      environment_id: acp,
    })).id;
    const w = new Watch(api, id);
    relay.length = 0;
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.message', payload: { content: `ttft ${STEPS}`, authored_by: principal, caused_by: { kind: 'api' } } });
    const message = await w.nth('agent.message', 1);
    await w.nth('session.status_idle', 1);
    w.close();
    const inSandbox = /ttft ([0-9.,]+)/.exec(JSON.stringify(message.payload))?.[1]?.split(',').map(Number) ?? [];
    await waitFor('the runner log of every step', async () => (relay.length >= STEPS ? true : undefined), 10_000).catch(() => undefined);

    const t = summarize(acpTurns);
    const tf = summarize(floorTurns);
    const m = summarize(inSandbox.slice(1));
    const mf = summarize(relay.slice(1, STEPS));
    const rows: Row[] = [
      { metric: 'one-tool turn p50 (acp vs colocated)', ours: t.p50, floor: tf.p50, unit: 'ms' },
      { metric: 'one-tool turn p99 (acp vs colocated)', ours: t.p99, floor: tf.p99, unit: 'ms' },
      { metric: 'model TTFT p50 (sandbox loopback vs runner WebSocket)', ours: m.p50, floor: mf.p50, unit: 'ms' },
      { metric: 'model TTFT p99 (sandbox loopback vs runner WebSocket)', ours: m.p99, floor: mf.p99, unit: 'ms' },
    ];
    printTable(`ACP harness (${TURNS} turns each after a warm-up; ${STEPS - 1} model steps; scripted model, Docker sandbox)`, rows);
  } finally {
    daemon?.kill('SIGKILL');
    await p.stop();
  }
}

main().then(() => process.exit(0), (err: unknown) => {
  process.stderr.write(`${err instanceof Error ? err.stack : String(err)}\n`);
  process.exit(1);
});
