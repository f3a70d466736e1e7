import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ChildProcess } from 'node:child_process';
import { streamEvents, type HttpClient, type SseFrame } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { pairDaemon, startDaemon } from './harness/daemon.js';

/**
 * Coordinator Sessions (docs/COORDINATION.md) end to end, with the scripted model on two real
 * runners (two slots each): fan-out to three children running at the same time and combined,
 * a child blocking on a custom tool answered by `session_thread_id` (and the ambiguity refused
 * without it), interrupt during a fan-out, `stop_thread` on a waiting child, condensed vs
 * complete listings and thread streams resumed with Last-Event-ID, then kill -9 of one child's
 * runner.
 */
let p: Platform;
let api: HttpClient;
let owner: string;
let envId: string;
const daemons: ChildProcess[] = [];
const byRunner = new Map<string, ChildProcess>();

type Json = Record<string, unknown>;
interface Ev { id: string; seq: number; type: string; payload: Json; session_thread_id: string | null }
interface Thread { id: string; parent_thread_id: string | null; status: string; agent: Json; usage: Json | null; stats: Json }
interface Run { id: string; session_thread_id: string; status: string; attempts: { runner_id: string; outcome: string }[]; timestamps: Json }
const SCRIPT = (rules: unknown[]) => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;

let researcher: { id: string; version: number };
let asker: { id: string; version: number };

beforeAll(async () => {
  p = await startPlatform({
    runner: false,
    scheduler: true,
    env: {
      LEASE_MS: '4000', OFFER_TIMEOUT_MS: '1500', STALLED_INTERVAL_MS: '500', RUN_BACKOFF_MS: '100', RUNNER_HEARTBEAT_INTERVAL_MS: '1000',
      RUNNER_PRESENCE_TTL_MS: '3000',
    },
  });
  api = p.root;
  owner = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: 'owner', principal_type: 'person', display_name: 'Owner',
  })).id;
  envId = (await api.post<{ id: string }>('/v1/environments', {
    name: 'sb', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 500, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
  })).id;
  // A member that works in its own sandbox: one bash call, then its answer.
  researcher = await api.post<{ id: string; version: number }>('/v1/agents', {
    name: 'researcher', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
    system: SCRIPT([
      { when: { on: 'user', user_contains: 'slow' }, then: [{ tool: 'bash', input: { command: 'sleep 30; echo late' } }] },
      { when: { on: 'user', user_contains: 'sleepy' }, then: [{ tool: 'bash', input: { command: 'sleep 12; echo done-{{user}}' } }] },
      { when: { on: 'user' }, then: [{ tool: 'bash', input: { command: 'sleep 5; echo done-{{user}}' } }] },
      { when: { after_tool: 'bash' }, then: [{ reply: 'answer {{tool_result}}' }] },
    ]),
  });
  // A member that blocks on a custom tool its client answers.
  asker = await api.post<{ id: string; version: number }>('/v1/agents', {
    name: 'asker', model: 'default',
    tools: [{ type: 'custom', name: 'lookup', description: 'Ask the client', input_schema: { type: 'object', properties: { q: { type: 'string' } } } }],
    system: SCRIPT([
      { when: { on: 'user' }, then: [{ tool: 'lookup', input: { q: 'same question' } }] },
      { when: { after_tool: 'lookup' }, then: [{ reply: 'asker got {{tool_result}}' }] },
    ]),
  });
  await Promise.all([daemon('box-a'), daemon('box-b')]);
}, 120_000);

afterAll(async () => {
  for (const d of daemons) d.kill('SIGKILL');
  await p?.stop();
});

async function daemon(label: string): Promise<{ proc: ChildProcess; runnerId: string }> {
  const { dir, runnerId } = await pairDaemon(p, owner, label);
  const proc = startDaemon(dir, ['--slots', '2']);
  daemons.push(proc);
  byRunner.set(runnerId, proc);
  await waitFor(`${label} ready`, async () => ((await api.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined), 60_000);
  return { proc, runnerId };
}

/** A coordinator over both members; its script is the test's. */
async function coordinator(rules: unknown[]): Promise<{ session: string; primary: string }> {
  const agent = await api.post<{ id: string; multiagent: Json }>('/v1/agents', {
    name: 'lead', model: 'default', system: SCRIPT(rules),
    multiagent: { roster: [{ agent_id: researcher.id, version: researcher.version }, { agent_id: asker.id, version: asker.version }], max_concurrent_threads: 8 },
  });
  expect(agent.multiagent).toMatchObject({ max_concurrent_threads: 8 });
  const s = await api.post<{ id: string }>('/v1/sessions', { agent: agent.id, environment_id: envId });
  const primary = (await threads(s.id))[0]?.id ?? '';
  return { session: s.id, primary };
}

const say = (session: string, text: string) =>
  api.post(`/v1/sessions/${session}/events`, { type: 'user.message', payload: { content: text, authored_by: owner, caused_by: { kind: 'api' } } });
const threads = async (session: string) => (await api.get<{ data: Thread[] }>(`/v1/sessions/${session}/threads`)).data;
const threadEvents = async (session: string, thread: string) =>
  (await api.get<{ data: Ev[] }>(`/v1/sessions/${session}/threads/${thread}/events`, { limit: 1000 })).data;
const runsOf = async (session: string) => (await api.get<{ data: Run[] }>(`/v1/sessions/${session}/runs`, { limit: 100 })).data;

const idleStops = (evs: Ev[], thread: string) =>
  evs.filter((e) => e.type === 'session.status_idle' && e.session_thread_id === thread).map((e) => (e.payload.stop_reason as { type: string }).type);

/** The primary thread's events once its turn has ended other than requires_action. */
const turnOver = (session: string, primary: string, ms = 90_000) => waitFor('the coordinator turn to end', async () => {
  const evs = await threadEvents(session, primary);
  return idleStops(evs, primary).some((t) => t !== 'requires_action') ? evs : undefined;
}, ms);

/** The Session's one child once it waits on its custom tool. */
const childWaiting = (session: string) => waitFor('the child to wait on its custom tool', async () => {
  const t = (await threads(session))[1];
  return t && idleStops(await threadEvents(session, t.id), t.id).includes('requires_action') ? t : undefined;
}, 60_000);

/** The child's wait ended by an interrupt: its turn ended interrupted, its open use answered as interrupted. */
async function childWaitInterrupted(session: string, child: string, toolUseId: unknown): Promise<void> {
  const evs = await waitFor('the child\'s wait to end', async () => {
    const e = await threadEvents(session, child);
    return idleStops(e, child).length >= 2 ? e : undefined;
  }, 30_000);
  expect(idleStops(evs, child)).toEqual(['requires_action', 'interrupted']);
  expect(evs.find((e) => e.type === 'agent.tool_result' && e.payload.tool_use_id === toolUseId)?.payload).toMatchObject({ is_error: true, interrupted: true });
}

const fanOut = (tasks: string[], member = 'researcher') => [
  { when: { on: 'user' }, then: [...tasks.map((task) => ({ tool: 'start_thread', input: { agent: member, task } })), { tool: 'wait_threads', input: {} }] },
  { when: { after_tool: 'wait_threads' }, then: [{ reply: 'combined: {{tool_result}}' }] },
  { then: [{ reply: 'unexpected: {{tool_results}}' }] },
];

describe('coordinator sessions', () => {
  it('refuses a roster member that is itself a coordinator (depth 1) and the reserved tool names', async () => {
    const lead = await api.post<{ id: string; version: number }>('/v1/agents', {
      name: 'lead0', model: 'default', multiagent: { roster: [{ agent_id: researcher.id, version: researcher.version }] },
    });
    const nested = await api.request('POST', '/v1/agents', { body: { name: 'x', model: 'default', multiagent: { roster: [{ agent_id: lead.id, version: lead.version }] } } });
    expect(nested.status).toBe(400);
    expect(JSON.stringify(nested.body)).toContain('depth 1');
    const reserved = await api.request('POST', '/v1/agents', {
      body: {
        name: 'y', model: 'default', multiagent: { roster: [{ agent_id: researcher.id, version: researcher.version }] },
        tools: [{ type: 'custom', name: 'start_thread', description: 'd', input_schema: { type: 'object' } }],
      },
    });
    expect(reserved.status).toBe(400);
    // Nor by a Session's update: a coordinator Session's tools keep the delegation names free.
    const s = await api.post<{ id: string }>('/v1/sessions', { agent: lead.id, environment_id: envId });
    const custom = (name: string) => ({ agent: { tools: [{ type: 'custom', name, description: 'd', input_schema: { type: 'object' } }] } });
    const updated = await api.request('POST', `/v1/sessions/${s.id}`, { body: custom('wait_threads') });
    expect([updated.status, (updated.body as { error: { type: string; message: string } }).error?.message]).toEqual([400, "body.agent.tools: 'wait_threads' is reserved for the delegation tools of a coordinator"]);
    expect((await api.request('POST', `/v1/sessions/${s.id}`, { body: custom('lookup') })).status).toBe(200);
  });

  it('a coordinator release publishes a deployment revision only with its roster snapshot', async () => {
    const ws = p.bootstrap.workspace_id;
    const hprof = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/harness-profiles`, { key: 'coord', kind: 'builtin' })).id;
    const sprof = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/sandbox-profiles`, { key: 'coord', image: 'agentplane/sandbox:latest' })).id;
    const mrp = (await api.get<{ data: { id: string }[] }>(`/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key: 'default' })).data[0]?.id;
    const revision = (expected: number, release: number, roster?: unknown) => ({
      expected_resource_version: expected, agent_release_number: release, model_routing: { model_routing_profile_id: mrp, model_routing_profile_revision_number: 1 },
      execution_target: { type: 'managed', harness_profile_id: hprof, harness_profile_revision_number: 1, sandbox_profile_id: sprof, sandbox_profile_revision_number: 1, harness_topology: 'split' },
      skill_selections: [], connection_binding_selections: [], ...(roster ? { roster_snapshot: roster } : {}),
    });
    const memberHead = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: researcher.id, key: 'member' })).id;
    await api.post(`/v1/agent-deployments/${memberHead}/revisions`, revision(1, researcher.version));
    const lead = await api.post<{ id: string; version: number }>('/v1/agents', {
      name: 'deployed-lead', model: 'default', multiagent: { roster: [{ agent_id: researcher.id, version: researcher.version }] },
    });
    const leadHead = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: lead.id, key: 'lead' })).id;
    const entry = { position: 0, member_agent_id: researcher.id, member_agent_release_number: researcher.version, member_agent_deployment_id: memberHead, member_agent_deployment_revision_number: 1 };
    const without = await api.request('POST', `/v1/agent-deployments/${leadHead}/revisions`, { body: revision(1, lead.version) });
    expect(without.status).toBe(400);
    const wrong = await api.request('POST', `/v1/agent-deployments/${leadHead}/revisions`, { body: revision(1, lead.version, { entries: [{ ...entry, member_agent_release_number: researcher.version + 1 }] }) });
    expect(wrong.status).toBe(400);
    const ok = await api.post<{ roster_snapshot: unknown }>(`/v1/agent-deployments/${leadHead}/revisions`, revision(1, lead.version, { entries: [entry] }));
    expect(ok.roster_snapshot).toEqual({ entries: [entry] });
    const session = await api.post<{ agent: { multiagent?: unknown } }>(`/v1/agent-deployments/${leadHead}/sessions`, {});
    expect(session.agent.multiagent).toEqual({ roster: [{ agent_id: researcher.id, version: researcher.version }] });
  });

  let fan: { session: string; primary: string };
  it('fans out to three children running at the same time on two runners and combines their answers', async () => {
    fan = await coordinator(fanOut(['alpha', 'beta', 'gamma']));
    await say(fan.session, 'research this');
    const evs = await turnOver(fan.session, fan.primary);
    expect(idleStops(evs, fan.primary)).toEqual(['requires_action', 'end_turn']);
    const combined = evs.filter((e) => e.type === 'agent.message' && e.session_thread_id === fan.primary).map((e) => JSON.stringify(e.payload)).join(' ');
    for (const t of ['alpha', 'beta', 'gamma']) expect(combined).toContain(`done-${t}`);

    const all = await threads(fan.session);
    expect(all).toHaveLength(4);
    expect(all[0]?.agent).not.toHaveProperty('multiagent');
    const children = all.slice(1);
    for (const c of children) {
      expect(c.parent_thread_id).toBe(fan.primary);
      expect(c.agent).toMatchObject({ id: researcher.id, version: researcher.version, name: 'researcher' });
      expect(c.agent).not.toHaveProperty('multiagent');
      expect(c.status).toBe('idle');
      expect(c.usage).not.toBeNull();
    }
    // Each child's Runs are its own, leased independently: the three ran at once, on both runners.
    const runs = (await runsOf(fan.session)).filter((r) => r.session_thread_id !== fan.primary);
    expect(runs).toHaveLength(3);
    expect(new Set(runs.flatMap((r) => r.attempts.map((a) => a.runner_id))).size).toBe(2);
    const starts = runs.map((r) => Date.parse(String(r.timestamps.started_at)));
    const ends = runs.map((r) => Date.parse(String(r.timestamps.ended_at)));
    expect(Math.max(...starts)).toBeLessThan(Math.min(...ends));

    // Usage rolls up: the Session counts every thread's tokens.
    const session = await api.get<{ usage: { input_tokens: number } }>(`/v1/sessions/${fan.session}`);
    const childTokens = children.reduce((n, c) => n + Number((c.usage as { input_tokens: number }).input_tokens), 0);
    expect(session.usage.input_tokens).toBeGreaterThanOrEqual(childTokens);
  }, 150_000);

  it('lists a child\'s complete history and the primary\'s condensed one; thread streams resume after Last-Event-ID', async () => {
    const [, child] = await threads(fan.session);
    const childEvents = await threadEvents(fan.session, child!.id);
    expect(childEvents.every((e) => e.session_thread_id === child!.id)).toBe(true);
    expect(childEvents.map((e) => e.type)).toEqual(expect.arrayContaining(['user.message', 'session.status_running', 'agent.tool_use', 'agent.tool_result', 'agent.message', 'session.status_idle']));
    const primaryEvents = await threadEvents(fan.session, fan.primary);
    const fromChildren = primaryEvents.filter((e) => e.session_thread_id !== fan.primary && e.session_thread_id !== null);
    expect(fromChildren.length).toBeGreaterThan(0);
    expect(fromChildren.every((e) => e.type.startsWith('session.'))).toBe(true);

    // The thread stream replays after the cursor, then goes live.
    const ac = new AbortController();
    const seen: Ev[] = [];
    const after = childEvents[1]!;
    try {
      for await (const f of streamEvents(api, `/v1/sessions/${fan.session}/threads/${child!.id}/stream`, { signal: ac.signal, lastEventId: String(after.seq) }) as AsyncGenerator<SseFrame>) {
        if (!f.id) continue;
        seen.push(JSON.parse(f.data) as Ev);
        if (seen.length === childEvents.length - 2) break;
      }
    } finally {
      ac.abort();
    }
    expect(seen.map((e) => e.seq)).toEqual(childEvents.slice(2).map((e) => e.seq));

    // The Session stream is the condensed view too.
    const ac2 = new AbortController();
    const sessionSeen: Ev[] = [];
    const lastPrimary = primaryEvents[primaryEvents.length - 1]!;
    try {
      for await (const f of streamEvents(api, `/v1/sessions/${fan.session}/events/stream`, { signal: ac2.signal }) as AsyncGenerator<SseFrame>) {
        if (!f.id) continue;
        const e = JSON.parse(f.data) as Ev;
        sessionSeen.push(e);
        if (e.seq >= lastPrimary.seq) break;
      }
    } finally {
      ac2.abort();
    }
    expect(sessionSeen.map((e) => e.seq)).toEqual(primaryEvents.map((e) => e.seq));

    // Archive: the primary cannot be archived; an idle child is frozen.
    const primaryArchive = await api.request('POST', `/v1/sessions/${fan.session}/threads/${fan.primary}/archive`);
    expect(primaryArchive.status).toBe(409);
    expect(JSON.stringify(primaryArchive.body)).toContain('runtime.primary_thread');
    const archived = await api.post<Thread & { archived_at: string | null }>(`/v1/sessions/${fan.session}/threads/${child!.id}/archive`);
    expect(archived.status).toBe('terminated');
    expect(archived.archived_at).not.toBeNull();
  }, 60_000);

  it('routes a child\'s custom tool result by session_thread_id and refuses the ambiguous one', async () => {
    const c = await coordinator(fanOut(['same task', 'same task'], 'asker'));
    await say(c.session, 'ask twice');
    // Both children block on the same tool use id.
    const [, one, two] = await waitFor('both children to wait', async () => {
      const all = await threads(c.session);
      if (all.length < 3) return undefined;
      const evs = await Promise.all(all.slice(1).map((t) => threadEvents(c.session, t.id)));
      return evs.every((e) => idleStops(e, e[0]!.session_thread_id ?? '').includes('requires_action')) ? all : undefined;
    }, 60_000);
    const useOf = async (t: string) => String((await threadEvents(c.session, t)).find((e) => e.type === 'agent.tool_use')?.payload.id);
    const toolUseId = await useOf(one!.id);
    expect(await useOf(two!.id)).toBe(toolUseId);

    const answer = (result: string, thread?: string) => api.request('POST', `/v1/sessions/${c.session}/events`, {
      body: { type: 'user.custom_tool_result', payload: { tool_use_id: toolUseId, result, ...(thread ? { session_thread_id: thread } : {}), authored_by: owner, caused_by: { kind: 'api' } } },
    });
    const ambiguous = await answer('x');
    expect(ambiguous.status).toBe(400);
    expect(JSON.stringify(ambiguous.body)).toContain('session_thread_id is required');

    // The coordinator's own delegation wait is not a client's to answer.
    const waitUse = (await threadEvents(c.session, c.primary)).find((e) => e.type === 'agent.tool_use' && e.payload.name === 'wait_threads');
    const notYours = await api.request('POST', `/v1/sessions/${c.session}/events`, {
      body: { type: 'user.custom_tool_result', payload: { tool_use_id: String(waitUse?.payload.id), result: 'x', authored_by: owner, caused_by: { kind: 'api' } } },
    });
    expect(notYours.status).toBe(409);

    expect((await answer('first answer', one!.id)).status).toBe(201);
    await waitFor('the first child to finish', async () => (idleStops(await threadEvents(c.session, one!.id), one!.id).includes('end_turn') ? true : undefined), 60_000);
    // The second still waits; the coordinator too.
    expect(idleStops(await threadEvents(c.session, c.primary), c.primary)).toEqual(['requires_action']);
    // Now unambiguous: the only pending use is the second child's.
    const second = await answer('second answer');
    expect(second.status).toBe(201);
    // Its exact retry, when no thread waits on the use any more, finds the answer it recorded (not
    // the first child's, another answer): the original event again, nothing appended.
    const retried = await answer('second answer');
    expect([retried.status, (retried.body as { id: string }).id]).toEqual([200, (second.body as { id: string }).id]);
    expect((await answer('a third answer')).status).toBe(409);
    const evs = await turnOver(c.session, c.primary);
    const combined = evs.filter((e) => e.type === 'agent.message' && e.session_thread_id === c.primary).map((e) => JSON.stringify(e.payload)).join(' ');
    expect(combined).toContain('asker got first answer');
    expect(combined).toContain('asker got second answer');
  }, 120_000);

  it('user.interrupt during a fan-out interrupts the coordinator and every running child', async () => {
    const c = await coordinator([{ when: { user_contains: 'again' }, then: [{ reply: 'fresh turn' }] }, ...fanOut(['slow one', 'slow two'])]);
    await say(c.session, 'go slow');
    await waitFor('both children in their tool call', async () => {
      const all = await threads(c.session);
      if (all.length < 3) return undefined;
      const evs = await Promise.all(all.slice(1).map((t) => threadEvents(c.session, t.id)));
      return evs.every((e) => e.some((x) => x.type === 'agent.tool_use')) ? true : undefined;
    }, 60_000);
    await api.post(`/v1/sessions/${c.session}/events`, { type: 'user.interrupt', payload: { authored_by: owner, caused_by: { kind: 'api' } } });
    const evs = await turnOver(c.session, c.primary, 30_000);
    expect(idleStops(evs, c.primary)).toEqual(['requires_action', 'interrupted']);
    const children = (await threads(c.session)).slice(1);
    for (const t of children) {
      const stops = await waitFor('the child to stop', async () => {
        const s = idleStops(await threadEvents(c.session, t.id), t.id);
        return s.length > 0 ? s : undefined;
      }, 30_000);
      expect(stops).toEqual(['interrupted']);
    }
    // The coordinator takes the next message as usual.
    await say(c.session, 'again?');
    const next = await waitFor('the next turn', async () => {
      const stops = idleStops(await threadEvents(c.session, c.primary), c.primary);
      return stops.length >= 3 ? stops : undefined;
    }, 60_000);
    expect(next).toEqual(['requires_action', 'interrupted', 'end_turn']);
  }, 120_000);

  it('user.interrupt on the Session also ends the wait of a child blocked on a client\'s answer', async () => {
    const c = await coordinator(fanOut(['blocked task'], 'asker'));
    await say(c.session, 'ask');
    const child = await childWaiting(c.session);
    const use = (await threadEvents(c.session, child.id)).find((e) => e.type === 'agent.tool_use');
    await api.post(`/v1/sessions/${c.session}/events`, { type: 'user.interrupt', payload: { authored_by: owner, caused_by: { kind: 'api' } } });
    const evs = await turnOver(c.session, c.primary, 30_000);
    expect(idleStops(evs, c.primary)).toEqual(['requires_action', 'interrupted']);
    await childWaitInterrupted(c.session, child.id, use?.payload.id);
    // The cancelled wait takes no late answer, and the child can now be archived.
    const late = await api.request('POST', `/v1/sessions/${c.session}/events`, {
      body: { type: 'user.custom_tool_result', payload: { tool_use_id: String(use?.payload.id), result: 'late', session_thread_id: child.id, authored_by: owner, caused_by: { kind: 'api' } } },
    });
    expect(late.status).toBe(409);
    const archived = await api.post<Thread>(`/v1/sessions/${c.session}/threads/${child.id}/archive`, {});
    expect(archived.status).toBe('terminated');
  }, 120_000);

  it('stop_thread ends the wait of a child blocked on a client\'s answer, and says it interrupted it', async () => {
    // Turn 1 starts the child and ends; turn 2 (the message is the child's id) stops it.
    const c = await coordinator([
      { when: { on: 'user', user_contains: 'sthr_' }, then: [{ tool: 'stop_thread', input: { session_thread_id: '{{user}}' } }] },
      { when: { after_tool: 'stop_thread' }, then: [{ reply: 'stopped {{tool_result}}' }] },
      { when: { on: 'user' }, then: [{ tool: 'start_thread', input: { agent: 'asker', task: 'blocked task' } }] },
      { when: { after_tool: 'start_thread' }, then: [{ reply: 'started' }] },
    ]);
    await say(c.session, 'ask');
    const child = await childWaiting(c.session);
    await waitFor('the first coordinator turn to end', async () => (idleStops(await threadEvents(c.session, c.primary), c.primary).includes('end_turn') ? true : undefined), 60_000);
    const use = (await threadEvents(c.session, child.id)).find((e) => e.type === 'agent.tool_use');
    await say(c.session, child.id);
    const evs = await waitFor('the second coordinator turn to end', async () => {
      const e = await threadEvents(c.session, c.primary);
      return idleStops(e, c.primary).filter((x) => x === 'end_turn').length >= 2 ? e : undefined;
    }, 60_000);
    const reply = evs.filter((e) => e.type === 'agent.message' && e.session_thread_id === c.primary).map((e) => JSON.stringify(e.payload)).join(' ');
    expect(reply).toContain('stopped');
    expect(reply).toContain('\\"interrupted\\":true');
    await childWaitInterrupted(c.session, child.id, use?.payload.id);
    expect((await threads(c.session)).find((t) => t.id === child.id)?.status).toBe('idle');
  }, 120_000);

  it('delegation tools pass the ActionPolicy gate: a denied start_thread starts nothing', async () => {
    const policy = await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'deny', tool: { kind: 'custom', name: 'start_thread' }, description: 'no delegation' });
    try {
      const c = await coordinator(fanOut(['denied']));
      await say(c.session, 'try');
      const evs = await turnOver(c.session, c.primary);
      expect(idleStops(evs, c.primary)).toEqual(['requires_action', 'end_turn']);
      const start = evs.find((e) => e.type === 'agent.tool_use' && e.payload.name === 'start_thread');
      expect(evs.find((e) => e.type === 'agent.tool_result' && e.payload.tool_use_id === start?.payload.id)?.payload).toMatchObject({ denied: true, is_error: true, policy_rule_id: policy.id });
      expect(await threads(c.session)).toHaveLength(1);
    } finally {
      await p.root.delete(`/v1/action-policies/${policy.id}`);
    }
  }, 60_000);

  it('wait_threads holds to its schema: another mode, or ids that are not a list, is an error the model reads', async () => {
    const c = await coordinator([
      { when: { on: 'user' }, then: [
        { tool: 'start_thread', input: { agent: 'researcher', task: 'odd waits' } },
        { tool: 'wait_threads', input: { mode: 'some' } },
        { tool: 'wait_threads', input: { session_thread_ids: 'notarray' } },
      ] },
      { then: [{ reply: 'read {{tool_results}}' }] },
    ]);
    await say(c.session, 'go');
    const evs = await turnOver(c.session, c.primary);
    const waits = evs.filter((e) => e.type === 'agent.tool_use' && e.payload.name === 'wait_threads').map((e) => e.payload.id);
    const results = waits.map((id) => evs.find((e) => e.type === 'agent.tool_result' && e.payload.tool_use_id === id)?.payload);
    expect(results).toHaveLength(2);
    expect(results[0]).toMatchObject({ is_error: true });
    expect(JSON.stringify(results[0])).toContain("mode must be 'all' or 'any'");
    expect(results[1]).toMatchObject({ is_error: true });
    expect(JSON.stringify(results[1])).toContain('session_thread_ids must be a list of child thread ids');
  }, 90_000);

  it('kill -9 the runner of one child: only the children it ran reschedule, and the fan-out still completes', async () => {
    const c = await coordinator(fanOut(['one', 'two', 'three'].map((x) => `${x} sleepy`)));
    await say(c.session, 'go');
    const runs = await waitFor('all three children leased', async () => {
      const r = (await runsOf(c.session)).filter((x) => x.session_thread_id !== c.primary && x.attempts.length > 0);
      if (r.length < 3) return undefined;
      const evs = await Promise.all(r.map((x) => threadEvents(c.session, x.session_thread_id)));
      return evs.every((e) => e.some((x) => x.type === 'agent.tool_use')) ? r : undefined;
    }, 60_000);
    const victim = runs[0]!.attempts[0]!.runner_id;
    const onVictim = runs.filter((r) => r.attempts[0]!.runner_id === victim).map((r) => r.session_thread_id);
    const elsewhere = runs.filter((r) => r.attempts[0]!.runner_id !== victim).map((r) => r.session_thread_id);
    expect(elsewhere.length).toBeGreaterThan(0);
    byRunner.get(victim)!.kill('SIGKILL');

    const evs = await turnOver(c.session, c.primary, 120_000);
    expect(idleStops(evs, c.primary)).toEqual(['requires_action', 'end_turn']);
    const combined = evs.filter((e) => e.type === 'agent.message' && e.session_thread_id === c.primary).map((e) => JSON.stringify(e.payload)).join(' ');
    for (const t of ['one', 'two', 'three']) expect(combined).toContain(`done-${t} sleepy`);
    for (const t of onVictim) {
      expect((await threadEvents(c.session, t)).filter((e) => e.type === 'session.thread_status_rescheduled')).toHaveLength(1);
    }
    for (const t of elsewhere) {
      expect((await threadEvents(c.session, t)).filter((e) => e.type === 'session.thread_status_rescheduled')).toHaveLength(0);
    }
    expect((await threadEvents(c.session, c.primary)).filter((e) => e.type === 'session.thread_status_rescheduled' && e.session_thread_id === c.primary)).toHaveLength(0);
  }, 180_000);
});
