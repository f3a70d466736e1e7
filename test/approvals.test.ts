import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import type { Platform } from './harness/platform.js';
import { createCredential, createPrincipal, errMsg, errType } from './harness/governance.js';
import { mcpCall, mcpToolNames, toolBody } from './harness/mcp-call.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnEvent, type TurnPlatform } from './harness/turns.js';

/**
 * ActionApprovals end to end: a `require_approval` ActionPolicy pauses a real Run at the tool
 * boundary (split topology, Docker sandbox, the scripted model); the approval is resolved over
 * REST (or expires through its delayed job) and the turn continues exactly once.
 */
let p: Platform;
let api: HttpClient;
let principal: string;
let envId: string;
let msg: TurnPlatform['msg'];

interface Approval {
  id: string;
  status: string;
  version: number;
  session_id: string;
  session_thread_id: string;
  tool_use_id: string;
  tool: { kind: string; name: string };
  input: Json;
  rule_id: string;
  principal_ids: string[];
  expires_at: string;
  resolved_by: { id: string } | null;
  reason: string | null;
}

beforeAll(async () => {
  ({ p, api, principal, envId, msg } = await startTurnPlatform({ name: 'approvals' }));
}, 180_000);
afterAll(async () => {
  await p?.stop();
});

async function session(system: string, tools: Json[] = [{ type: 'builtin', name: 'bash' }]): Promise<string> {
  return (await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'approver', model: 'default', system, tools }, environment_id: envId })).id;
}
async function gate(prefix: string, extra: Json = {}): Promise<string> {
  return (await p.root.post<{ id: string }>('/v1/action-policies', {
    effect: 'require_approval', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: prefix }, ...extra,
  })).id;
}
/** One bash call per user message, then a reply quoting its result. */
const bashScript = (command: string) => SCRIPT([
  { when: { user_contains: 'run' }, then: [{ tool: 'bash', input: { command } }] },
  { when: { on: 'tool_result' }, then: [{ reply: 'Result: {{tool_result}}' }] },
]);
const results = (events: TurnEvent[], toolUseId?: string) =>
  events.filter((e) => e.type === 'agent.tool_result' && (toolUseId === undefined || e.payload.tool_use_id === toolUseId));
const stopOf = (events: TurnEvent[], n: number) => events.filter((e) => e.type === 'session.status_idle')[n]?.payload.stop_reason;
const resolve = (id: string, verdict: 'approve' | 'deny', body: Json = {}, opts: { idempotencyKey?: string; client?: HttpClient } = {}) =>
  (opts.client ?? p.root).request<Approval>('POST', `/v1/action-approvals/${id}/${verdict}`, { body, ...(opts.idempotencyKey ? { idempotencyKey: opts.idempotencyKey } : {}) });

/** Starts a turn whose bash call waits for approval; returns the approval named by the Session's event. */
async function waitingTurn(command: string): Promise<{ id: string; approval: Approval; events: TurnEvent[] }> {
  const id = await session(bashScript(command));
  await api.post(`/v1/sessions/${id}/events`, msg('run it'));
  const events = await untilEvents(api, id, (e) => idleCount(e) >= 1);
  expect(stopOf(events, 0)).toMatchObject({ type: 'requires_action' });
  const use = events.find((e) => e.type === 'agent.tool_use');
  expect(use?.payload).toMatchObject({ name: 'bash', blocking: true, awaiting: 'tool_confirmation' });
  const requested = events.find((e) => e.type === 'session.action_approval_requested');
  expect(requested?.payload).toMatchObject({ tool_use_id: use?.payload.id, tool: { kind: 'builtin', name: 'bash' } });
  expect(String(requested?.payload.approval_id)).toMatch(/^approval_[0-9a-f]{32}$/);
  expect(results(events)).toHaveLength(0);
  const approval = await p.root.get<Approval>(`/v1/action-approvals/${String(requested?.payload.approval_id)}`);
  return { id, approval, events };
}

describe('ActionApprovals', () => {
  it('a require_approval bash call waits, is approved over REST (Idempotency-Key) and runs exactly once', async () => {
    const rule = await gate('echo approved-once');
    const { id, approval } = await waitingTurn('echo approved-once >> /workspace/approved.log; cat /workspace/approved.log');
    expect(approval).toMatchObject({
      status: 'pending', version: 1, session_id: id, rule_id: rule, principal_ids: [principal], resolved_by: null,
      tool: { kind: 'builtin', name: 'bash' }, input: { command: 'echo approved-once >> /workspace/approved.log; cat /workspace/approved.log' },
    });

    // The client cannot answer the wait itself: only the approval does.
    const bypass = await api.request('POST', `/v1/sessions/${id}/events`, {
      body: { type: 'user.tool_confirmation', payload: { tool_use_id: approval.tool_use_id, result: 'allow', authored_by: principal, caused_by: { kind: 'api' } } },
    });
    expect(bypass.status).toBe(409);
    expect(errType(bypass)).toBe('runtime.invalid_transition');
    expect(errMsg(bypass)).toContain('ActionApproval');

    const ok = await resolve(approval.id, 'approve', { expected_version: 1, reason: 'looks safe' }, { idempotencyKey: 'approve-once' });
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ id: approval.id, status: 'approved', version: 2, reason: 'looks safe', resolved_by: { id: expect.stringMatching(/^key_/) } });
    // The same key replays the first answer; another attempt is refused.
    const replay = await resolve(approval.id, 'approve', { expected_version: 1, reason: 'looks safe' }, { idempotencyKey: 'approve-once' });
    expect(replay.status).toBe(200);
    expect(replay.body).toEqual(ok.body);
    const again = await resolve(approval.id, 'approve');
    expect(again.status).toBe(409);
    expect(errType(again)).toBe('runtime.invalid_transition');
    const flip = await resolve(approval.id, 'deny');
    expect(flip.status).toBe(409);
    expect(errType(flip)).toBe('runtime.invalid_transition');

    const events = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(events.find((e) => e.type === 'session.action_approval_resolved')?.payload).toMatchObject({ approval_id: approval.id, status: 'approved' });
    expect(stopOf(events, 1)).toMatchObject({ type: 'end_turn' });
    const ran = results(events, approval.tool_use_id);
    expect(ran).toHaveLength(1);
    // The command ran once: the log it appends to holds one line.
    expect(String(ran[0]?.payload.content).match(/approved-once/g)).toHaveLength(1);
    expect(ran[0]?.payload).toMatchObject({ is_error: false, exit_code: 0 });

    const audit = await p.root.post<{ data: { action: string; outcome: string; detail: string | null }[] }>('/v1/audit/export', { target: approval.id });
    expect(audit.data.map((r) => [r.action, r.outcome])).toEqual([
      ['action_approval.requested', 'requested'],
      ['approvals.approveActionApproval', 'succeeded'],
      ['approvals.approveActionApproval', 'failed'],
      ['approvals.denyActionApproval', 'failed'],
    ]);
    expect(audit.data[0]?.detail).toBe(rule);
    // The rule's decisions on the call: an approval asked for, then the approved call allowed.
    const decisions = await p.root.post<{ data: { outcome: string; detail: string | null }[] }>('/v1/audit/export', { target: id, action: 'policy.builtin:bash' });
    expect(decisions.data.map((r) => [r.outcome, r.detail])).toEqual([['requested', rule], ['allowed', rule]]);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it('a denied approval ends the tool call with a clear refusal naming the approval; the command never runs', async () => {
    const rule = await gate('echo never-run');
    const { id, approval } = await waitingTurn('echo never-run output-text');
    const denied = await resolve(approval.id, 'deny', { reason: 'not today' });
    expect(denied.status).toBe(200);
    expect(denied.body).toMatchObject({ status: 'denied', reason: 'not today' });

    const events = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(stopOf(events, 1)).toMatchObject({ type: 'end_turn' });
    const refused = results(events, approval.tool_use_id);
    expect(refused).toHaveLength(1);
    expect(refused[0]?.payload).toMatchObject({ is_error: true, denied: true, policy_rule_id: rule });
    const content = String(refused[0]?.payload.content);
    expect(content).toContain(`ActionApproval ${approval.id} was denied by`);
    expect(content).toContain('not today');
    expect(content).not.toContain('output-text');
    // The model was handed the refusal as the tool's result.
    expect(JSON.stringify(events.filter((e) => e.type === 'agent.message'))).toContain('Not run');
    // The rule's decisions on the call: an approval asked for, then the call refused.
    const decisions = await p.root.post<{ data: { outcome: string; detail: string | null }[] }>('/v1/audit/export', { target: id, action: 'policy.builtin:bash' });
    expect(decisions.data.map((r) => [r.outcome, r.detail])).toEqual([['requested', rule], ['denied', rule]]);

    // Deleting the Session erases its approvals (they hold tool inputs).
    expect((await api.request('DELETE', `/v1/sessions/${id}`)).status).toBe(200);
    const gone = await p.root.request('GET', `/v1/action-approvals/${approval.id}`);
    expect([gone.status, errType(gone)]).toEqual([404, 'validation.not_found']);
    const all = await p.root.get<{ data: Approval[] }>('/v1/action-approvals?limit=100');
    expect(all.data.map((a) => a.id)).not.toContain(approval.id);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it('concurrent double approval resolves once; a stale expected_version is a conflict', async () => {
    const rule = await gate('echo raced');
    const { id, approval } = await waitingTurn('echo raced >> /workspace/raced.log; cat /workspace/raced.log');
    const stale = await resolve(approval.id, 'approve', { expected_version: 7 });
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('validation.conflict');
    expect((await p.root.get<Approval>(`/v1/action-approvals/${approval.id}`)).status).toBe('pending');

    const both = await Promise.all([resolve(approval.id, 'approve'), resolve(approval.id, 'approve'), resolve(approval.id, 'approve')]);
    expect(both.map((r) => r.status).sort()).toEqual([200, 409, 409]);
    expect(both.filter((r) => r.status === 409).map(errType)).toEqual(['runtime.invalid_transition', 'runtime.invalid_transition']);

    const events = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    const ran = results(events, approval.tool_use_id);
    expect(ran).toHaveLength(1);
    expect(String(ran[0]?.payload.content).match(/raced/g)).toHaveLength(1);
    expect(events.filter((e) => e.type === 'session.action_approval_resolved')).toHaveLength(1);
    expect(events.filter((e) => e.type === 'session.status_running')).toHaveLength(2);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it('an approval expires through its delayed job: an event, a refused tool call, an audit record; resolving it afterwards is 409', async () => {
    const rule = await gate('echo too-late', { approval_expires_in_seconds: 2 });
    const { id, approval } = await waitingTurn('echo too-late output-text');
    expect(Date.parse(approval.expires_at) - Date.parse((await p.root.get<{ created_at: string }>(`/v1/action-approvals/${approval.id}`)).created_at)).toBe(2000);

    const events = await untilEvents(api, id, (e) => idleCount(e) >= 2, 30_000);
    expect(events.find((e) => e.type === 'session.action_approval_expired')?.payload).toMatchObject({ approval_id: approval.id, tool_use_id: approval.tool_use_id, status: 'expired' });
    const refused = results(events, approval.tool_use_id);
    expect(refused).toHaveLength(1);
    expect(refused[0]?.payload).toMatchObject({ is_error: true, denied: true });
    expect(String(refused[0]?.payload.content)).toContain(`ActionApproval ${approval.id} expired`);
    expect(String(refused[0]?.payload.content)).not.toContain('output-text');

    expect((await p.root.get<Approval>(`/v1/action-approvals/${approval.id}`)).status).toBe('expired');
    const late = await resolve(approval.id, 'approve');
    expect(late.status).toBe(409);
    expect(errType(late)).toBe('runtime.invalid_transition');
    expect(errMsg(late)).toContain('expired');
    const audit = await p.root.post<{ data: { action: string; outcome: string; actor: { id: string } }[] }>('/v1/audit/export', { target: approval.id, action: 'action_approval.expired' });
    expect(audit.data).toEqual([expect.objectContaining({ outcome: 'expired', actor: { id: 'platform', credential_id: null } })]);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it('the approvals queue lists per Workspace and per Session with cursor paging; the turn waits for every approval of the step', async () => {
    const rule = await gate('echo queued');
    const id = await session(SCRIPT([
      { when: { user_contains: 'run' }, then: [{ tool: 'bash', input: { command: 'echo queued one' } }, { tool: 'bash', input: { command: 'echo queued two' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'Done: {{tool_result}}' }] },
    ]));
    await api.post(`/v1/sessions/${id}/events`, msg('run both'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    expect(stopOf(first, 0)).toMatchObject({ type: 'requires_action', tool_use_ids: [expect.any(String), expect.any(String)] });
    expect(first.filter((e) => e.type === 'session.action_approval_requested')).toHaveLength(2);

    const page1 = await p.root.get<{ data: Approval[]; next_page: string | null }>(`/v1/sessions/${id}/action-approvals?limit=1`);
    expect(page1.data).toHaveLength(1);
    expect(page1.next_page).toMatch(/^c1_/);
    const page2 = await p.root.get<{ data: Approval[]; next_page: string | null }>(`/v1/sessions/${id}/action-approvals?limit=1&page=${page1.next_page}`);
    expect(page2.data).toHaveLength(1);
    expect(page2.next_page).toBeNull();
    const mine = [...page1.data, ...page2.data];
    expect(new Set(mine.map((a) => a.id)).size).toBe(2);
    expect(mine.map((a) => a.input.command).sort()).toEqual(['echo queued one', 'echo queued two']);

    // The Workspace queue, filtered to what waits, holds both (and none of the resolved ones).
    const pending: Approval[] = [];
    for (let page: string | null = null, n = 0; n === 0 || page; n++) {
      const r: { data: Approval[]; next_page: string | null } = await p.root.get(`/v1/action-approvals?status=pending&limit=2${page ? `&page=${page}` : ''}`);
      pending.push(...r.data);
      page = r.next_page;
    }
    expect(pending.every((a) => a.status === 'pending')).toBe(true);
    expect(pending.filter((a) => a.session_id === id).map((a) => a.id).sort()).toEqual(mine.map((a) => a.id).sort());
    const bad = await p.root.request('GET', '/v1/action-approvals?status=maybe');
    expect(bad.status).toBe(400);
    expect(errType(bad)).toBe('validation.malformed');

    // One approval answers one of two waits: the turn continues only when both are resolved.
    expect((await resolve(mine[0]!.id, 'approve')).status).toBe(200);
    // A continuation would have moved the thread to running before the approve answered.
    expect((await p.root.get<{ status: string }>(`/v1/sessions/${id}/threads/${mine[0]!.session_thread_id}`)).status).toBe('idle');
    expect((await resolve(mine[1]!.id, 'deny')).status).toBe(200);
    const all = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(stopOf(all, 1)).toMatchObject({ type: 'end_turn' });
    expect(all.filter((e) => e.type === 'session.status_running')).toHaveLength(2);
    const byId = new Map(results(all).map((e) => [e.payload.tool_use_id, e.payload]));
    expect(String(byId.get(mine[0]!.tool_use_id)?.content)).toContain(String(mine[0]!.input.command).slice(5));
    expect(byId.get(mine[1]!.tool_use_id)).toMatchObject({ is_error: true, denied: true });
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it('Principals need approve: the assignment is checked live on the approval\'s Session; errors are the catalog\'s', async () => {
    const rule = await gate('echo by-principal');
    const { id, approval } = await waitingTurn('echo by-principal');
    const ws = p.bootstrap.workspace_id;
    const approver = await createPrincipal(p.root, ws, 'approver');
    const cred = await createCredential(p.root, approver);
    const as = api.with({ token: cred.secret });

    const refused = await resolve(approval.id, 'approve', {}, { client: as });
    expect(refused.status).toBe(403);
    expect(errType(refused)).toBe('policy.denied');
    expect(errMsg(refused)).toContain(`'approve' on session ${id}`);
    expect((await as.request('GET', `/v1/sessions/${id}/action-approvals`)).status).toBe(403);

    // A developer key may read the queue but not resolve it.
    expect((await api.request('GET', `/v1/action-approvals/${approval.id}`)).status).toBe(200);
    const dev = await resolve(approval.id, 'approve', {}, { client: api });
    expect(dev.status).toBe(403);
    expect(errType(dev)).toBe('policy.denied');

    // Bad input: wrong id prefix, unknown id, unknown field, expiry on a non-approval rule.
    const prefix = await p.root.request('POST', `/v1/action-approvals/apol_${'0'.repeat(32)}/approve`, { body: {} });
    expect([prefix.status, errType(prefix)]).toEqual([400, 'validation.malformed']);
    const unknown = await p.root.request('POST', `/v1/action-approvals/approval_${'0'.repeat(32)}/approve`, { body: {} });
    expect([unknown.status, errType(unknown)]).toEqual([404, 'validation.not_found']);
    const field = await p.root.request('POST', `/v1/action-approvals/${approval.id}/approve`, { body: { verdict: 'yes' } });
    expect([field.status, errType(field)]).toEqual([400, 'validation.malformed']);
    const expiryOnDeny = await p.root.request('POST', '/v1/action-policies', { body: { effect: 'deny', tool: { kind: 'builtin', name: 'bash' }, approval_expires_in_seconds: 5 } });
    expect([expiryOnDeny.status, errType(expiryOnDeny)]).toEqual([400, 'validation.malformed']);
    const tooLong = await p.root.request('POST', '/v1/action-policies', { body: { effect: 'require_approval', tool: { kind: 'builtin', name: 'bash' }, approval_expires_in_seconds: 8 * 24 * 3600 } });
    expect([tooLong.status, errType(tooLong)]).toEqual([400, 'validation.malformed']);
    expect((await p.root.get<Approval>(`/v1/action-approvals/${approval.id}`)).status).toBe('pending');

    // Granted `approve` on the Session, the same credential resolves it (the very next request).
    const grant = await p.root.post<{ id: string }>('/v1/permission-assignments', { principal_id: approver, target: { type: 'session', id }, actions: ['approve'] });
    const listed = await as.request<{ data: Approval[] }>('GET', `/v1/sessions/${id}/action-approvals`);
    expect(listed.status).toBe(200);
    expect(listed.body.data.map((a) => a.id)).toEqual([approval.id]);
    const ok = await resolve(approval.id, 'approve', {}, { client: as });
    expect(ok.status).toBe(200);
    expect(ok.body.resolved_by).toEqual({ id: approver, credential_id: cred.id });
    const events = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(results(events, approval.tool_use_id)).toHaveLength(1);
    await p.root.request('DELETE', `/v1/permission-assignments/${grant.id}`);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it('an always_ask tool under a require_approval rule needs both: the approval, then the user\'s confirmation; it runs once', async () => {
    const rule = await gate('echo doubly');
    const id = await session(bashScript('echo doubly gated'), [{ type: 'builtin', name: 'bash', permission: 'always_ask' }]);
    const confirm = (toolUseId: string) => api.request('POST', `/v1/sessions/${id}/events`, {
      body: { type: 'user.tool_confirmation', payload: { tool_use_id: toolUseId, result: 'allow', authored_by: principal, caused_by: { kind: 'api' } } },
    });
    await api.post(`/v1/sessions/${id}/events`, msg('run it'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    const approvalId = String(first.find((e) => e.type === 'session.action_approval_requested')?.payload.approval_id);
    const toolUseId = String(first.find((e) => e.type === 'agent.tool_use')?.payload.id);
    expect((await confirm(toolUseId)).status).toBe(409);
    expect((await resolve(approvalId, 'approve')).status).toBe(200);

    // Approved, the use still waits for its tool's own confirmation (a new wait, answerable by the user).
    const second = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(stopOf(second, 1)).toMatchObject({ type: 'requires_action', tool_use_ids: [toolUseId] });
    expect(results(second)).toHaveLength(0);
    const answered = await confirm(toolUseId);
    expect([answered.status, errMsg(answered)]).toEqual([201, ""]);
    const third = await untilEvents(api, id, (e) => idleCount(e) >= 3);
    expect(stopOf(third, 2)).toMatchObject({ type: 'end_turn' });
    expect(results(third, toolUseId)).toHaveLength(1);
    expect(String(results(third, toolUseId)[0]?.payload.content)).toContain('doubly gated');
    expect(third.filter((e) => e.type === 'session.action_approval_requested')).toHaveLength(1);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it('a custom tool under a require_approval rule: the client answers only once approved; denied, the client is never asked', async () => {
    const rule = (await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'require_approval', tool: { kind: 'custom', name: 'get_weather' } })).id;
    const id = await session(SCRIPT([
      { when: { user_contains: 'weather' }, then: [{ tool: 'get_weather', input: { city: '{{user}}' } }] },
      { when: { after_tool: 'get_weather' }, then: [{ reply: 'Forecast: {{tool_result}}' }] },
    ]), [{ type: 'custom', name: 'get_weather', description: 'Weather for a city', input_schema: { type: 'object', properties: { city: { type: 'string' } } } }]);
    const answer = (toolUseId: string) => api.request('POST', `/v1/sessions/${id}/events`, {
      body: { type: 'user.custom_tool_result', payload: { tool_use_id: toolUseId, result: 'sunny, 21C', authored_by: principal, caused_by: { kind: 'api' } } },
    });
    await api.post(`/v1/sessions/${id}/events`, msg('weather in Paris'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    const use = first.find((e) => e.type === 'agent.tool_use');
    expect(use?.payload).toMatchObject({ blocking: true, awaiting: 'custom_tool_result' });
    const toolUseId = String(use?.payload.id);
    const early = await answer(toolUseId);
    expect([early.status, errType(early)]).toEqual([409, 'runtime.invalid_transition']);
    const approvalId = String(first.find((e) => e.type === 'session.action_approval_requested')?.payload.approval_id);
    expect((await resolve(approvalId, 'approve')).status).toBe(200);
    const second = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(stopOf(second, 1)).toMatchObject({ type: 'requires_action', tool_use_ids: [toolUseId] });
    expect((await answer(toolUseId)).status).toBe(201);
    const third = await untilEvents(api, id, (e) => idleCount(e) >= 3);
    expect(stopOf(third, 2)).toMatchObject({ type: 'end_turn' });
    expect(JSON.stringify(third.filter((e) => e.type === 'agent.message'))).toContain('sunny, 21C');

    await api.post(`/v1/sessions/${id}/events`, msg('weather in Rome'));
    const fourth = await untilEvents(api, id, (e) => idleCount(e) >= 4);
    const again = fourth.filter((e) => e.type === 'session.action_approval_requested').at(-1)?.payload;
    expect((await resolve(String(again?.approval_id), 'deny')).status).toBe(200);
    const fifth = await untilEvents(api, id, (e) => idleCount(e) >= 5);
    expect(stopOf(fifth, 4)).toMatchObject({ type: 'end_turn' });
    expect(results(fifth, String(again?.tool_use_id))[0]?.payload).toMatchObject({ is_error: true, denied: true, policy_rule_id: rule });
    const late = await answer(String(again?.tool_use_id));
    expect([late.status, errType(late)]).toEqual([409, 'runtime.invalid_transition']);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it('an archived Session takes no new work: its pending approval cannot be resolved', async () => {
    const rule = await gate('echo archived');
    const { id, approval } = await waitingTurn('echo archived now');
    expect((await api.request('POST', `/v1/sessions/${id}/archive`, { body: {} })).status).toBe(200);
    const refused = await resolve(approval.id, 'approve');
    expect([refused.status, errType(refused)]).toEqual([409, 'runtime.invalid_transition']);
    expect(errMsg(refused)).toContain('archived');
    expect((await p.root.get<Approval>(`/v1/action-approvals/${approval.id}`)).status).toBe('pending');
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it('an approval whose wait an interrupt ended lapses then: it reads expired, resolving it is 409, nothing runs', async () => {
    const rule = await gate('echo interrupted');
    const { id, approval } = await waitingTurn('echo interrupted now');
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } });
    // The interrupt itself lapses the approval: no one has to try to resolve it first.
    const after = await untilEvents(api, id, (e) => idleCount(e) >= 2 && e.some((x) => x.type === 'session.action_approval_expired'));
    expect(stopOf(after, 1)).toMatchObject({ type: 'interrupted' });
    expect((await p.root.get<Approval>(`/v1/action-approvals/${approval.id}`)).status).toBe('expired');
    const pending = await p.root.get<{ data: Approval[] }>(`/v1/sessions/${id}/action-approvals`, { status: 'pending' });
    expect(pending.data.map((a) => a.id)).not.toContain(approval.id);
    const refused = await resolve(approval.id, 'approve');
    expect([refused.status, errType(refused)]).toEqual([409, 'runtime.invalid_transition']);
    expect(errMsg(refused)).toContain('expired');
    expect(after.filter((e) => e.type === 'session.action_approval_resolved')).toEqual([]);
    expect(results(after, approval.tool_use_id).map((e) => e.payload.interrupted)).toEqual([true]);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it('the MCP compact catalog lists the approvals queue and its resolution; tools/call resolves through the same pipeline', async () => {
    const names = await mcpToolNames(p.baseUrl, p.bootstrap.root_key);
    expect(names).toEqual(expect.arrayContaining([
      'approvals_listActionApprovals', 'approvals_listSessionActionApprovals', 'approvals_getActionApproval',
      'approvals_approveActionApproval', 'approvals_denyActionApproval',
    ]));
    const rule = await gate('echo over-mcp');
    const { id, approval } = await waitingTurn('echo over-mcp');
    const listed = await mcpCall(p.baseUrl, p.bootstrap.root_key, 'approvals_listSessionActionApprovals', { path: { session_id: id } });
    expect(listed.result?.isError).toBeFalsy();
    expect((toolBody(listed.result).data as Approval[]).map((a) => a.id)).toEqual([approval.id]);
    const denied = await mcpCall(p.baseUrl, p.bootstrap.root_key, 'approvals_denyActionApproval', { path: { approval_id: approval.id }, body: { reason: 'via mcp' }, idempotency_key: 'mcp-deny' });
    expect(denied.result?.isError).toBeFalsy();
    expect(toolBody(denied.result)).toMatchObject({ status: 'denied', reason: 'via mcp' });
    const events = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(results(events, approval.tool_use_id)[0]?.payload).toMatchObject({ denied: true });
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });
});

describe('Principal-scoped ActionPolicies inside Runs', () => {
  it("a rule for a Principal governs the tool uses of the turns that Principal's messages start, and no one else's", async () => {
    const ws = p.bootstrap.workspace_id;
    const other = await createPrincipal(p.root, ws, 'other');
    const rule = (await p.root.post<{ id: string }>('/v1/action-policies', {
      effect: 'deny', tool: { kind: 'builtin', name: 'bash' }, principal_id: principal, description: 'no bash for user one',
    })).id;
    const id = await session(bashScript('echo scoped-ran'));
    await api.post(`/v1/sessions/${id}/events`, msg('run as user one'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    expect(results(first)[0]?.payload).toMatchObject({ is_error: true, denied: true, policy_rule_id: rule });

    await api.post(`/v1/sessions/${id}/events`, { type: 'user.message', payload: { content: 'run as the other', authored_by: other, caused_by: { kind: 'api' } } });
    const second = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    const ran = results(second).at(-1)?.payload;
    expect(ran).toMatchObject({ is_error: false, exit_code: 0 });
    expect(String(ran?.content)).toContain('scoped-ran');
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });
});
