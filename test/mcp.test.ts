import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { createCredential, createPrincipal } from './harness/governance.js';
import { mcpCall, mcpToolNames, toolBody } from './harness/mcp-call.js';

let p: Platform;
beforeAll(async () => {
  p = await startPlatform();
});
afterAll(async () => {
  await p?.stop();
});

const MODERN = '2026-07-28';

type ToolResult = { isError?: boolean; content: { type: string; text: string }[] };
const parsed = (r: unknown): Record<string, unknown> => JSON.parse((r as ToolResult).content[0]?.text ?? 'null') as Record<string, unknown>;
const errType = (r: unknown): unknown => (parsed(r).error as { type?: string } | undefined)?.type;

/** Official SDK client (2025-era handshake, its default); `version` rewrites the initialize request so the 2025-06-18 leg is exercised too. */
async function sdkClient(version: '2025-06-18' | '2025-11-25', token = p.bootstrap.root_key, query = '') {
  const seen: { version?: string | null } = {};
  const fetchFn: typeof fetch = async (input, init) => {
    let body = init?.body;
    if (typeof body === 'string' && body.includes('"initialize"')) {
      const msg = JSON.parse(body) as { method: string; params: { protocolVersion: string } };
      if (msg.method === 'initialize') msg.params.protocolVersion = version;
      body = JSON.stringify(msg);
    }
    const h = new Headers(init?.headers);
    if (!(typeof body === 'string' && body.includes('"initialize"'))) seen.version = h.get('mcp-protocol-version');
    return fetch(input, { ...init, body });
  };
  const transport = new StreamableHTTPClientTransport(new URL(`${p.baseUrl}/v1/mcp${query}`), {
    fetch: fetchFn,
    requestInit: { headers: { Authorization: `Bearer ${token}` } },
  });
  const client = new Client({ name: 'mcp-test', version: '1.0.0' });
  await client.connect(transport);
  return { client, transport, seen };
}

/** The parts of a JSON-RPC response these tests read. */
interface RpcBody {
  id?: string | number | null;
  result: {
    protocolVersion?: string;
    resultType?: string;
    isError?: boolean;
    tools: { name: string; inputSchema: { required?: string[] } }[];
    content: { type: string; text: string }[];
    [k: string]: unknown;
  };
  error: { code: number; message: string; data: { supported: string[] } };
}

/** One raw JSON-RPC POST. */
async function rpc(body: unknown, headers: Record<string, string> = {}, opts: { token?: string | null; query?: string } = {}) {
  const token = opts.token === undefined ? p.bootstrap.root_key : opts.token;
  const r = await fetch(`${p.baseUrl}/v1/mcp${opts.query ?? ''}`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      ...(token ? { authorization: `Bearer ${token}` } : {}),
      ...headers,
    },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  return { status: r.status, headers: r.headers, body: (text ? JSON.parse(text) : null) as RpcBody };
}

/** A 2026-07-28 request with every header set consistently (overridable). */
function modern(method: string, params: Record<string, unknown> = {}, headerOverrides: Record<string, string | null> = {}, metaVersion = MODERN) {
  const body = {
    jsonrpc: '2.0', id: 7, method,
    params: { ...params, _meta: { 'io.modelcontextprotocol/protocolVersion': metaVersion, 'io.modelcontextprotocol/clientCapabilities': {}, 'io.modelcontextprotocol/clientInfo': { name: 'raw', version: '1' } } },
  };
  const headers: Record<string, string> = { 'mcp-protocol-version': MODERN, 'mcp-method': method };
  if (method === 'tools/call') headers['mcp-name'] = String(params.name);
  for (const [k, v] of Object.entries(headerOverrides)) {
    if (v === null) delete headers[k];
    else headers[k] = v;
  }
  return rpc(body, headers);
}

const ws = () => p.bootstrap.workspace_id;

describe.each(['2025-06-18', '2025-11-25'] as const)('legacy shape %s through the official SDK client', (version) => {
  it('initializes with the requested version, lists, searches and calls', async () => {
    const { client, transport, seen } = await sdkClient(version);
    try {
      expect(transport.protocolVersion).toBe(version);
      expect(client.getServerVersion()?.name).toBe('agentplane');
      await client.ping();
      expect(seen.version).toBe(version);

      const compact = await client.listTools();
      const names = compact.tools.map((t) => t.name);
      expect(names).toContain('support_getCapabilities');
      expect(names).toContain('agentplane_search_operations');
      expect(names).not.toContain('principals_createPrincipal'); // a full-catalog operation
      expect(names.some((n) => n.startsWith('apiKeys_'))).toBe(false);

      const search = await client.callTool({ name: 'agentplane_search_operations', arguments: { query: 'create principal' } });
      expect(search.isError).toBe(false);
      const hits = (parsed(search).data as { name: string; requires_idempotency_key: boolean }[]);
      expect(hits[0]?.name).toBe('principals_createPrincipal');
      expect(hits[0]?.requires_idempotency_key).toBe(true);
      expect(hits.some((h) => h.name === 'principals_createAccessCredential')).toBe(false); // credentials are REST-only

      const read = await client.callTool({ name: 'support_getCapabilities', arguments: {} });
      expect(read.isError).toBe(false);
      expect(parsed(read).service_version).toBe('2026-08-27');

      // A searched (unlisted) mutation is callable; it needs idempotency_key.
      const args = { path: { workspace_id: ws() }, body: { external_subject_id: `mcp-${version}`, principal_type: 'service', display_name: 'MCP' } };
      const refused = await client.callTool({ name: 'principals_createPrincipal', arguments: args });
      expect(refused.isError).toBe(true);
      expect(errType(refused)).toBe('validation.malformed');
      const created = await client.callTool({ name: 'principals_createPrincipal', arguments: { ...args, idempotency_key: `mcp-create-${version}` } });
      expect(created.isError).toBe(false);
      const principal = parsed(created) as { id: string };
      expect(principal.id).toMatch(/^prin_[0-9a-f]{32}$/);
      const replay = await client.callTool({ name: 'principals_createPrincipal', arguments: { ...args, idempotency_key: `mcp-create-${version}` } });
      expect((parsed(replay) as { id: string }).id).toBe(principal.id);
      expect(replay._meta?.['dev.agentplane/idempotent_replayed']).toBe(true);
      // The same key with other arguments is the REST idempotency conflict, as an isError result.
      const other = await client.callTool({ name: 'principals_createPrincipal', arguments: { ...args, body: { ...args.body, display_name: 'Other' }, idempotency_key: `mcp-create-${version}` } });
      expect(other.isError).toBe(true);
      expect(errType(other)).toBe('idempotency.conflict');
      // A handler's client error is stored under its key; its replay is still an isError result.
      for (let i = 0; i < 2; i++) {
        const dup = await client.callTool({ name: 'principals_createPrincipal', arguments: { ...args, idempotency_key: `mcp-dup-${version}` } });
        expect(dup.isError).toBe(true);
        expect(errType(dup)).toBe('validation.conflict');
      }
      // The REST side sees the same resource.
      const rest = await p.root.request<{ id: string }>('GET', `/v1/principals/${principal.id}`);
      expect(rest.status).toBe(200);

      // REST failures are tool results with isError and the full wire error body.
      const missing = await client.callTool({ name: 'principals_getPrincipal', arguments: { path: { principal_id: `prin_${'0'.repeat(32)}` } } });
      expect(missing.isError).toBe(true);
      expect(parsed(missing)).toMatchObject({ error: { type: 'validation.not_found', message: expect.any(String), more: expect.stringMatching(/#validation-not-found$/) } });
      const invalid = await client.callTool({ name: 'principals_getPrincipal', arguments: { path: { principal_id: 'sess_nope' } } });
      expect(errType(invalid)).toBe('validation.malformed');
    } finally {
      await client.close();
    }
  });
});

describe('the Session journey over MCP (tools projected from other modules)', () => {
  it('creates an agent, an environment and a session, then reads it back', async () => {
    const { client } = await sdkClient('2025-11-25', p.bootstrap.root_key, '?catalog=full');
    try {
      const tools = new Map((await client.listTools()).tools.map((t) => [t.name, t]));
      const call = async (name: string, args: Record<string, unknown>) => {
        const needsKey = (tools.get(name)?.inputSchema.required ?? []).includes('idempotency_key');
        const r = await client.callTool({ name, arguments: needsKey ? { ...args, idempotency_key: `journey-${name}` } : args });
        expect(r.isError, `${name}: ${JSON.stringify(r.content)}`).toBe(false);
        return parsed(r) as { id: string } & Record<string, unknown>;
      };
      const agent = await call('agents_createAgent', { body: { name: 'mcp-agent', model: 'default' } });
      expect(agent.id).toMatch(/^agent_/);
      const env = await call('environments_createEnvironment', { body: { name: 'mcp-env', image: 'agentplane/sandbox:test' } });
      expect(env.id).toMatch(/^env_/);
      const session = await call('sessions_createSession', { body: { agent: agent.id, environment_id: env.id, title: 'over mcp' } });
      expect(session.id).toMatch(/^sess_/);
      const read = await call('sessions_getSession', { path: { session_id: session.id } });
      expect(read.title).toBe('over mcp');
      const list = await call('sessions_listSessions', { query: { limit: 5 } });
      expect((list.data as { id: string }[]).map((x) => x.id)).toContain(session.id);
    } finally {
      await client.close();
    }
  });
});

describe('legacy shape, raw', () => {
  it('answers an unsupported initialize version with 2025-06-18 and echoes a supported one', async () => {
    const init = (v: string) => rpc({ jsonrpc: '2.0', id: 1, method: 'initialize', params: { protocolVersion: v, capabilities: {}, clientInfo: { name: 'raw', version: '1' } } });
    expect((await init('2024-11-05')).body.result.protocolVersion).toBe('2025-06-18');
    expect((await init('2025-11-25')).body.result.protocolVersion).toBe('2025-11-25');
  });

  it('-32600 for an omitted or unserved MCP-Protocol-Version after initialize', async () => {
    const list = { jsonrpc: '2.0', id: 2, method: 'tools/list', params: {} };
    const omitted = await rpc(list);
    expect(omitted.status).toBe(400);
    expect(omitted.body.error.code).toBe(-32600);
    const unserved = await rpc(list, { 'mcp-protocol-version': '2025-03-26' });
    expect(unserved.body.error.code).toBe(-32600);
    const ok = await rpc(list, { 'mcp-protocol-version': '2025-06-18' });
    expect(ok.status).toBe(200);
    expect(ok.body.result.resultType).toBeUndefined();
  });

  it('catalog=full lists every projected operation and never a REST-only one', async () => {
    const r = await rpc({ jsonrpc: '2.0', id: 3, method: 'tools/list' }, { 'mcp-protocol-version': '2025-11-25' }, { query: '?catalog=full' });
    const names = (r.body.result.tools as { name: string }[]).map((t) => t.name);
    expect(names).toEqual(expect.arrayContaining(['principals_createPrincipal', 'principals_listPrincipals', 'organizations_getWorkspace', 'support_getCapabilities', 'agentplane_search_operations']));
    for (const n of names) expect(n).not.toMatch(/^apiKeys_|AccessCredential|^meta_/);
    const create = (r.body.result.tools as { name: string; inputSchema: { required?: string[] } }[]).find((t) => t.name === 'principals_createPrincipal');
    expect(create?.inputSchema.required).toEqual(expect.arrayContaining(['path', 'body', 'idempotency_key']));
    const bad = await rpc({ jsonrpc: '2.0', id: 3, method: 'tools/list' }, { 'mcp-protocol-version': '2025-11-25' }, { query: '?catalog=huge' });
    expect(bad.status).toBe(400);
  });

  it('notifications are acknowledged with 202 and no body', async () => {
    const r = await fetch(`${p.baseUrl}/v1/mcp`, {
      method: 'POST',
      headers: { authorization: `Bearer ${p.bootstrap.root_key}`, 'content-type': 'application/json', 'mcp-protocol-version': '2025-11-25' },
      body: JSON.stringify({ jsonrpc: '2.0', method: 'notifications/initialized' }),
    });
    expect(r.status).toBe(202);
    expect(await r.text()).toBe('');
  });

  it('unknown tool is -32602; unknown method -32601; batches refused', async () => {
    const h = { 'mcp-protocol-version': '2025-11-25' };
    expect((await rpc({ jsonrpc: '2.0', id: 4, method: 'tools/call', params: { name: 'nope_nope' } }, h)).body.error.code).toBe(-32602);
    expect((await rpc({ jsonrpc: '2.0', id: 5, method: 'resources/list' }, h)).body.error.code).toBe(-32601);
    expect((await rpc([{ jsonrpc: '2.0', id: 6, method: 'ping' }], h)).body.error.code).toBe(-32600);
    expect((await rpc('{not json', h)).body.error.code).toBe(-32700);
    // Params by position (or a scalar) are invalid params, answered under the request's own id.
    for (const params of ['x', [1]]) {
      const r = await rpc({ jsonrpc: '2.0', id: 7, method: 'tools/list', params }, h);
      expect([r.body.id, r.body.error.code]).toEqual([7, -32602]);
    }
  });
});

describe('stateless shape 2026-07-28 through the SDK v2 client', () => {
  it.each([{ pin: MODERN }, 'auto'] as const)('negotiates the modern era (%s), lists and calls', async (mode) => {
    const client = new Client({ name: 'mcp-test-v2', version: '1.0.0' }, { versionNegotiation: { mode } });
    const transport = new StreamableHTTPClientTransport(new URL(`${p.baseUrl}/v1/mcp`), { requestInit: { headers: { Authorization: `Bearer ${p.bootstrap.root_key}` } } });
    await client.connect(transport);
    try {
      expect(client.getProtocolEra()).toBe('modern');
      expect(client.getServerVersion()?.name).toBe('agentplane');
      expect((await client.listTools()).tools.map((t) => t.name)).toContain('agentplane_search_operations');
      const read = await client.callTool({ name: 'organizations_getWorkspace', arguments: { path: { workspace_id: ws() } } });
      expect(read.isError).toBe(false);
      const key = `v2-${typeof mode === 'string' ? mode : 'pin'}`;
      const args = { path: { workspace_id: ws() }, body: { external_subject_id: key, principal_type: 'person', display_name: 'V2' }, idempotency_key: key };
      const created = await client.callTool({ name: 'principals_createPrincipal', arguments: args });
      expect(created.isError).toBe(false);
      expect((parsed(created) as { external_subject_id: string }).external_subject_id).toBe(key);
    } finally {
      await client.close();
    }
  });
});

describe('stateless shape 2026-07-28, raw JSON-RPC', () => {
  it('server/discover, tools/list and tools/call carry resultType', async () => {
    const d = await modern('server/discover');
    expect(d.status).toBe(200);
    expect(d.body.result).toMatchObject({ resultType: 'complete', supportedVersions: ['2026-07-28', '2025-11-25', '2025-06-18'], capabilities: { tools: {} } });
    const l = await modern('tools/list');
    expect(l.body.result.resultType).toBe('complete');
    expect((l.body.result.tools as { name: string }[]).map((t) => t.name)).toContain('agentplane_search_operations');
    const c = await modern('tools/call', { name: 'organizations_getWorkspace', arguments: { path: { workspace_id: ws() } } });
    expect(c.body.result).toMatchObject({ resultType: 'complete', isError: false });
    expect((JSON.parse(c.body.result.content[0]?.text ?? '{}') as { id: string }).id).toBe(ws());
  });

  it('no ping or initialize on this shape', async () => {
    expect((await modern('ping')).body.error.code).toBe(-32601);
    expect((await modern('initialize', { protocolVersion: MODERN, capabilities: {}, clientInfo: { name: 'x', version: '1' } })).body.error.code).toBe(-32601);
  });

  it('-32020 for every header that disagrees with the body', async () => {
    const cases: [string, Record<string, unknown>, Record<string, string | null>][] = [
      ['tools/list', {}, { 'mcp-protocol-version': null }],
      ['tools/list', {}, { 'mcp-protocol-version': '2025-11-25' }],
      ['tools/list', {}, { 'mcp-method': null }],
      ['tools/list', {}, { 'mcp-method': 'tools/call' }],
      ['tools/call', { name: 'support_getCapabilities', arguments: {} }, { 'mcp-name': null }],
      ['tools/call', { name: 'support_getCapabilities', arguments: {} }, { 'mcp-name': 'principals_getPrincipal' }],
    ];
    for (const [method, params, over] of cases) {
      const r = await modern(method, params, over);
      expect(r.status, JSON.stringify(over)).toBe(400);
      expect(r.body.error.code, JSON.stringify(over)).toBe(-32020);
    }
    // The version header says 2026-07-28 but the body carries no _meta version.
    const r = await rpc({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, { 'mcp-protocol-version': MODERN, 'mcp-method': 'tools/list' });
    expect(r.body.error.code).toBe(-32020);
    // A Base64 sentinel Mcp-Name that decodes to the body's name agrees.
    const b64 = await modern('tools/call', { name: 'support_getCapabilities', arguments: {} }, { 'mcp-name': `=?base64?${Buffer.from('support_getCapabilities').toString('base64')}?=` });
    expect(b64.body.result.isError).toBe(false);
  });

  it('-32022 listing the supported versions for an unserved _meta version', async () => {
    const r = await modern('tools/list', {}, { 'mcp-protocol-version': '2027-01-01' }, '2027-01-01');
    expect(r.body.error.code).toBe(-32022);
    expect(r.body.error.data.supported).toEqual(['2026-07-28', '2025-11-25', '2025-06-18']);
    expect(r.body.error.message).toBe('unsupported protocol version 2027-01-01');
    // A version served in the legacy shape, sent in _meta: told how it is spoken, not called unsupported.
    const legacy = await modern('tools/list', {}, { 'mcp-protocol-version': '2025-06-18' }, '2025-06-18');
    expect(legacy.body.error.code).toBe(-32022);
    expect(legacy.body.error.message).toContain('MCP-Protocol-Version header alone');
  });

  it('an Origin header is refused before authentication', async () => {
    const anon = await rpc({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, { origin: 'https://evil.example' }, { token: null });
    expect(anon.status).toBe(403);
    const authed = await modern('tools/list', {}, { origin: 'http://127.0.0.1' });
    expect(authed.status).toBe(403);
  });

  it('401 discovery chain: WWW-Authenticate → protected resource → authorization server', async () => {
    const r = await rpc({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, {}, { token: null });
    expect(r.status).toBe(401);
    const www = r.headers.get('www-authenticate') ?? '';
    const url = /resource_metadata_url="([^"]+)"/.exec(www)?.[1];
    expect(www).toMatch(/^Bearer /);
    expect(www).toContain(`resource_metadata="${url}"`);
    expect(url).toBe(`${p.baseUrl}/.well-known/oauth-protected-resource/v1/mcp`);
    const bad = await rpc({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, {}, { token: 'ap_key_not-a-real-key' });
    expect(bad.status).toBe(401);
    const prm = await (await fetch(url as string)).json() as { resource: string; authorization_servers: string[] };
    expect(prm.resource).toBe(`${p.baseUrl}/v1/mcp`);
    const as = await (await fetch(`${prm.authorization_servers[0]}/.well-known/oauth-authorization-server`)).json() as { grant_types_supported: unknown[] };
    expect(as.grant_types_supported).toEqual([]);
  });

  it('refuses a request body over 4 MiB', async () => {
    const big = JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: { pad: 'x'.repeat(4 * 1024 * 1024) } });
    const r = await rpc(big, { 'mcp-protocol-version': '2025-11-25' });
    expect(r.status).toBe(413);
    expect(r.body.error.code).toBe(-32600);
  });

  it('a REST result over 1 MiB is an isError result, not a truncated one', async () => {
    const system = 'x'.repeat(190_000);
    for (let i = 0; i < 6; i++) {
      const r = await p.root.request('POST', '/v1/agents', { body: { name: `big-${i}`, model: 'default', system } });
      expect(r.status).toBe(201);
    }
    const big = await modern('tools/call', { name: 'agents_listAgents', arguments: { query: { limit: 100 } } });
    expect(big.status).toBe(200);
    expect(big.body.result.isError).toBe(true);
    expect(JSON.parse(big.body.result.content[0]?.text ?? '{}').error.type).toBe('validation.payload_too_large');
    const small = await modern('tools/call', { name: 'agents_listAgents', arguments: { query: { limit: 2 } } });
    expect(small.body.result.isError).toBe(false);
  });

  it('GET and DELETE are 405 (stateless: no stream, no session)', async () => {
    const r = await fetch(`${p.baseUrl}/v1/mcp`, { headers: { authorization: `Bearer ${p.bootstrap.root_key}` } });
    expect(r.status).toBe(405);
    expect(r.headers.get('allow')).toBe('POST');
  });
});

describe('callers', () => {
  async function principalCredential(audience: 'api_mcp' | 'a2a'): Promise<string> {
    const prin = await p.root.request<{ id: string }>('POST', `/v1/organizations/workspaces/${ws()}/principals`, {
      body: { external_subject_id: `cred-${audience}`, principal_type: 'person', display_name: 'P' },
    });
    expect(prin.status).toBe(201);
    const cred = await p.root.request<{ secret: string }>('POST', `/v1/principals/${prin.body.id}/access-credentials`, {
      body: { audience }, idempotencyKey: `cred-${audience}`,
    });
    expect(cred.status).toBe(201);
    return cred.body.secret;
  }

  it('a Principal credential gets the closed, read-only principal catalog', async () => {
    const secret = await principalCredential('api_mcp');
    const { client } = await sdkClient('2025-11-25', secret, '?catalog=full');
    try {
      // Only reads marked mcpPrincipal (AgentDefinition, MemoryStore, SurfaceScope reads with
      // permission checks); none is served yet, so the closed catalog is empty today.
      const names = (await client.listTools()).tools.map((t) => t.name);
      expect(names).not.toContain('agentplane_search_operations');
      expect(names.every((n) => !/create|update|delete|suspend|resume|archive|send/i.test(n))).toBe(true);
      // A REST read that admits Principal credentials is still outside the MCP principal catalog.
      for (const name of ['support_getCapabilities', 'principals_listPrincipals', 'agentplane_search_operations']) {
        const denied = await client.callTool({ name, arguments: name === 'agentplane_search_operations' ? { query: 'principal' } : {} });
        expect(denied.isError, name).toBe(true);
        expect(errType(denied), name).toBe('policy.denied');
      }
      // An unknown tool is denied the same way: the caller learns nothing about the full table.
      const unknown = await client.callTool({ name: 'nope_nope', arguments: {} });
      expect(errType(unknown)).toBe('policy.denied');
    } finally {
      await client.close();
    }
  });

  it('the Principal catalog lists the ActionApproval reads an `approve` on a Session or its Agent reaches', async () => {
    const prin = await createPrincipal(p.root, ws(), 'session-approver');
    const cred = await createCredential(p.root, prin);
    const env = await p.root.post<{ id: string }>('/v1/environments', { name: 'approver-env', image: 'agentplane/sandbox:1' });
    const agent = await p.root.post<{ id: string }>('/v1/agents', { name: 'approver-agent', model: 'default' });
    const session = await p.root.post<{ id: string }>('/v1/sessions', { agent: agent.id, environment_id: env.id });
    // An approval is governed as its Session: `approve` on the Session (or on its Agent) reaches
    // one by id as it reaches the Session's queue, so both reads are listed; the Workspace's
    // queue needs `approve` on the Workspace.
    for (const target of [{ type: 'session', id: session.id }, { type: 'agent', id: agent.id }]) {
      const a = await p.root.post<{ id: string }>('/v1/permission-assignments', { principal_id: prin, target, actions: ['approve'] });
      expect((await mcpToolNames(p.baseUrl, cred.secret)).sort(), target.type).toEqual(['approvals_getActionApproval', 'approvals_listSessionActionApprovals']);
      const listed = await mcpCall(p.baseUrl, cred.secret, 'approvals_listSessionActionApprovals', { path: { session_id: session.id } });
      expect(listed.result?.isError, target.type).toBe(false);
      expect(toolBody(listed.result).data).toEqual([]);
      expect((await p.root.request('DELETE', `/v1/permission-assignments/${a.id}`)).status).toBe(200);
      expect(await mcpToolNames(p.baseUrl, cred.secret)).toEqual([]);
    }
  });

  it('suspending the Principal denies its next MCP request', async () => {
    const prin = await p.root.request<{ id: string; version: number }>('POST', `/v1/organizations/workspaces/${ws()}/principals`, {
      body: { external_subject_id: 'to-suspend', principal_type: 'person', display_name: 'S' },
    });
    const cred = await p.root.request<{ secret: string }>('POST', `/v1/principals/${prin.body.id}/access-credentials`, { body: {}, idempotencyKey: 'to-suspend' });
    const list = () => rpc({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, { 'mcp-protocol-version': '2025-06-18' }, { token: cred.body.secret });
    expect((await list()).status).toBe(200);
    expect((await p.root.request('POST', `/v1/principals/${prin.body.id}/suspend`, { body: {} })).status).toBe(200);
    const denied = await list();
    expect(denied.status).toBe(401);
    expect(denied.headers.get('www-authenticate')).toContain('resource_metadata=');
  });

  it("one MCP request counts once against the key's rate limit; a limited call is an isError result", async () => {
    const second = new Date().getUTCSeconds();
    if (second > 45) await new Promise((r) => setTimeout(r, (61 - second) * 1000));
    const key = await p.root.request<{ secret: string }>('POST', `/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
      body: { display_name: 'mcp limited', role: 'developer', scope: { type: 'workspace', workspace_id: ws() }, rate_limit_per_minute: 3 },
      idempotencyKey: 'mcp-limited',
    });
    const h = { 'mcp-protocol-version': '2025-11-25', authorization: `Bearer ${key.body.secret}` };
    const list = { jsonrpc: '2.0', id: 1, method: 'tools/list' };
    const read = { jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'organizations_getWorkspace', arguments: { path: { workspace_id: ws() } } } };
    expect((await rpc(list, h)).status).toBe(200); // 1
    const call = await rpc(read, h); // 2: the dispatched REST call is not counted again
    expect(call.body.result.isError).toBe(false);
    expect((await rpc(list, h)).status).toBe(200); // 3
    const limited = await rpc(list, h);
    expect(limited.status).toBe(429);
    expect(limited.body.error.code).toBe(-32029);
    expect(Number(limited.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);
    const limitedCall = await rpc(read, h);
    expect(limitedCall.status).toBe(200);
    expect(limitedCall.body.result.isError).toBe(true);
    expect((JSON.parse(limitedCall.body.result.content[0]?.text ?? '{}') as { error: { type: string } }).error.type).toBe('budget.exceeded');
    expect(limitedCall.body.result._meta).toMatchObject({ 'dev.agentplane/http_status': 429, 'dev.agentplane/retry_after_seconds': expect.any(Number) });
  });

  it('an a2a bearer is refused', async () => {
    const secret = await principalCredential('a2a');
    const r = await modern('tools/list', {}, { authorization: `Bearer ${secret}` });
    expect(r.status).toBe(401);
    expect(r.headers.get('www-authenticate')).toContain('invalid_token');
  });

  it('an API key keeps its role: a viewer lists no mutations and is refused one by the REST pipeline', async () => {
    const key = await p.root.request<{ secret: string }>('POST', `/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
      body: { display_name: 'mcp viewer', role: 'viewer', scope: { type: 'workspace', workspace_id: ws() } }, idempotencyKey: 'mcp-viewer',
    });
    const h = { 'mcp-protocol-version': '2025-11-25', authorization: `Bearer ${key.body.secret}` };
    const list = await rpc({ jsonrpc: '2.0', id: 1, method: 'tools/list' }, h, { query: '?catalog=full' });
    const names = (list.body.result.tools as { name: string }[]).map((t) => t.name);
    expect(names).toContain('principals_listPrincipals');
    expect(names).not.toContain('principals_createPrincipal');
    const call = await rpc({ jsonrpc: '2.0', id: 2, method: 'tools/call', params: { name: 'principals_createPrincipal', arguments: {
      path: { workspace_id: ws() }, body: { external_subject_id: 'v', principal_type: 'person', display_name: 'V' }, idempotency_key: 'v-1' } } }, h);
    expect(call.body.result.isError).toBe(true);
    expect((JSON.parse(call.body.result.content[0]?.text ?? '{}') as { error: { type: string } }).error.type).toBe('policy.denied');
    // A malformed envelope does not get ahead of the role: the viewer is refused, not corrected.
    const bare = await rpc({ jsonrpc: '2.0', id: 3, method: 'tools/call', params: { name: 'principals_createPrincipal', arguments: {
      path: { workspace_id: ws() }, body: { external_subject_id: 'v', principal_type: 'person', display_name: 'V' }, bogus: 1 } } }, h);
    expect((JSON.parse(bare.body.result.content[0]?.text ?? '{}') as { error: { type: string } }).error.type).toBe('policy.denied');
  });

  it('a tool call refused for its arguments is recorded in the audit log, like a REST request refused for its body', async () => {
    const errorType = (r: Awaited<ReturnType<typeof rpc>>) => (JSON.parse(r.body.result.content[0]?.text ?? '{}') as { error: { type: string; message: string } }).error;
    const audited = async (requestId: string | null) =>
      (await p.root.post<{ data: { action: string; outcome: string; status: number; detail: string | null; request_id: string }[] }>('/v1/audit/export', { action: 'principals.createPrincipal' }))
        .data.filter((r) => r.request_id === requestId);
    const body = { external_subject_id: 'audit-me', principal_type: 'person', display_name: 'A' };
    const cases: [string, Record<string, unknown>, string][] = [
      ['an unknown argument', { path: { workspace_id: ws() }, body, idempotency_key: 'audit-1', bogus: 1 }, "arguments: unknown field 'bogus'"],
      ['no idempotency_key', { path: { workspace_id: ws() }, body }, 'principals_createPrincipal requires idempotency_key'],
      ['a path that is not an object', { path: 'x', body, idempotency_key: 'audit-2' }, 'arguments: path must be an object'],
    ];
    for (const [what, args, message] of cases) {
      const r = await rpc({ jsonrpc: '2.0', id: 9, method: 'tools/call', params: { name: 'principals_createPrincipal', arguments: args } }, { 'mcp-protocol-version': '2025-11-25' });
      expect([what, r.body.result.isError, errorType(r).type]).toEqual([what, true, 'validation.malformed']);
      expect(errorType(r).message).toContain(message);
      const records = await audited(r.headers.get('request-id'));
      expect([what, records]).toEqual([what, [expect.objectContaining({ outcome: 'failed', status: 400, detail: 'validation.malformed' })]]);
    }
    // Nothing was created by any of them.
    const principals = await p.root.get<{ data: { external_subject_id: string }[] }>(`/v1/organizations/workspaces/${ws()}/principals`, { limit: 100 });
    expect(principals.data.filter((x) => x.external_subject_id === 'audit-me')).toEqual([]);
    // A call on a resource named by its path is recorded naming it, as over REST; a path value
    // that is not a well-formed id is not written into the record.
    const approval = `approval_${'a'.repeat(32)}`;
    for (const [path, target] of [[{ approval_id: approval }, approval], [{ approval_id: 'not an id' }, null]] as const) {
      const r = await rpc({ jsonrpc: '2.0', id: 10, method: 'tools/call', params: { name: 'approvals_approveActionApproval', arguments: { path, body: {} } } }, { 'mcp-protocol-version': '2025-11-25' });
      expect(errorType(r).message).toContain('requires idempotency_key');
      const records = (await p.root.post<{ data: { target: string | null; request_id: string; status: number }[] }>('/v1/audit/export', { action: 'approvals.approveActionApproval' })).data
        .filter((x) => x.request_id === r.headers.get('request-id'));
      expect(records).toEqual([expect.objectContaining({ target, status: 400 })]);
    }
  });
});
