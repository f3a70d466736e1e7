import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import type { Platform } from './harness/platform.js';
import { startMcpUpstream } from './harness/mcp-upstream.js';
import { createCredential, createPrincipal, expectPolicyRefusal } from './harness/governance.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnEvent, type TurnPlatform } from './harness/turns.js';

/**
 * ActionPolicies at the tool-call boundary, through the whole path: the runner asks the control
 * plane before each tool use (split topology, and colocated, where the loop in the sandbox asks
 * through the runner; real Docker sandboxes, the scripted model).
 */
let p: Platform;
let api: HttpClient;
let principal: string;
let envId: string;
let msg: TurnPlatform['msg'];

beforeAll(async () => {
  // Its MCP upstreams listen on loopback: reachable in development mode only (the outbound address guard).
  ({ p, api, principal, envId, msg } = await startTurnPlatform({ name: 'governance-runs', env: { AGENTPLANE_MODE: 'development' } }));
}, 180_000);
afterAll(async () => {
  await p?.stop();
});

async function session(system: string, tools: Json[] = [{ type: 'builtin', name: 'bash' }], environment = envId): Promise<string> {
  return (await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'governed', model: 'default', system, tools }, environment_id: environment })).id;
}
async function policy(body: Json): Promise<string> {
  return (await p.root.post<{ id: string }>('/v1/action-policies', body)).id;
}
const results = (events: TurnEvent[]) => events.filter((e) => e.type === 'agent.tool_result');

describe('ActionPolicies on the runner path', () => {
  it('a bash call denied by policy never reaches the sandbox; the model gets a clear refusal', async () => {
    const rule = await policy({ effect: 'deny', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'touch' }, description: 'no touching' });
    const id = await session(SCRIPT([
      { when: { user_contains: 'make' }, then: [{ tool: 'bash', input: { command: 'touch /workspace/denied-marker' } }] },
      { when: { user_contains: 'look' }, then: [{ tool: 'bash', input: { command: 'ls -a /workspace; echo listed' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'Tool said: {{tool_result}}' }] },
    ]));
    await api.post(`/v1/sessions/${id}/events`, msg('make the marker'));
    expectPolicyRefusal(await untilEvents(api, id, (e) => idleCount(e) >= 1), rule);

    // The sandbox never saw the command: the marker does not exist.
    await api.post(`/v1/sessions/${id}/events`, msg('look around'));
    const second = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    const listing = String(results(second).at(-1)?.payload.content);
    expect(listing).toContain('listed');
    expect(listing).not.toContain('denied-marker');

    // The decision is in the audit log, naming the rule and the Session.
    const audit = await p.root.post<{ data: { outcome: string; detail: string; action: string }[] }>('/v1/audit/export', { target: id, action: 'policy.builtin:bash' });
    expect(audit.data).toEqual([expect.objectContaining({ outcome: 'denied', detail: rule })]);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it("an MCP connection tool is matched by its own name and Connection; a denied call never reaches the server", async () => {
    const upstream = await startMcpUpstream();
    try {
      const conn = await p.root.post<{ id: string }>('/v1/connections', { name: 'gov-upstream', url: upstream.url });
      const rule = await policy({ effect: 'deny', tool: { kind: 'mcp', name: 'ech?', connection_id: conn.id } });
      const id = await session(SCRIPT([
        { when: { user_contains: 'echo' }, then: [{ tool: 'ext__echo', input: { text: 'should not arrive' } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'MCP said: {{tool_result}}' }] },
      ]));
      await api.post(`/v1/sessions/${id}`, { agent: { mcp_servers: [{ name: 'ext', type: 'url', url: upstream.url, permission: 'always_allow' }] } });
      await api.post(`/v1/sessions/${id}/events`, msg('echo please'));
      const evs = await untilEvents(api, id, (e) => idleCount(e) >= 1);
      expect(results(evs)[0]?.payload).toMatchObject({ is_error: true, denied: true, policy_rule_id: rule });
      expect(JSON.stringify(evs)).not.toContain('echo: should not arrive');
      await p.root.request('DELETE', `/v1/action-policies/${rule}`);
    } finally {
      await upstream.close();
    }
  });

  it('an MCP connection tool under require_approval: approved, the call passes the endpoint\'s own check and runs once; every call is audited', async () => {
    const upstream = await startMcpUpstream();
    try {
      const conn = await p.root.post<{ id: string }>('/v1/connections', { name: 'gov-approval', url: upstream.url });
      const rule = await policy({ effect: 'require_approval', tool: { kind: 'mcp', name: 'echo', connection_id: conn.id } });
      const id = await session(SCRIPT([
        { when: { user_contains: 'echo' }, then: [{ tool: 'ext__echo', input: { text: 'approved call' } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'MCP said: {{tool_result}}' }] },
      ]));
      await api.post(`/v1/sessions/${id}`, { agent: { mcp_servers: [{ name: 'ext', type: 'url', url: upstream.url, permission: 'always_allow' }] } });
      await api.post(`/v1/sessions/${id}/events`, msg('echo please'));
      const asked = await untilEvents(api, id, (e) => e.some((x) => x.type === 'session.action_approval_requested'));
      const approval = String(asked.find((e) => e.type === 'session.action_approval_requested')?.payload.approval_id);
      expect((await p.root.request('POST', `/v1/action-approvals/${approval}/approve`, { body: {} })).status).toBe(200);
      const evs = await untilEvents(api, id, (e) => idleCount(e) >= 2);
      expect(results(evs).map((e) => [e.payload.is_error, e.payload.content])).toEqual([[false, 'echo: approved call']]);
      await p.root.request('DELETE', `/v1/action-policies/${rule}`);
      const audit = await p.root.post<{ data: { action: string; outcome: string; status: number | null }[] }>('/v1/audit/export', { target: conn.id });
      const calls = audit.data.filter((r) => r.action.startsWith('connections.runtimeCallTool'));
      expect(calls.map((r) => [r.action, r.outcome, r.status])).toEqual([['connections.runtimeCallTool:echo', 'succeeded', 200]]);
    } finally {
      await upstream.close();
    }
  });

  it('colocated: require_approval waits for its ActionApproval; approved it runs once, denied it is refused', async () => {
    const colocated = (await api.post<{ id: string }>('/v1/environments', {
      name: 'colocated-approvals', image: 'agentplane/sandbox:latest', harness_topology: 'colocated',
      resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    })).id;
    const rule = await policy({ effect: 'require_approval', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'echo gated' } });
    const id = await session(SCRIPT([
      { when: { user_contains: 'run' }, then: [{ tool: 'bash', input: { command: 'echo gated output' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'Result: {{tool_result}}' }] },
    ]), [{ type: 'builtin', name: 'bash' }], colocated);
    const approvalOf = (events: TurnEvent[]) => String(events.filter((e) => e.type === 'session.action_approval_requested').at(-1)?.payload.approval_id);
    await api.post(`/v1/sessions/${id}/events`, msg('run it'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    expect(first.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'requires_action' });
    const use = first.find((e) => e.type === 'agent.tool_use');
    expect(use?.payload).toMatchObject({ blocking: true, awaiting: 'tool_confirmation' });
    expect(results(first)).toHaveLength(0);
    // A drive event cannot stand in for the approval.
    const bypass = await api.request('POST', `/v1/sessions/${id}/events`, {
      body: { type: 'user.tool_confirmation', payload: { tool_use_id: String(use?.payload.id), result: 'allow', authored_by: principal, caused_by: { kind: 'api' } } },
    });
    expect(bypass.status).toBe(409);
    expect((await p.root.request('POST', `/v1/action-approvals/${approvalOf(first)}/approve`, { body: {} })).status).toBe(200);
    const after = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(results(after).filter((e) => String(e.payload.content).includes('gated output'))).toHaveLength(1);

    await api.post(`/v1/sessions/${id}/events`, msg('run it again'));
    const again = await untilEvents(api, id, (e) => idleCount(e) >= 3);
    expect((await p.root.request('POST', `/v1/action-approvals/${approvalOf(again)}/deny`, { body: {} })).status).toBe(200);
    const denied = await untilEvents(api, id, (e) => idleCount(e) >= 4);
    expect(results(denied).at(-1)?.payload).toMatchObject({ is_error: true, denied: true, policy_rule_id: rule });
    expect(results(denied).filter((e) => String(e.payload.content).includes('gated output'))).toHaveLength(1);
    const audit = await p.root.post<{ data: { outcome: string; detail: string }[] }>('/v1/audit/export', { target: id, action: 'policy.builtin:bash' });
    expect(audit.data.map((r) => r.outcome)).toContain('requested');
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });

  it('colocated: the loop inside the sandbox asks through the runner; a denied bash call is refused and never runs', async () => {
    const colocated = (await api.post<{ id: string }>('/v1/environments', {
      name: 'colocated', image: 'agentplane/sandbox:latest', harness_topology: 'colocated',
      resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    })).id;
    const rule = await policy({ effect: 'deny', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'touch' }, description: 'no touching in the sandbox' });
    const id = await session(SCRIPT([
      { when: { user_contains: 'make' }, then: [{ tool: 'bash', input: { command: 'touch /workspace/colocated-marker' } }] },
      { when: { user_contains: 'look' }, then: [{ tool: 'bash', input: { command: 'ls -a /workspace; ps -eo args; echo listed' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'Tool said: {{tool_result}}' }] },
    ]), [{ type: 'builtin', name: 'bash' }], colocated);
    await api.post(`/v1/sessions/${id}/events`, msg('make the marker'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    expect(first.find((e) => e.type === 'agent.tool_use')?.payload).toMatchObject({ name: 'bash', blocking: false });
    expect(expectPolicyRefusal(first, rule)).not.toHaveProperty('exit_code');

    // The command never ran in the sandbox: the marker is absent (the listing comes from the in-sandbox loop).
    await api.post(`/v1/sessions/${id}/events`, msg('look around'));
    const second = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    const listing = String(results(second).at(-1)?.payload.content);
    expect(listing).toContain('listed');
    expect(listing).toContain('node /tmp/agentplane-harness.mjs');
    expect(listing).not.toContain('colocated-marker');

    // The decision went through the control plane and is in the audit log.
    const audit = await p.root.post<{ data: { outcome: string; detail: string }[] }>('/v1/audit/export', { target: id, action: 'policy.builtin:bash' });
    expect(audit.data.map((r) => [r.outcome, r.detail])).toContainEqual(['denied', rule]);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  });
});

describe('a Principal suspended mid-turn', () => {
  it('its running turn finishes, but its credential can no longer steer the Session', async () => {
    const ws = p.bootstrap.workspace_id;
    const prin = await createPrincipal(p.root, ws, 'steerer');
    const cred = await createCredential(p.root, prin);
    const granted = await p.root.request('POST', '/v1/permission-assignments', { body: { principal_id: prin, target: { type: 'workspace', id: ws }, actions: ['steer', 'observe'] } });
    expect(granted.status).toBe(201);
    const as = api.with({ token: cred.secret });
    const say = (content: string) => ({ type: 'user.message', payload: { content, authored_by: prin, caused_by: { kind: 'api' } } });

    const id = await session(SCRIPT([
      { when: { user_contains: 'work' }, then: [{ tool: 'bash', input: { command: 'sleep 2; echo worked' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'Tool said: {{tool_result}}' }] },
    ]));
    expect((await as.request('POST', `/v1/sessions/${id}/events`, { body: say('work please') })).status).toBeLessThan(300);
    await untilEvents(api, id, (e) => e.some((x) => x.type === 'agent.tool_use'));

    expect((await p.root.request('POST', `/v1/principals/${prin}/suspend`, { body: {} })).status).toBe(200);
    // The very next steering request of the suspended Principal is refused, and writes nothing.
    const refused = await as.request<{ error: { type: string } }>('POST', `/v1/sessions/${id}/events`, { body: say('work more') });
    expect(refused.status).toBe(401);
    expect(refused.body.error.type).toBe('auth.invalid_key');
    expect((await as.request('POST', `/v1/sessions/${id}/events`, { body: { type: 'user.interrupt', payload: { authored_by: prin, caused_by: { kind: 'api' } } } })).status).toBe(401);

    // The turn it started runs to its end.
    const events = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(String(results(events)[0]?.payload.content)).toContain('worked');
    expect(events.filter((e) => e.type === 'user.message')).toHaveLength(1);
  });
});
