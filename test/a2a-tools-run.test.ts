import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import type { Platform } from './harness/platform.js';
import { signCard, cardJson, signingKey, startSdkPeer, type SdkPeer } from './harness/a2a-peer.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnEvent, type TurnPlatform } from './harness/turns.js';

/**
 * A synced A2A tool source attached to an agent: its skill is an always-ask tool of the Run. The
 * harness asks through `user.tool_confirmation`; allowed, the peer is called once and the turn
 * gets its text; denied, the peer is never called.
 */
let p: Platform;
let api: HttpClient;
let principal: string;
let envId: string;
let msg: TurnPlatform['msg'];
let peer: SdkPeer;
let sourceId: string;

beforeAll(async () => {
  const key = await signingKey('k1');
  [{ p, api, principal, envId, msg }, peer] = await Promise.all([
    startTurnPlatform({ name: 'a2a-tools-run', env: { AGENTPLANE_MODE: 'development' } }),
    startSdkPeer(undefined, { instant: true }),
  ]);
  peer.card = await signCard(cardJson(peer.rpcUrl), key);
  await p.root.post('/v1/provider-packages', { name: 'peer', package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
  sourceId = (await p.root.post<{ id: string }>('/v1/tool-sources', { name: 'peer', provider: 'peer', source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] } })).id;
  const synced = await p.root.post<{ sync: { state: string } }>(`/v1/tool-sources/${sourceId}/sync`, {});
  expect(synced.sync.state).toBe('synced');
}, 180_000);
afterAll(async () => {
  await Promise.all([p?.stop(), peer?.close()]);
});

const sends = () => peer.calls.filter((c) => c.method === 'SendMessage' || c.method === 'SendStreamingMessage').length;

async function session(environment = envId, vaultIds: string[] = []): Promise<string> {
  return (await api.post<{ id: string }>('/v1/sessions', {
    agent: {
      name: 'a2a-user', model: 'default', tools: [],
      system: SCRIPT([
        { when: { user_contains: 'summarize' }, then: [{ tool: 'peer__a2a_peer_summarize', input: { text: 'the quarterly report' } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'Peer said: {{tool_result}}' }] },
      ]),
      mcp_servers: [{ name: 'peer', type: 'a2a_tool_source', tool_source_id: sourceId }],
    },
    environment_id: environment, ...(vaultIds.length > 0 ? { vault_ids: vaultIds } : {}),
  })).id;
}

describe('A2A tool sources in Runs', () => {
  it('stops with requires_action; allow calls the peer once with one exec.tool_invocation; deny never calls it', async () => {
    // The peer's credential comes from the Session's vault, matched by the JSON-RPC URL.
    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'peer-creds' })).id;
    await p.root.request('PUT', `/v1/vaults/${vault}/secrets/peer`, { body: { kind: 'mcp_bearer', match: peer.rpcUrl, value: 'peer-token-from-vault' } });
    const id = await session(envId, [vault]);
    const agent = await api.get<{ agent: { mcp_servers: unknown[] } }>(`/v1/sessions/${id}`);
    expect(agent.agent.mcp_servers).toEqual([{ name: 'peer', type: 'a2a_tool_source', tool_source_id: sourceId, permission: 'always_ask' }]);
    const answer = (toolUseId: string, result: 'allow' | 'deny') => api.post(`/v1/sessions/${id}/events`, {
      type: 'user.tool_confirmation', payload: { tool_use_id: toolUseId, result, authored_by: principal, caused_by: { kind: 'api' } },
    });
    const uses = (events: TurnEvent[]) => events.filter((e) => e.type === 'agent.tool_use');

    await api.post(`/v1/sessions/${id}/events`, msg('summarize please'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    expect(first.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'requires_action' });
    const use = uses(first).at(-1);
    expect(use?.payload).toMatchObject({ name: 'peer__a2a_peer_summarize', blocking: true });
    expect(sends()).toBe(0);

    await answer(String(use?.payload.id), 'allow');
    const allowed = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    const result = allowed.filter((e) => e.type === 'agent.tool_result').at(-1);
    expect(result?.payload).toMatchObject({ is_error: false });
    expect(JSON.stringify(result?.payload.content)).toContain('done: the quarterly report');
    expect(sends()).toBe(1);
    expect(peer.calls.find((c) => c.method === 'SendMessage' || c.method === 'SendStreamingMessage')?.authorization).toBe('Bearer peer-token-from-vault');
    const invocations = allowed.filter((e) => e.type === 'exec.tool_invocation');
    expect(invocations).toHaveLength(1);
    expect(invocations[0]?.payload).toMatchObject({ tool_use_id: use?.payload.id, tool_source_id: sourceId, tool: 'a2a_peer_summarize', status: 'completed' });
    // On the calling Run's thread (the Session's primary thread here).
    const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${id}/threads`)).data[0]?.id;
    expect(thread).toMatch(/^sthr_/);
    expect(invocations[0]?.session_thread_id).toBe(thread);
    // The call to the peer is in the audit log, as the Run, target the tool source.
    const audit = await p.root.post<{ data: { outcome: string; status: number | null; actor: { id: string; credential_id: string | null } }[] }>('/v1/audit/export', { action: 'toolSources.runtimeCallTool:a2a_peer_summarize', target: sourceId });
    expect(audit.data.map((r) => [r.outcome, r.status, r.actor.credential_id])).toEqual([['succeeded', 200, null]]);
    expect(audit.data[0]?.actor.id).toMatch(/^run_/);

    await api.post(`/v1/sessions/${id}/events`, msg('summarize again'));
    const again = await untilEvents(api, id, (e) => idleCount(e) >= 3);
    const second = uses(again).at(-1);
    expect(second?.payload.id).not.toBe(use?.payload.id);
    await answer(String(second?.payload.id), 'deny');
    const denied = await untilEvents(api, id, (e) => idleCount(e) >= 4);
    expect(sends()).toBe(1);
    expect(denied.filter((e) => e.type === 'exec.tool_invocation')).toHaveLength(1);
  });

  it('colocated topology: allow calls the peer once through the runner, with one exec.tool_invocation', async () => {
    const colocated = (await api.post<{ id: string }>('/v1/environments', {
      name: 'colocated-a2a', image: 'agentplane/sandbox:latest', harness_topology: 'colocated',
      resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    })).id;
    const id = await session(colocated);
    const before = sends();
    await api.post(`/v1/sessions/${id}/events`, msg('summarize please'));
    const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
    expect(first.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'requires_action' });
    const use = first.filter((e) => e.type === 'agent.tool_use').at(-1);
    expect(sends()).toBe(before);
    await api.post(`/v1/sessions/${id}/events`, {
      type: 'user.tool_confirmation', payload: { tool_use_id: String(use?.payload.id), result: 'allow', authored_by: principal, caused_by: { kind: 'api' } },
    });
    const allowed = await untilEvents(api, id, (e) => idleCount(e) >= 2);
    expect(JSON.stringify(allowed.filter((e) => e.type === 'agent.tool_result').at(-1)?.payload.content)).toContain('done: the quarterly report');
    expect(sends()).toBe(before + 1);
    expect(allowed.filter((e) => e.type === 'exec.tool_invocation')).toHaveLength(1);
  });

  it('under a require_approval rule naming the tool source: approved, then confirmed, the call passes the endpoint\'s own check and reaches the peer once', async () => {
    const rule = (await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'require_approval', tool: { kind: 'mcp', name: 'a2a_peer_summarize', connection_id: sourceId } })).id;
    try {
      const id = await session();
      const before = sends();
      await api.post(`/v1/sessions/${id}/events`, msg('summarize please'));
      const first = await untilEvents(api, id, (e) => idleCount(e) >= 1);
      const approval = String(first.find((e) => e.type === 'session.action_approval_requested')?.payload.approval_id);
      const use = String(first.filter((e) => e.type === 'agent.tool_use').at(-1)?.payload.id);
      expect((await p.root.request('POST', `/v1/action-approvals/${approval}/approve`, { body: {} })).status).toBe(200);
      // Approved, the always-ask use still waits for its confirmation; nothing has reached the peer.
      await untilEvents(api, id, (e) => idleCount(e) >= 2);
      expect(sends()).toBe(before);
      await api.post(`/v1/sessions/${id}/events`, {
        type: 'user.tool_confirmation', payload: { tool_use_id: use, result: 'allow', authored_by: principal, caused_by: { kind: 'api' } },
      });
      const done = await untilEvents(api, id, (e) => idleCount(e) >= 3);
      expect(JSON.stringify(done.filter((e) => e.type === 'agent.tool_result').at(-1)?.payload.content)).toContain('done: the quarterly report');
      expect(sends()).toBe(before + 1);
      expect(done.filter((e) => e.type === 'exec.tool_invocation')).toHaveLength(1);
    } finally {
      await p.root.request('DELETE', `/v1/action-policies/${rule}`);
    }
  });

  it('passes the ActionPolicy gate: a deny naming the tool source refuses the call before any confirmation', async () => {
    const rule = (await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'deny', tool: { kind: 'mcp', name: 'a2a_peer_*', connection_id: sourceId } })).id;
    try {
      const id = await session();
      const before = sends();
      await api.post(`/v1/sessions/${id}/events`, msg('summarize please'));
      const evs = await untilEvents(api, id, (e) => idleCount(e) >= 1);
      expect(evs.filter((e) => e.type === 'agent.tool_result').at(-1)?.payload).toMatchObject({ is_error: true, denied: true, policy_rule_id: rule });
      expect(sends()).toBe(before);
      expect(evs.filter((e) => e.type === 'exec.tool_invocation')).toHaveLength(0);
    } finally {
      await p.root.request('DELETE', `/v1/action-policies/${rule}`);
    }
  });
});
