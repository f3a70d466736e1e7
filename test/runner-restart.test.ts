import type { ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { DAEMON_READY_MS, pairDaemon, startDaemon } from './harness/daemon.js';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';

/**
 * A runner whose process restarts comes back naming the leases it still holds (none): the
 * control plane ends the lost ones at once instead of waiting for the lease to expire. The lease
 * here lasts 60 s, so only that path can reschedule the Run within the test's bound.
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
  p = await startPlatform({ runner: false, scheduler: true, env: { LEASE_MS: '120000', RUN_BACKOFF_MS: '100', RUNNER_HEARTBEAT_INTERVAL_MS: '1000' } });
  api = p.root;
  owner = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: 'owner', principal_type: 'person', display_name: 'Owner',
  })).id;
  envId = (await api.post<{ id: string }>('/v1/environments', { name: 'sb', image: 'agentplane/sandbox:latest' })).id;
}, 90_000);
afterAll(async () => {
  for (const d of daemons) d.kill('SIGKILL');
  await p?.stop();
});

async function daemon(dir: string, runnerId: string): Promise<ChildProcess> {
  const proc = startDaemon(dir);
  daemons.push(proc);
  await waitFor('runner ready', async () => ((await api.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined), DAEMON_READY_MS);
  return proc;
}

async function events(sessionId: string): Promise<Ev[]> {
  const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id ?? '';
  return (await api.get<{ data: Ev[] }>(`/v1/sessions/${sessionId}/threads/${thread}/events`, { limit: 1000 })).data;
}
const waitEvents = (id: string, pred: (e: Ev[]) => boolean, ms: number) => waitFor('events', async () => {
  const e = await events(id);
  return pred(e) ? e : undefined;
}, ms);

describe('a runner restarted mid-Run', () => {
  it('gets the lost lease ended at once: the Run is rescheduled within seconds, long before the lease would expire, and completes once', async () => {
    const { dir, runnerId } = await pairDaemon(p, owner, 'box');
    const first = await daemon(dir, runnerId);
    const s = await api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'a', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
        system: SCRIPT([
          { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: 'sleep 3; echo finished' } }] },
          { when: { on: 'tool_result' }, then: [{ reply: 'ok: {{tool_result}}' }] },
        ]),
      },
      environment_id: envId,
    });
    await api.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'go', authored_by: owner, caused_by: { kind: 'api' } } });
    await waitEvents(s.id, (e) => e.some((x) => x.type === 'agent.tool_use'), 40_000);
    const gone = new Promise((r) => first.once('exit', r));
    first.kill('SIGKILL');
    await gone;

    await daemon(dir, runnerId);
    const restartedAt = Date.now();
    // Far inside the 120 s lease: only the reconnect could have ended it (a loaded machine may
    // take a while to get there, so the bound leaves room without nearing the lease).
    const resched = await waitEvents(s.id, (e) => e.some((x) => x.type === 'session.thread_status_rescheduled'), 40_000);
    expect(Date.now() - restartedAt).toBeLessThan(40_000);
    expect(resched.filter((e) => e.type === 'session.thread_status_rescheduled')).toHaveLength(1);

    const evs = await waitEvents(s.id, (e) => e.some((x) => x.type === 'session.status_idle'), 40_000);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message'))).toContain('finished');
    const seqs = evs.map((e) => e.seq);
    expect(new Set(seqs).size).toBe(seqs.length);
    const runs = (await api.get<{ data: { id: string; status: string; attempts: { attempt: number; runner_id: string; outcome: string; cause: string | null }[] }[] }>(`/v1/sessions/${s.id}/runs`)).data;
    expect(runs).toHaveLength(1);
    expect(runs[0]?.status).toBe('succeeded');
    expect(runs[0]?.attempts.map((a) => a.runner_id)).toEqual([runnerId, runnerId]);
    // The restart lost the first attempt's lease: recorded `lost`, like an expired lease.
    expect(runs[0]?.attempts.map((a) => a.outcome)).toEqual(['lost', 'succeeded']);
    const runId = runs[0]?.id;
    // The thread's status as a stream shows it: running, rescheduled (naming the lost attempt and
    // why), running again when the retried attempt starts (before any of its events), idle.
    const statuses = evs.filter((e) => e.type.startsWith('session.status_') || e.type === 'session.thread_status_rescheduled');
    expect(statuses.map((e) => [e.type, e.payload])).toEqual([
      ['session.status_running', expect.objectContaining({ run_id: runId })],
      ['session.thread_status_rescheduled', { run_id: runId, attempt: runs[0]?.attempts[0]?.attempt, cause: runs[0]?.attempts[0]?.cause }],
      // The retried attempt's number is the Run's record of it: an offer the reconnecting runner
      // never accepted takes a number too.
      ['session.status_running', { run_id: runId, attempt: runs[0]?.attempts[1]?.attempt }],
      ['session.status_idle', expect.objectContaining({ stop_reason: { type: 'end_turn' } })],
    ]);
    const resumedAt = statuses[2]?.seq ?? 0;
    expect(evs.filter((e) => e.seq > (statuses[1]?.seq ?? 0) && e.seq < resumedAt && e.type.startsWith('agent.'))).toEqual([]);
  }, 150_000 + DAEMON_READY_MS);
});
