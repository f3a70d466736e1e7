import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HttpClient } from '@agentplane/client';
import { startMcpUpstream, type McpUpstream } from './harness/mcp-upstream.js';
import type { Platform } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnPlatform } from './harness/turns.js';

/**
 * Connection bindings applied (docs/DEPLOYMENTS.md): a Session created against a deployment
 * revision sees the bound Connection's MCP tools as the selected binding revision shapes them
 * (selection, aliases, strict arguments), and a new binding revision changes nothing until a
 * new deployment revision selects it.
 */
let p: Platform;
let dev: HttpClient;
let admin: HttpClient;
let msg: TurnPlatform['msg'];
let upstream: McpUpstream;

beforeAll(async () => {
  upstream = await startMcpUpstream({ tools: [{ name: 'ping', description: 'Ping', reply: 'pong' }, { name: 'secret', description: 'Secret', reply: 'classified' }] });
  // Its MCP upstreams listen on loopback: reachable in development mode only (the outbound address guard).
  ({ p, api: dev, msg } = await startTurnPlatform({ name: 'deployment-bindings', env: { AGENTPLANE_MODE: 'development' } }));
  const k = await p.root.post<{ secret: string }>(`/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
    display_name: 'admin', role: 'admin', scope: { type: 'workspace', workspace_id: p.bootstrap.workspace_id },
  }, { idempotencyKey: 'bindings-admin' });
  admin = new HttpClient({ baseUrl: p.baseUrl, token: k.secret });
}, 180_000);
afterAll(async () => {
  await p?.stop();
  await upstream?.close();
});

/** Every call the script makes, in order: exposed name and arguments. */
const CALLS: [string, Json][] = [
  ['ext__say', { text: 'hi' }],
  ['ext__say', { text: 'hi', loud: true }],
  ['ext__echo', { text: 'hi' }],
  ['ext__echo', { text: 'hi', loud: true }],
  ['ext__ping', {}],
  ['ext__secret', {}],
];

/** One turn in a new Session of the deployment: each call's result, `<ok|err> <content>`. */
async function turn(deployment: string): Promise<string[]> {
  const session = await dev.post<{ id: string; agent_deployment: { revision_number: number } }>(`/v1/agent-deployments/${deployment}/sessions`, {});
  await dev.post(`/v1/sessions/${session.id}/events`, msg('go'));
  const events = await untilEvents(dev, session.id, (e) => idleCount(e) >= 1, 90_000);
  expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
  const uses = events.filter((e) => e.type === 'agent.tool_use');
  expect(uses.map((e) => e.payload.name)).toEqual(CALLS.map(([name]) => name));
  const results = new Map(events.filter((e) => e.type === 'agent.tool_result').map((e) => [String(e.payload.tool_use_id), e.payload]));
  return uses.map((u) => {
    const r = results.get(String(u.payload.id));
    return `${r?.is_error === true ? 'err' : 'ok'} ${String(r?.content)}`;
  });
}

describe('a connection binding revision shapes the MCP tools of Sessions on the deployment revision that selects it', () => {
  it('selection, aliases and strict arguments; a new binding revision only counts from the next deployment revision', async () => {
    const ws = p.bootstrap.workspace_id;
    const hprof = (await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/harness-profiles`, { key: 'default', kind: 'builtin' })).id;
    const sprof = (await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/sandbox-profiles`, {
      key: 'default', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    })).id;
    const mrp = (await admin.get<{ data: { id: string }[] }>(`/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key: 'default' })).data[0]?.id ?? '';
    const conn = await admin.post<{ id: string }>('/v1/connections', { name: 'upstream', url: upstream.url });
    const agent = await dev.post<{ id: string }>('/v1/agents', {
      name: 'bound-tools', model: 'default',
      system: SCRIPT([
        { when: { user_contains: 'go' }, then: CALLS.map(([tool, input]) => ({ tool, input })) },
        { when: { on: 'tool_result' }, then: [{ reply: 'done' }] },
      ]),
      mcp_servers: [{ name: 'ext', type: 'url', url: upstream.url, permission: 'always_allow' }],
    });
    const head = await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: agent.id, key: 'bound-tools' });
    const binding = await admin.post<{ id: string }>(`/v1/agent-deployments/${head.id}/connection-bindings`, {
      agent_deployment_id: head.id, integration_connection_id: conn.id, key: 'upstream',
    });
    const publishBinding = (expected: number, body: Json) => admin.request<Json>('POST', `/v1/agent-deployment-connection-bindings/${binding.id}/revisions`, { body: { expected_resource_version: expected, ...body } });
    // Two selected tools under one name is refused.
    const clash = await publishBinding(1, { tool_selection: ['echo', 'ping'], tool_aliases: { echo: 'ping' }, argument_policy: 'default' });
    expect([clash.status, (clash.body.error as Json | undefined)?.type]).toEqual([400, 'validation.malformed']);
    expect((await publishBinding(1, { tool_selection: ['echo', 'ping'], tool_aliases: { echo: 'say' }, argument_policy: 'strict' })).status).toBe(201);
    const publishDeployment = (expected: number, bindingRevision: number) => admin.post(`/v1/agent-deployments/${head.id}/revisions`, {
      expected_resource_version: expected, agent_release_number: 1,
      model_routing: { model_routing_profile_id: mrp, model_routing_profile_revision_number: 1 },
      execution_target: { type: 'managed', harness_profile_id: hprof, harness_profile_revision_number: 1, sandbox_profile_id: sprof, sandbox_profile_revision_number: 1, runner_pool_id: null, harness_topology: 'split' },
      skill_selections: [], connection_binding_selections: [{ agent_deployment_connection_binding_id: binding.id, binding_revision_number: bindingRevision }],
    });
    await publishDeployment(1, 1);

    // Binding revision 1: echo (as `say`) and ping, strict arguments.
    const underRevision1 = [
      'ok echo: hi',
      expect.stringMatching(/^err .*"type":"validation\.malformed".*'loud'/),
      "err Unknown tool 'ext__echo'.",
      "err Unknown tool 'ext__echo'.",
      'ok pong',
      "err Unknown tool 'ext__secret'.",
    ];
    expect(await turn(head.id)).toEqual(underRevision1);

    // Binding revision 2 (echo and secret, no aliases, default arguments) changes nothing yet …
    expect((await publishBinding(2, { tool_selection: ['echo', 'secret'], tool_aliases: {}, argument_policy: 'default' })).status).toBe(201);
    expect(await turn(head.id)).toEqual(underRevision1);

    // … until a deployment revision selects it.
    await publishDeployment(2, 2);
    expect(await turn(head.id)).toEqual([
      "err Unknown tool 'ext__say'.",
      "err Unknown tool 'ext__say'.",
      'ok echo: hi',
      'ok echo: hi',
      "err Unknown tool 'ext__ping'.",
      'ok classified',
    ]);
  }, 300_000);
});
