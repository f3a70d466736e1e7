import type { ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { createPerson, DAEMON_READY_MS, pairDaemon, startDaemon, WITH_DAEMON_MS } from './harness/daemon.js';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';

/**
 * A runner holding a Run while its control plane goes away. When the API process restarts under
 * a model step, the step is lost with the socket: the runner ends it at once and the Run is
 * retried, rather than waiting for frames that never come until the Run's max duration. When the
 * control plane is gone and the operator stops the runner (SIGTERM, then SIGTERM again to cancel),
 * the canceled work does not wait for the control plane to come back: the daemon exits in seconds.
 */
let p: Platform;
let api: HttpClient;
let owner: string;
let envId: string;
const daemons: ChildProcess[] = [];

type Json = Record<string, unknown>;
interface Ev { seq: number; type: string; payload: Json }
const SCRIPT = (rules: unknown[]) => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;

beforeAll(async () => {
  // Leases far longer than the test's bounds: only the runner can end them in time.
  p = await startPlatform({ runner: false, scheduler: true, env: { LEASE_MS: '120000', RUN_BACKOFF_MS: '100', RUNNER_HEARTBEAT_INTERVAL_MS: '1000' } });
  api = p.root;
  owner = await createPerson(p, 'away-owner', 'Owner');
  envId = (await api.post<{ id: string }>('/v1/environments', {
    name: 'sb', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 600 },
  })).id;
}, 90_000);
afterAll(async () => {
  for (const d of daemons) if (d.exitCode === null && d.signalCode === null) d.kill('SIGKILL');
  await p?.stop();
});

async function readyDaemon(label: string, extra: string[] = []): Promise<ChildProcess> {
  const { dir, runnerId } = await pairDaemon(p, owner, label);
  const d = startDaemon(dir, extra);
  daemons.push(d);
  await waitFor(`${label} ready`, async () => ((await api.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data
    .some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined), DAEMON_READY_MS);
  return d;
}

async function events(sessionId: string): Promise<Ev[]> {
  const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id ?? '';
  return (await api.get<{ data: Ev[] }>(`/v1/sessions/${sessionId}/threads/${thread}/events`, { limit: 1000 })).data;
}
/** The events once `pred` holds; reads that fail while the API restarts are tried again. */
const waitEvents = (id: string, what: string, pred: (e: Ev[]) => boolean, ms: number) => waitFor(what, async () => {
  const e = await events(id).catch(() => [] as Ev[]);
  return pred(e) ? e : undefined;
}, ms);

async function session(rules: unknown[]): Promise<string> {
  const s = await api.post<{ id: string }>('/v1/sessions', {
    agent: { name: 'a', model: 'default', tools: [{ type: 'builtin', name: 'bash' }], system: SCRIPT(rules) }, environment_id: envId,
  });
  await api.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'go', authored_by: owner, caused_by: { kind: 'api' } } });
  return s.id;
}

describe('a runner whose control plane goes away mid-Run', () => {
  it('the API restarts under a model step: the step ends with the socket and the Run is retried and completes, long before its max duration', async () => {
    await readyDaemon('restart-box');
    const id = await session([{ when: { user_contains: 'go' }, then: [{ sleep_ms: 5000 }, { reply: 'hello there' }] }]);
    await waitEvents(id, 'the Run running', (e) => e.some((x) => x.type === 'session.status_running'), 60_000);
    // Inside the 5 s step: the API process dies, and the platform starts it again.
    await new Promise((r) => setTimeout(r, 1_500));
    const before = p.pids().api;
    process.kill(before as number, 'SIGKILL');
    const killedAt = Date.now();
    const evs = await waitEvents(id, 'the turn ended', (e) => e.some((x) => x.type === 'session.status_idle'), 60_000);
    // Before, the step waited for the Run's max duration (600 s here) with the Run running.
    expect(Date.now() - killedAt).toBeLessThan(60_000);
    expect(p.pids().api).not.toBe(before);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toEqual({ type: 'end_turn' });
    expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message'))).toContain('hello there');
    expect(evs.filter((e) => e.type === 'session.thread_status_rescheduled')).toHaveLength(1);
    const runs = (await api.get<{ data: { status: string; attempts: unknown[] }[] }>(`/v1/sessions/${id}/runs`)).data;
    expect(runs.map((r) => [r.status, r.attempts.length])).toEqual([['succeeded', 2]]);
  }, WITH_DAEMON_MS);

  // Last: it stops the platform.
  it('the control plane stopped, a tool running: a second SIGTERM cancels the work and the daemon exits in seconds', async () => {
    const d = await readyDaemon('offline-box');
    const id = await session([
      { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: 'sleep 600' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'done' }] },
    ]);
    await waitEvents(id, 'the tool use', (e) => e.some((x) => x.type === 'agent.tool_use'), 60_000);
    await p.stop();
    const exited = new Promise<number | null>((r) => d.once('exit', (code) => r(code)));
    d.kill('SIGTERM');
    // The second signal once the daemon took the first (two at once may arrive as one).
    await new Promise((r) => setTimeout(r, 1_000));
    d.kill('SIGTERM');
    const canceledAt = Date.now();
    const code = await Promise.race([exited, new Promise<'running'>((r) => setTimeout(() => r('running'), 30_000))]);
    // Before, the canceled tool's last events were waited for up to two minutes.
    expect(code).toBe(0);
    expect(Date.now() - canceledAt).toBeLessThan(20_000);
  }, WITH_DAEMON_MS);
});
