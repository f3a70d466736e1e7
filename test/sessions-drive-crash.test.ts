import { beforeAll, describe, expect, it } from 'vitest';
import { existsSync, rmSync, writeFileSync } from 'node:fs';
import { waitFor } from './harness/platform.js';
import { useCrashPlatforms, type CrashTurnPlatform } from './harness/crash-platform.js';
import { idleCount, SCRIPT, untilEvents, type Json, type TurnEvent } from './harness/turns.js';

/**
 * The API dies inside a drive event, after its write and before the work that write calls for
 * (named crash points, `AGENTPLANE_CRASH_AT`); the client's retry of the same event finishes
 * that work. Without it the Session stalled for good: a recorded answer whose turn never
 * continued, or an interrupt whose queued messages never started. Likewise an ActionApproval
 * resolved by a request whose process died before the resolution reached the Session.
 */
const crash = useCrashPlatforms('drive-crash');
let t: CrashTurnPlatform;
const marker = (point: string) => t.marker(point);
beforeAll(async () => {
  t = await crash.startTurn(['answer-recorded', 'interrupt-wait-written', 'approval-resolved'], { name: 'drive-crash' });
}, 180_000);

/** A Session whose first turn ends waiting on a custom tool; returns the Session and the tool use. */
async function waitingSession(): Promise<{ id: string; toolUseId: string }> {
  const s = await t.api.post<{ id: string }>('/v1/sessions', {
    agent: {
      name: 'a', model: 'default',
      tools: [{ type: 'custom', name: 'get_weather', description: 'Weather for a city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }],
      system: SCRIPT([
        { when: { user_contains: 'weather' }, then: [{ tool: 'get_weather', input: { city: 'Paris' } }] },
        { when: { after_tool: 'get_weather' }, then: [{ reply: 'Forecast: {{tool_result}}' }] },
        { when: { user_contains: 'meanwhile' }, then: [{ reply: 'queued reply' }] },
      ]),
    },
    environment_id: t.envId,
  });
  await t.api.post(`/v1/sessions/${s.id}/events`, t.msg('what is the weather?'));
  const first = await untilEvents(t.api, s.id, (e) => idleCount(e) >= 1);
  expect(first.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'requires_action' });
  return { id: s.id, toolUseId: String(first.find((e) => e.type === 'agent.tool_use')?.payload.id) };
}

/** Sends `body`, which the API dies answering, and waits for the restarted API. */
async function crashOn(point: string, sessionId: string, body: Json): Promise<void> {
  const apiBefore = t.p.pids().api;
  const lost = await t.api.request('POST', `/v1/sessions/${sessionId}/events`, { body }).catch(() => null);
  expect(lost === null || lost.status >= 500).toBe(true);
  await waitFor('the API back', async () => (await t.api.request('GET', `/v1/sessions/${sessionId}`).catch(() => null))?.status === 200 || undefined, 60_000);
  expect(existsSync(marker(point))).toBe(true);
  expect(t.p.pids().api).not.toBe(apiBefore);
}

describe('a crash inside a drive event', () => {
  it('after an answer marked its wait answered, before the turn continued: the exact retry replays the answer and the turn continues once', async () => {
    const { api, principal } = t;
    const s = await waitingSession();
    const answer = { type: 'user.custom_tool_result', payload: { tool_use_id: s.toolUseId, result: 'sunny, 21C', authored_by: principal, caused_by: { kind: 'api' } } };
    await crashOn('answer-recorded', s.id, answer);

    const retry = await api.request<{ id: string; type: string }>('POST', `/v1/sessions/${s.id}/events`, { body: answer });
    expect([retry.status, retry.body.type]).toEqual([200, 'user.custom_tool_result']);
    const all = await untilEvents(api, s.id, (e) => idleCount(e) >= 2, 90_000);
    expect(all.filter((e) => e.type === 'session.status_idle').map((e) => (e.payload.stop_reason as { type: string }).type)).toEqual(['requires_action', 'end_turn']);
    expect(all.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload)).join(' ')).toContain('sunny, 21C');
    // One answer in the log, one continuation Run.
    expect(all.filter((e) => e.type === 'user.custom_tool_result').map((e) => e.id)).toEqual([retry.body.id]);
    expect(all.filter((e) => e.type === 'session.status_running')).toHaveLength(2);
    expect(new Set(all.map((e) => e.seq)).size).toBe(all.length);
    // Sent once more, it changes nothing.
    const again = await api.request<{ id: string }>('POST', `/v1/sessions/${s.id}/events`, { body: answer });
    expect([again.status, again.body.id]).toEqual([200, retry.body.id]);
    const runs = await api.get<{ data: { status: string }[] }>(`/v1/sessions/${s.id}/runs`);
    expect(runs.data.map((r) => r.status)).toEqual(['succeeded', 'succeeded']);
  }, 240_000);

  it('after an interrupt ended a wait, before the messages queued during it started: the retried interrupt starts them, once', async () => {
    const { api, principal } = t;
    const s = await waitingSession();
    const queued = await api.post<{ id: string }>(`/v1/sessions/${s.id}/events`, t.msg('meanwhile'));
    const interrupt = { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } };
    await crashOn('interrupt-wait-written', s.id, interrupt);

    // The wait was ended by the interrupt's one write; the queued message waits for a turn.
    const retry = await api.request<{ type: string }>('POST', `/v1/sessions/${s.id}/events`, { body: interrupt });
    expect([retry.status, retry.body.type]).toEqual([201, 'user.interrupt']);
    const all = await untilEvents(api, s.id, (e) => idleCount(e) >= 3, 90_000);
    expect(all.filter((e) => e.type === 'session.status_idle').map((e) => (e.payload.stop_reason as { type: string }).type)).toEqual(['requires_action', 'interrupted', 'end_turn']);
    const starts = all.filter((e) => e.type === 'session.status_running');
    expect(starts).toHaveLength(2);
    expect(starts[1]?.payload.input_event_ids).toEqual([queued.id]);
    expect(all.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload)).join(' ')).toContain('queued reply');
    expect(new Set(all.map((e) => e.seq)).size).toBe(all.length);
  }, 240_000);
});

describe('a crash inside an approval\'s resolution', () => {
  it('after the approval was marked approved, before its wait was answered: the refused retry finishes it, and the call runs once', async () => {
    const { api, p } = t;
    await p.root.post('/v1/action-policies', { effect: 'require_approval', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'echo crash-approved' } });
    const s = await api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'a', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
        system: SCRIPT([
          { when: { user_contains: 'run' }, then: [{ tool: 'bash', input: { command: 'echo crash-approved >> /workspace/ran.log; cat /workspace/ran.log' } }] },
          { when: { on: 'tool_result' }, then: [{ reply: 'Result: {{tool_result}}' }] },
        ]),
      },
      environment_id: t.envId,
    });
    await api.post(`/v1/sessions/${s.id}/events`, t.msg('run it'));
    const first = await untilEvents(api, s.id, (e) => idleCount(e) >= 1);
    expect(first.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'requires_action' });
    const approvalId = String(first.find((e) => e.type === 'session.action_approval_requested')?.payload.approval_id);
    expect(approvalId).toMatch(/^approval_/);

    const apiBefore = p.pids().api;
    const lost = await p.root.request('POST', `/v1/action-approvals/${approvalId}/approve`, { body: {} }).catch(() => null);
    expect(lost === null || lost.status >= 500).toBe(true);
    await waitFor('the API back', async () => (await api.request('GET', `/v1/sessions/${s.id}`).catch(() => null))?.status === 200 || undefined, 60_000);
    expect(existsSync(marker('approval-resolved'))).toBe(true);
    expect(p.pids().api).not.toBe(apiBefore);

    // Resolved once: the retry is refused, and finishes what the lost request left undone.
    const retry = await p.root.request('POST', `/v1/action-approvals/${approvalId}/approve`, { body: {} });
    expect(retry.status).toBe(409);
    const all = await untilEvents(api, s.id, (e) => idleCount(e) >= 2, 90_000);
    expect(all.filter((e) => e.type === 'session.status_idle').map((e) => (e.payload.stop_reason as { type: string }).type)).toEqual(['requires_action', 'end_turn']);
    expect(all.filter((e) => e.type === 'session.action_approval_resolved')).toHaveLength(1);
    const ran = all.filter((e) => e.type === 'agent.tool_result').map((e) => JSON.stringify(e.payload.content));
    expect(ran).toHaveLength(1);
    expect(ran[0]?.match(/crash-approved/g)).toHaveLength(1);
    expect(new Set(all.map((e) => e.seq)).size).toBe(all.length);
  }, 240_000);
});

describe('a child thread\'s archive and the work it has taken', () => {
  // A platform of its own: the supervisor gives up on a process that dies five times a minute.
  let u: CrashTurnPlatform;
  beforeAll(async () => {
    u = await crash.startTurn(['answer-recorded', 'message-queued'], { name: 'drive-crash-archive' });
    // Each point is armed by the test that crashes there (its marker removed then): every
    // message queued behind a turn, and every answer, passes one.
    for (const point of ['answer-recorded', 'message-queued']) writeFileSync(u.marker(point), '');
  }, 180_000);
  /** A coordinator Session whose one child (of `member`, given `task`) is started by the first message. */
  async function withChild(member: { name: string; system: string; tools?: unknown[] }, task: string): Promise<{ session: string; primary: string; child: () => Promise<string> }> {
    const m = await u.api.post<{ id: string; version: number }>('/v1/agents', { name: member.name, model: 'default', system: member.system, ...(member.tools ? { tools: member.tools } : {}) });
    const lead = await u.api.post<{ id: string }>('/v1/agents', {
      name: 'lead', model: 'default', multiagent: { roster: [{ agent_id: m.id, version: m.version }] },
      system: SCRIPT([
        { when: { on: 'user' }, then: [{ tool: 'start_thread', input: { agent: member.name, task } }, { tool: 'wait_threads', input: {} }] },
        { when: { after_tool: 'wait_threads' }, then: [{ reply: 'combined: {{tool_result}}' }] },
      ]),
    });
    const s = await u.api.post<{ id: string }>('/v1/sessions', { agent: lead.id, environment_id: u.envId });
    const threads = async () => (await u.api.get<{ data: { id: string; parent_thread_id: string | null }[] }>(`/v1/sessions/${s.id}/threads`)).data;
    const primary = (await threads())[0]?.id ?? '';
    await u.api.post(`/v1/sessions/${s.id}/events`, u.msg('go'));
    const child = () => waitFor('the child thread', async () => (await threads()).find((x) => x.parent_thread_id !== null)?.id, 60_000);
    return { session: s.id, primary, child };
  }
  const threadEvents = async (session: string, thread: string) =>
    (await u.api.get<{ data: TurnEvent[] }>(`/v1/sessions/${session}/threads/${thread}/events`, { limit: 1000 })).data.filter((e) => e.session_thread_id === thread);
  const stops = (evs: TurnEvent[]) => evs.filter((e) => e.type === 'session.status_idle').map((e) => (e.payload.stop_reason as { type: string }).type);
  const turnsEnded = (session: string, thread: string, n: number) => waitFor(`${n} turns of ${thread}`, async () => {
    const evs = await threadEvents(session, thread).catch(() => []);
    return stops(evs).length >= n ? evs : undefined;
  }, 90_000);
  const archive = (session: string, thread: string) => u.api.request<{ status: string; error?: { type: string; message: string } }>('POST', `/v1/sessions/${session}/threads/${thread}/archive`);
  /** Kills the API at `point` (re-armed) with `body`, and waits for the one that replaces it. */
  async function crashDriving(point: string, session: string, body: Json): Promise<void> {
    rmSync(u.marker(point), { force: true });
    const apiBefore = u.p.pids().api;
    const lost = await u.api.request('POST', `/v1/sessions/${session}/events`, { body }).catch(() => null);
    expect(lost === null || lost.status >= 500).toBe(true);
    await waitFor('the API back', async () => (await u.api.request('GET', `/v1/sessions/${session}`).catch(() => null))?.status === 200 || undefined, 60_000);
    expect(existsSync(u.marker(point))).toBe(true);
    expect(u.p.pids().api).not.toBe(apiBefore);
  }

  it('a child whose answer was recorded, its turn not continued yet (the API died): refused until that turn is over', async () => {
    const c = await withChild({
      name: 'asker',
      tools: [{ type: 'custom', name: 'lookup', description: 'Ask the client', input_schema: { type: 'object', properties: { q: { type: 'string' } } } }],
      system: SCRIPT([{ when: { on: 'user' }, then: [{ tool: 'lookup', input: { q: 'x' } }] }, { when: { after_tool: 'lookup' }, then: [{ reply: 'asker got {{tool_result}}' }] }]),
    }, 'ask');
    const child = await c.child();
    const waiting = await turnsEnded(c.session, child, 1);
    expect(stops(waiting)).toEqual(['requires_action']);
    const use = waiting.find((e) => e.type === 'agent.tool_use');
    const answer = { type: 'user.custom_tool_result', payload: { tool_use_id: String(use?.payload.id), result: 'forty-two', session_thread_id: child, authored_by: u.principal, caused_by: { kind: 'api' } } };
    await crashDriving('answer-recorded', c.session, answer);

    // Idle, every wait answered, its continuation not started: the turn is not over.
    const refused = await archive(c.session, child);
    expect([refused.status, refused.body.error?.type]).toEqual([409, 'runtime.invalid_transition']);
    expect(refused.body.error?.message).toContain('continues with the answers');
    // The retry continues the turn; the answer reaches the coordinator; then the child archives.
    expect((await u.api.request('POST', `/v1/sessions/${c.session}/events`, { body: answer })).status).toBe(200);
    const lead = await turnsEnded(c.session, c.primary, 2);
    expect(lead.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload)).join(' ')).toContain('asker got forty-two');
    await turnsEnded(c.session, child, 2);
    expect((await archive(c.session, child)).body.status).toBe('terminated');
  }, 240_000);

  it('an idle child with a message queued (the API died before its turn started): refused, and the message runs', async () => {
    const c = await withChild({ name: 'echo', system: SCRIPT([{ when: { on: 'user' }, then: [{ reply: 'echo {{user}}' }] }]) }, 'first task');
    const child = await c.child();
    await turnsEnded(c.session, c.primary, 2);
    expect(stops(await threadEvents(c.session, child))).toEqual(['end_turn']);
    // An API that has not read the thread since it started queues the message and starts its
    // turn in two steps: it dies between them.
    const before = u.p.pids().api;
    process.kill(before as number, 'SIGKILL');
    await waitFor('the API back', async () => (u.p.pids().api !== before && (await u.api.request('GET', `/v1/sessions/${c.session}`).catch(() => null))?.status === 200) || undefined, 60_000);
    const message = (text: string) => ({ type: 'user.message', payload: { content: text, session_thread_id: child, authored_by: u.principal, caused_by: { kind: 'api' } } });
    await crashDriving('message-queued', c.session, message('queued one'));

    const refused = await archive(c.session, child);
    expect([refused.status, refused.body.error?.type]).toEqual([409, 'runtime.invalid_transition']);
    expect(refused.body.error?.message).toContain('message(s) queued');
    // The next message starts the turn with both; then the child archives.
    expect((await u.api.request('POST', `/v1/sessions/${c.session}/events`, { body: message('and another') })).status).toBe(201);
    const evs = await turnsEnded(c.session, child, 2);
    expect(evs.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload)).join(' ')).toContain('queued one');
    expect((await archive(c.session, child)).body.status).toBe('terminated');
  }, 240_000);
});
