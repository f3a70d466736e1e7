import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { ConnectionService, RedisRuntimeBearers, type RuntimeGrant } from '@agentplane/domain';
import { SecretBox } from '@agentplane/core';
import { LeaseFence } from '@agentplane/lease';
import { connectRedis, DocumentStore, type Redis } from '@agentplane/store';
import { startPlatform, type Platform } from './harness/platform.js';
import { startMcpUpstream, type McpUpstream } from './harness/mcp-upstream.js';

const UPSTREAM_TOKEN = 'upstream-secret-token-0123456789';

let p: Platform;
let upstream: McpUpstream;
let redis: Redis;
let bearers: RedisRuntimeBearers;
let fence: LeaseFence;

beforeAll(async () => {
  [p, upstream] = await Promise.all([
    // Its MCP upstreams listen on loopback: reachable in development mode only (the outbound address guard).
    startPlatform({ env: { AGENTPLANE_MODE: 'development' } }),
    startMcpUpstream({
      token: UPSTREAM_TOKEN,
      tools: [
        { name: 'drop_tables', description: 'Dangerous', reply: 'dropped' },
        { name: 'deploy', description: 'Needs a human', reply: 'deployed' },
      ],
    }),
  ]);
  redis = connectRedis(p.redisUrl(), { name: 'test' });
  fence = new LeaseFence(redis);
  bearers = new RedisRuntimeBearers(redis);
});
afterAll(async () => {
  await redis?.quit();
  await upstream?.close();
  await p?.stop();
});

const ws = () => p.bootstrap.workspace_id;
const hex = (c: string) => c.repeat(32);

let leaseSeq = 0;

/**
 * A live lease on a fresh Session, the way the lease work holds one (the Session's fence), and
 * the grant a runtime bearer for it carries. `leaseMs` is the fence's life; the bearer's own
 * expiry is the attempt's later hard deadline, so the fence decides.
 */
async function grant(connections: RuntimeGrant['connections'], leaseMs = 60_000, run = hex('a')): Promise<RuntimeGrant> {
  const n = ++leaseSeq;
  const sessionId = `sess_${n.toString(16).padStart(32, '0')}`;
  const leaseId = `lease-${n}`;
  await fence.claim({ sessionId, token: leaseId, runnerId: 'runner_test', attempt: 1, runId: `run_${run}` }, leaseMs);
  return {
    run_id: `run_${run}`, session_id: sessionId, workspace_id: ws(), organization_id: p.bootstrap.organization_id,
    lease_id: leaseId, expires_at: new Date(Date.now() + Math.max(leaseMs, 0) + 60_000).toISOString(), connections,
  };
}

async function runtimeClient(connectionId: string, bearer: string): Promise<Client> {
  const client = new Client({ name: 'harness', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`${p.baseUrl}/v1/runtime/mcp/${connectionId}`), {
    requestInit: { headers: { Authorization: `Bearer ${bearer}` } },
  }));
  return client;
}

const post = (path: string, bearer: string, body: unknown = { jsonrpc: '2.0', id: 1, method: 'tools/list' }) =>
  fetch(`${p.baseUrl}${path}`, {
    method: 'POST',
    headers: { authorization: `Bearer ${bearer}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-11-25' },
    body: JSON.stringify(body),
  });

describe('Connections (REST)', () => {
  it('stores the upstream secret sealed and never returns it; creating is REST-only', async () => {
    const created = await p.root.request<{ id: string; auth: Record<string, unknown> }>('POST', '/v1/connections', {
      body: { name: 'upstream', url: upstream.url, auth: { type: 'bearer', token: UPSTREAM_TOKEN } },
    });
    expect(created.status).toBe(201);
    expect(created.body.id).toMatch(/^conn_[0-9a-f]{32}$/);
    expect(created.body.auth).toEqual({ type: 'bearer', secret_hint: '…6789' });
    expect(JSON.stringify(created.body)).not.toContain(UPSTREAM_TOKEN);
    const stored = await redis.get(`ap:{w:${ws()}}:doc:${created.body.id}`);
    expect(stored).not.toContain(UPSTREAM_TOKEN);
    const read = await p.root.request('GET', `/v1/connections/${created.body.id}`);
    expect(JSON.stringify(read.body)).not.toContain(UPSTREAM_TOKEN);

    const userinfo = await p.root.request('POST', '/v1/connections', { body: { name: 'x', url: 'https://user:pw@mcp.example.invalid/mcp' } });
    expect(userinfo.status).toBe(400);
    const list = await fetch(`${p.baseUrl}/v1/mcp?catalog=full`, {
      method: 'POST',
      headers: { authorization: `Bearer ${p.bootstrap.root_key}`, 'content-type': 'application/json', 'mcp-protocol-version': '2025-11-25' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    const names = ((await list.json()) as { result: { tools: { name: string }[] } }).result.tools.map((t) => t.name);
    expect(names).toContain('connections_getConnection');
    expect(names).not.toContain('connections_createConnection');
    expect(names).not.toContain('connections_updateConnection');
  });

  it('refuses, on create and on PATCH, a token that cannot go out as an Authorization header value and a name that is not well-formed Unicode', async () => {
    const tokens = ['tok\r\nX-Injected: 1', 'tok\nen-0123456789', 'caf\u00e9-0123456789', 'lone\ud800-0123456789', ' leading-0123456789', 'trailing-0123456789\t', 'nul\u0000-0123456789'];
    for (const token of tokens) {
      const r = await p.root.request<{ error: { type: string; message: string } }>('POST', '/v1/connections', {
        body: { name: 'bad-token', url: 'https://mcp.example.com/mcp', auth: { type: 'bearer', token } },
      });
      expect(r.status, JSON.stringify(token)).toBe(400);
      expect(r.body.error.type).toBe('validation.malformed');
      expect(r.body.error.message).not.toContain(token);
    }
    const name = await p.root.request<{ error: { type: string } }>('POST', '/v1/connections', { body: { name: 'up \ud800', url: 'https://mcp.example.com/mcp' } });
    expect(name.status).toBe(400);
    expect(name.body.error.type).toBe('validation.malformed');

    const ok = await p.root.request<{ id: string }>('POST', '/v1/connections', {
      body: { name: 'good-token', url: 'https://mcp.example.com/mcp', auth: { type: 'bearer', token: 'key with spaces\tand-a-tab=' } },
    });
    expect(ok.status).toBe(201);
    for (const body of [{ auth: { type: 'bearer', token: 'tok\r\nX-Injected: 1' } }, { name: 'x\udc00' }]) {
      const r = await p.root.request<{ error: { type: string } }>('PATCH', `/v1/connections/${ok.body.id}`, { body });
      expect(r.status).toBe(400);
      expect(r.body.error.type).toBe('validation.malformed');
    }
    // Nothing was written by the refused PATCHes.
    expect(await p.root.get<{ version: number; name: string }>(`/v1/connections/${ok.body.id}`)).toMatchObject({ version: 1, name: 'good-token' });
  });
  it('a Connection holding an upstream token is re-pointed to another origin only with its auth in the same PATCH: the token never follows the URL', async () => {
    const c = await p.root.post<{ id: string; version: number }>('/v1/connections', { name: 'repoint', url: upstream.url, auth: { type: 'bearer', token: UPSTREAM_TOKEN } });
    const origin = new URL(upstream.url);
    const elsewhere = `http://localhost:${origin.port}/mcp`;
    for (const body of [{ url: elsewhere }, { url: 'https://mcp.example.com/mcp', name: 'moved' }]) {
      const r = await p.root.request<{ error: { type: string; message: string } }>('PATCH', `/v1/connections/${c.id}`, { body });
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(r.body.error.type).toBe('validation.malformed');
      expect(r.body.error.message).toContain('body.auth');
      expect(r.body.error.message).not.toContain(UPSTREAM_TOKEN);
    }
    // Nothing was written by the refused PATCHes.
    expect(await p.root.get<{ version: number; url: string; name: string }>(`/v1/connections/${c.id}`)).toMatchObject({ version: c.version, url: upstream.url, name: 'repoint' });
    // Another path on the same origin keeps the token; a new origin with its own auth (or none) is taken.
    const samePath = await p.root.request<{ url: string; auth: { type: string } }>('PATCH', `/v1/connections/${c.id}`, { body: { url: `${origin.origin}/other/mcp` } });
    expect([samePath.status, samePath.body.url, samePath.body.auth.type]).toEqual([200, `${origin.origin}/other/mcp`, 'bearer']);
    const withAuth = await p.root.request<{ url: string; auth: { type: string; secret_hint?: string } }>('PATCH', `/v1/connections/${c.id}`, { body: { url: elsewhere, auth: { type: 'bearer', token: 'another-upstream-token-42' } } });
    expect([withAuth.status, withAuth.body.url, withAuth.body.auth]).toEqual([200, elsewhere, { type: 'bearer', secret_hint: '…n-42' }]);
    const without = await p.root.request<{ url: string; auth: { type: string } }>('PATCH', `/v1/connections/${c.id}`, { body: { url: 'https://mcp.example.com/mcp', auth: { type: 'none' } } });
    expect([without.status, without.body.url, without.body.auth.type]).toEqual([200, 'https://mcp.example.com/mcp', 'none']);
    // A Connection without a token moves freely.
    const moved = await p.root.request<{ url: string }>('PATCH', `/v1/connections/${c.id}`, { body: { url: 'https://mcp.example.org/mcp' } });
    expect([moved.status, moved.body.url]).toEqual([200, 'https://mcp.example.org/mcp']);
  });
});

describe('/v1/runtime/mcp/{connection_id}', () => {
  let connectionId: string;
  beforeAll(async () => {
    const c = await p.root.request<{ id: string }>('POST', '/v1/connections', {
      body: { name: 'runtime upstream', url: upstream.url, auth: { type: 'bearer', token: UPSTREAM_TOKEN } },
    });
    connectionId = c.body.id;
  });

  it('with a live lease: lists the tools the policy admits and proxies calls', async () => {
    const bearer = await bearers.mint(await grant({ [connectionId]: { default: 'allow', tools: { drop_tables: 'deny', deploy: 'ask' } } }));
    expect(bearer).toMatch(/^ap_rt_/);
    const client = await runtimeClient(connectionId, bearer);
    try {
      const tools = (await client.listTools()).tools;
      expect(tools.map((t) => t.name).sort()).toEqual(['deploy', 'echo']);
      expect(tools.find((t) => t.name === 'deploy')?._meta?.['dev.agentplane/permission']).toBe('ask');
      const before = upstream.calls.length;
      const r = await client.callTool({ name: 'echo', arguments: { text: 'hi' } });
      expect(r.isError).toBeFalsy();
      expect((r.content as { text: string }[])[0]?.text).toBe('echo: hi');
      expect(upstream.calls.slice(before).every((c) => c.auth === `Bearer ${UPSTREAM_TOKEN}`)).toBe(true);
      const denied = await client.callTool({ name: 'drop_tables', arguments: {} });
      expect(denied.isError).toBe(true);
      expect(JSON.parse((denied.content as { text: string }[])[0]?.text ?? '{}').error.type).toBe('policy.denied');
      const ask = await client.callTool({ name: 'deploy', arguments: {} });
      expect(ask.isError).toBe(true);
    } finally {
      await client.close();
    }
  });

  it("decides the Workspace's ActionPolicies itself: a call they refuse never reaches the upstream, whoever holds the bearer", async () => {
    // A bearer used without the runner's own check first (a leaked one): the endpoint is the gate.
    const g = await grant({ [connectionId]: { default: 'allow' } }, 60_000, hex('9'));
    const bearer = await bearers.mint(g);
    const deny = (await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'deny', tool: { kind: 'mcp', name: 'drop_tables', connection_id: connectionId } })).id;
    const gate = (await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'require_approval', tool: { kind: 'mcp', name: 'deploy', connection_id: connectionId } })).id;
    const wire = (r: { content: unknown }) => (JSON.parse((r.content as { text: string }[])[0]?.text ?? '{}') as { error?: { type: string; message: string } }).error;
    const client = await runtimeClient(connectionId, bearer);
    try {
      const before = upstream.calls.length;
      const denied = await client.callTool({ name: 'drop_tables', arguments: {} });
      expect(denied.isError).toBe(true);
      expect(wire(denied)).toMatchObject({ type: 'policy.denied', message: expect.stringContaining(deny) });
      // Naming a tool use is not an approval: no approved ActionApproval covers the call.
      const held = await client.callTool({ name: 'deploy', arguments: {}, _meta: { 'dev.agentplane/tool_use_id': 'toolu_never_checked' } });
      expect(held.isError).toBe(true);
      expect(wire(held)).toMatchObject({ type: 'policy.denied', message: expect.stringContaining(gate) });
      expect(upstream.calls.length).toBe(before);
      const allowed = await client.callTool({ name: 'echo', arguments: { text: 'allowed' } });
      expect([allowed.isError ?? false, (allowed.content as { text: string }[])[0]?.text]).toEqual([false, 'echo: allowed']);
    } finally {
      await client.close();
      for (const id of [deny, gate]) await p.root.request('DELETE', `/v1/action-policies/${id}`);
    }
    // Every call is one audit record, as the Run, allowed or not; each decision a rule made is one too, on the Session.
    type Row = { action: string; target: string | null; outcome: string; status: number | null; detail: string | null; actor: { id: string; credential_id: string | null }; request_id: string | null };
    const calls = (await p.root.post<{ data: Row[] }>('/v1/audit/export', { target: connectionId, limit: 1000 })).data.filter((r) => r.actor.id === g.run_id);
    expect(calls.map((r) => [r.action, r.outcome, r.status, r.detail])).toEqual([
      ['connections.runtimeCallTool:drop_tables', 'denied', 403, 'policy.denied'],
      ['connections.runtimeCallTool:deploy', 'denied', 403, 'policy.denied'],
      ['connections.runtimeCallTool:echo', 'succeeded', 200, null],
    ]);
    expect(calls.every((r) => r.actor.credential_id === null && typeof r.request_id === 'string')).toBe(true);
    const decisions = (await p.root.post<{ data: Row[] }>('/v1/audit/export', { target: g.session_id, limit: 1000 })).data;
    expect(decisions.map((r) => [r.action, r.outcome, r.detail, r.actor.id])).toEqual([
      ['policy.mcp:drop_tables', 'denied', deny, g.run_id],
      ['policy.mcp:deploy', 'requested', gate, g.run_id],
    ]);
  });

  it('an upstream that quotes the credential it was sent never gets it into a result or an error', async () => {
    const token = 'leaky-upstream-token-9876543210';
    const leaky = createServer((req, res) => {
      req.resume();
      req.on('end', () => res.writeHead(500, { 'content-type': 'text/plain' }).end(`internal error; request had Authorization: ${req.headers.authorization ?? ''}`));
    });
    await new Promise<void>((r) => leaky.listen(0, '127.0.0.1', r));
    try {
      const url = `http://127.0.0.1:${(leaky.address() as AddressInfo).port}/mcp`;
      const conn = await p.root.post<{ id: string }>('/v1/connections', { name: 'leaky', url, auth: { type: 'bearer', token } });
      const bearer = await bearers.mint(await grant({ [conn.id]: { default: 'allow', tools: {} } }));
      const client = await runtimeClient(conn.id, bearer);
      try {
        const listed = await client.listTools().then(() => 'listed', (err: unknown) => String(err instanceof Error ? err.message : err));
        expect(listed).toContain('unreachable');
        const called = await client.callTool({ name: 'anything', arguments: {} });
        expect(called.isError).toBe(true);
        for (const text of [listed, JSON.stringify(called)]) {
          expect(text).toContain('[redacted]');
          expect(text).not.toContain('9876543210');
        }
      } finally {
        await client.close();
      }
    } finally {
      leaky.close();
    }
  });

  it("a deployment binding's shaping: selected tools only, under their alias, calls mapped back, strict arguments", async () => {
    const shaping = { agent_deployment_connection_binding_id: `adcb_${hex('b')}`, binding_revision_number: 1, tool_selection: ['echo', 'deploy'], tool_aliases: { echo: 'say' }, argument_policy: 'strict' as const };
    const bearer = await bearers.mint(await grant({ [connectionId]: { default: 'allow', shaping } }));
    const client = await runtimeClient(connectionId, bearer);
    try {
      const tools = (await client.listTools()).tools;
      expect(tools.map((t) => t.name).sort()).toEqual(['deploy', 'say']);
      const say = tools.find((t) => t.name === 'say');
      expect(say?.inputSchema).toMatchObject({ additionalProperties: false, properties: { text: { type: 'string' } } });
      expect(say?._meta?.['dev.agentplane/upstream_tool']).toBe('echo');
      const r = await client.callTool({ name: 'say', arguments: { text: 'aliased' } });
      expect([r.isError ?? false, (r.content as { text: string }[])[0]?.text]).toEqual([false, 'echo: aliased']);
      // Under the alias only: neither the upstream name of an aliased tool nor an unselected tool is served.
      for (const name of ['echo', 'drop_tables']) await expect(client.callTool({ name, arguments: {} })).rejects.toThrow(`unknown tool '${name}'`);
      const strict = await client.callTool({ name: 'say', arguments: { text: 'x', loud: true } });
      expect(strict.isError).toBe(true);
      expect(JSON.parse((strict.content as { text: string }[])[0]?.text ?? '{}').error).toMatchObject({ type: 'validation.malformed', message: expect.stringContaining("'loud'") });
      const noArgs = await client.callTool({ name: 'deploy', arguments: { any: 1 } });
      expect(noArgs.isError).toBe(true);
    } finally {
      await client.close();
    }
  });

  it("resolves an agent version's mcp_servers to Connections for the grant, by URL", async () => {
    const service = new ConnectionService(new DocumentStore(redis), new SecretBox(randomBytes(32)));
    const resolved = await service.resolveAgentServers(ws(), [
      { name: 'tools', url: `${upstream.url}/`, permission: 'always_ask' },
      { name: 'elsewhere', url: 'https://mcp.example.invalid/mcp' },
    ]);
    expect(resolved.unresolved).toEqual(['elsewhere']);
    expect(resolved.servers.map((s) => s.name)).toEqual(['tools']);
    const id = resolved.servers[0]?.connection_id ?? '';
    expect(resolved.grants[id]).toEqual({ default: 'ask' });
    const bearer = await bearers.mint(await grant(resolved.grants));
    const client = await runtimeClient(id, bearer);
    try {
      const tools = (await client.listTools()).tools;
      expect(tools.every((t) => t._meta?.['dev.agentplane/permission'] === 'ask')).toBe(true);
    } finally {
      await client.close();
    }
  });

  it('serves the 2026-07-28 shape too (SDK v2 client)', async () => {
    const bearer = await bearers.mint(await grant({ [connectionId]: { default: 'deny', tools: { echo: 'allow' } } }));
    const client = new Client({ name: 'modern-harness', version: '1.0.0' }, { versionNegotiation: { mode: { pin: '2026-07-28' } } });
    await client.connect(new StreamableHTTPClientTransport(new URL(`${p.baseUrl}/v1/runtime/mcp/${connectionId}`), {
      requestInit: { headers: { Authorization: `Bearer ${bearer}` } },
    }));
    try {
      expect(client.getProtocolEra()).toBe('modern');
      expect((await client.listTools()).tools.map((t) => t.name)).toEqual(['echo']);
      const r = await client.callTool({ name: 'echo', arguments: { text: 'modern' } });
      expect((r.content as { text: string }[])[0]?.text).toBe('echo: modern');
    } finally {
      await client.close();
    }
  });

  it('an expired lease is refused, and so is a lease taken over by a newer one', async () => {
    const past = await grant({ [connectionId]: { default: 'allow' } });
    await expect(bearers.mint({ ...past, expires_at: new Date(Date.now() - 1000).toISOString() })).rejects.toThrow();

    // A fence held for a second and not renewed: served while it holds, refused once it lapses
    // (waited for, not slept on: a slow machine may take longer than the fence to answer).
    const short = await grant({ [connectionId]: { default: 'allow' } }, 1000);
    const bearer = await bearers.mint(short);
    expect((await post(`/v1/runtime/mcp/${connectionId}`, bearer)).status).toBe(200);
    await expect.poll(async () => (await post(`/v1/runtime/mcp/${connectionId}`, bearer)).status, { timeout: 15_000, interval: 100 }).toBe(401);
    const r = await post(`/v1/runtime/mcp/${connectionId}`, bearer);
    expect(r.status).toBe(401);
    expect(r.headers.get('www-authenticate')).toContain('invalid_token');

    const first = await grant({ [connectionId]: { default: 'allow' } });
    const firstBearer = await bearers.mint(first);
    expect((await post(`/v1/runtime/mcp/${connectionId}`, firstBearer)).status).toBe(200);
    // A newer lease of the same Session (a retry elsewhere) takes the fence: the old bearer dies at once.
    await fence.claim({ sessionId: first.session_id, token: 'lease-newer', runnerId: 'runner_other', attempt: 2, runId: first.run_id }, 60_000);
    expect((await post(`/v1/runtime/mcp/${connectionId}`, firstBearer)).status).toBe(401);
  });

  it("another Run's bearer (without this connection) is refused; revocation is immediate", async () => {
    const other = await bearers.mint(await grant({}, 60_000, hex('c')));
    expect((await post(`/v1/runtime/mcp/${connectionId}`, other)).status).toBe(403);
    const mine = await bearers.mint(await grant({ [connectionId]: { default: 'allow' } }));
    await bearers.revoke(mine);
    expect((await post(`/v1/runtime/mcp/${connectionId}`, mine)).status).toBe(401);
  });

  it('a tool call refused because the Run has no such resource is an audit record of the Run, on every runtime tool endpoint', async () => {
    const run = randomBytes(16).toString('hex');
    const bearer = await bearers.mint(await grant({}, 60_000, run));
    const store = `memstore_${hex('8')}`;
    const source = `tsrc_${hex('7')}`;
    const call = (path: string, name: string) => post(path, bearer, { jsonrpc: '2.0', id: 1, method: 'tools/call', params: { name, arguments: { path: 'a.md', content: 'x' } } });
    const refusals = [
      await call(`/v1/runtime/mcp/${connectionId}`, 'echo'),
      await call(`/v1/runtime/memory/${store}`, 'create'),
      await call(`/v1/runtime/toolsource/${source}`, 'ask_peer'),
      // Reads (a listing, a memory view) are not recorded, as when they are served.
      await post(`/v1/runtime/mcp/${connectionId}`, bearer),
      await call(`/v1/runtime/memory/${store}`, 'view'),
    ];
    expect(refusals.map((r) => r.status)).toEqual([403, 403, 403, 403, 403]);
    const records = (await p.root.post<{ data: Array<{ action: string; actor: { id: string; credential_id: string | null }; target: string | null; outcome: string; status: number; detail: string | null; request_id: string | null }> }>(
      '/v1/audit/export', { actor: `run_${run}`, limit: 100 },
    )).data;
    expect(records.map((r) => [r.action, r.actor.credential_id, r.target, r.outcome, r.status, r.detail, r.request_id])).toEqual([
      ['connections.runtimeCallTool:echo', null, connectionId, 'denied', 403, 'policy.denied', refusals[0]?.headers.get('request-id')],
      ['memoryStores.runtimeCreate', null, store, 'denied', 403, 'policy.denied', refusals[1]?.headers.get('request-id')],
      ['toolSources.runtimeCallTool:ask_peer', null, source, 'denied', 403, 'policy.denied', refusals[2]?.headers.get('request-id')],
    ]);
  });

  it('a runtime bearer never works on /v1/mcp, and an API key never works here', async () => {
    const bearer = await bearers.mint(await grant({ [connectionId]: { default: 'allow' } }));
    expect((await post('/v1/mcp', bearer)).status).toBe(401);
    expect((await post(`/v1/runtime/mcp/${connectionId}`, p.bootstrap.root_key)).status).toBe(401);
  });

  it('every refusal carries the wire error body of its catalog type in the JSON-RPC error data', async () => {
    const refusal = async (r: Response, status: number, code: number, type: string) => {
      expect(r.status).toBe(status);
      const body = await r.json() as { id: unknown; error: { code: number; message: string; data?: { error?: { type: string; message: string; more: string } } } };
      expect(body.id).toBeNull();
      expect(body.error.code).toBe(code);
      expect(body.error.data).toEqual({ error: { type, message: body.error.message, more: expect.stringMatching(/\/reference\/errors#/) } });
      expect(body.error.data?.error?.more.endsWith(`#${type.replace(/[._]/g, '-')}`)).toBe(true);
    };
    await refusal(await post(`/v1/runtime/mcp/${connectionId}`, 'ap_rt_not-a-bearer'), 401, -32001, 'auth.invalid_key');
    const other = await bearers.mint(await grant({}, 60_000, hex('d')));
    await refusal(await post(`/v1/runtime/mcp/${connectionId}`, other), 403, -32001, 'policy.denied');
    const gone = `conn_${hex('e')}`;
    const bearer = await bearers.mint(await grant({ [gone]: { default: 'allow' } }));
    await refusal(await post(`/v1/runtime/mcp/${gone}`, bearer), 404, -32600, 'validation.not_found');
    const withOrigin = await fetch(`${p.baseUrl}/v1/runtime/mcp/${connectionId}`, {
      method: 'POST', headers: { authorization: `Bearer ${bearer}`, 'content-type': 'application/json', origin: 'https://example.com' }, body: '{}',
    });
    await refusal(withOrigin, 403, -32600, 'policy.denied');
    // The memory store and tool source endpoints refuse the same way.
    await refusal(await post(`/v1/runtime/memory/memstore_${hex('f')}`, other), 403, -32001, 'policy.denied');
    await refusal(await post(`/v1/runtime/toolsource/tsrc_${hex('f')}`, 'ap_rt_not-a-bearer'), 401, -32001, 'auth.invalid_key');
  });

  it('an archived connection is gone for every Run', async () => {
    const c = await p.root.request<{ id: string }>('POST', '/v1/connections', { body: { name: 'short-lived', url: upstream.url } });
    const bearer = await bearers.mint(await grant({ [c.body.id]: { default: 'allow' } }));
    await p.root.request('PATCH', `/v1/connections/${c.body.id}`, { body: { status: 'archived' } });
    expect((await post(`/v1/runtime/mcp/${c.body.id}`, bearer)).status).toBe(404);
  });
});
