import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { RedisRuntimeBearers, type RuntimeGrant } from '@agentplane/domain';
import { LeaseFence } from '@agentplane/lease';
import { connectRedis, type Redis } from '@agentplane/store';
import { startPlatform, type Platform } from './harness/platform.js';
import { cardJson, signCard, signingKey, startSdkPeer, type SdkPeer } from './harness/a2a-peer.js';

/**
 * `POST /v1/runtime/toolsource/{tool_source_id}` with a runtime bearer used directly, without the
 * runner's `tool.check` first (a leaked bearer, a harness that does not ask): the endpoint decides
 * the Workspace's ActionPolicies itself, and then asks for the confirmation every tool of a source
 * needs (always_ask), so a call refused by either never reaches the peer, and every call is one
 * audit record as the Run. (A confirmed use reaching the peer: runtime-tool-confirmation.test.ts.)
 */
let p: Platform;
let peer: SdkPeer;
let redis: Redis;
let sourceId: string;
let sessionId: string;
let threadId: string;

beforeAll(async () => {
  const key = await signingKey('k1');
  [p, peer] = await Promise.all([startPlatform({ env: { AGENTPLANE_MODE: 'development' } }), startSdkPeer(undefined, { instant: true })]);
  redis = connectRedis(p.redisUrl(), { name: 'test' });
  peer.card = await signCard(cardJson(peer.rpcUrl), key);
  await p.root.post('/v1/provider-packages', { name: 'peer', package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
  sourceId = (await p.root.post<{ id: string }>('/v1/tool-sources', { name: 'peer', provider: 'peer', source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] } })).id;
  expect((await p.root.post<{ sync: { state: string } }>(`/v1/tool-sources/${sourceId}/sync`, {})).sync.state).toBe('synced');
  const envId = (await p.root.post<{ id: string }>('/v1/environments', { name: 'a2a-env', image: 'agentplane/sandbox:1' })).id;
  const agentId = (await p.root.post<{ id: string }>('/v1/agents', { name: 'a2a-agent', model: 'default', mcp_servers: [{ name: 'peer', type: 'a2a_tool_source', tool_source_id: sourceId }] })).id;
  sessionId = (await p.root.post<{ id: string }>('/v1/sessions', { agent: agentId, environment_id: envId })).id;
  threadId = (await p.root.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]!.id;
}, 120_000);
afterAll(async () => {
  await redis?.quit();
  await Promise.all([p?.stop(), peer?.close()]);
});

/** A live lease on the Session (its fence held, as the lease work holds it) and a runtime bearer for it. */
async function leasedBearer(run: string): Promise<{ grant: RuntimeGrant; bearer: string }> {
  const leaseId = `lease-${run}`;
  await new LeaseFence(redis).claim({ sessionId, token: leaseId, runnerId: 'runner_test', attempt: 1, runId: run }, 60_000);
  const grant: RuntimeGrant = {
    run_id: run, session_id: sessionId, session_thread_id: threadId, workspace_id: p.bootstrap.workspace_id, organization_id: p.bootstrap.organization_id,
    lease_id: leaseId, expires_at: new Date(Date.now() + 120_000).toISOString(), connections: {}, tool_sources: [sourceId],
  };
  return { grant, bearer: await new RedisRuntimeBearers(redis).mint(grant) };
}

const sends = () => peer.calls.filter((c) => c.method === 'SendMessage' || c.method === 'SendStreamingMessage').length;
const text = (r: { content: unknown }) => (r.content as { text: string }[])[0]?.text ?? '';
const wire = (r: { content: unknown }) => (JSON.parse(text(r)) as { error?: { type: string; message: string } }).error;

describe('/v1/runtime/toolsource/{tool_source_id}', () => {
  it("decides the Workspace's ActionPolicies itself, then the confirmation: a refused call never reaches the peer, and every call is audited as the Run", async () => {
    const { grant, bearer } = await leasedBearer(`run_${'e'.repeat(32)}`);
    // Rules name the tool source as their connection_id, and the tool by its own name (or a glob).
    const deny = (await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'deny', tool: { kind: 'mcp', name: 'a2a_peer_translate', connection_id: sourceId } })).id;
    const gate = (await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'require_approval', tool: { kind: 'mcp', name: 'a2a_peer_sum*', connection_id: sourceId } })).id;
    const client = new Client({ name: 'harness', version: '1.0.0' });
    await client.connect(new StreamableHTTPClientTransport(new URL(`${p.baseUrl}/v1/runtime/toolsource/${sourceId}`), { requestInit: { headers: { Authorization: `Bearer ${bearer}` } } }));
    const call = (name: string, toolUseId: string, message: string) => client.callTool({ name, arguments: { text: message }, _meta: { 'dev.agentplane/tool_use_id': toolUseId } });
    let unconfirmed: Awaited<ReturnType<typeof call>>;
    try {
      const before = peer.calls.length;
      const denied = await call('a2a_peer_translate', 'toolu_runtime_denied', 'never sent');
      expect(denied.isError).toBe(true);
      expect(wire(denied)).toMatchObject({ type: 'policy.denied', message: expect.stringContaining(deny) });
      // Naming a tool use is not an approval: no approved ActionApproval covers the call.
      const held = await call('a2a_peer_summarize', 'toolu_runtime_unapproved', 'never sent either');
      expect(held.isError).toBe(true);
      expect(wire(held)).toMatchObject({ type: 'policy.denied', message: expect.stringContaining(gate) });
      expect(peer.calls.length).toBe(before);
      await p.root.request('DELETE', `/v1/action-policies/${gate}`);
      // The ActionPolicies allow it now, but the tool is always_ask and no user.tool_confirmation allowed this use.
      unconfirmed = await call('a2a_peer_summarize', 'toolu_runtime_allowed', 'the report');
    } finally {
      await client.close();
      for (const id of [deny, gate]) await p.root.request('DELETE', `/v1/action-policies/${id}`);
    }
    expect(unconfirmed.isError).toBe(true);
    expect(wire(unconfirmed)).toMatchObject({ type: 'policy.denied', message: expect.stringContaining('always_ask') });
    expect(sends()).toBe(0);
    const events = (await p.root.get<{ data: { type: string; payload: { tool_use_id: string; status: string } }[] }>(`/v1/sessions/${sessionId}/threads/${threadId}/events`, { limit: 1000 })).data;
    expect(events.filter((e) => e.type === 'exec.tool_invocation')).toEqual([]);

    type Row = { action: string; target: string | null; outcome: string; status: number | null; detail: string | null; actor: { id: string; credential_id: string | null }; request_id: string | null };
    const calls = (await p.root.post<{ data: Row[] }>('/v1/audit/export', { target: sourceId, limit: 1000 })).data.filter((r) => r.actor.id === grant.run_id);
    expect(calls.map((r) => [r.action, r.outcome, r.status, r.detail])).toEqual([
      ['toolSources.runtimeCallTool:a2a_peer_translate', 'denied', 403, 'policy.denied'],
      ['toolSources.runtimeCallTool:a2a_peer_summarize', 'denied', 403, 'policy.denied'],
      ['toolSources.runtimeCallTool:a2a_peer_summarize', 'denied', 403, 'policy.denied'],
    ]);
    expect(calls.every((r) => r.actor.credential_id === null && typeof r.request_id === 'string')).toBe(true);
    // Each decision a rule made is one too, on the Session, as the Run.
    const decisions = (await p.root.post<{ data: Row[] }>('/v1/audit/export', { target: sessionId, limit: 1000 })).data.filter((r) => r.action.startsWith('policy.'));
    expect(decisions.map((r) => [r.action, r.outcome, r.detail, r.actor.id])).toEqual([
      ['policy.mcp:a2a_peer_translate', 'denied', deny, grant.run_id],
      ['policy.mcp:a2a_peer_summarize', 'requested', gate, grant.run_id],
    ]);
  });
});
