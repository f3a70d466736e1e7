import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { idleCount, SCRIPT, untilEvents, type Json, type TurnEvent } from './harness/turns.js';
import { FIXTURE_COMMAND, FIXTURE_PACKAGE, startAcpPlatform, type AcpPlatform } from './harness/acp-fixture.js';
import { startMcpUpstream } from './harness/mcp-upstream.js';

/**
 * Third-party agent harnesses over ACP, end to end (docs/ACP.md): the fixture agent (written with
 * the official SDK) is packed as an npm package, installed by two runners into a sandbox image
 * layer, probed, reported in their capabilities, and driven by them over stdio inside the
 * Session's Docker sandbox, with its model steps through the sandbox-loopback endpoints and the
 * scripted model, its permission requests through the workspace's ActionPolicies.
 */
let acp: AcpPlatform;
let api: HttpClient;
let principal: string;
let envId: string;
let daemons: AcpPlatform['daemons'];

const msg = (content: string) => ({ type: 'user.message' as const, payload: { content, authored_by: principal, caused_by: { kind: 'api' } } });

beforeAll(async () => {
  acp = await startAcpPlatform();
  ({ api, principal, envId, daemons } = acp);
  // One runner (a Session's workspace lives on the runner that ran it).
  await acp.ready([await acp.daemon('acp-a')]);
}, 240_000);
afterAll(async () => {
  await acp?.stop();
});

async function session(system: string): Promise<string> {
  return (await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'acp', model: 'default', system, tools: [] }, environment_id: envId })).id;
}
const until = (id: string, stop: (e: TurnEvent[]) => boolean, timeoutMs = 60_000): Promise<TurnEvent[]> => untilEvents(api, id, stop, timeoutMs);
const agentEvents = (events: TurnEvent[]) => events.filter((e) => e.type.startsWith('agent.'));
const runsOf = async (id: string) => (await api.get<{ data: Array<{ status: string; attempts: Array<{ runner_id: string }> }> }>(`/v1/sessions/${id}/runs`)).data;

describe('ACP agent harness', () => {
  it('the runners report ACP over stdio and the installed harness with its release digest', async () => {
    const r = await api.get<{ data: Array<{ runner: string; capabilities: { providers: Json[] } }> }>('/v1/runner-pools/presences');
    const docker = r.data.filter((x) => daemons.has(x.runner)).map((x) => x.capabilities.providers.find((pr) => pr.id === 'docker'));
    expect(docker).toHaveLength(1);
    for (const pr of docker) {
      expect(pr?.acp_transport).toBe('stdio');
      expect(pr?.acp_harnesses).toEqual([{ package: FIXTURE_PACKAGE, version: '1.0.0', harness_release_digest: expect.stringMatching(/^sha256:[0-9a-f]{64}$/) }]);
    }
    const env = await api.get<Json>(`/v1/environments/${envId}`);
    expect(env.harness).toEqual({ kind: 'acp', package: FIXTURE_PACKAGE, command: FIXTURE_COMMAND });
    const bad = await api.request('POST', '/v1/environments', { body: { name: 'x', image: 'img:1', harness: { kind: 'acp', package: 'Not A Name', command: 'x' } } });
    expect(bad.status).toBe(400);
    const plain = await api.post<Json>('/v1/environments', { name: 'plain', image: 'img:1' });
    expect(plain.harness).toBeNull();
  });

  it('maps a turn: plan, thinking, streamed message, a terminal command and a file write, each asked and allowed; the next turn loads the session', async () => {
    const id = await session(SCRIPT([
      { when: { user_contains: 'build' }, then: [{ reply: 'Working on it.' }, { tool: 'run', input: { command: 'echo from-terminal; id -u' } }] },
      { when: { after_tool: 'run' }, then: [{ tool: 'write_file', input: { path: '/workspace/notes/out.txt', content: 'written by the agent' } }] },
      { when: { after_tool: 'write_file' }, then: [{ reply: 'Done: {{tool_result}}' }] },
      { when: { user_contains: 'read' }, then: [{ tool: 'read_file', input: { path: 'notes/out.txt' } }] },
      { when: { after_tool: 'read_file' }, then: [{ reply: 'File says: {{tool_result}}' }] },
    ]));
    await api.post(`/v1/sessions/${id}/events`, msg('build it'));
    const first = await until(id, (e) => idleCount(e) >= 1);
    expect(first.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    const types = agentEvents(first).map((e) => e.type);
    expect(types[0]).toBe('agent.plan');
    expect(types).toContain('agent.thinking');
    const uses = first.filter((e) => e.type === 'agent.tool_use');
    expect(uses.map((e) => e.payload.name)).toEqual(['bash', 'edit']);
    expect(uses[0]?.payload).toMatchObject({ blocking: false, input: { command: 'echo from-terminal; id -u' } });
    expect(String(uses[0]?.payload.id)).toMatch(/^toolu_/);
    const results = first.filter((e) => e.type === 'agent.tool_result');
    expect(results.map((e) => e.payload.tool_use_id)).toEqual(uses.map((e) => e.payload.id));
    expect(String(results[0]?.payload.content)).toContain('from-terminal\n10001');
    expect(results.every((e) => e.payload.is_error === false)).toBe(true);
    const messages = first.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload));
    expect(messages[0]).toContain('Working on it.');
    expect(messages.at(-1)).toContain('Done: wrote /workspace/notes/out.txt');
    expect(first.filter((e) => e.type === 'agent.plan').at(-1)?.payload).toEqual({ entries: [{ content: 'Answer the message', priority: 'high', status: 'completed' }] });

    await api.post(`/v1/sessions/${id}/events`, msg('read it back'));
    const all = await until(id, (e) => idleCount(e) >= 2);
    expect(JSON.stringify(all.filter((e) => e.type === 'agent.message').at(-1)?.payload)).toContain('File says: written by the agent');
    // session/load replays the history: none of it reappears in the log.
    expect(all.filter((e) => e.type === 'agent.message' && JSON.stringify(e.payload).includes('Working on it.'))).toHaveLength(1);
    const seqs = all.map((e) => e.seq);
    expect(new Set(seqs).size).toBe(seqs.length);

    const sess = await api.get<{ usage: { input_tokens: number; output_tokens: number } }>(`/v1/sessions/${id}`);
    expect(sess.usage.input_tokens).toBeGreaterThan(0);
    expect(sess.usage.output_tokens).toBeGreaterThan(0);
    expect((await runsOf(id)).map((r) => r.status)).toEqual(['succeeded', 'succeeded']);
  });

  it('the OpenAI-compatible endpoint serves the same agent', async () => {
    const id = await session(SCRIPT([
      { when: { user_contains: 'openai' }, then: [{ tool: 'run', input: { command: 'echo via-openai' } }] },
      { when: { after_tool: 'run' }, then: [{ reply: 'OpenAI path: {{tool_result}}' }] },
    ]));
    await api.post(`/v1/sessions/${id}/events`, msg('use openai'));
    const evs = await until(id, (e) => idleCount(e) >= 1);
    expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message').at(-1)?.payload)).toContain('OpenAI path: via-openai');
  });

  it("the Session's MCP servers reach the agent through the sandbox loopback and the runtime MCP endpoint", async () => {
    const upstream = await startMcpUpstream();
    try {
      await api.post('/v1/connections', { name: 'upstream-acp', url: upstream.url });
      const id = await session(SCRIPT([]));
      await api.post(`/v1/sessions/${id}`, { agent: { mcp_servers: [{ name: 'ext', type: 'url', url: upstream.url, permission: 'always_allow' }] } });
      await api.post(`/v1/sessions/${id}/events`, msg('mcp echo through the loopback'));
      const evs = await until(id, (e) => idleCount(e) >= 1);
      expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message').at(-1)?.payload)).toContain('MCP said: echo: through the loopback');
    } finally {
      await upstream.close();
    }
  });

  it("an MCP call under require_approval is held until approved; the runtime endpoint then finds this Run's approval of the very call", async () => {
    const upstream = await startMcpUpstream();
    try {
      const conn = await api.post<{ id: string }>('/v1/connections', { name: 'upstream-acp-approval', url: upstream.url });
      const rule = (await api.post<{ id: string }>('/v1/action-policies', { effect: 'require_approval', tool: { kind: 'mcp', name: 'echo', connection_id: conn.id } })).id;
      try {
        const id = await session(SCRIPT([]));
        await api.post(`/v1/sessions/${id}`, { agent: { mcp_servers: [{ name: 'ext', type: 'url', url: upstream.url, permission: 'always_allow' }] } });
        await api.post(`/v1/sessions/${id}/events`, msg('mcp echo through the loopback'));
        const asked = await until(id, (e) => e.some((x) => x.type === 'session.action_approval_requested'));
        const approvalId = String(asked.find((x) => x.type === 'session.action_approval_requested')?.payload.approval_id);
        await api.post(`/v1/action-approvals/${approvalId}/approve`, { reason: 'fine' });
        const evs = await until(id, (e) => idleCount(e) >= 1);
        expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message').at(-1)?.payload)).toContain('MCP said: echo: through the loopback');
        const audit = await api.post<{ data: Array<{ action: string; outcome: string }> }>('/v1/audit/export', { target: conn.id, action: 'connections.runtimeCallTool:echo' });
        expect(audit.data.map((r) => r.outcome)).toEqual(['succeeded']);
      } finally {
        await api.request('DELETE', `/v1/action-policies/${rule}`);
      }
    } finally {
      await upstream.close();
    }
  });

  it('a permission request denied by an ActionPolicy is refused: the command never runs, the agent is told', async () => {
    const rule = (await api.post<{ id: string }>('/v1/action-policies', { effect: 'deny', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'touch' }, description: 'no touching' })).id;
    try {
      const id = await session(SCRIPT([
        { when: { user_contains: 'touch' }, then: [{ tool: 'run', input: { command: 'touch /workspace/denied-marker' } }] },
        { when: { user_contains: 'list' }, then: [{ tool: 'run', input: { command: 'ls -a /workspace; echo listed' } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'Tool said: {{tool_result}}' }] },
      ]));
      await api.post(`/v1/sessions/${id}/events`, msg('touch the marker'));
      const first = await until(id, (e) => idleCount(e) >= 1);
      const result = first.find((e) => e.type === 'agent.tool_result');
      expect(result?.payload).toMatchObject({ is_error: true, denied: true, policy_rule_id: rule });
      expect(String(result?.payload.content)).toContain(`refused by the workspace's ActionPolicy ${rule}`);
      expect(first.filter((e) => e.type === 'agent.tool_result')).toHaveLength(1);
      expect(JSON.stringify(first.filter((e) => e.type === 'agent.message').at(-1)?.payload)).toContain('Tool said: permission denied');

      await api.post(`/v1/sessions/${id}/events`, msg('list the workspace'));
      const second = await until(id, (e) => idleCount(e) >= 2);
      const listing = String(second.filter((e) => e.type === 'agent.tool_result').at(-1)?.payload.content);
      expect(listing).toContain('listed');
      expect(listing).not.toContain('denied-marker');
      const audit = await api.post<{ data: Array<{ outcome: string; detail: string }> }>('/v1/audit/export', { target: id, action: 'policy.builtin:bash' });
      expect(audit.data).toEqual(expect.arrayContaining([expect.objectContaining({ outcome: 'denied', detail: rule })]));
    } finally {
      await api.request('DELETE', `/v1/action-policies/${rule}`);
    }
  });

  it('a require_approval policy holds the permission request open until the ActionApproval is approved', async () => {
    const rule = (await api.post<{ id: string }>('/v1/action-policies', { effect: 'require_approval', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'echo approved' } })).id;
    try {
      const id = await session(SCRIPT([
        { when: { user_contains: 'deploy' }, then: [{ tool: 'run', input: { command: 'echo approved run' } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'Ran: {{tool_result}}' }] },
      ]));
      await api.post(`/v1/sessions/${id}/events`, msg('deploy it'));
      const asked = await until(id, (e) => e.some((x) => x.type === 'session.action_approval_requested'));
      const approvalId = String(asked.find((x) => x.type === 'session.action_approval_requested')?.payload.approval_id);
      expect(asked.some((x) => x.type === 'agent.tool_result')).toBe(false);
      await api.post(`/v1/action-approvals/${approvalId}/approve`, { reason: 'fine' });
      const evs = await until(id, (e) => idleCount(e) >= 1);
      const result = evs.find((e) => e.type === 'agent.tool_result');
      // The command ran only after the approval was resolved.
      expect(evs.indexOf(result as TurnEvent)).toBeGreaterThan(evs.findIndex((e) => e.type === 'session.action_approval_resolved'));
      expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
      expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message').at(-1)?.payload)).toContain('Ran: approved run');
    } finally {
      await api.request('DELETE', `/v1/action-policies/${rule}`);
    }
  });

  it('user.interrupt mid-prompt cancels the agent within bounded time; the sandbox takes the next turn', async () => {
    const id = await session(SCRIPT([
      { when: { user_contains: 'sleep' }, then: [{ tool: 'run', input: { command: 'sleep 600' } }] },
      { when: { user_contains: 'check' }, then: [{ tool: 'run', input: { command: 'ps -eo args | grep -c "^sleep 600" || true' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'sleepers: {{tool_result}}' }] },
    ]));
    await api.post(`/v1/sessions/${id}/events`, msg('sleep please'));
    await until(id, (e) => e.some((x) => x.type === 'agent.tool_use'));
    const started = Date.now();
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } });
    const evs = await until(id, (e) => idleCount(e) >= 1);
    expect(Date.now() - started).toBeLessThan(15_000);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'interrupted' });
    expect(evs.find((e) => e.type === 'agent.tool_result')?.payload).toMatchObject({ is_error: true });

    await api.post(`/v1/sessions/${id}/events`, msg('check'));
    const after = await until(id, (e) => idleCount(e) >= 2);
    expect(String(after.filter((e) => e.type === 'agent.tool_result').at(-1)?.payload.content)).toMatch(/^0\n/);
  });

  it('an agent that crashes mid-turn fails the turn cleanly; the sandbox survives for the next turn', async () => {
    const id = await session(SCRIPT([
      { when: { user_contains: 'save' }, then: [{ tool: 'write_file', input: { path: '/workspace/kept.txt', content: 'survives' } }] },
      { when: { user_contains: 'show' }, then: [{ tool: 'run', input: { command: 'cat /workspace/kept.txt' } }] },
      { when: { on: 'tool_result' }, then: [{ reply: 'Got: {{tool_result}}' }] },
    ]));
    await api.post(`/v1/sessions/${id}/events`, msg('save it'));
    await until(id, (e) => idleCount(e) >= 1);
    await api.post(`/v1/sessions/${id}/events`, msg('crash now'));
    const crashed = await until(id, (e) => idleCount(e) >= 2);
    const stop = crashed.filter((x) => x.type === 'session.status_idle')[1]?.payload.stop_reason as Json;
    expect(stop).toMatchObject({ type: 'error' });
    expect(JSON.stringify(stop)).toContain('exited with code 7');
    expect((await runsOf(id)).map((r) => r.status).sort()).toEqual(['failed', 'succeeded']);

    await api.post(`/v1/sessions/${id}/events`, msg('show it'));
    const after = await until(id, (e) => idleCount(e) >= 3);
    expect(JSON.stringify(after.filter((e) => e.type === 'agent.message').at(-1)?.payload)).toContain('Got: survives');
  });
});
