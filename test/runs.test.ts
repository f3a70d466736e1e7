import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnEvent, type TurnPlatform } from './harness/turns.js';
import { customToolRoundTrip } from './harness/round-trip.js';
import { DAEMON_READY_MS, pairDaemon, startDaemon, WITH_DAEMON_MS } from './harness/daemon.js';
import { startMcpUpstream } from './harness/mcp-upstream.js';

/**
 * The whole path, started like `npm start`: user.message → Run → BullMQ lease → runner over
 * WebSocket → Docker sandbox → scripted model through the model gateway → events on the
 * Session log → session.status_idle.
 */
let p: Platform;
let api: HttpClient;
let principal: string;
let envId: string;
let msg: TurnPlatform['msg'];

type Ev = TurnEvent;

beforeAll(async () => {
  // Its MCP upstreams listen on loopback: reachable in development mode only (the outbound address guard).
  ({ p, api, principal, envId, msg } = await startTurnPlatform({ name: 'runs', env: { AGENTPLANE_MODE: 'development' } }));
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

async function session(system: string, tools: Json[] = [{ type: 'builtin', name: 'bash' }, { type: 'builtin', name: 'read' }, { type: 'builtin', name: 'write' }]): Promise<string> {
  const s = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'scripted', model: 'default', system, tools }, environment_id: envId });
  return s.id;
}

const until = (sessionId: string, stop: (events: Ev[]) => boolean, timeoutMs = 60_000, lastEventId?: string): Promise<Ev[]> =>
  untilEvents(api, sessionId, stop, timeoutMs, lastEventId);

describe('turns end to end', () => {
  it('a user.message runs a turn on the local runner and ends idle with the agent reply', async () => {
    const id = await session(SCRIPT([{ then: [{ reply: 'Hello from the sandbox side' }] }]));
    await api.post(`/v1/sessions/${id}/events`, msg('hi'));
    const evs = await until(id, (e) => idleCount(e) >= 1);
    const reply = evs.find((e) => e.type === 'agent.message');
    expect(JSON.stringify(reply?.payload)).toContain('Hello from the sandbox side');
    const idle = evs.find((e) => e.type === 'session.status_idle');
    expect(idle?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    const seqs = evs.map((e) => e.seq);
    expect(seqs).toEqual([...seqs].sort((a, b) => a - b));
    expect(new Set(seqs).size).toBe(seqs.length);

    const runs = await api.get<{ data: Json[] }>(`/v1/sessions/${id}/runs`);
    const run = runs.data[0] as Json & { status: string; attempts: Json[]; timestamps: Json };
    expect(run.status).toBe('succeeded');
    expect(run.attempts).toHaveLength(1);
    for (const k of ['accepted_at', 'enqueued_at', 'leased_at', 'started_at', 'first_event_at', 'ended_at']) expect(run.timestamps[k]).toBeTruthy();
    // The model gateway metered the turn: the Session's usage shows it.
    const sess = await api.get<{ usage: { input_tokens: number; output_tokens: number } }>(`/v1/sessions/${id}`);
    expect(sess.usage.input_tokens).toBeGreaterThan(0);
    expect(sess.usage.output_tokens).toBeGreaterThan(0);
  });

  it('a file written in turn 1 is read back in turn 2 (the Session keeps its sandbox)', async () => {
    const id = await session(SCRIPT([
      { when: { user_contains: 'save' }, then: [{ tool: 'bash', input: { command: 'echo kept-between-turns > /workspace/note.txt' } }] },
      { when: { user_contains: 'load' }, then: [{ tool: 'bash', input: { command: 'cat /workspace/note.txt' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'Tool said: {{tool_result}}' }] },
    ]));
    await api.post(`/v1/sessions/${id}/events`, msg('save it'));
    await until(id, (e) => idleCount(e) >= 1);
    await api.post(`/v1/sessions/${id}/events`, msg('load it'));
    const evs = await until(id, (e) => idleCount(e) >= 2);
    const results = evs.filter((e) => e.type === 'agent.tool_result').map((e) => JSON.stringify(e.payload));
    expect(results.some((r) => r.includes('kept-between-turns'))).toBe(true);
  });

  it('a custom tool ends the Run with requires_action and user.custom_tool_result continues the turn', async () => {
    await customToolRoundTrip({ api, principal, msg }, session);
  });

  it('an always_ask tool waits for user.tool_confirmation: allow runs it in the sandbox, deny is reported to the model', async () => {
    const id = await session(
      SCRIPT([
        { when: { user_contains: 'list' }, then: [{ tool: 'bash', input: { command: 'echo confirmed-run' } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'Result: {{tool_result}}' }] },
      ]),
      [{ type: 'builtin', name: 'bash', permission: 'always_ask' }],
    );
    const answer = (toolUseId: string, result: 'allow' | 'deny') => api.post(`/v1/sessions/${id}/events`, {
      type: 'user.tool_confirmation', payload: { tool_use_id: toolUseId, result, authored_by: principal, caused_by: { kind: 'api' } },
    });
    await api.post(`/v1/sessions/${id}/events`, msg('list files'));
    const first = await until(id, (e) => idleCount(e) >= 1);
    expect(first.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'requires_action' });
    const use = first.find((e) => e.type === 'agent.tool_use');
    expect(use?.payload).toMatchObject({ blocking: true });
    await answer(String(use?.payload.id), 'allow');
    const allowed = await until(id, (e) => idleCount(e) >= 2);
    expect(JSON.stringify(allowed.filter((e) => e.type === 'agent.tool_result'))).toContain('confirmed-run');

    await api.post(`/v1/sessions/${id}/events`, msg('list again'));
    const again = await until(id, (e) => idleCount(e) >= 3);
    const second = again.filter((e) => e.type === 'agent.tool_use').at(-1);
    await answer(String(second?.payload.id), 'deny');
    const denied = await until(id, (e) => idleCount(e) >= 4);
    const results = denied.filter((e) => e.type === 'agent.tool_result');
    expect(results.at(-1)?.payload).toMatchObject({ denied: true, is_error: true });
    expect(denied.filter((e) => e.type === 'agent.tool_result').filter((e) => JSON.stringify(e.payload).includes('confirmed-run'))).toHaveLength(1);
  });

  it("the agent's MCP server tools run through the runtime endpoint with the lease's bearer", async () => {
    const upstream = await startMcpUpstream();
    const url = upstream.url;
    try {
      await p.root.post('/v1/connections', { name: 'upstream', url });
      const id = await session(
        SCRIPT([
          { when: { user_contains: 'echo' }, then: [{ tool: 'ext__echo', input: { text: 'through the lease' } }] },
          { when: { on: 'tool_result' }, then: [{ reply: 'MCP said: {{tool_result}}' }] },
        ]),
      );
      await api.post(`/v1/sessions/${id}`, { agent: { mcp_servers: [{ name: 'ext', type: 'url', url, permission: 'always_allow' }] } });
      await api.post(`/v1/sessions/${id}/events`, msg('echo please'));
      const evs = await until(id, (e) => idleCount(e) >= 1);
      expect(JSON.stringify(evs.filter((e) => e.type === 'agent.tool_result'))).toContain('echo: through the lease');
      expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message'))).toContain('MCP said: echo: through the lease');
    } finally {
      await upstream.close();
    }
  });

  it("an unreachable MCP server's tools are left out of the turn; the other server's tools still run", async () => {
    const upstream = await startMcpUpstream();
    // A server that is down: a loopback port nothing listens on any more.
    const closed = await startMcpUpstream();
    const downUrl = closed.url;
    await closed.close();
    try {
      await p.root.post('/v1/connections', { name: 'upstream-up', url: upstream.url });
      const down = await p.root.post<{ id: string }>('/v1/connections', { name: 'upstream-down', url: downUrl });
      const id = await session(
        SCRIPT([
          { when: { user_contains: 'echo' }, then: [{ tool: 'up__echo', input: { text: 'despite the other server' } }] },
          { when: { on: 'tool_result' }, then: [{ reply: 'MCP said: {{tool_result}}' }] },
        ]),
      );
      await api.post(`/v1/sessions/${id}`, {
        agent: {
          mcp_servers: [
            { name: 'down', type: 'url', url: downUrl, permission: 'always_allow' },
            { name: 'up', type: 'url', url: upstream.url, permission: 'always_allow' },
          ],
        },
      });
      await api.post(`/v1/sessions/${id}/events`, msg('echo please'));
      const evs = await until(id, (e) => idleCount(e) >= 1);
      expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
      expect(JSON.stringify(evs.filter((e) => e.type === 'agent.tool_result'))).toContain('echo: despite the other server');
      expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message'))).toContain('MCP said: echo: despite the other server');
      // The runner's log says which Connection was left out.
      const line = await waitFor('the log line naming the unreachable connection', () =>
        readFileSync(p.logFile, 'utf8').split('\n').find((l) => l.includes(down.id) && l.includes('left out')), 10_000);
      expect(JSON.parse(line)).toMatchObject({ server: 'down', connection_id: down.id });
    } finally {
      await upstream.close();
    }
  });

  it('user.interrupt stops a running sleep inside bounded time', async () => {
    const id = await session(SCRIPT([{ when: { user_contains: 'sleep' }, then: [{ tool: 'bash', input: { command: 'sleep 600' } }] }]));
    await api.post(`/v1/sessions/${id}/events`, msg('sleep please'));
    await until(id, (e) => e.some((x) => x.type === 'agent.tool_use'));
    const started = Date.now();
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } });
    const evs = await until(id, (e) => idleCount(e) >= 1);
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'interrupted' });
  });

  it('the turn an archived Session still runs can be interrupted: archiving stops new work, not the work under way', async () => {
    const id = await session(SCRIPT([{ when: { user_contains: 'sleep' }, then: [{ tool: 'bash', input: { command: 'sleep 600' } }] }]));
    await api.post(`/v1/sessions/${id}/events`, msg('sleep please'));
    await until(id, (e) => e.some((x) => x.type === 'agent.tool_use'));
    await api.post(`/v1/sessions/${id}/archive`);
    expect((await api.request('POST', `/v1/sessions/${id}/events`, { body: msg('more') })).status).toBe(409);
    const started = Date.now();
    const r = await api.request('POST', `/v1/sessions/${id}/events`, { body: { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } } });
    expect(r.status).toBe(201);
    const evs = await until(id, (e) => idleCount(e) >= 1);
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'interrupted' });
  });
});

describe('runner drain with held work (SIGTERM)', () => {
  let q: Platform;
  let qapi: HttpClient;
  let owner: string;
  let env2: string;
  beforeAll(async () => {
    q = await startPlatform({ runner: false, scheduler: true, env: { LEASE_MS: '6000', OFFER_TIMEOUT_MS: '2000', STALLED_INTERVAL_MS: '1000', RUNNER_HEARTBEAT_INTERVAL_MS: '1000' } });
    qapi = q.root;
    owner = (await q.root.post<{ id: string }>(`/v1/organizations/workspaces/${q.bootstrap.workspace_id}/principals`, {
      external_subject_id: 'owner', principal_type: 'person', display_name: 'Owner',
    })).id;
    env2 = (await qapi.post<{ id: string }>('/v1/environments', { name: 'sb', image: 'agentplane/sandbox:latest' })).id;
  }, 60_000);
  afterAll(async () => {
    await q?.stop();
  });

  async function sleepyTurn(seconds: number): Promise<string> {
    const s = await qapi.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'sleepy', model: 'default', system: SCRIPT([
        { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: `sleep ${seconds}; echo slept` } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'done: {{tool_result}}' }] },
      ]), tools: [{ type: 'builtin', name: 'bash' }] },
      environment_id: env2,
    });
    await qapi.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'go', authored_by: owner, caused_by: { kind: 'api' } } });
    return s.id;
  }

  async function waitEvents(sessionId: string, pred: (evs: Ev[]) => boolean, ms = 30_000): Promise<Ev[]> {
    return waitFor('events', async () => {
      const r = await qapi.get<{ data: Ev[] }>(`/v1/sessions/${sessionId}/threads/${await primary(sessionId)}/events`, { limit: 1000 });
      return pred(r.data) ? r.data : undefined;
    }, ms);
  }
  const primaries = new Map<string, string>();
  async function primary(sessionId: string): Promise<string> {
    let t = primaries.get(sessionId);
    if (!t) {
      t = (await qapi.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id ?? '';
      primaries.set(sessionId, t);
    }
    return t;
  }

  it('the first SIGTERM drains: held work finishes, then the daemon exits 0', async () => {
    const { dir, runnerId } = await pairDaemon(q, owner, 'drain-box');
    const daemon = startDaemon(dir);
    const exited = new Promise<number | null>((r) => daemon.once('exit', (code) => r(code)));
    try {
      await waitFor('ready runner', async () => ((await q.root.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined), DAEMON_READY_MS);
      const id = await sleepyTurn(3);
      await waitEvents(id, (evs) => evs.some((e) => e.type === 'agent.tool_use'));
      daemon.kill('SIGTERM');
      await waitFor('draining presence', async () => ((await q.root.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.runner === runnerId && x.status === 'draining') ? true : undefined), 5000);
      expect(daemon.exitCode).toBeNull();
      expect(await exited).toBe(0);
      const evs = await waitEvents(id, (e) => e.some((x) => x.type === 'session.status_idle'));
      expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
      expect(JSON.stringify(evs.filter((e) => e.type === 'agent.tool_result'))).toContain('slept');
    } finally {
      daemon.kill('SIGKILL');
    }
  }, WITH_DAEMON_MS);

  it('a second SIGTERM cancels held work and the daemon exits at once', async () => {
    const { dir, runnerId } = await pairDaemon(q, owner, 'cancel-box');
    const daemon = startDaemon(dir);
    const exited = new Promise<number | null>((r) => daemon.once('exit', (code) => r(code)));
    try {
      await waitFor('ready runner', async () => ((await q.root.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined), DAEMON_READY_MS);
      const id = await sleepyTurn(600);
      await waitEvents(id, (evs) => evs.some((e) => e.type === 'agent.tool_use'));
      daemon.kill('SIGTERM');
      // The first signal has been taken (the runner reports itself draining) before the second.
      await waitFor('draining presence', async () => ((await q.root.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.runner === runnerId && x.status === 'draining') ? true : undefined), 10_000);
      const t0 = Date.now();
      daemon.kill('SIGTERM');
      expect(await exited).toBe(0);
      expect(Date.now() - t0).toBeLessThan(5000);
      // The runner stopping is not the tool's outcome: no result is recorded for the killed command
      // (its retry runs it again), the Run is rescheduled as the runner's failure.
      const evs = await waitEvents(id, (e) => e.some((x) => x.type === 'session.thread_status_rescheduled'));
      expect(evs.filter((e) => e.type === 'agent.tool_result')).toEqual([]);
    } finally {
      daemon.kill('SIGKILL');
    }
  }, WITH_DAEMON_MS);
});

describe('a brief disconnect inside the lease', () => {
  it('an API restart while a turn runs: the runner reconnects, keeps its lease, nothing is rescheduled', async () => {
    // The lease outlasts a slow API restart on a loaded machine by far: only a lost lease could reschedule.
    const r = await startPlatform({ runner: true, scheduler: true, env: { LEASE_MS: '45000', RUNNER_HEARTBEAT_INTERVAL_MS: '1000' } });
    try {
      const ws = r.bootstrap.workspace_id;
      const owner = (await r.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, { external_subject_id: 'o', principal_type: 'person', display_name: 'O' })).id;
      const env = (await r.root.post<{ id: string }>('/v1/environments', { name: 'sb', image: 'agentplane/sandbox:latest' })).id;
      await waitFor('ready runner', async () => ((await r.root.get<{ data: { status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.status === 'ready') ? true : undefined), 60_000);
      const s = await r.root.post<{ id: string }>('/v1/sessions', {
        agent: { name: 'a', model: 'default', system: SCRIPT([
          { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: 'sleep 6; echo survived' } }] },
          { when: { on: 'tool_result' }, then: [{ reply: 'ok: {{tool_result}}' }] },
        ]), tools: [{ type: 'builtin', name: 'bash' }] },
        environment_id: env,
      });
      await r.root.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'go', authored_by: owner, caused_by: { kind: 'api' } } });
      const thread = (await r.root.get<{ data: { id: string }[] }>(`/v1/sessions/${s.id}/threads`)).data[0]?.id ?? '';
      const evs = async () => (await r.root.get<{ data: Ev[] }>(`/v1/sessions/${s.id}/threads/${thread}/events`, { limit: 1000 })).data;
      await waitFor('tool running', async () => ((await evs()).some((e) => e.type === 'agent.tool_use') ? true : undefined), 30_000);
      const api = r.pids().api as number;
      process.kill(api, 'SIGKILL');
      const done = await waitFor('turn done', async () => {
        try {
          const e = await evs();
          return e.some((x) => x.type === 'session.status_idle') ? e : undefined;
        } catch {
          return undefined;
        }
      }, 60_000);
      expect(done.some((e) => e.type === 'session.thread_status_rescheduled')).toBe(false);
      expect(JSON.stringify(done.filter((e) => e.type === 'agent.tool_result'))).toContain('survived');
      const runs = await r.root.get<{ data: { attempts: unknown[]; status: string }[] }>(`/v1/sessions/${s.id}/runs`);
      expect(runs.data[0]?.status).toBe('succeeded');
      expect(runs.data[0]?.attempts).toHaveLength(1);
    } finally {
      await r.stop();
    }
  }, 120_000);
});
