import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ChildProcess } from 'node:child_process';
import type { HttpClient } from '@agentplane/client';
import { Job, Queue, Worker } from 'bullmq';
import { Redis } from 'ioredis';
import { queuePrefix, RUN_QUEUE } from '@agentplane/lease';
import { EnqueueOutbox, SessionStore, ThreadRuntime, type TurnScheduler } from '@agentplane/domain';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { DAEMON_READY_MS, pairDaemon, startDaemon, WITH_DAEMON_MS } from './harness/daemon.js';
import Docker from 'dockerode';

/**
 * Crash paths of the lease engine, with real processes: kill -9 a runner mid-Run, kill -9 the
 * scheduler, a Run no runner can serve, an interrupt while the Run is still queued.
 */
let p: Platform;
let api: HttpClient;
let owner: string;
let envId: string;
const daemons: ChildProcess[] = [];
const byRunner = new Map<string, ChildProcess>();
const docker = new Docker();

type Json = Record<string, unknown>;
interface Ev { seq: number; type: string; payload: Json }
const SCRIPT = (rules: unknown[]) => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;

beforeAll(async () => {
  p = await startPlatform({
    runner: false,
    scheduler: true,
    env: {
      LEASE_MS: '4000', OFFER_TIMEOUT_MS: '1500', STALLED_INTERVAL_MS: '500', RUN_BACKOFF_MS: '100', RUNNER_HEARTBEAT_INTERVAL_MS: '1000',
      RUNNER_PRESENCE_TTL_MS: '3000', ENQUEUE_REPAIR_AFTER_MS: '1500',
    },
  });
  api = p.root;
  owner = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: 'owner', principal_type: 'person', display_name: 'Owner',
  })).id;
  envId = (await api.post<{ id: string }>('/v1/environments', { name: 'sb', image: 'agentplane/sandbox:latest' })).id;
}, 60_000);
afterAll(async () => {
  for (const d of daemons) d.kill('SIGKILL');
  await p?.stop();
});

async function daemon(label: string, existing?: { dir: string; runnerId: string }): Promise<{ proc: ChildProcess; runnerId: string; dir: string }> {
  const { dir, runnerId } = existing ?? (await pairDaemon(p, owner, label));
  const proc = startDaemon(dir, ['--sandbox-report-seconds', '1']);
  daemons.push(proc);
  byRunner.set(runnerId, proc);
  await waitFor(`${label} ready`, async () => ((await api.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined), DAEMON_READY_MS);
  return { proc, runnerId, dir };
}

/** The containers and workspace volumes one runner keeps for one Session. */
async function sandboxOf(runnerId: string, sessionId: string): Promise<{ running: number; containers: number; volumes: number }> {
  const filters = JSON.stringify({ label: [`agentplane.runner=${runnerId}`, `agentplane.session=${sessionId}`] });
  const [containers, volumes] = await Promise.all([docker.listContainers({ all: true, filters }), docker.listVolumes({ filters })]);
  return { running: containers.filter((c) => c.State === 'running').length, containers: containers.length, volumes: (volumes.Volumes ?? []).length };
}

async function turn(rules: unknown[], text = 'go', env = envId): Promise<string> {
  const s = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default', system: SCRIPT(rules), tools: [{ type: 'builtin', name: 'bash' }] }, environment_id: env });
  await api.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: text, authored_by: owner, caused_by: { kind: 'api' } } });
  return s.id;
}

async function events(sessionId: string): Promise<Ev[]> {
  const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id ?? '';
  return (await api.get<{ data: Ev[] }>(`/v1/sessions/${sessionId}/threads/${thread}/events`, { limit: 1000 })).data;
}
const waitEvents = (id: string, pred: (e: Ev[]) => boolean, ms = 40_000) => waitFor('events', async () => {
  const e = await events(id);
  return pred(e) ? e : undefined;
}, ms);
const runsOf = async (id: string) => (await api.get<{ data: (Json & { runner_pool_id?: string; status: string; attempts: { runner_id: string; outcome: string }[]; failure: Json | null })[] }>(`/v1/sessions/${id}/runs`)).data;

describe('crash paths', () => {
  it('kill -9 a runner mid-Run: the lease expires, the Run completes on another runner; restarted, the runner reaps its orphan; archive removes both sandboxes', async () => {
    const a = await daemon('box-a');
    // Paired now, started only after the kill: a daemon's start can take longer than the tool
    // call runs, and the kill must land while the call is in flight.
    const bPaired = await pairDaemon(p, owner, 'box-b');
    const id = await turn([
      { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: 'sleep 8; echo finished' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'ok: {{tool_result}}' }] },
    ]);
    await waitEvents(id, (e) => e.some((x) => x.type === 'agent.tool_use'));
    await waitFor('the sandbox running the tool call', async () => ((await sandboxOf(a.runnerId, id)).running === 1 ? true : undefined), 20_000);
    a.proc.kill('SIGKILL');
    const b = await daemon('box-b', bPaired);
    const evs = await waitEvents(id, (e) => e.some((x) => x.type === 'session.status_idle'), 60_000);
    const [dbg] = await runsOf(id);
    // The stalled handler, the repair before the next offer and the stall sweep all see this
    // loss: it is still recorded exactly once.
    expect(evs.filter((e) => e.type === 'session.thread_status_rescheduled'), JSON.stringify({ types: evs.map((e) => e.type), dbg })).toHaveLength(1);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    const seqs = evs.map((e) => e.seq);
    expect(new Set(seqs).size).toBe(seqs.length);
    const [run] = await runsOf(id);
    expect(run?.status).toBe('succeeded');
    expect(run?.attempts.map((x) => x.runner_id)).toEqual([a.runnerId, b.runnerId]);
    expect(run?.attempts[0]?.outcome).toBe('lost');
    // The thread runs again when the retried attempt starts, as a first attempt's turn does:
    // rescheduled (naming the lost attempt), then running (naming the new one), then idle. An
    // attempt's number counts the scheduler's takes of the Run, so it is 2 unless the Run was
    // taken and given back meanwhile (no runner ready yet: the second daemon starts after the
    // kill), which skips numbers: the new one is the number its lease was recorded under.
    const retried = (run?.attempts[1] as { attempt?: number } | undefined)?.attempt;
    expect(retried).toBeGreaterThanOrEqual(2);
    const statuses = evs.filter((e) => e.type.startsWith('session.status_') || e.type === 'session.thread_status_rescheduled');
    expect(statuses.map((e) => [e.type, e.payload.attempt])).toEqual([
      ['session.status_running', undefined], ['session.thread_status_rescheduled', 1], ['session.status_running', retried], ['session.status_idle', undefined],
    ]);

    // The killed runner left its sandbox behind. Restarted, it stops the orphan and keeps the
    // workspace of the still-live Session; once the Session is archived, both runners remove theirs.
    expect((await sandboxOf(a.runnerId, id)).containers).toBe(1);
    await daemon('box-a', a);
    await waitFor('the orphan container to be reaped', async () => ((await sandboxOf(a.runnerId, id)).containers === 0 ? true : undefined), 20_000);
    expect((await sandboxOf(a.runnerId, id)).volumes).toBe(1);
    expect((await sandboxOf(b.runnerId, id)).running).toBe(1);
    await api.post(`/v1/sessions/${id}/archive`);
    for (const r of [a.runnerId, b.runnerId]) {
      await waitFor('the archived Session\'s sandboxes to go', async () => {
        const left = await sandboxOf(r, id);
        return left.containers === 0 && left.volumes === 0 ? true : undefined;
      }, 20_000);
    }
  }, WITH_DAEMON_MS + 2 * DAEMON_READY_MS);

  it('the scheduler dies after BullMQ moved a lost lease back to wait, before it recorded the loss: the reschedule is still recorded once, before the next attempt', async () => {
    await Promise.all([daemon('box-c'), daemon('box-d')]);
    const id = await turn([
      { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: 'sleep 8; echo finished' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'ok: {{tool_result}}' }] },
    ]);
    await waitEvents(id, (e) => e.some((x) => x.type === 'agent.tool_use'));
    const [leased] = await runsOf(id);
    const holder = leased?.attempts[0]?.runner_id ?? '';
    const victim = byRunner.get(holder);
    expect(victim, `runner ${holder} holds the lease`).toBeDefined();

    // Freeze the scheduler: its stalled check (and its handler) cannot run from now on.
    const scheduler = p.pids().scheduler as number;
    process.kill(scheduler, 'SIGSTOP');
    try {
      const gone = new Promise((r) => victim?.once('exit', r));
      victim?.kill('SIGKILL');
      await gone;
      const before = (await events(id)).map((e) => e.seq);

      // BullMQ's stalled check runs (here, in a process with no handler) and moves the Run back
      // to wait: exactly what happens when the scheduler dies right after the check.
      const conn = new Redis(p.redisUrl(), { maxRetriesPerRequest: null });
      const prefix = queuePrefix(String(leased?.runner_pool_id));
      const queue = new Queue(RUN_QUEUE, { connection: conn, prefix });
      const checker = new Worker(RUN_QUEUE, null, { connection: conn, prefix, autorun: false, lockDuration: 4000, stalledInterval: 300, maxStalledCount: 3 });
      checker.on('error', () => undefined);
      try {
        await checker.startStalledCheckTimer();
        await waitFor('the stalled check to move the Run back', async () => {
          const state = await (await Job.fromId(queue, String(leased?.id)))?.getState();
          return state && state !== 'active' ? state : undefined;
        }, 20_000);
      } finally {
        await checker.close();
        await queue.close();
        conn.disconnect();
      }
      expect((await events(id)).filter((e) => e.type === 'session.thread_status_rescheduled')).toHaveLength(0);

      // The scheduler dies without having handled the stall; the supervisor starts a new one.
      process.kill(scheduler, 'SIGKILL');
      await waitFor('a new scheduler', () => (p.pids().scheduler !== scheduler ? true : undefined), 20_000);

      const evs = await waitEvents(id, (e) => e.some((x) => x.type === 'session.status_idle'), 60_000);
      const [run] = await runsOf(id);
      const rescheduled = evs.filter((e) => e.type === 'session.thread_status_rescheduled');
      expect(rescheduled, JSON.stringify({ types: evs.map((e) => e.type), run })).toHaveLength(1);
      // Recorded before anything of the next attempt.
      expect(evs.find((e) => !before.includes(e.seq))?.type).toBe('session.thread_status_rescheduled');
      expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
      expect(run?.status).toBe('succeeded');
      expect(run?.attempts).toHaveLength(2);
      expect(run?.attempts[0]).toMatchObject({ runner_id: holder, outcome: 'lost' });
      expect(run?.attempts[1]?.runner_id).not.toBe(holder);
      expect(run?.attempts[1]?.outcome).toBe('succeeded');
    } finally {
      try {
        process.kill(scheduler, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }, WITH_DAEMON_MS);

  /** A turn whose enqueue the API never finished: the scheduler's repair enqueued it, it ran to its end, and its outbox entry is gone. */
  async function expectRepaired(sessionId: string, outbox: EnqueueOutbox, reply: string): Promise<void> {
    const evs = await waitEvents(sessionId, (e) => e.some((x) => x.type === 'session.status_idle'), 40_000);
    expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message'))).toContain(reply);
    const [done] = await runsOf(sessionId);
    expect(done?.status).toBe('succeeded');
    expect((await outbox.due(0)).filter((x) => x.session_id === sessionId)).toEqual([]);
  }

  it('the API dies between the turn start and the enqueue: the scheduler enqueues the Run, and the turn completes', async () => {
    await daemon('box-outbox');
    const s = await api.post<{ id: string; }>('/v1/sessions', {
      agent: { name: 'a', model: 'default', system: SCRIPT([{ then: [{ reply: 'picked up after all' }] }]), tools: [] }, environment_id: envId,
    });
    // What the API does for a user.message, up to the point where it dies: the event, the intent,
    // the committed turn start; the BullMQ job is never added.
    const redis = new Redis(p.redisUrl());
    try {
      const store = new SessionStore(redis);
      const outbox = new EnqueueOutbox(redis);
      const crashed: TurnScheduler = {
        runStarting: (sessionId, runId) => outbox.add(sessionId, runId),
        runQueued: async () => undefined,
        interruptRequested: async () => undefined,
        waitsResolved: async () => undefined,
      };
      const session = await store.get(p.bootstrap.workspace_id, s.id);
      const appended = await store.log.append(s.id, [{
        type: 'user.message', payload: { content: 'hello?', authored_by: owner, caused_by: { kind: 'api' } }, session_thread_id: session._primary_thread_id,
      }]);
      if (!appended.ok) throw new Error('append refused');
      const { run } = await new ThreadRuntime(store, () => crashed).submitUserMessage(session, session._primary_thread_id, appended.events[0]?.id ?? null);
      expect(run?.status).toBe('queued');
      await expectRepaired(s.id, outbox, 'picked up after all');
    } finally {
      redis.disconnect();
    }
  }, WITH_DAEMON_MS);

  it('the job sent behind a committed start never lands: the Run records its enqueue, yet the scheduler enqueues it, and the turn completes', async () => {
    await daemon('box-behind');
    const s = await api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'a', model: 'default', system: SCRIPT([{ then: [{ reply: 'queued by the repair' }] }]), tools: [] }, environment_id: envId,
    });
    const pool = (await api.get<{ data: { id: string; name: string }[] }>('/v1/runner-pools')).data.find((x) => x.name === 'default')?.id;
    if (!pool) throw new Error('no default pool');
    // A start with something behind it is refused while Redis does not hold the commit script
    // (`unloaded`): a turn through the API first, which loads it whatever ran before this test.
    await turn([{ then: [{ reply: 'loads the scripts' }] }]);
    // The drive path's single script (the message and the turn start), the Run written with its
    // pool and enqueue time as when its job goes right behind the start; the job is never sent.
    const redis = new Redis(p.redisUrl());
    try {
      const store = new SessionStore(redis);
      const outbox = new EnqueueOutbox(redis);
      const lost: TurnScheduler = {
        intentAhead: true,
        runStarting: (sessionId, runId) => outbox.add(sessionId, runId),
        sendBehind: (run) => ({
          run: { ...run, runner_pool_id: pool, timestamps: { accepted_at: run.created_at, enqueued_at: new Date().toISOString(), leased_at: null, started_at: null, first_event_at: null, ended_at: null }, attempts: [] },
          send: () => async () => undefined,
        }),
        runQueued: async () => undefined,
        interruptRequested: async () => undefined,
        waitsResolved: async () => undefined,
      };
      const session = await store.get(p.bootstrap.workspace_id, s.id);
      const thread = await store.thread(s.id, session._primary_thread_id);
      const runtime = new ThreadRuntime(store, () => lost);
      const intent = runtime.intendStart(session, thread);
      if (!intent) throw new Error('an idle thread gets an intent');
      const started = await runtime.startWithMessage(session, thread, { type: 'user.message', payload: { content: 'hello?', authored_by: owner, caused_by: { kind: 'api' } } }, intent);
      expect(started?.run.timestamps?.enqueued_at).toEqual(expect.any(String));
      await expectRepaired(s.id, outbox, 'queued by the repair');
    } finally {
      redis.disconnect();
    }
  }, WITH_DAEMON_MS);

  it('kill -9 the scheduler: queued Runs are not lost and are leased once it is back', async () => {
    const before = p.pids().scheduler as number;
    process.kill(before, 'SIGKILL');
    const id = await turn([{ then: [{ reply: 'after the scheduler came back' }] }]);
    await waitFor('a new scheduler', () => (p.pids().scheduler !== before ? true : undefined), 20_000);
    const evs = await waitEvents(id, (e) => e.some((x) => x.type === 'session.status_idle'));
    expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message'))).toContain('after the scheduler came back');
    const [run] = await runsOf(id);
    expect(run?.attempts).toHaveLength(1);
  });

  it('a Run no runner in the pool can serve waits, saying why, until it is interrupted', async () => {
    const huge = (await api.post<{ id: string }>('/v1/environments', {
      name: 'huge', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 256_000, memory_mib: 1_048_576, disk_mib: 4096, max_duration_seconds: 60 },
    })).id;
    const id = await turn([{ then: [{ reply: 'never' }] }], 'go', huge);
    const run = await waitFor('waiting with the reason', async () => {
      const r = (await runsOf(id))[0] as (Json & { status: string; waiting_reason?: string }) | undefined;
      return r?.status === 'waiting' && r.waiting_reason?.includes('no runner in the pool can serve') ? r : undefined;
    }, 20_000);
    expect(run.waiting_reason).toMatch(/exceeds the runner maximum/);
    const waiting = await events(id);
    expect(waiting.some((e) => e.type === 'session.run_waiting' && JSON.stringify(e.payload).includes('no runner in the pool can serve'))).toBe(true);
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.interrupt', payload: { authored_by: owner, caused_by: { kind: 'api' } } });
    const evs = await waitEvents(id, (e) => e.some((x) => x.type === 'session.status_idle'), 15_000);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'interrupted' });
    expect(evs.some((e) => e.type === 'agent.message')).toBe(false);
  });

  it('interrupt while queued removes the Run: it never runs and the turn ends interrupted', async () => {
    // Drain every runner so the Run stays queued.
    const pres = (await api.get<{ data: { runner: string }[] }>('/v1/runner-pools/presences')).data;
    for (const d of daemons) d.kill('SIGKILL');
    await waitFor('no live runner', async () => ((await api.get<{ data: unknown[] }>('/v1/runner-pools/presences')).data.length === 0 ? true : undefined), 20_000);
    expect(pres.length).toBeGreaterThan(0);
    const id = await turn([{ then: [{ reply: 'must not run' }] }]);
    await waitFor('waiting visibly', async () => ((await runsOf(id))[0]?.status === 'waiting' ? true : undefined), 10_000);
    const waiting = await events(id);
    expect(waiting.some((e) => e.type === 'session.run_waiting')).toBe(true);
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.interrupt', payload: { authored_by: owner, caused_by: { kind: 'api' } } });
    const evs = await waitEvents(id, (e) => e.some((x) => x.type === 'session.status_idle'), 10_000);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'interrupted' });
    expect(evs.some((e) => e.type === 'agent.message')).toBe(false);
    expect((await runsOf(id))[0]?.status).toBe('canceled');
  });

  it('a Run BullMQ completed whose turn was never ended (the API died in between) is reconciled by the scheduler', async () => {
    // No runner is live (the previous test killed them): take the job as a runner would and
    // complete it in BullMQ only, as if the API died right after moveToCompleted.
    const id = await turn([{ then: [{ reply: 'never streamed' }] }]);
    const run = await waitFor('queued run', async () => {
      const r = (await runsOf(id))[0];
      return r?.runner_pool_id ? r : undefined;
    }, 10_000);
    const conn = new Redis(p.redisUrl(), { maxRetriesPerRequest: null });
    const worker = new Worker(RUN_QUEUE, null, { connection: conn, prefix: queuePrefix(String(run.runner_pool_id)), autorun: false });
    try {
      const token = 'reconcile-test-token';
      const job = await waitFor('the job', async () => (await worker.getNextJob(token)) ?? undefined, 10_000);
      await job.moveToCompleted({ stop_reason: { type: 'end_turn' } }, token, false);
    } finally {
      await worker.close();
      conn.disconnect();
    }
    const evs = await waitEvents(id, (e) => e.some((x) => x.type === 'session.status_idle'), 15_000);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    expect((await runsOf(id))[0]?.status).toBe('succeeded');
  });

  it('kill -9 the embedded Redis: it comes back on its AOF and turns run again', async () => {
    const marker = await api.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
      external_subject_id: 'before-redis-crash', principal_type: 'service', display_name: 'Survivor',
    });
    await new Promise((r) => setTimeout(r, 1500)); // appendfsync everysec
    const before = p.pids().redis as number;
    process.kill(before, 'SIGKILL');
    // process.kill returns before the old server is gone: wait for the restarted one by its pid
    // (the platform records it once the new server answers), then for the API through it.
    await waitFor('redis restarted', async () => (p.pids().redis !== before ? true : undefined), 30_000);
    await waitFor('the API answering through the new redis', async () => {
      try {
        const r = await api.request('GET', `/v1/principals/${marker.id}`);
        return r.status === 200 ? true : undefined;
      } catch {
        return undefined;
      }
    }, 30_000);
    await daemon('after-redis');
    const id = await turn([{ then: [{ reply: 'redis came back' }] }]);
    const evs = await waitEvents(id, (e) => e.some((x) => x.type === 'session.status_idle'), 40_000);
    expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message'))).toContain('redis came back');
  }, WITH_DAEMON_MS);

  it('kill -9 the runner mid-tool call, then interrupt with no runner left: the turn ends at once, its tool use answered as interrupted', async () => {
    // One runner only: once it is killed, nothing takes the Run again before the interrupt.
    for (const d of daemons) d.kill('SIGKILL');
    await waitFor('no live runner', async () => ((await api.get<{ data: unknown[] }>('/v1/runner-pools/presences')).data.length === 0 ? true : undefined), 20_000);
    const only = await daemon('box-only');
    const id = await turn([
      { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: 'sleep 30; echo finished' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'ok: {{tool_result}}' }] },
    ]);
    const use = (await waitEvents(id, (e) => e.some((x) => x.type === 'agent.tool_use'))).find((x) => x.type === 'agent.tool_use');
    await waitFor('the sandbox running the tool call', async () => ((await sandboxOf(only.runnerId, id)).running === 1 ? true : undefined), 20_000);
    only.proc.kill('SIGKILL');
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.interrupt', payload: { authored_by: owner, caused_by: { kind: 'api' } } });
    const evs = await waitEvents(id, (e) => e.some((x) => x.type === 'session.status_idle'), 40_000);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'interrupted' });
    // The use its runner never answered is answered by the turn's end, before it, once.
    const results = evs.filter((e) => e.type === 'agent.tool_result');
    expect(results.map((e) => e.payload)).toEqual([expect.objectContaining({ tool_use_id: use?.payload.id, is_error: true, interrupted: true })]);
    expect(evs.findIndex((e) => e.type === 'agent.tool_result')).toBeLessThan(evs.findIndex((e) => e.type === 'session.status_idle'));
    expect((await runsOf(id))[0]?.status).toBe('canceled');
  }, WITH_DAEMON_MS + DAEMON_READY_MS);
});
