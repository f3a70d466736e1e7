import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createServer } from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Webhook } from 'standardwebhooks';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents } from './harness/turns.js';
import { errType } from './harness/governance.js';

/**
 * Automations end to end: a real platform (scheduler, local runner, Docker sandboxes, the
 * scripted model), BullMQ Job Schedulers with a short interval, manual fires, signed webhook
 * deliveries, firing receipts and their content-free traces, feedback labels.
 */
let p: Platform;
let api: HttpClient;
let envId: string;
let agentId: string;
let service: string;
const MARKER = 'PROMPT-MARKER-7f3a';
const REPLY = 'REPLY-MARKER-91bd';

interface Firing {
  id: string; status: string; outcome: string | null; session_id: string | null; run_id: string | null; attempt_count: number; error: string | null;
  source: { kind: string; delivery_id?: string; scheduled_at?: string; event_id?: string }; admission: { disposition: string; check_configured: boolean };
}
interface Automation {
  id: string; version: number; status: string; signing_secret?: string; next_fire_at: string | null; metrics: Record<string, number>; webhook: { ingest_path: string } | null;
  agent: { id: string; version: number | null }; created_at: string; updated_at: string;
}

async function newServicePrincipal(name: string, grant = true): Promise<string> {
  const ws = p.bootstrap.workspace_id;
  const id = (await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
    external_subject_id: `${name}-${Math.random()}`, principal_type: 'service', display_name: name,
  })).id;
  if (grant) await p.root.post('/v1/permission-assignments', { principal_id: id, target: { type: 'agent', id: agentId }, actions: ['invoke'] });
  return id;
}

async function createAutomation(body: Record<string, unknown>): Promise<Automation> {
  return api.post<Automation>('/v1/automations', {
    name: 'nightly', principal_id: service, agent: agentId, environment_id: envId, prompt: `${MARKER} handle {{event}}`, ...body,
  });
}

async function settled(id: string, timeoutMs = 90_000): Promise<Firing> {
  return waitFor(`firing ${id} to finish`, async () => {
    const f = await api.get<Firing>(`/v1/automation-firings/${id}`);
    return ['completed', 'refused', 'failed', 'skipped'].includes(f.status) ? f : undefined;
  }, timeoutMs);
}

function signed(secret: string, body: string, opts: { id?: string; at?: Date } = {}): Record<string, string> {
  const id = opts.id ?? `msg_${Math.random().toString(36).slice(2)}`;
  const at = opts.at ?? new Date();
  return {
    'content-type': 'application/json', 'webhook-id': id, 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)),
    'webhook-signature': new Webhook(secret).sign(id, at, body),
  };
}

async function deliver(path: string, body: string, headers: Record<string, string>): Promise<{ status: number; body: Record<string, unknown>; headers: Record<string, string> }> {
  const res = await fetch(`${p.baseUrl}${path}`, { method: 'POST', headers, body });
  const text = await res.text();
  return { status: res.status, body: text ? (JSON.parse(text) as Record<string, unknown>) : {}, headers: Object.fromEntries(res.headers) };
}

beforeAll(async () => {
  ({ p, api, envId } = await startTurnPlatform({ name: 'automations', env: { AUTOMATION_SWEEP_MS: '500', AGENTPLANE_MODE: 'development', WEBHOOK_MAX_ATTEMPTS: '1' } }));
  agentId = (await api.post<{ id: string }>('/v1/agents', {
    name: 'automated', model: 'default',
    system: SCRIPT([{ when: { user_contains: MARKER }, then: [{ reply: `${REPLY} done` }] }]),
  })).id;
  service = await newServicePrincipal('robot');
}, 180_000);
afterAll(async () => {
  await p?.stop();
});

describe('manual fire, receipt, Session and trace', () => {
  it('a manual fire writes a pending receipt, starts a Session with automation_id and completes when the turn ends', async () => {
    const a = await createAutomation({ trigger: { type: 'schedule', cron: '0 3 * * *', timezone: 'Europe/Paris' } });
    expect(a.next_fire_at).toMatch(/^\d{4}-/);
    const r = await api.request<Firing & { workspace_id: string }>('POST', `/v1/automations/${a.id}/fire`, { body: { event: { ticket: 42 } } });
    expect(r.status).toBe(202);
    expect(r.body).toMatchObject({ status: 'pending', attempt_count: 0, source: { kind: 'manual' }, outcome: null, session_id: null, run_id: null, error: null });
    // No budget: the firing has no spend check of its own.
    expect(r.body.admission).toEqual({ disposition: 'pending', check_configured: false });
    expect(r.body.id).toMatch(/^afire_[0-9a-f]{32}$/);

    const f = await settled(r.body.id);
    expect(f).toMatchObject({ status: 'completed', outcome: 'succeeded', attempt_count: 1, admission: { disposition: 'admitted', check_configured: false } });
    expect(f.session_id).toMatch(/^sess_/);
    expect(f.run_id).toMatch(/^run_/);
    const session = await api.get<{ automation_id: string; metadata: Record<string, string> }>(`/v1/sessions/${f.session_id}`);
    expect(session.automation_id).toBe(a.id);
    const listed = await api.get<{ data: { id: string }[] }>('/v1/sessions', { automation_id: a.id });
    expect(listed.data.map((s) => s.id)).toEqual([f.session_id]);

    const trace = await api.get<Record<string, Record<string, unknown>>>(`/v1/automation-firings/${f.id}/trace`);
    expect(Object.keys(trace).sort()).toEqual(['admission', 'authority', 'children', 'completeness', 'delivery', 'execution', 'feedback', 'filtering', 'firing', 'outcome', 'outcome_attempts', 'steps'].sort());
    expect(trace.authority).toBe('firing_receipt_and_session_event_log');
    expect(trace.firing).toEqual({
      id: f.id, workspace_id: p.bootstrap.workspace_id, automation_id: a.id, source: { kind: 'manual' }, attempt_count: 1,
      created_at: expect.any(String), updated_at: expect.any(String), status: 'completed', outcome: 'succeeded', session_id: f.session_id, run_id: f.run_id, error: null,
    });
    expect(trace.execution).toMatchObject({ applicable: true, session_id: f.session_id, stop_reason: 'end_turn' });
    expect(trace.steps).toMatchObject({ applicable: true, agent_message_count: 1, user_message_count: 1 });
    expect(trace.admission).toMatchObject({ disposition: 'admitted', check_usage: expect.objectContaining({ total_tokens: expect.any(Number) }) });
    expect(trace.feedback).toEqual({ total: 0, by_disposition: { useful: 0, noisy: 0, incorrect: 0, too_late: 0, already_handled: 0 } });
    expect(trace.completeness).toMatchObject({ status: 'complete' });
    expect(Number(trace.completeness?.through_sequence)).toBeGreaterThanOrEqual(3);
    // Content-free: neither the prompt, the event nor the model's reply is in it.
    const text = JSON.stringify(trace);
    expect(text).not.toContain(MARKER);
    expect(text).not.toContain(REPLY);
    expect(text).not.toContain('ticket');

    expect(trace.outcome).toMatchObject({ outcome_id: null, result: null, evaluation_count: 0 });

    // An outcome worked in the firing's Session shows in the trace as the platform grader recorded it.
    const rubric = `- The answer is there\n\n\`\`\`scripted\n${JSON.stringify({ rules: [{ then: [{ verdict: 'satisfied' }] }] })}\n\`\`\`\n`;
    const defined = await api.request('POST', `/v1/sessions/${f.session_id}/events`, {
      body: { type: 'user.define_outcome', payload: { description: `${MARKER} once more`, rubric, authored_by: service, caused_by: { kind: 'api' } } },
    });
    expect(defined.status).toBe(201);
    await untilEvents(api, String(f.session_id), (e) => e.some((x) => x.type === 'session.outcome_ended'), 90_000);
    const graded = await api.get<{ outcome: Record<string, unknown> }>(`/v1/automation-firings/${f.id}/trace`);
    expect(graded.outcome).toMatchObject({ outcome_id: expect.stringMatching(/^outc_/), result: 'satisfied', evaluation_count: 1, revision_count: 0 });
    expect(JSON.stringify(graded)).not.toContain(MARKER);

    // Erasing the Session shows in the trace's completeness.
    await api.request('DELETE', `/v1/sessions/${f.session_id}`);
    const erased = await api.get<{ completeness: { status: string } }>(`/v1/automation-firings/${f.id}/trace`);
    expect(erased.completeness.status).toBe('erased');

    const firings = await api.get<{ data: Firing[] }>(`/v1/automations/${a.id}/firings`, { source: 'manual', status: 'completed' });
    expect(firings.data.map((x) => x.id)).toEqual([f.id]);
    // Firings of an Automation that is not in this Workspace: 404, as for every sub-collection.
    const nowhere = await api.request('GET', '/v1/automations/auto_00000000000000000000000000000001/firings');
    expect([nowhere.status, errType(nowhere)]).toEqual([404, 'validation.not_found']);
    expect((await api.get<Automation>(`/v1/automations/${a.id}`)).metrics).toMatchObject({ fires: 1, succeeded: 1, admission_refusals: 0 });
  });

  it('a turn waiting on requires_action keeps the firing running with an open trace; answering it completes the firing', async () => {
    const waiting = (await api.post<{ id: string }>('/v1/agents', {
      name: 'asks', model: 'default',
      system: SCRIPT([
        { when: { user_contains: MARKER }, then: [{ tool: 'lookup', input: { q: 'x' } }] },
        { when: { after_tool: 'lookup' }, then: [{ reply: `${REPLY} looked up {{tool_result}}` }] },
      ]),
      tools: [{ type: 'custom', name: 'lookup', description: 'Look something up', input_schema: { type: 'object', properties: { q: { type: 'string' } } } }],
    })).id;
    await p.root.post('/v1/permission-assignments', { principal_id: service, target: { type: 'agent', id: waiting }, actions: ['invoke'] });
    const a = await createAutomation({ agent: waiting, trigger: { type: 'webhook' } });
    const fired = await api.post<Firing>(`/v1/automations/${a.id}/fire`, {});
    const running = await waitFor('the firing running', async () => {
      const f = await api.get<Firing>(`/v1/automation-firings/${fired.id}`);
      return f.status === 'running' ? f : undefined;
    }, 60_000);
    const first = await untilEvents(api, String(running.session_id), (e) => idleCount(e) >= 1);
    expect(first.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'requires_action' });
    const toolUseId = String(first.find((e) => e.type === 'agent.tool_use')?.payload.id);
    const open = await api.get<{ firing: { status: string }; completeness: { status: string; through_sequence: number }; execution: Record<string, unknown> }>(`/v1/automation-firings/${fired.id}/trace`);
    expect(open.firing.status).toBe('running');
    expect(open.completeness.status).toBe('open');
    expect(open.execution).toMatchObject({ applicable: true, ended_at: null, stop_reason: null });
    const early = await api.request('GET', `/v1/automation-firings/${fired.id}/feedback`);
    expect([early.status, errType(early)]).toEqual([409, 'runtime.invalid_transition']);

    await api.post(`/v1/sessions/${running.session_id}/events`, {
      type: 'user.custom_tool_result', payload: { tool_use_id: toolUseId, result: 'found', authored_by: service, caused_by: { kind: 'api' } },
    });
    const done = await settled(fired.id);
    expect(done).toMatchObject({ status: 'completed', outcome: 'succeeded' });
    const closed = await api.get<{ completeness: { status: string }; execution: { stop_reason: string }; steps: { turn_end_count: number; tool_use_count: number } }>(`/v1/automation-firings/${fired.id}/trace`);
    expect(closed).toMatchObject({ completeness: { status: 'complete' }, execution: { stop_reason: 'end_turn' }, steps: { turn_end_count: 2, tool_use_count: 1 } });
  });

  it('admission refuses without the service Principal\'s invoke grant, past the concurrency limit, and while paused', async () => {
    const ungranted = await newServicePrincipal('ungranted', false);
    const a = await createAutomation({ principal_id: ungranted, trigger: { type: 'webhook' } });
    const refused = await settled((await api.post<Firing>(`/v1/automations/${a.id}/fire`, {})).id);
    expect(refused).toMatchObject({ status: 'refused', error: 'policy.denied', admission: { disposition: 'refused_governance' }, session_id: null });
    const trace = await api.get<{ completeness: { status: string }; execution: { applicable: boolean } }>(`/v1/automation-firings/${refused.id}/trace`);
    expect(trace).toMatchObject({ completeness: { status: 'complete', through_sequence: 0 }, execution: { applicable: false } });

    // Granted, but an ActionPolicy denies this Principal's drive: refused like a REST drive would be.
    const blocked = await newServicePrincipal('policy-blocked');
    const rule = await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'deny', tool: { kind: 'drive', name: 'user.message' }, principal_id: blocked });
    const c = await createAutomation({ principal_id: blocked, trigger: { type: 'webhook' } });
    const denied = await settled((await api.post<Firing>(`/v1/automations/${c.id}/fire`, {})).id);
    expect(denied).toMatchObject({ status: 'refused', error: 'policy.denied', admission: { disposition: 'refused_governance' }, session_id: null });
    await p.root.request('DELETE', `/v1/action-policies/${rule.id}`);

    const b = await createAutomation({ max_concurrent_firings: 1, trigger: { type: 'webhook' } });
    const [one, two] = await Promise.all([api.post<Firing>(`/v1/automations/${b.id}/fire`, {}), api.post<Firing>(`/v1/automations/${b.id}/fire`, {})]);
    const results = await Promise.all([settled(one.id), settled(two.id)]);
    expect(results.map((x) => x.status).sort()).toEqual(['completed', 'refused']);
    expect(results.find((x) => x.status === 'refused')).toMatchObject({ error: 'concurrency_limit', admission: { disposition: 'refused_concurrency' } });

    const paused = await api.post<Automation>(`/v1/automations/${b.id}/pause`, { expected_version: b.version });
    expect(paused.status).toBe('paused');
    const r = await api.request('POST', `/v1/automations/${b.id}/fire`, { body: {} });
    expect([r.status, errType(r)]).toEqual([409, 'runtime.invalid_transition']);
    const stale = await api.request('POST', `/v1/automations/${b.id}/resume`, { body: { expected_version: b.version } });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);

    // A budget is a spend check of the firing's own: check_configured says so.
    const budgeted = await createAutomation({ budget: { max_list_cost: { amount: 5 } }, trigger: { type: 'webhook' } });
    const receipt = await api.post<Firing>(`/v1/automations/${budgeted.id}/fire`, {});
    expect(receipt.admission).toEqual({ disposition: 'pending', check_configured: true });
    expect((await settled(receipt.id)).admission).toEqual({ disposition: 'admitted', check_configured: true });
  });

  it('a disabled Workspace fires nothing: its ticks are refused, its deliveries 403, until it is enabled again', async () => {
    const ws = await p.root.post<{ id: string; version: number }>(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'to-disable' });
    const inWs = p.root.with({ workspaceId: ws.id });
    const bot = (await inWs.post<{ id: string }>(`/v1/organizations/workspaces/${ws.id}/principals`, { external_subject_id: 'tenancy-bot', principal_type: 'service', display_name: 'bot' })).id;
    await inWs.post('/v1/permission-assignments', { principal_id: bot, target: { type: 'workspace', id: ws.id }, actions: ['invoke'] });
    const env = (await inWs.post<{ id: string }>('/v1/environments', { name: 'e', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 60 } })).id;
    const agent = (await inWs.post<{ id: string }>('/v1/agents', { name: 'a', model: 'default' })).id;
    const base = { principal_id: bot, agent, environment_id: env, prompt: `${MARKER} {{event}}`, max_concurrent_firings: 100 };
    const tick = await inWs.post<Automation>('/v1/automations', { ...base, name: 'tick', trigger: { type: 'schedule', interval_seconds: 1 } });
    const hook = await inWs.post<Automation>('/v1/automations', { ...base, name: 'hook', trigger: { type: 'webhook' } });
    // Disabled before the first tick is due (one interval after the create).
    const off = await p.root.request<{ version: number }>('PATCH', `/v1/organizations/workspaces/${ws.id}`, { body: { expected_version: ws.version, status: 'disabled' } });
    expect(off.status).toBe(200);
    const body = '{"alert":"while disabled"}';
    const refused = await deliver(String(hook.webhook?.ingest_path), body, signed(String(hook.signing_secret), body));
    expect([refused.status, (refused.body.error as { type: string } | undefined)?.type]).toEqual([403, 'auth.disabled_tenancy']);
    await new Promise((r) => setTimeout(r, 2500));
    const enabling = Date.now();
    const on = await p.root.request('PATCH', `/v1/organizations/workspaces/${ws.id}`, { body: { expected_version: off.body.version, status: 'active' } });
    expect(on.status).toBe(200);
    await inWs.post(`/v1/automations/${tick.id}/pause`, { expected_version: tick.version });
    // The ticks due while it was disabled have receipts, each refused, none with a Session (a tick
    // just before the enable may be admitted after it: only those well before it are looked at).
    const firings = (await inWs.get<{ data: (Firing & { created_at: string })[] }>(`/v1/automations/${tick.id}/firings`, { limit: 100 })).data
      .filter((f) => Date.parse(f.created_at) < enabling - 500);
    expect(firings.length).toBeGreaterThan(0);
    const done = await Promise.all(firings.map(async (f) => {
      const s = await waitFor(`firing ${f.id} admitted or refused`, async () => {
        const cur = await inWs.get<Firing>(`/v1/automation-firings/${f.id}`);
        return cur.status === 'pending' ? undefined : cur;
      }, 30_000);
      return [s.status, s.error, s.admission.disposition, s.session_id];
    }));
    expect(done).toContainEqual(['refused', 'auth.disabled_tenancy', 'refused_governance', null]);
    expect(done.filter((d) => d[0] !== 'refused')).toEqual([]);
    // The refused delivery left no receipt; enabled again, the same delivery fires.
    expect((await inWs.get<{ data: unknown[] }>(`/v1/automations/${hook.id}/firings`)).data).toEqual([]);
    const accepted = await deliver(String(hook.webhook?.ingest_path), body, signed(String(hook.signing_secret), body));
    expect(accepted.status).toBe(202);
  });

  it('refuses an Automation that could never fire: an archived Agent at its current version, an archived Environment', async () => {
    const gone = (await api.post<{ id: string; version: number }>('/v1/agents', { name: 'retired', model: 'default' }));
    expect((await api.request('POST', `/v1/agents/${gone.id}/archive`, { body: {} })).status).toBe(200);
    const oldEnv = (await api.post<{ id: string }>('/v1/environments', { name: 'retired-env', image: 'agentplane/sandbox:latest' })).id;
    expect((await api.request('POST', `/v1/environments/${oldEnv}/archive`, { body: {} })).status).toBe(200);
    const base = { name: 'never', principal_id: service, environment_id: envId, prompt: 'p', trigger: { type: 'webhook' } };
    for (const body of [{ ...base, agent: gone.id }, { ...base, agent: { id: gone.id, version: null } }, { ...base, agent: agentId, environment_id: oldEnv }]) {
      const r = await api.request('POST', '/v1/automations', { body });
      expect([r.status, errType(r)], JSON.stringify(r.body)).toEqual([409, 'runtime.invalid_transition']);
    }
    // Pinned to a version, an archived Agent's Sessions still start.
    const pinned = await api.request('POST', '/v1/automations', { body: { ...base, agent: { id: gone.id, version: gone.version } } });
    expect(pinned.status).toBe(201);
  });

  it('refuses a prompt whose {{event}} expansion passes 64 KiB with 400 and writes no receipt', async () => {
    const a = await createAutomation({ trigger: { type: 'webhook' } });
    const r = await api.request('POST', `/v1/automations/${a.id}/fire`, { body: { event: 'x'.repeat(70_000) } });
    expect([r.status, errType(r)]).toEqual([400, 'validation.malformed']);
    expect((await api.get<{ data: unknown[] }>(`/v1/automations/${a.id}/firings`)).data).toEqual([]);
    const big = await api.request('POST', '/v1/automations', { body: { name: 'x', principal_id: service, agent: agentId, environment_id: envId, prompt: 'é'.repeat(40_000), trigger: { type: 'webhook' } } });
    expect([big.status, errType(big)]).toEqual([400, 'validation.malformed']);
    const cron = await api.request('POST', '/v1/automations', { body: { name: 'x', principal_id: service, agent: agentId, environment_id: envId, prompt: 'p', trigger: { type: 'schedule', cron: 'every day ok', timezone: 'UTC' } } });
    expect([cron.status, errType(cron)]).toEqual([400, 'validation.malformed']);
    const tz = await api.request('POST', '/v1/automations', { body: { name: 'x', principal_id: service, agent: agentId, environment_id: envId, prompt: 'p', trigger: { type: 'schedule', cron: '* * * * *', timezone: 'Mars/Olympus' } } });
    expect([tz.status, errType(tz)]).toEqual([400, 'validation.malformed']);
  });
});

describe('automation bodies', () => {
  it('takes back the agent reference it answers, and explains a bad schedule', async () => {
    const a = await createAutomation({ trigger: { type: 'webhook' } });
    expect(a.agent).toEqual({ id: agentId, version: null });
    const same = await createAutomation({ trigger: { type: 'webhook' }, agent: a.agent });
    expect(same.agent).toEqual({ id: agentId, version: null });
    const zero = await api.request('POST', '/v1/automations', { body: {
      name: 'zero', principal_id: service, agent: agentId, environment_id: envId, prompt: 'x', trigger: { type: 'schedule', interval_seconds: 0 },
    } });
    expect([zero.status, errType(zero)]).toEqual([400, 'validation.malformed']);
    expect((zero.body as { error: { message: string } }).error.message).toMatch(/interval_seconds: must be >= 1/);
    // An update that sets nothing but its version is refused, naming what it may set.
    const nothing = await api.request<{ error: { message: string } }>('POST', `/v1/automations/${a.id}`, { body: { expected_version: a.version } });
    expect([nothing.status, errType(nothing)]).toEqual([400, 'validation.malformed']);
    expect(nothing.body.error.message).toContain('prompt');
  });
});

describe('schedules (BullMQ Job Schedulers)', () => {
  it('fires every second while active; pausing removes the scheduler, resuming restores it, deleting removes it', async () => {
    const a = await createAutomation({ max_concurrent_firings: 5, trigger: { type: 'schedule', interval_seconds: 1 } });
    // Every second from now: the first tick is one interval after the create, not at once.
    expect(Date.parse(String(a.next_fire_at))).toBeGreaterThanOrEqual(Date.parse(a.created_at) + 1000);
    const list = () => api.get<{ data: Firing[] }>(`/v1/automations/${a.id}/firings`, { source: 'schedule', limit: 100 });
    await waitFor('two scheduled firings', async () => ((await list()).data.length >= 2 ? true : undefined), 30_000);
    // Each firing carries the time its tick was due: the first is the next_fire_at the create
    // answered, the next ones a whole number of intervals later.
    // Oldest first by default (the spec's default order); `order=desc` lists them newest first.
    const listed = (await list()).data;
    const ticks = listed.map((f) => Date.parse(String(f.source.scheduled_at)));
    const newest = await api.get<{ data: Firing[] }>(`/v1/automations/${a.id}/firings`, { source: 'schedule', limit: 100, order: 'desc' });
    expect(newest.data.slice(-listed.length).map((f) => f.id)).toEqual(listed.map((f) => f.id).reverse());
    expect(ticks[0]).toBeGreaterThanOrEqual(Date.parse(a.created_at) + 1000);
    expect(new Date(ticks[0]!).toISOString()).toBe(a.next_fire_at);
    for (const t of ticks.slice(1)) expect((t - ticks[0]!) % 1000).toBe(0);
    expect(new Set(ticks).size).toBe(ticks.length);
    const paused = await api.post<Automation>(`/v1/automations/${a.id}/pause`, { expected_version: a.version });
    expect(paused).toMatchObject({ status: 'paused', next_fire_at: null });
    const resumed = await api.post<Automation>(`/v1/automations/${a.id}/resume`, { expected_version: paused.version });
    expect(Date.parse(String(resumed.next_fire_at))).toBeGreaterThanOrEqual(Date.parse(resumed.updated_at) + 1000);
    const before = (await list()).data.length;
    await waitFor('a firing after resuming', async () => ((await list()).data.length > before ? true : undefined), 30_000);
    const scheduled = (await list()).data;
    for (const f of scheduled) expect(f.source).toMatchObject({ kind: 'schedule', scheduled_at: expect.any(String) });
    const done = await settled(scheduled[scheduled.length - 1]!.id);
    expect(done.status).toBe('completed');

    const gone = await api.request('DELETE', `/v1/automations/${a.id}`, { query: { expected_version: resumed.version } });
    expect(gone.body).toEqual({ id: a.id, type: 'automation_deleted' });
    expect((await api.request('GET', `/v1/automations/${a.id}`)).status).toBe(404);
    // Its firings stay readable, and listed.
    const after = await api.request<{ data: Firing[] }>('GET', `/v1/automations/${a.id}/firings`, { query: { source: 'schedule', limit: 100 } });
    expect(after.status).toBe(200);
    expect(after.body.data.map((f) => f.id)).toEqual(expect.arrayContaining(scheduled.map((f) => f.id)));
  });
});

describe('signed webhook deliveries', () => {
  it('accepts a valid delivery once; refuses bad signatures, replays, stale timestamps, oversize and deep bodies', async () => {
    const a = await createAutomation({ max_concurrent_firings: 10, trigger: { type: 'webhook' } });
    const secret = String(a.signing_secret);
    expect(secret).toMatch(/^whsec_/);
    expect((await api.get<Automation>(`/v1/automations/${a.id}`)).signing_secret).toBeUndefined();
    const path = String(a.webhook?.ingest_path);
    expect(path).toBe(`/v1/ingest/automations/${a.id}`);

    const body = JSON.stringify({ alert: 'disk full' });
    const headers = signed(secret, body);
    const ok = await deliver(path, body, headers);
    expect(ok.status).toBe(202);
    expect(ok.body).toMatchObject({ status: 'pending', source: { kind: 'webhook', delivery_id: headers['webhook-id'] } });

    const replay = await deliver(path, body, headers);
    expect(replay.status).toBe(200);
    expect(replay.body).toMatchObject({ id: ok.body.id, duplicate: true });

    // The signature covers the bytes as sent: a body that starts with a byte order mark verifies.
    const bom = '\uFEFF{"alert":"with a byte order mark"}';
    const withBom = await deliver(path, bom, signed(secret, bom));
    expect([withBom.status, withBom.body.status]).toEqual([202, 'pending']);

    const bad = await deliver(path, body, { ...signed(secret, body), 'webhook-signature': 'v1,' + Buffer.alloc(32).toString('base64') });
    expect([bad.status, (bad.body.error as { type: string }).type]).toEqual([401, 'auth.invalid_key']);
    const tampered = await deliver(path, JSON.stringify({ alert: 'disk fine' }), signed(secret, body));
    expect(tampered.status).toBe(401);
    const unsigned = await deliver(path, body, { 'content-type': 'application/json' });
    expect(unsigned.status).toBe(401);
    const stale = await deliver(path, body, signed(secret, body, { at: new Date(Date.now() - 6 * 60_000) }));
    expect([stale.status, (stale.body.error as { type: string }).type]).toEqual([401, 'auth.invalid_key']);

    const huge = 'x'.repeat(1024 * 1024 + 1);
    const tooBig = await deliver(path, huge, signed(secret, huge));
    expect([tooBig.status, (tooBig.body.error as { type: string }).type]).toEqual([413, 'validation.payload_too_large']);
    const deep = '['.repeat(65) + ']'.repeat(65);
    const tooDeep = await deliver(path, deep, signed(secret, deep));
    expect([tooDeep.status, (tooDeep.body.error as { type: string }).type]).toEqual([400, 'validation.malformed']);
    const fine = '['.repeat(64) + ']'.repeat(64);
    expect((await deliver(path, fine, signed(secret, fine))).status).toBe(202);
    const many = JSON.stringify(new Array(100_000).fill(1));
    expect((await deliver(path, many, signed(secret, many))).status).toBe(400);
    // Signed, but not JSON: the caller's mistake (400), not a refused signature.
    const notJson = await deliver(path, 'notjson', signed(secret, 'notjson'));
    expect([notJson.status, (notJson.body.error as { type: string }).type]).toEqual([400, 'validation.malformed']);

    const f = await settled(String(ok.body.id));
    expect(f).toMatchObject({ status: 'completed', outcome: 'succeeded' });

    // The delivery is in the audit log, credential-free, once: its redelivery is not a second record.
    const audit = await p.root.post<{ data: { actor: { id: string }; outcome: string; request_id: string }[] }>('/v1/audit/export', { action: 'automations.ingestAutomationWebhook', target: a.id });
    expect(audit.data[0]).toMatchObject({ actor: { id: 'anonymous' }, outcome: 'succeeded' });
    expect(audit.data.filter((r) => r.request_id === ok.headers['request-id'])).toHaveLength(1);
    expect(audit.data.filter((r) => r.request_id === replay.headers['request-id'])).toEqual([]);
  });

  it('a keyed create or rotation that showed a secret is replayed only while that secret is current', async () => {
    const body = { name: 'keyed', principal_id: service, agent: agentId, environment_id: envId, prompt: `${MARKER} {{event}}`, trigger: { type: 'webhook' } };
    const key = `auto-secret-${Math.random()}`;
    const made = await api.request<Automation>('POST', '/v1/automations', { body, idempotencyKey: key });
    expect(made.status).toBe(201);
    const replay = await api.request<Automation>('POST', '/v1/automations', { body, idempotencyKey: key });
    expect([replay.status, replay.body.signing_secret]).toEqual([201, made.body.signing_secret]);
    const rotKey = `auto-rot-${Math.random()}`;
    const rot = await api.request<Automation>('POST', `/v1/automations/${made.body.id}/rotate-secret`, { body: { expected_version: made.body.version, overlap_seconds: 0 }, idempotencyKey: rotKey });
    expect(rot.status).toBe(200);
    // The create's secret is no longer current: its replay is 409 and shows no secret.
    const stale = await api.request('POST', '/v1/automations', { body, idempotencyKey: key });
    expect([stale.status, errType(stale)]).toEqual([409, 'idempotency.conflict']);
    expect(JSON.stringify(stale.body)).not.toContain(String(made.body.signing_secret));
    const rotReplay = await api.request<Automation>('POST', `/v1/automations/${made.body.id}/rotate-secret`, { body: { expected_version: made.body.version, overlap_seconds: 0 }, idempotencyKey: rotKey });
    expect([rotReplay.status, rotReplay.body.signing_secret]).toEqual([200, rot.body.signing_secret]);
    expect((await api.request('DELETE', `/v1/automations/${made.body.id}`)).status).toBeLessThan(300);
    const gone = await api.request('POST', `/v1/automations/${made.body.id}/rotate-secret`, { body: { expected_version: made.body.version, overlap_seconds: 0 }, idempotencyKey: rotKey });
    expect([gone.status, errType(gone)]).toEqual([409, 'idempotency.conflict']);
    expect(JSON.stringify(gone.body)).not.toContain(String(rot.body.signing_secret));
  });

  it('rotating the secret keeps the previous one valid during the overlap, and not after', async () => {
    const a = await createAutomation({ max_concurrent_firings: 10, trigger: { type: 'webhook' } });
    const path = `/v1/ingest/automations/${a.id}`;
    const old = String(a.signing_secret);
    const rotated = await api.post<Automation>(`/v1/automations/${a.id}/rotate-secret`, { expected_version: a.version, overlap_seconds: 3600 });
    const fresh = String(rotated.signing_secret);
    expect(fresh).not.toBe(old);
    const body = '{"n":1}';
    expect((await deliver(path, body, signed(old, body))).status).toBe(202);
    expect((await deliver(path, body, signed(fresh, body))).status).toBe(202);
    const again = await api.post<Automation>(`/v1/automations/${a.id}/rotate-secret`, { expected_version: rotated.version, overlap_seconds: 0 });
    expect((await deliver(path, body, signed(fresh, body))).status).toBe(401);
    expect((await deliver(path, body, signed(String(again.signing_secret), body))).status).toBe(202);
    const stale = await api.request('POST', `/v1/automations/${a.id}/rotate-secret`, { body: { expected_version: rotated.version } });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);
    // A paused Automation refuses signed deliveries.
    await api.post(`/v1/automations/${a.id}/pause`, { expected_version: again.version });
    const r = await deliver(path, body, signed(String(again.signing_secret), body));
    expect(r.status).toBe(409);
  });
});

describe('feedback labels', () => {
  it('labels a finished firing once per Principal, pages them, updates with CAS, and counts them in the trace', async () => {
    const a = await createAutomation({ trigger: { type: 'webhook' } });
    const f = await settled((await api.post<Firing>(`/v1/automations/${a.id}/fire`, {})).id);
    const people: string[] = [];
    for (let i = 0; i < 3; i++) people.push(await newServicePrincipal(`rater-${i}`, false));
    const labels: { id: string; version: number }[] = [];
    for (const [i, who] of people.entries()) {
      labels.push(await api.post(`/v1/automation-firings/${f.id}/feedback`, { authored_by: who, disposition: i === 0 ? 'useful' : 'noisy' }));
    }
    const dup = await api.request('POST', `/v1/automation-firings/${f.id}/feedback`, { body: { authored_by: people[0], disposition: 'noisy' } });
    expect([dup.status, errType(dup)]).toEqual([409, 'validation.conflict']);
    const text = await api.request('POST', `/v1/automation-firings/${f.id}/feedback`, { body: { authored_by: people[0], disposition: 'useful', comment: 'nice' } });
    expect([text.status, errType(text)]).toEqual([400, 'validation.malformed']);

    const first = await api.get<{ data: { id: string }[]; next_page: string | null }>(`/v1/automation-firings/${f.id}/feedback`, { limit: 2 });
    expect(first.data).toHaveLength(2);
    // Exactly the Firing feedback label's fields, as create answers them.
    const labelFields = ['id', 'workspace_id', 'automation_id', 'firing_id', 'authored_by', 'disposition', 'version', 'created_at', 'updated_at'].sort();
    for (const l of first.data) expect(Object.keys(l).sort()).toEqual(labelFields);
    expect(Object.keys(labels[0]!).sort()).toEqual(labelFields);
    expect(first.next_page).toMatch(/^c1_/);
    const second = await api.get<{ data: { id: string }[]; next_page: string | null }>(`/v1/automation-firings/${f.id}/feedback`, { limit: 2, page: String(first.next_page) });
    expect([...first.data, ...second.data].map((l) => l.id)).toEqual(labels.map((l) => l.id));
    expect(second.next_page).toBeNull();

    const label = labels[1]!;
    const updated = await api.post<{ disposition: string; version: number }>(`/v1/automation-firings/${f.id}/feedback/${label.id}`, { expected_version: label.version, disposition: 'already_handled' });
    expect(updated).toMatchObject({ disposition: 'already_handled', version: label.version + 1 });
    const stale = await api.request('POST', `/v1/automation-firings/${f.id}/feedback/${label.id}`, { body: { expected_version: label.version, disposition: 'too_late' } });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);

    const trace = await api.get<{ feedback: unknown }>(`/v1/automation-firings/${f.id}/trace`);
    expect(trace.feedback).toEqual({ total: 3, by_disposition: { useful: 1, noisy: 1, incorrect: 0, too_late: 0, already_handled: 1 } });
    const missing = await api.request('GET', `/v1/automation-firings/afire_${'0'.repeat(32)}/trace`);
    expect([missing.status, errType(missing)]).toEqual([404, 'validation.not_found']);
  });
});

describe('subscriptions', () => {
  it('session.turn_ended fires for matching Sessions of the Workspace, never for the Automation\'s own', async () => {
    const watched = (await api.post<{ id: string }>('/v1/agents', {
      name: 'watched', model: 'default', system: SCRIPT([{ when: { user_contains: MARKER }, then: [{ reply: `${REPLY} ok` }] }]),
    })).id;
    await p.root.post('/v1/permission-assignments', { principal_id: service, target: { type: 'agent', id: watched }, actions: ['invoke'] });
    const s = await createAutomation({
      agent: watched, prompt: `${MARKER} follow up on {{event.session_id}} ({{event.stop_reason}})`, max_concurrent_firings: 5,
      trigger: { type: 'subscription', event: 'session.turn_ended', filter: { stop_reasons: ['end_turn'], agent_ids: [watched] } },
    });
    const bad = await api.request('POST', '/v1/automations', { body: { name: 'x', principal_id: service, agent: agentId, environment_id: envId, prompt: 'p', trigger: { type: 'subscription', event: 'session.turn_ended', filter: { stop_reasons: ['requires_action'] } } } });
    expect([bad.status, errType(bad)]).toEqual([400, 'validation.malformed']);

    const drive = (content: string) => ({ type: 'user.message', payload: { content, authored_by: service, caused_by: { kind: 'api' } } });
    const firings = () => api.get<{ data: Firing[] }>(`/v1/automations/${s.id}/firings`, { order: 'asc' });
    // A Session of another Agent does not match the filter; the watched one does.
    await api.post('/v1/sessions', { agent: agentId, environment_id: envId, initial_events: [drive(`${MARKER} unwatched`)] });
    const one = (await api.post<{ id: string }>('/v1/sessions', { agent: watched, environment_id: envId, initial_events: [drive(`${MARKER} first`)] })).id;
    const first = await waitFor('a subscription firing', async () => (await firings()).data[0], 60_000);
    expect(first.source).toMatchObject({ kind: 'subscription', event_type: 'session.turn_ended', event_id: expect.stringMatching(/^evt_/) });
    expect(await settled(first.id)).toMatchObject({ status: 'completed', outcome: 'succeeded' });
    const trace = await api.get<{ filtering: unknown }>(`/v1/automation-firings/${first.id}/trace`);
    expect(trace.filtering).toEqual({ applicable: true, event_type: 'session.turn_ended', filters_applied: ['stop_reasons', 'agent_ids'], matched: true });

    const two = (await api.post<{ id: string }>('/v1/sessions', { agent: watched, environment_id: envId, initial_events: [drive(`${MARKER} second`)] })).id;
    await waitFor('the second firing', async () => ((await firings()).data.length >= 2 ? true : undefined), 60_000);
    const all = (await firings()).data;
    await Promise.all(all.map((f) => settled(f.id)));
    // Exactly the two watched Sessions fired it: its own Sessions (same Agent, same stop reason) did not.
    const again = (await firings()).data;
    expect(again).toHaveLength(2);
    const own = await api.get<{ data: { id: string }[] }>('/v1/sessions', { automation_id: s.id });
    expect(own.data).toHaveLength(2);
    expect(own.data.map((x) => x.id)).not.toContain(one);
    expect(own.data.map((x) => x.id)).not.toContain(two);
  });

  it('two Automations subscribed to each other\'s turns fire a bounded chain: the loop ends with a refused firing', async () => {
    const looping = (await api.post<{ id: string }>('/v1/agents', {
      name: 'looping', model: 'default', system: SCRIPT([{ when: { user_contains: MARKER }, then: [{ reply: `${REPLY} again` }] }]),
    })).id;
    await p.root.post('/v1/permission-assignments', { principal_id: service, target: { type: 'agent', id: looping }, actions: ['invoke'] });
    // Both run the looping Agent and subscribe to every turn of its Sessions: each fires on the other's Sessions.
    const make = () => createAutomation({
      agent: looping, prompt: `${MARKER} follow up on {{event.session_id}}`, max_concurrent_firings: 10,
      trigger: { type: 'subscription', event: 'session.turn_ended', filter: { agent_ids: [looping] } },
    });
    const [a, b] = [await make(), await make()];
    const firings = async (id: string) => (await api.get<{ data: Firing[] }>(`/v1/automations/${id}/firings`, { order: 'asc', limit: 100 })).data;
    await api.post('/v1/sessions', {
      agent: looping, environment_id: envId,
      initial_events: [{ type: 'user.message', payload: { content: `${MARKER} start`, authored_by: service, caused_by: { kind: 'api' } } }],
    });
    // The Session's turn fires A and B; A's Session fires B, B's fires A; the Sessions of those
    // would fire an Automation already in their chain: refused, and the chain ends there.
    const refused = await waitFor('each chain to end with a refused firing', async () => {
      const [fa, fb] = [await firings(a.id), await firings(b.id)];
      const ends = [...fa, ...fb].filter((f) => f.status === 'refused');
      return ends.length >= 2 ? ends : undefined;
    }, 120_000);
    for (const f of refused) expect(f).toMatchObject({ error: 'automation_loop', admission: { disposition: 'refused_loop' }, session_id: null, source: { kind: 'subscription' } });
    const all = [...(await firings(a.id)), ...(await firings(b.id))];
    await Promise.all(all.map((f) => settled(f.id)));
    const [fa, fb] = [await firings(a.id), await firings(b.id)];
    expect(fa.map((f) => f.status).sort()).toEqual(['completed', 'completed', 'refused']);
    expect(fb.map((f) => f.status).sort()).toEqual(['completed', 'completed', 'refused']);
  }, 180_000);

  it('session.turn_ended fires once per agent turn of an outcome, not for the end of its grader Run', async () => {
    const graded = (await api.post<{ id: string }>('/v1/agents', {
      name: 'graded', model: 'default', system: SCRIPT([{ when: { user_contains: MARKER }, then: [{ reply: `${REPLY} answer` }] }]),
    })).id;
    const s = await createAutomation({
      max_concurrent_firings: 5, trigger: { type: 'subscription', event: 'session.turn_ended', filter: { agent_ids: [graded] } },
    });
    const firings = async () => (await api.get<{ data: Firing[] }>(`/v1/automations/${s.id}/firings`, { order: 'asc', limit: 100 })).data;
    const rubric = `- The answer is there\n\n\`\`\`scripted\n${JSON.stringify({ rules: [{ then: [{ verdict: 'satisfied' }] }] })}\n\`\`\`\n`;
    const session = (await api.post<{ id: string }>('/v1/sessions', {
      agent: graded, environment_id: envId,
      initial_events: [{ type: 'user.define_outcome', payload: { description: `${MARKER} the answer`, rubric, authored_by: service, caused_by: { kind: 'api' } } }],
    })).id;
    const events = await untilEvents(api, session, (e) => e.some((x) => x.type === 'session.outcome_ended'), 90_000);
    expect(events.find((x) => x.type === 'session.outcome_ended')?.payload).toMatchObject({ result: 'satisfied', evaluation_count: 1 });
    // The agent's turn and the grader Run each ended with session.status_idle end_turn.
    const idles = events.filter((x) => x.type === 'session.status_idle');
    const graderStart = events.find((x) => x.type === 'session.outcome_evaluation_started')!;
    const [agentEnd, graderEnd] = [idles.find((x) => x.seq < graderStart.seq)!, idles.find((x) => x.seq > graderStart.seq)!];
    expect([agentEnd, graderEnd].map((x) => (x.payload.stop_reason as { type: string }).type)).toEqual(['end_turn', 'end_turn']);
    // One more agent turn in the Session: its firing comes after anything the earlier ends fired.
    await api.post(`/v1/sessions/${session}/events`, { type: 'user.message', payload: { content: `${MARKER} and then`, authored_by: service, caused_by: { kind: 'api' } } });
    const later = await untilEvents(api, session, (e) => e.filter((x) => x.type === 'session.status_idle').length >= 3, 90_000);
    const lastEnd = later.filter((x) => x.type === 'session.status_idle')[2]!;
    await waitFor('the firing of the later turn', async () => ((await firings()).some((f) => f.source.event_id === lastEnd.id) ? true : undefined), 60_000);
    expect((await firings()).map((f) => f.source.event_id)).toEqual([agentEnd.id, lastEnd.id]);
    await Promise.all((await firings()).map((f) => settled(f.id)));
  }, 180_000);

  it('webhook_endpoint.disabled fires when a delivery exhausts its attempts', async () => {
    const receiver = createServer((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(500).end());
    });
    await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', () => r()));
    try {
      const port = (receiver.address() as { port: number }).port;
      const endpoint = await p.root.post<{ id: string }>('/v1/webhook-endpoints', { url: `http://127.0.0.1:${port}/hook`, event_types: ['user.message'] });
      const s = await createAutomation({ trigger: { type: 'subscription', event: 'webhook_endpoint.disabled', filter: { webhook_endpoint_ids: [endpoint.id] } } });
      await api.post('/v1/sessions', { agent: agentId, environment_id: envId, initial_events: [{ type: 'user.message', payload: { content: `${MARKER} ping`, authored_by: service, caused_by: { kind: 'api' } } }] });
      const f = await waitFor('the subscription firing', async () => (await api.get<{ data: Firing[] }>(`/v1/automations/${s.id}/firings`)).data[0], 60_000);
      expect(f.source).toMatchObject({ kind: 'subscription', event_type: 'webhook_endpoint.disabled', event_id: endpoint.id });
      expect(await p.root.get(`/v1/webhook-endpoints/${endpoint.id}`)).toMatchObject({ status: 'disabled', disabled_reason: 'delivery_failed' });
      expect(await settled(f.id)).toMatchObject({ status: 'completed' });
    } finally {
      receiver.close();
    }
  });
});

describe('missed schedule fires across a restart', () => {
  it('on_missed fire_once fires the overdue tick once after the restart; skip records it as skipped; on-time ticks are never skipped', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'agentplane-missed-'));
    // The interval is longer than the missed threshold: an on-time tick must still fire.
    const intervalMs = 3000;
    const missedAfterMs = 2000;
    const env = { AUTOMATION_MISSED_AFTER_MS: String(missedAfterMs), AUTOMATION_SWEEP_MS: '500' };
    let q = await startPlatform({ dataDir: dir, env });
    try {
      const ws = q.bootstrap.workspace_id;
      const root = q.root.with({ workspaceId: ws });
      const bot = (await root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, { external_subject_id: 'missed-bot', principal_type: 'service', display_name: 'bot' })).id;
      await root.post('/v1/permission-assignments', { principal_id: bot, target: { type: 'workspace', id: ws }, actions: ['invoke'] });
      const env2 = (await root.post<{ id: string }>('/v1/environments', { name: 'e', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 60 } })).id;
      const agent = (await root.post<{ id: string }>('/v1/agents', { name: 'a', model: 'default' })).id;
      const make = (on_missed: string) => root.post<{ id: string }>('/v1/automations', {
        name: on_missed, principal_id: bot, agent, environment_id: env2, prompt: 'tick {{event.scheduled_at}}', max_concurrent_firings: 100,
        trigger: { type: 'schedule', interval_seconds: intervalMs / 1000, on_missed },
      });
      const once = await make('fire_once');
      const skip = await make('skip');
      const list = (c: typeof root, id: string) => c.get<{ data: (Firing & { created_at: string; source: { scheduled_at?: string } })[] }>(`/v1/automations/${id}/firings`, { limit: 100 });
      await waitFor('a tick of each', async () => ((await list(root, once.id)).data.length > 0 && (await list(root, skip.id)).data.length > 0 ? true : undefined), 30_000);
      // On time: a tick whose period is longer than the threshold is not a missed one.
      const onTime = (await list(root, skip.id)).data;
      expect(onTime.map((f) => [f.status, f.error])).not.toContainEqual(['skipped', 'missed_schedule']);
      await q.stop();
      const stoppedAt = Date.now();
      // The tick pending at the stop was due at most one interval after it: once the threshold has
      // passed beyond that, it is overdue by more than the threshold when the platform is back.
      const overdueFrom = stoppedAt + intervalMs + missedAfterMs;
      await waitFor('the pending tick to be overdue past the threshold', () => (Date.now() > overdueFrom ? true : undefined), intervalMs + missedAfterMs + 5000);
      const restartedAt = Date.now();
      q = await startPlatform({ dataDir: dir, env });
      const after = q.root.with({ workspaceId: ws });
      const overdue = <F extends { created_at: string; source: { scheduled_at?: string } }>(fs: F[]): F[] =>
        fs.filter((f) => Date.parse(f.created_at) > stoppedAt && Date.parse(String(f.source.scheduled_at)) < restartedAt);
      const skipped = await waitFor('the overdue tick skipped', async () => overdue((await list(after, skip.id)).data)[0], 30_000);
      expect(skipped).toMatchObject({ status: 'skipped', error: 'missed_schedule', session_id: null, attempt_count: 0 });
      expect(Date.parse(String(skipped.source.scheduled_at))).toBeLessThanOrEqual(stoppedAt + intervalMs);
      const fired = await waitFor('the overdue tick fired', async () => overdue((await list(after, once.id)).data)[0], 30_000);
      expect(fired.status).not.toBe('skipped');
      expect(overdue((await list(after, once.id)).data)).toHaveLength(1);
      expect(overdue((await list(after, skip.id)).data)).toHaveLength(1);
      expect((await after.get<{ metrics: { skipped: number } }>(`/v1/automations/${skip.id}`)).metrics.skipped).toBeGreaterThanOrEqual(1);
    } finally {
      await q.stop();
      rmSync(dir, { recursive: true, force: true });
    }
  }, 120_000);
});
