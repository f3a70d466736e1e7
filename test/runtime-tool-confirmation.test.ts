import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WebSocket } from 'ws';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import type { HttpClient } from '@agentplane/client';
import { frame, MODEL_GATEWAY_PROTOCOL } from '@agentplane/protocol';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { connectRawRunner, dockerHello, pairedRunnerSecret, type RawRunner, type RunnerFrame } from './harness/raw-runner.js';
import { developerWorkspace, idleCount, untilEvents } from './harness/turns.js';
import { startMcpUpstream, type McpUpstream } from './harness/mcp-upstream.js';
import { cardJson, signCard, signingKey, startSdkPeer, type SdkPeer } from './harness/a2a-peer.js';

/**
 * The Agent's own permission policy at the runtime endpoints: a tool that is `always_ask` (a
 * Connection's tools under an `always_ask` server, every tool of an A2A tool source) runs only
 * for a tool use the Session confirmed with `user.tool_confirmation` (allow), named in
 * `_meta["dev.agentplane/tool_use_id"]`, for that very tool and arguments. The runtime bearer here
 * is the one the scheduler minted for each lease (a protocol client written here plays the
 * runner, so the bearer is used directly, as a leaked one would be): without a confirmation the
 * call is refused with 403 `policy.denied` and neither the upstream nor the peer hears of it.
 */
let p: Platform;
let api: HttpClient;
let principal = '';
let envId = '';
let upstream: McpUpstream;
let peer: SdkPeer;
let connectionId = '';
let sourceId = '';
const sockets: WebSocket[] = [];

type Frame = RunnerFrame<Record<string, unknown>>;
interface Lease { ref: { lease_id: string; attempt: number }; runId: string; bearer: string }

beforeAll(async () => {
  const key = await signingKey('k1');
  [p, upstream, peer] = await Promise.all([
    // The upstream and the peer listen on loopback: reachable in development mode only.
    startPlatform({ scheduler: true, runner: false, env: { AGENTPLANE_MODE: 'development', LOG_LEVEL: 'warn', OFFER_TIMEOUT_MS: '10000' } }),
    startMcpUpstream({ tools: [{ name: 'deploy', description: 'Deploys', reply: 'deployed' }] }),
    startSdkPeer(undefined, { instant: true }),
  ]);
  ({ api, principal, envId } = await developerWorkspace(p, 'runtime-confirmation'));
  connectionId = (await p.root.post<{ id: string }>('/v1/connections', { name: 'ops', url: upstream.url })).id;
  peer.card = await signCard(cardJson(peer.rpcUrl), key);
  await p.root.post('/v1/provider-packages', { name: 'peer', package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
  sourceId = (await p.root.post<{ id: string }>('/v1/tool-sources', { name: 'peer', provider: 'peer', source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] } })).id;
  expect((await p.root.post<{ sync: { state: string } }>(`/v1/tool-sources/${sourceId}/sync`, {})).sync.state).toBe('synced');
}, 120_000);

afterAll(async () => {
  for (const s of sockets) s.terminate();
  await Promise.all([p?.stop(), upstream?.close(), peer?.close()]);
});

const nextFrame = (r: RawRunner<Frame>, type: string, after = 0): Promise<Frame> =>
  waitFor(type, () => r.frames.slice(after).find((f) => f.type === type), 15_000);

/** Takes the next offer: accepted, and running once the Run says so; its spec's runtime bearer. */
async function takeOffer(r: RawRunner<Frame>, after: number): Promise<Lease> {
  const offer = await nextFrame(r, 'lease.offer', after);
  const spec = offer.payload.spec as { runtime_mcp?: { bearer: string } };
  expect(spec.runtime_mcp?.bearer).toMatch(/^ap_rt_/);
  const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
  const runId = String(offer.payload.run_id);
  r.sock.send(frame('lease.accept', `a-${runId}`, ref));
  await waitFor('the Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status === 'running' ? true : undefined), 10_000);
  return { ref, runId, bearer: spec.runtime_mcp?.bearer ?? '' };
}

/** A tools/call on a runtime endpoint with the lease's bearer, naming `toolUseId` when given. */
async function callTool(path: string, bearer: string, name: string, args: Record<string, unknown>, toolUseId?: string): Promise<{ isError: boolean; text: string }> {
  const client = new Client({ name: 'harness', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`${p.baseUrl}${path}`), { requestInit: { headers: { Authorization: `Bearer ${bearer}` } } }));
  try {
    const r = await client.callTool({ name, arguments: args, ...(toolUseId ? { _meta: { 'dev.agentplane/tool_use_id': toolUseId } } : {}) });
    return { isError: r.isError === true, text: (r.content as { text: string }[])[0]?.text ?? '' };
  } finally {
    await client.close();
  }
}

const errorType = (r: { text: string }): string | undefined => (JSON.parse(r.text) as { error?: { type: string } }).error?.type;
const sends = () => peer.calls.filter((c) => c.method === 'SendMessage' || c.method === 'SendStreamingMessage').length;

describe('always_ask tools at the runtime endpoints', () => {
  it('run only for a use confirmed with allow, for that tool and its arguments; the upstream and the peer hear of nothing else', async () => {
    const r = await connectRawRunner<Frame>(p, await pairedRunnerSecret(p, principal, 'confirming-runner'), dockerHello([MODEL_GATEWAY_PROTOCOL], { slots: 4 }));
    sockets.push(r.sock);
    const sessionId = (await api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'asker', model: 'default',
        mcp_servers: [
          { name: 'ops', type: 'url', url: upstream.url, permission: 'always_ask' },
          { name: 'peer', type: 'a2a_tool_source', tool_source_id: sourceId },
        ],
      },
      environment_id: envId,
    })).id;
    await api.post(`/v1/sessions/${sessionId}/events`, { type: 'user.message', payload: { content: 'ship it', authored_by: principal, caused_by: { kind: 'api' } } });
    const mcp = `/v1/runtime/mcp/${connectionId}`;
    const a2a = `/v1/runtime/toolsource/${sourceId}`;
    const [deployUse, echoUse, deniedUse, peerUse] = ['toolu_deploy01', 'toolu_echo01', 'toolu_deploy02', 'toolu_peer01'];

    // The first Run asks for four uses of always_ask tools.
    const first = await takeOffer(r, 0);
    const uses = [
      { id: deployUse, name: 'ops__deploy', input: {} },
      { id: echoUse, name: 'ops__echo', input: { text: 'hi' } },
      { id: deniedUse, name: 'ops__deploy', input: { target: 'prod' } },
      { id: peerUse, name: 'peer__a2a_peer_summarize', input: { text: 'the report' } },
    ];
    const acked = r.frames.length;
    r.sock.send(frame('events.batch', 'b1', {
      ...first.ref, session_id: sessionId,
      events: uses.map((u, i) => ({ producer_key: `${first.ref.lease_id}:${i}`, type: 'agent.tool_use', payload: { ...u, blocking: true, awaiting: 'tool_confirmation' } })),
    }));
    await nextFrame(r, 'events.ack', acked);
    const before = upstream.calls.length;
    // Not confirmed yet: neither named nor unnamed, the call is refused before the upstream or the peer.
    for (const refused of [
      await callTool(mcp, first.bearer, 'deploy', {}, deployUse),
      await callTool(mcp, first.bearer, 'deploy', {}),
      await callTool(a2a, first.bearer, 'a2a_peer_summarize', { text: 'the report' }, peerUse),
    ]) {
      expect(refused.isError).toBe(true);
      expect(errorType(refused)).toBe('policy.denied');
    }
    expect(upstream.calls.length).toBe(before);
    expect(sends()).toBe(0);

    r.sock.send(frame('lease.complete', 'c1', {
      ...first.ref, result: { stop_reason: { type: 'requires_action', tool_use_ids: uses.map((u) => u.id) }, waits: uses.map((u) => ({ tool_use_id: u.id, kind: 'confirmation' })) },
    }));
    await untilEvents(api, sessionId, (e) => idleCount(e) >= 1, 15_000);
    const offered = r.frames.length;
    for (const [id, result] of [[deployUse, 'allow'], [echoUse, 'allow'], [deniedUse, 'deny'], [peerUse, 'allow']] as const) {
      await api.post(`/v1/sessions/${sessionId}/events`, { type: 'user.tool_confirmation', payload: { tool_use_id: id, result, authored_by: principal, caused_by: { kind: 'api' } } });
    }

    // The Run that continues after the answers: its bearer gets only what was confirmed.
    const second = await takeOffer(r, offered);
    for (const refused of [
      // No use named.
      await callTool(mcp, second.bearer, 'deploy', {}),
      // A use nobody confirmed.
      await callTool(mcp, second.bearer, 'deploy', {}, 'toolu_never01'),
      // A use whose confirmation said deny.
      await callTool(mcp, second.bearer, 'deploy', { target: 'prod' }, deniedUse),
      // Another use's confirmation (of another tool) does not count.
      await callTool(mcp, second.bearer, 'deploy', {}, echoUse),
      // Nor does this use's with other arguments.
      await callTool(mcp, second.bearer, 'deploy', { target: 'prod' }, deployUse),
      // On the tool source: a confirmed use of another skill.
      await callTool(a2a, second.bearer, 'a2a_peer_translate', { text: 'the report' }, peerUse),
    ]) {
      expect(refused.isError).toBe(true);
      expect(errorType(refused)).toBe('policy.denied');
    }
    expect(upstream.calls.length).toBe(before);
    expect(sends()).toBe(0);

    // The confirmed uses run, each once.
    expect(await callTool(mcp, second.bearer, 'deploy', {}, deployUse)).toEqual({ isError: false, text: 'deployed' });
    expect(await callTool(mcp, second.bearer, 'echo', { text: 'hi' }, echoUse)).toEqual({ isError: false, text: 'echo: hi' });
    expect(await callTool(a2a, second.bearer, 'a2a_peer_summarize', { text: 'the report' }, peerUse)).toEqual({ isError: false, text: 'done: the report' });
    expect(sends()).toBe(1);

    // Every call is one audit record as its Run: each refusal denied, each confirmed use succeeded once.
    type Row = { action: string; outcome: string; status: number | null; detail: string | null; actor: { id: string } };
    const rows = async (target: string, runId: string) => (await p.root.post<{ data: Row[] }>('/v1/audit/export', { target, limit: 1000 })).data
      .filter((x) => x.actor.id === runId).map((x) => [x.action, x.outcome, x.status, x.detail]);
    const denied = (tool: string) => [`connections.runtimeCallTool:${tool}`, 'denied', 403, 'policy.denied'];
    expect(await rows(connectionId, first.runId)).toEqual([denied('deploy'), denied('deploy')]);
    expect(await rows(connectionId, second.runId)).toEqual([
      ...Array.from({ length: 5 }, () => denied('deploy')),
      ['connections.runtimeCallTool:deploy', 'succeeded', 200, null],
      ['connections.runtimeCallTool:echo', 'succeeded', 200, null],
    ]);
    expect(await rows(sourceId, first.runId)).toEqual([['toolSources.runtimeCallTool:a2a_peer_summarize', 'denied', 403, 'policy.denied']]);
    expect(await rows(sourceId, second.runId)).toEqual([
      ['toolSources.runtimeCallTool:a2a_peer_translate', 'denied', 403, 'policy.denied'],
      ['toolSources.runtimeCallTool:a2a_peer_summarize', 'succeeded', 200, null],
    ]);

    r.sock.send(frame('lease.complete', 'c2', { ...second.ref, result: { stop_reason: { type: 'end_turn' } } }));
    await untilEvents(api, sessionId, (e) => idleCount(e) >= 2, 15_000);
  });

  it('an approved ActionApproval covers its use for the Run that continues after it, never for a later Run of the Session', async () => {
    // Offers go to this test's runner only.
    for (const s of sockets.splice(0)) s.terminate();
    const r = await connectRawRunner<Frame>(p, await pairedRunnerSecret(p, principal, 'approving-runner'), dockerHello([MODEL_GATEWAY_PROTOCOL], { slots: 4 }));
    sockets.push(r.sock);
    const rule = (await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'require_approval', tool: { kind: 'mcp', name: 'deploy', connection_id: connectionId } })).id;
    const sessionId = (await api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'approver', model: 'default', mcp_servers: [{ name: 'ops', type: 'url', url: upstream.url, permission: 'always_allow' }] },
      environment_id: envId,
    })).id;
    await api.post(`/v1/sessions/${sessionId}/events`, { type: 'user.message', payload: { content: 'ship it', authored_by: principal, caused_by: { kind: 'api' } } });
    const mcp = `/v1/runtime/mcp/${connectionId}`;
    const use = 'toolu_deploy_approved1';
    const first = await takeOffer(r, 0);
    let at = r.frames.length;
    r.sock.send(frame('tool.check', 'tc1', { ...first.ref, tool_use_id: use, tool: { kind: 'mcp', name: 'deploy', connection_id: connectionId }, input: {} }));
    const decision = await nextFrame(r, 'tool.decision', at);
    expect(decision.payload.decision).toBe('require_approval');
    at = r.frames.length;
    r.sock.send(frame('events.batch', 'b1', { ...first.ref, session_id: sessionId, events: [{ producer_key: `${first.ref.lease_id}:0`, type: 'agent.tool_use', payload: { id: use, name: 'ops__deploy', input: {}, blocking: true, awaiting: 'tool_confirmation' } }] }));
    await nextFrame(r, 'events.ack', at);
    r.sock.send(frame('lease.complete', 'c1', { ...first.ref, result: { stop_reason: { type: 'requires_action', tool_use_ids: [use] }, waits: [{ tool_use_id: use, kind: 'confirmation' }] } }));
    await untilEvents(api, sessionId, (e) => idleCount(e) >= 1, 15_000);
    const approvals = await p.root.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/action-approvals`);
    const offered = r.frames.length;
    await p.root.post(`/v1/action-approvals/${approvals.data[0]?.id ?? ''}/approve`, {});
    const second = await takeOffer(r, offered);
    expect(await callTool(mcp, second.bearer, 'deploy', {}, use)).toEqual({ isError: false, text: 'deployed' });
    r.sock.send(frame('lease.complete', 'c2', { ...second.ref, result: { stop_reason: { type: 'end_turn' } } }));
    await untilEvents(api, sessionId, (e) => idleCount(e) >= 2, 15_000);

    const offered3 = r.frames.length;
    await api.post(`/v1/sessions/${sessionId}/events`, { type: 'user.message', payload: { content: 'anything else?', authored_by: principal, caused_by: { kind: 'api' } } });
    const third = await takeOffer(r, offered3);
    const before = upstream.calls.length;
    // A Run a message started names the approved use again, with the same arguments: refused.
    const replay = await callTool(mcp, third.bearer, 'deploy', {}, use);
    expect(replay.isError).toBe(true);
    expect(errorType(replay)).toBe('policy.denied');
    expect(upstream.calls.length).toBe(before);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
    r.sock.send(frame('lease.complete', 'c3', { ...third.ref, result: { stop_reason: { type: 'end_turn' } } }));
    await untilEvents(api, sessionId, (e) => idleCount(e) >= 3, 15_000);
  }, 90_000);

  it('a confirmed use of a name two tools are offered under covers neither of them', async () => {
    for (const s of sockets.splice(0)) s.terminate();
    // One server whose tools `deploy.prod` and `deploy_prod` are both offered as `ops__deploy_prod`;
    // its `x__y` and the `y` of a server named `ops__x` are both offered as `ops__x__y`.
    const [twins, nested] = await Promise.all([
      startMcpUpstream({ tools: [{ name: 'deploy.prod', description: 'Deploys', reply: 'dotted' }, { name: 'deploy_prod', description: 'Deploys', reply: 'underscored' }, { name: 'x__y', description: 'X', reply: 'x then y' }] }),
      startMcpUpstream({ tools: [{ name: 'y', description: 'Y', reply: 'y alone' }] }),
    ]);
    try {
      const twinsId = (await p.root.post<{ id: string }>('/v1/connections', { name: 'twins', url: twins.url })).id;
      const nestedId = (await p.root.post<{ id: string }>('/v1/connections', { name: 'nested', url: nested.url })).id;
      const r = await connectRawRunner<Frame>(p, await pairedRunnerSecret(p, principal, 'colliding-runner'), dockerHello([MODEL_GATEWAY_PROTOCOL], { slots: 4 }));
      sockets.push(r.sock);
      const sessionId = (await api.post<{ id: string }>('/v1/sessions', {
        agent: {
          name: 'collider', model: 'default',
          mcp_servers: [
            { name: 'ops', type: 'url', url: twins.url, permission: 'always_ask' },
            { name: 'ops__x', type: 'url', url: nested.url, permission: 'always_ask' },
          ],
        },
        environment_id: envId,
      })).id;
      await api.post(`/v1/sessions/${sessionId}/events`, { type: 'user.message', payload: { content: 'ship it', authored_by: principal, caused_by: { kind: 'api' } } });
      const uses = [
        { id: 'toolu_twin01', name: 'ops__deploy_prod', input: {} },
        { id: 'toolu_nested01', name: 'ops__x__y', input: {} },
        { id: 'toolu_echo02', name: 'ops__echo', input: { text: 'hi' } },
      ];
      const first = await takeOffer(r, 0);
      const acked = r.frames.length;
      r.sock.send(frame('events.batch', 'b1', {
        ...first.ref, session_id: sessionId,
        events: uses.map((u, i) => ({ producer_key: `${first.ref.lease_id}:${i}`, type: 'agent.tool_use', payload: { ...u, blocking: true, awaiting: 'tool_confirmation' } })),
      }));
      await nextFrame(r, 'events.ack', acked);
      r.sock.send(frame('lease.complete', 'c1', {
        ...first.ref, result: { stop_reason: { type: 'requires_action', tool_use_ids: uses.map((u) => u.id) }, waits: uses.map((u) => ({ tool_use_id: u.id, kind: 'confirmation' })) },
      }));
      await untilEvents(api, sessionId, (e) => idleCount(e) >= 1, 15_000);
      const offered = r.frames.length;
      for (const u of uses) {
        await api.post(`/v1/sessions/${sessionId}/events`, { type: 'user.tool_confirmation', payload: { tool_use_id: u.id, result: 'allow', authored_by: principal, caused_by: { kind: 'api' } } });
      }

      const second = await takeOffer(r, offered);
      const twinsMcp = `/v1/runtime/mcp/${twinsId}`;
      const nestedMcp = `/v1/runtime/mcp/${nestedId}`;
      for (const [path, tool, use, other] of [
        // Either tool of one server offered under the confirmed name.
        [twinsMcp, 'deploy_prod', 'toolu_twin01', "its tool 'deploy.prod'"],
        [twinsMcp, 'deploy.prod', 'toolu_twin01', "its tool 'deploy_prod'"],
        // Either tool of two servers whose names and tool names run together alike.
        [twinsMcp, 'x__y', 'toolu_nested01', "the Run's server 'ops__x'"],
        [nestedMcp, 'y', 'toolu_nested01', "the Run's server 'ops'"],
      ] as const) {
        const refused = await callTool(path, second.bearer, tool, {}, use);
        expect(refused.isError).toBe(true);
        const error = (JSON.parse(refused.text) as { error: { type: string; message: string } }).error;
        expect(error.type).toBe('policy.denied');
        expect(error.message).toContain(other);
        expect(error.message).toContain('cannot tell them apart');
      }
      // A tool whose offered name is its own still runs for its confirmed use.
      expect(await callTool(twinsMcp, second.bearer, 'echo', { text: 'hi' }, 'toolu_echo02')).toEqual({ isError: false, text: 'echo: hi' });

      type Row = { action: string; outcome: string; status: number | null; detail: string | null; actor: { id: string } };
      const rows = async (target: string) => (await p.root.post<{ data: Row[] }>('/v1/audit/export', { target, limit: 1000 })).data
        .filter((x) => x.actor.id === second.runId).map((x) => [x.action, x.outcome, x.status, x.detail]);
      const denied = (tool: string) => [`connections.runtimeCallTool:${tool}`, 'denied', 403, 'policy.denied'];
      expect(await rows(twinsId)).toEqual([denied('deploy_prod'), denied('deploy.prod'), denied('x__y'), ['connections.runtimeCallTool:echo', 'succeeded', 200, null]]);
      expect(await rows(nestedId)).toEqual([denied('y')]);

      r.sock.send(frame('lease.complete', 'c2', { ...second.ref, result: { stop_reason: { type: 'end_turn' } } }));
      await untilEvents(api, sessionId, (e) => idleCount(e) >= 2, 15_000);
    } finally {
      await Promise.all([twins.close(), nested.close()]);
    }
  }, 90_000);
});
