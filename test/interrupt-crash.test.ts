import { describe, expect, it } from 'vitest';
import { existsSync } from 'node:fs';
import { Job, Queue } from 'bullmq';
import { Redis } from 'ioredis';
import type { HttpClient } from '@agentplane/client';
import { queuePrefix, RUN_QUEUE } from '@agentplane/lease';
import { waitFor } from './harness/platform.js';
import { useCrashPlatforms } from './harness/crash-platform.js';
import { developerWorkspace, FAST_LEASES, SCRIPT, type TurnEvent } from './harness/turns.js';

/**
 * The API dies inside the interrupt of a queued Run (crash point `interrupt-run-canceled`): after
 * the Run's end is recorded and before its job is removed. The turn has ended `interrupted` all
 * the same, and the job left behind is one whose Run has ended, which no dispatcher runs. (Removed
 * first, the job was gone while the Run stayed queued and its thread running, and nothing, not
 * even a second interrupt, ended them.)
 */
const crash = useCrashPlatforms('interrupt-crash');

type Json = Record<string, unknown>;

async function log(api: HttpClient, sessionId: string): Promise<TurnEvent[]> {
  const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id ?? '';
  return (await api.get<{ data: TurnEvent[] }>(`/v1/sessions/${sessionId}/threads/${thread}/events`, { limit: 1000 })).data;
}

describe('a crash inside the interrupt of a queued Run', () => {
  it('after the Run is cancelled, before its job is removed: the turn has ended interrupted, and the Run never runs', async () => {
    // No runner: the Run stays queued until it is interrupted.
    const q = await crash.start(['interrupt-run-canceled'], { runner: false, scheduler: true, env: FAST_LEASES });
    const { p } = q;
    const marker = q.marker('interrupt-run-canceled');
    const { api, principal, envId } = await developerWorkspace(p, 'interrupt-crash');
    const pidsBefore = p.pids();
    const s = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default', system: SCRIPT([{ then: [{ reply: 'must not run' }] }]) }, environment_id: envId });
    await api.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'hi', authored_by: principal, caused_by: { kind: 'api' } } });
    const runs = () => api.get<{ data: (Json & { id: string; status: string; runner_pool_id?: string })[] }>(`/v1/sessions/${s.id}/runs`);
    const queued = await waitFor('the Run queued in its pool', async () => {
      const r = (await runs()).data[0];
      return r?.runner_pool_id && (r.status === 'queued' || r.status === 'waiting') ? r : undefined;
    }, 20_000);

    // The API dies while it answers the interrupt.
    await api.post(`/v1/sessions/${s.id}/events`, { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } }).catch(() => undefined);
    const events = await waitFor('the turn ended', async () => {
      const e = await log(api, s.id).catch(() => []);
      return e.some((x) => x.type === 'session.status_idle') ? e : undefined;
    }, 60_000);
    expect(existsSync(marker)).toBe(true);
    expect(p.pids().api).not.toBe(pidsBefore.api);
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'interrupted' });
    expect(events.some((e) => e.type === 'agent.message')).toBe(false);
    expect((await runs()).data[0]?.status).toBe('canceled');
    const thread = (await api.get<{ data: { status: string }[] }>(`/v1/sessions/${s.id}/threads`)).data[0];
    expect(thread?.status).toBe('idle');

    // The job the crash left behind waits in the queue, and is one no dispatcher runs (its Run ended).
    const conn = new Redis(p.redisUrl(), { maxRetriesPerRequest: null });
    const queue = new Queue(RUN_QUEUE, { connection: conn, prefix: queuePrefix(String(queued.runner_pool_id)) });
    try {
      const job = await Job.fromId(queue, queued.id);
      expect(job ? await job.getState() : 'absent').not.toBe('active');
    } finally {
      await queue.close();
      conn.disconnect();
    }
  }, 180_000);
});
