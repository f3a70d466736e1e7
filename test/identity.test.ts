import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import http from 'node:http';
import { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { mcpCall, toolBody } from './harness/mcp-call.js';
import { startApiNode, type ApiNode } from './harness/cluster-platform.js';

let p: Platform;
let org: string;
let wsA: string;
let wsB: string;
let keyB: HttpClient;

type Err = { error: { type: string; message: string; more: string } };
const errType = (r: { body: unknown }) => (r.body as Err).error?.type;

async function newKey(role: string, workspaceId: string | null, extra: Record<string, unknown> = {}): Promise<{ id: string; client: HttpClient; secret: string }> {
  const scope = workspaceId ? { type: 'workspace', workspace_id: workspaceId } : { type: 'organization' };
  const r = await p.root.request<{ id: string; secret: string }>('POST', `/v1/organizations/${org}/api-keys`, {
    body: { display_name: `${role} key`, role, scope, ...extra },
    idempotencyKey: `k-${Math.random()}`,
  });
  expect(r.status).toBe(201);
  return { id: r.body.id, client: new HttpClient({ baseUrl: p.baseUrl, token: r.body.secret }), secret: r.body.secret };
}

async function newPrincipal(client: HttpClient, ws: string, subject: string): Promise<string> {
  const r = await client.request<{ id: string }>('POST', `/v1/organizations/workspaces/${ws}/principals`, {
    body: { external_subject_id: subject, principal_type: 'person', display_name: subject },
  });
  expect(r.status).toBe(201);
  return r.body.id;
}

beforeAll(async () => {
  p = await startPlatform();
  org = p.bootstrap.organization_id;
  wsA = p.bootstrap.workspace_id;
  const ws = await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name: 'second' });
  wsB = ws.id;
  keyB = (await newKey('admin', wsB)).client;
});
afterAll(async () => {
  await p?.stop();
});

describe('tenancy', () => {
  it('a key of workspace B gets 404 for workspace A resources', async () => {
    const prinA = await newPrincipal(p.root, wsA, 'alice');
    const r = await keyB.request('GET', `/v1/principals/${prinA}`);
    expect(r.status).toBe(404);
    expect(errType(r)).toBe('validation.not_found');
    const list = await keyB.request('GET', `/v1/organizations/workspaces/${wsA}/principals`);
    expect(list.status).toBe(404);
  });

  it('an organization key selects a workspace with Service-Workspace-Id', async () => {
    const prinB = await newPrincipal(keyB, wsB, 'bob');
    const inB = await p.root.with({ workspaceId: wsB }).request('GET', `/v1/principals/${prinB}`);
    expect(inB.status).toBe(200);
    expect(inB.headers.get('service-workspace-id')).toBe(wsB);
    const inA = await p.root.request('GET', `/v1/principals/${prinB}`);
    expect(inA.status).toBe(404);
    const unknown = await p.root.with({ workspaceId: `wrkspc_${'0'.repeat(32)}` }).request('GET', '/v1/support/capabilities');
    expect(unknown.status).toBe(404);
    // A Workspace-bound key may not select one: refused, the answer naming its own Workspace.
    const bound = await keyB.with({ workspaceId: wsB }).request('GET', '/v1/support/capabilities');
    expect([bound.status, bound.headers.get('service-workspace-id')]).toEqual([400, wsB]);
  });

  it('403 auth.disabled_tenancy while the workspace is disabled', async () => {
    const ws = await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name: 'to-disable' });
    const { client, secret } = await newKey('developer', ws.id);
    expect((await client.request('GET', '/v1/support/capabilities')).status).toBe(200);
    await p.root.patch(`/v1/organizations/workspaces/${ws.id}`, { status: 'disabled' });
    const r = await client.request('GET', '/v1/support/capabilities');
    expect(r.status).toBe(403);
    expect(errType(r)).toBe('auth.disabled_tenancy');
    // The refusal names the Workspace, and a refused mutation is recorded there, denied.
    expect(r.headers.get('service-workspace-id')).toBe(ws.id);
    const selected = p.root.with({ workspaceId: ws.id });
    const write = await client.request('POST', `/v1/organizations/workspaces/${ws.id}/principals`, { body: { external_subject_id: 'refused', principal_type: 'person', display_name: 'r' } });
    expect([write.status, errType(write), write.headers.get('service-workspace-id')]).toEqual([403, 'auth.disabled_tenancy', ws.id]);
    const bySelector = await selected.request('POST', '/v1/agents', { body: { name: 'refused', model: 'default' } });
    expect([bySelector.status, errType(bySelector), bySelector.headers.get('service-workspace-id')]).toEqual([403, 'auth.disabled_tenancy', ws.id]);
    // Over MCP the same: a tool call is refused by the pipeline (a tool result naming the
    // Workspace, the mutation recorded), any other method at the edge (403, naming it).
    const viaMcp = await mcpCall(p.baseUrl, secret, 'agents_createAgent', { body: { name: 'refused-mcp', model: 'default' }, idempotency_key: 'mcp-disabled' });
    expect([viaMcp.status, viaMcp.result?.isError, (toolBody(viaMcp.result).error as { type?: string } | undefined)?.type, viaMcp.headers.get('service-workspace-id')])
      .toEqual([200, true, 'auth.disabled_tenancy', ws.id]);
    const search = await mcpCall(p.baseUrl, p.bootstrap.root_key, 'agentplane_search_operations', { query: 'agents' }, { 'service-workspace-id': ws.id });
    expect((toolBody(search.result).error as { type?: string } | undefined)?.type).toBe('auth.disabled_tenancy');
    const listed = await fetch(`${p.baseUrl}/v1/mcp`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${secret}`, 'mcp-protocol-version': '2025-06-18' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    expect([listed.status, listed.headers.get('service-workspace-id')]).toEqual([403, ws.id]);
    // An organization key selecting it still reaches organization-level operations, and re-enables
    // it (over MCP too: the list of Workspaces answers).
    const orgOverMcp = await mcpCall(p.baseUrl, p.bootstrap.root_key, 'organizations_listWorkspaces', { path: { organization_id: org } }, { 'service-workspace-id': ws.id });
    expect([orgOverMcp.status, orgOverMcp.result?.isError]).toEqual([200, false]);
    expect((await selected.request('GET', `/v1/organizations/${org}/workspaces`)).status).toBe(200);
    expect((await selected.request('PATCH', `/v1/organizations/workspaces/${ws.id}`, { body: { status: 'active' } })).status).toBe(200);
    expect((await client.request('GET', '/v1/support/capabilities')).status).toBe(200);
    const audit = await p.root.with({ workspaceId: ws.id }).post<{ data: { action: string; outcome: string; status: number | null }[] }>('/v1/audit/export', {});
    const denied = audit.data.filter((x) => x.outcome === 'denied' && x.status === 403).map((x) => x.action);
    expect(denied).toEqual(expect.arrayContaining(['principals.createPrincipal', 'agents.createAgent']));
    expect(denied.filter((a) => a === 'agents.createAgent')).toHaveLength(2);
  });

  it('only an organization-scoped root key manages keys', async () => {
    const { client: wsRoot } = await newKey('root', wsA);
    const r = await wsRoot.request('GET', `/v1/organizations/${org}/api-keys`);
    expect(r.status).toBe(403);
    expect(errType(r)).toBe('policy.denied');
    const { client: orgAdmin } = await newKey('admin', null);
    expect((await orgAdmin.request('GET', `/v1/organizations/${org}/api-keys`)).status).toBe(403);
    const other = await p.root.request('GET', `/v1/organizations/org_${'1'.repeat(32)}/api-keys`);
    expect(other.status).toBe(404);
  });

  it('a runner-role key cannot manage principals; a viewer cannot write', async () => {
    const { client: runner } = await newKey('runner', wsA);
    const r = await runner.request('GET', `/v1/organizations/workspaces/${wsA}/principals`);
    expect(r.status).toBe(403);
    const { client: viewer } = await newKey('viewer', wsA);
    expect((await viewer.request('GET', `/v1/organizations/workspaces/${wsA}/principals`)).status).toBe(200);
    const w = await viewer.request('POST', `/v1/organizations/workspaces/${wsA}/principals`, {
      body: { external_subject_id: 'nope', principal_type: 'person', display_name: 'n' },
    });
    expect(w.status).toBe(403);
  });
});

describe('API keys', () => {
  it('re-roling takes effect on the next request; stale expected_version is 409', async () => {
    const { id, client } = await newKey('viewer', wsA);
    const meta = await p.root.get<{ version: number }>(`/v1/api-keys/${id}`);
    const stale = await p.root.request('PATCH', `/v1/api-keys/${id}`, { body: { role: 'admin', expected_version: meta.version + 5 } });
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('validation.conflict');
    await p.root.patch(`/v1/api-keys/${id}`, { role: 'admin', expected_version: meta.version });
    const w = await client.request('POST', `/v1/organizations/workspaces/${wsA}/principals`, {
      body: { external_subject_id: `promoted-${id}`, principal_type: 'service', display_name: 'p' },
    });
    expect(w.status).toBe(201);
  });

  it('a keyed retry of create replays the secret while the generation is live, and fails closed after a patch', async () => {
    const body = { display_name: 'replayable', role: 'viewer', scope: { type: 'workspace', workspace_id: wsA } };
    const a = await p.root.request<{ id: string; secret: string }>('POST', `/v1/organizations/${org}/api-keys`, { body, idempotencyKey: 'replay-me' });
    const b = await p.root.request<{ id: string; secret: string }>('POST', `/v1/organizations/${org}/api-keys`, { body, idempotencyKey: 'replay-me' });
    expect(b.status).toBe(201);
    expect(b.body.secret).toBe(a.body.secret);
    expect(b.headers.get('idempotent-replayed')).toBe('true');
    await p.root.patch(`/v1/api-keys/${a.body.id}`, { display_name: 'renamed' });
    const c = await p.root.request('POST', `/v1/organizations/${org}/api-keys`, { body, idempotencyKey: 'replay-me' });
    expect(c.status).toBe(409);
    expect(errType(c)).toBe('idempotency.conflict');
    expect(JSON.stringify(c.body)).not.toContain(a.body.secret);
  });

  it('revocation is irreversible and retry-safe', async () => {
    const { id, client } = await newKey('developer', wsA);
    const r1 = await p.root.request<{ status: string }>('POST', `/v1/api-keys/${id}/revoke`, { body: {} });
    const r2 = await p.root.request<{ status: string }>('POST', `/v1/api-keys/${id}/revoke`, { body: {} });
    expect(r1.body.status).toBe('revoked');
    expect(r2.status).toBe(200);
    expect((await client.request('GET', '/v1/support/capabilities')).status).toBe(401);
    const rot = await p.root.request('POST', `/v1/api-keys/${id}/rotate`, { body: {}, idempotencyKey: 'rot-revoked' });
    expect(rot.status).toBe(409);
    expect(errType(rot)).toBe('runtime.invalid_transition');
  });

  it("the organization's last live root key is neither re-roled nor revoked; one of two is", async () => {
    type Key = { id: string; role: string; status: string; scope: { type: string } };
    const live = async () => {
      const all: Key[] = [];
      for (let page: string | null | undefined; ;) {
        const r = await p.root.get<{ data: Key[]; next_page: string | null }>(`/v1/organizations/${org}/api-keys`, { limit: 100, ...(page ? { page } : {}) });
        all.push(...r.data);
        if (!(page = r.next_page)) break;
      }
      return all.filter((k) => k.status === 'active' && k.role === 'root' && k.scope.type === 'organization');
    };
    // Down to the bootstrap key (the oldest) alone: earlier tests may have made other root keys.
    const [bootstrap, ...others] = await live();
    for (const k of others) expect((await p.root.request('POST', `/v1/api-keys/${k.id}/revoke`, { body: {} })).status).toBe(200);
    const id = (bootstrap as Key).id;
    for (const [method, path, body] of [['PATCH', `/v1/api-keys/${id}`, { role: 'viewer' }], ['POST', `/v1/api-keys/${id}/revoke`, {}]] as const) {
      const r = await p.root.request(method, path, { body });
      expect([r.status, errType(r)], `${method} ${path}`).toEqual([409, 'runtime.invalid_transition']);
    }
    expect((await p.root.request('GET', '/v1/support/capabilities')).status).toBe(200);
    // With a second root key, either may go.
    const second = await newKey('root', null);
    expect((await p.root.request('PATCH', `/v1/api-keys/${second.id}`, { body: { role: 'admin' } })).status).toBe(200);
    expect((await p.root.request('PATCH', `/v1/api-keys/${id}`, { body: { role: 'viewer' } })).status).toBe(409);
  });

  it('on one kept-alive connection, each request is the bearer it carries, and a revoked key is refused on the next', async () => {
    const a = await newKey('developer', wsA);
    const b = await newKey('developer', wsB);
    const agent = new http.Agent({ keepAlive: true, maxSockets: 1 });
    const reused: boolean[] = [];
    const get = (token: string) => new Promise<{ status: number; workspace: string | undefined }>((resolve, reject) => {
      const req = http.get(`${p.baseUrl}/v1/support/capabilities`, { agent, headers: { authorization: `Bearer ${token}`, 'service-version': '2026-08-27' } }, (res) => {
        res.resume();
        res.on('end', () => resolve({ status: res.statusCode ?? 0, workspace: res.headers['service-workspace-id'] as string | undefined }));
      });
      req.on('socket', () => reused.push(req.reusedSocket));
      req.on('error', reject);
    });
    try {
      expect(await get(a.secret)).toEqual({ status: 200, workspace: wsA });
      expect(await get(b.secret)).toEqual({ status: 200, workspace: wsB });
      expect(await get(a.secret)).toEqual({ status: 200, workspace: wsA });
      expect((await get(`${a.secret}x`)).status).toBe(401);
      expect(await get(a.secret)).toEqual({ status: 200, workspace: wsA });
      expect((await p.root.request('POST', `/v1/api-keys/${a.id}/revoke`, { body: {} })).status).toBe(200);
      expect((await get(a.secret)).status).toBe(401);
      expect(await get(b.secret)).toEqual({ status: 200, workspace: wsB });
      // Every request after the first went over the first one's connection.
      expect(reused).toEqual([false, true, true, true, true, true, true]);
    } finally {
      agent.destroy();
    }
  });

  it('lists metadata with cursor pagination and never a secret', async () => {
    const first = await p.root.get<{ data: Record<string, unknown>[]; next_page: string | null }>(`/v1/organizations/${org}/api-keys`, { limit: 2 });
    expect(first.data).toHaveLength(2);
    expect(first.next_page).toMatch(/^c1_[0-9a-z]+$/);
    const second = await p.root.get<{ data: { id: string }[] }>(`/v1/organizations/${org}/api-keys`, { limit: 2, page: first.next_page ?? '' });
    expect(second.data[0]?.id).not.toBe(first.data[0]?.id);
    for (const k of [...first.data, ...second.data]) expect(k).not.toHaveProperty('secret');
    const bad = await p.root.request('GET', `/v1/organizations/${org}/api-keys`, { query: { page: 'c1_zz' } });
    expect(bad.status).toBe(400);
    const zero = await p.root.request('GET', `/v1/organizations/${org}/api-keys`, { query: { limit: 0 } });
    expect(zero.status).toBe(400);
  });

  it('429 budget.exceeded with Retry-After past the per-minute rate limit', async () => {
    const { client } = await newKey('viewer', wsA, { rate_limit_per_minute: 3 });
    for (let i = 0; i < 3; i++) expect((await client.request('GET', '/v1/support/capabilities')).status).toBe(200);
    const r = await client.request('GET', '/v1/support/capabilities');
    expect(r.status).toBe(429);
    expect(errType(r)).toBe('budget.exceeded');
    const retry = Number(r.headers.get('retry-after'));
    expect(Number.isInteger(retry)).toBe(true);
    expect(retry).toBeGreaterThanOrEqual(1);
    expect(retry).toBeLessThanOrEqual(60);
  });
});

describe('Principals and access credentials', () => {
  it('external_subject_id is unique per workspace', async () => {
    await newPrincipal(p.root, wsA, 'dup-subject');
    const r = await p.root.request('POST', `/v1/organizations/workspaces/${wsA}/principals`, {
      body: { external_subject_id: 'dup-subject', principal_type: 'person', display_name: 'x' },
    });
    expect(r.status).toBe(409);
    expect(errType(r)).toBe('validation.conflict');
  });

  it('an external_subject_id or display_name that is not well-formed Unicode is 400, and never claims another subject', async () => {
    const create = (external_subject_id: string, display_name = 'x') => p.root.request('POST', `/v1/organizations/workspaces/${wsA}/principals`, {
      body: { external_subject_id, principal_type: 'person', display_name },
    });
    // Two different lone surrogates: as UTF-8 both would be U+FFFD, the same subject.
    for (const subject of ['subj-\ud800', 'subj-\udbff']) {
      const r = await create(subject);
      expect([r.status, errType(r)], JSON.stringify(subject)).toEqual([400, 'validation.malformed']);
    }
    const name = await create('subj-ok-name', 'name \udc00');
    expect([name.status, errType(name)]).toEqual([400, 'validation.malformed']);
    // Nothing was claimed by the refused ones: the well-formed neighbours are free.
    expect((await create('subj-\ufffd')).status).toBe(201);
    expect((await create('subj-ok-name')).status).toBe(201);
  });

  it("a deleted Principal's credential is never rotated into a new secret (404); a suspended one's is", async () => {
    const prin = await newPrincipal(p.root, wsA, 'rotate-after-delete');
    const c = await p.root.post<{ id: string }>(`/v1/principals/${prin}/access-credentials`, {}, { idempotencyKey: 'cred-rad' });
    await p.root.post(`/v1/principals/${prin}/suspend`, {});
    const whileSuspended = await p.root.request<{ generation_number: number; secret?: string }>('POST', `/v1/principal-access-credentials/${c.id}/rotate`, {
      body: { expected_generation_number: 1 }, idempotencyKey: 'rot-rad-1' });
    expect(whileSuspended.status).toBe(200);
    expect(whileSuspended.body.generation_number).toBe(2);
    expect((await p.root.request('DELETE', `/v1/principals/${prin}`)).status).toBe(200);
    const r = await p.root.request<{ secret?: string }>('POST', `/v1/principal-access-credentials/${c.id}/rotate`, {
      body: { expected_generation_number: 2 }, idempotencyKey: 'rot-rad-2' });
    expect([r.status, errType(r)]).toEqual([404, 'validation.not_found']);
    expect(r.body.secret).toBeUndefined();
    // Nothing changed: the credential is still at the generation it was.
    expect(await p.root.get<{ generation_number: number }>(`/v1/principal-access-credentials/${c.id}`)).toMatchObject({ generation_number: 2 });
  });

  it('credential: secret once, rotation kills the old bearer, stale generation 409, revoke', async () => {
    const prin = await newPrincipal(p.root, wsA, 'cred-owner');
    const noKey = await p.root.request('POST', `/v1/principals/${prin}/access-credentials`, { body: {} });
    expect(noKey.status).toBe(400);
    const c = await p.root.request<{ id: string; secret: string; audience: string; generation_number: number }>(
      'POST', `/v1/principals/${prin}/access-credentials`, { body: {}, idempotencyKey: 'cred-1' });
    expect(c.status).toBe(201);
    expect(c.body.audience).toBe('api_mcp');
    const bearer = new HttpClient({ baseUrl: p.baseUrl, token: c.body.secret });
    expect((await bearer.request('GET', '/v1/support/capabilities')).status).toBe(200);
    // A principal bearer is read-only and closed: no principal management.
    expect((await bearer.request('GET', `/v1/organizations/workspaces/${wsA}/principals`)).status).toBe(403);
    const meta = await p.root.get<Record<string, unknown>>(`/v1/principal-access-credentials/${c.body.id}`);
    expect(meta.secret).toBeUndefined();

    const stale = await p.root.request('POST', `/v1/principal-access-credentials/${c.body.id}/rotate`, {
      body: { expected_generation_number: 7 }, idempotencyKey: 'rot-stale' });
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('validation.conflict');
    const rot = await p.root.request<{ secret: string; generation_number: number }>('POST', `/v1/principal-access-credentials/${c.body.id}/rotate`, {
      body: { expected_generation_number: 1 }, idempotencyKey: 'rot-1' });
    expect(rot.status).toBe(200);
    expect(rot.body.generation_number).toBe(2);
    expect((await bearer.request('GET', '/v1/support/capabilities')).status).toBe(401);
    const bearer2 = new HttpClient({ baseUrl: p.baseUrl, token: rot.body.secret });
    expect((await bearer2.request('GET', '/v1/support/capabilities')).status).toBe(200);

    const rev = await p.root.request('POST', `/v1/principal-access-credentials/${c.body.id}/revoke`, {
      body: { expected_generation_number: 2 }, idempotencyKey: 'rev-1' });
    expect(rev.status).toBe(200);
    expect((await bearer2.request('GET', '/v1/support/capabilities')).status).toBe(401);
  });

  it('suspending or deleting the Principal denies its bearer on the next request', async () => {
    const prin = await newPrincipal(p.root, wsA, 'to-suspend');
    const c = await p.root.post<{ id: string; secret: string }>(`/v1/principals/${prin}/access-credentials`, {}, { idempotencyKey: 'cred-s' });
    const bearer = new HttpClient({ baseUrl: p.baseUrl, token: c.secret });
    expect((await bearer.request('GET', '/v1/support/capabilities')).status).toBe(200);
    // Read twice (the second answered from the read cache's shared copy as stored), then changed:
    // every read shows the Principal as it is now.
    const read = async () => (await p.root.get<{ status: string; version: number }>(`/v1/principals/${prin}`));
    const before = await read();
    expect(await read()).toEqual(before);
    await p.root.post(`/v1/principals/${prin}/suspend`, {});
    expect(await read()).toMatchObject({ status: 'suspended', version: before.version + 1 });
    expect(await read()).toMatchObject({ status: 'suspended', version: before.version + 1 });
    expect((await bearer.request('GET', '/v1/support/capabilities')).status).toBe(401);
    await p.root.post(`/v1/principals/${prin}/resume`, {});
    expect(await read()).toMatchObject({ status: 'active', version: before.version + 2 });
    expect((await bearer.request('GET', '/v1/support/capabilities')).status).toBe(200);
    const del = await p.root.request<{ type: string }>('DELETE', `/v1/principals/${prin}`);
    expect(del.body.type).toBe('principal_deleted');
    expect((await bearer.request('GET', '/v1/support/capabilities')).status).toBe(401);
    expect((await p.root.request('GET', `/v1/principals/${prin}`)).status).toBe(404);
    // Its credential reads as it works: revoked with the Principal.
    expect(await p.root.get(`/v1/principal-access-credentials/${c.id}`)).toMatchObject({ status: 'revoked', revoked_at: expect.any(String) });
  });

  it('an a2a bearer is refused on REST', async () => {
    const prin = await newPrincipal(p.root, wsA, 'a2a-user');
    const c = await p.root.post<{ secret: string; audience: string }>(`/v1/principals/${prin}/access-credentials`, { audience: 'a2a' }, { idempotencyKey: 'cred-a2a' });
    expect(c.audience).toBe('a2a');
    const bearer = new HttpClient({ baseUrl: p.baseUrl, token: c.secret });
    const r = await bearer.request('GET', '/v1/support/capabilities');
    expect(r.status).toBe(403);
  });
});

describe('the wire edge', () => {
  it('404 for unknown routes and for a known path with another method (the catalog has no 405), in the wire error shape', async () => {
    const r = await p.root.request('GET', '/v1/nope');
    expect(r.status).toBe(404);
    expect(errType(r)).toBe('validation.not_found');
    for (const [method, path] of [['PUT', '/v1/support/capabilities'], ['PUT', '/v1/agents'], ['GET', '/v1/sessions/sesn_x/events']] as const) {
      const m = await p.root.request(method, path, method === 'PUT' ? { body: {} } : {});
      expect([m.status, errType(m)], `${method} ${path}`).toEqual([404, 'validation.not_found']);
    }
    const m = await p.root.request('PUT', '/v1/support/capabilities', { body: {} });
    expect(m.headers.get('allow')).toContain('GET');
  });

  it('400 validation.malformed for a non-JSON body (a content type the schema rejects) and for invalid JSON', async () => {
    for (const type of ['application/x-www-form-urlencoded', 'text/plain']) {
      const r = await p.root.request('POST', `/v1/organizations/workspaces/${wsA}/principals`, { rawBody: 'a=b', headers: { 'content-type': type } });
      expect([r.status, errType(r)], type).toEqual([400, 'validation.malformed']);
    }
    const j = await p.root.request('POST', `/v1/organizations/workspaces/${wsA}/principals`, { rawBody: '{"a":' });
    expect(j.status).toBe(400);
    expect(errType(j)).toBe('validation.malformed');
  });

  it('rejects malformed Idempotency-Keys', async () => {
    const r = await p.root.request('POST', `/v1/organizations/workspaces/${wsA}/principals`, {
      body: { external_subject_id: 'ik', principal_type: 'person', display_name: 'x' }, headers: { 'idempotency-key': 'has space' } });
    expect(r.status).toBe(400);
    const long = await p.root.request('POST', `/v1/organizations/workspaces/${wsA}/principals`, {
      body: { external_subject_id: 'ik', principal_type: 'person', display_name: 'x' }, idempotencyKey: 'x'.repeat(256) });
    expect(long.status).toBe(400);
  });

  it('concurrent requests under one Idempotency-Key create exactly one resource', async () => {
    const body = { external_subject_id: 'race-subject', principal_type: 'person', display_name: 'race' };
    const rs = await Promise.all(
      Array.from({ length: 12 }, () => p.root.request<{ id?: string }>('POST', `/v1/organizations/workspaces/${wsA}/principals`, { body, idempotencyKey: 'race' })),
    );
    const created = rs.filter((r) => r.status === 201);
    expect(created.length).toBeGreaterThanOrEqual(1);
    expect(new Set(created.map((r) => r.body.id)).size).toBe(1);
    for (const r of rs.filter((x) => x.status !== 201)) {
      expect(r.status).toBe(409);
      expect(errType(r)).toBe('idempotency.conflict');
    }
  });

  it('a body that differs only by a __proto__ key is another request under the same Idempotency-Key', async () => {
    const first = await p.root.request<{ metadata: Record<string, string> }>('POST', '/v1/agents', {
      rawBody: '{"name":"proto","model":"default","metadata":{"__proto__":"x","team":"a"}}', idempotencyKey: 'proto-body' });
    expect(first.status).toBe(201);
    expect(JSON.stringify(first.body.metadata)).toBe('{"__proto__":"x","team":"a"}');
    const second = await p.root.request('POST', '/v1/agents', {
      rawBody: '{"name":"proto","model":"default","metadata":{"team":"a"}}', idempotencyKey: 'proto-body' });
    expect(second.status).toBe(409);
    expect(errType(second)).toBe('idempotency.conflict');
  });

  it('serves the OpenAPI document generated from the operation table', async () => {
    const r = await p.anon.request<{ openapi: string; paths: Record<string, Record<string, { operationId: string }>> }>('GET', '/v1/openapi.json');
    expect(r.status).toBe(200);
    expect(r.body.openapi).toBe('3.1.0');
    expect(r.body.paths['/v1/principals/{principal_id}']?.get?.operationId).toBe('principals.getPrincipal');
    // A 204 has no body: no 204 response may declare content.
    const bodied204 = Object.entries(r.body.paths).flatMap(([path, item]) => Object.entries(item)
      .filter(([, o]) => (o as unknown as { responses: Record<string, { content?: unknown }> }).responses['204']?.content !== undefined)
      .map(([method]) => `${method} ${path}`));
    expect(bodied204).toEqual([]);
  });

  it('serves Prometheus metrics', async () => {
    const r = await fetch(`${p.baseUrl}/metrics`);
    expect(r.status).toBe(200);
    expect(await r.text()).toContain('agentplane_http_requests_total');
  });
});

// Each API process keeps credentials, tenancy and Principals in its read cache: a change made
// through one process must govern the very next request to any other (Redis invalidates).
describe('two API processes', () => {
  let other: ApiNode;
  beforeAll(async () => {
    other = await startApiNode(p, p.redisUrl(), 'api-2');
  }, 90_000);
  afterAll(async () => {
    await other?.kill();
  });

  const via = (baseUrl: string, token: string) => new HttpClient({ baseUrl, token });

  it('a key revoked through one process is refused by the other on the next request', async () => {
    for (let i = 0; i < 5; i++) {
      const { id, client, secret } = await newKey('admin', wsA);
      const there = via(other.baseUrl, secret);
      // Both processes have read (and cached) the live key.
      expect((await client.request('GET', '/v1/support/capabilities')).status).toBe(200);
      expect((await there.request('GET', '/v1/support/capabilities')).status).toBe(200);
      const rev = await p.root.request('POST', `/v1/api-keys/${id}/revoke`, { body: {} });
      expect(rev.status).toBe(200);
      expect((await there.request('GET', '/v1/support/capabilities')).status).toBe(401);
      expect((await client.request('GET', '/v1/support/capabilities')).status).toBe(401);
    }
  });

  it('a re-role, a suspended Principal and a disabled workspace govern the other process at once', async () => {
    const { id, secret } = await newKey('admin', wsA);
    const there = via(other.baseUrl, secret);
    const principals = `/v1/organizations/workspaces/${wsA}/principals`;
    expect((await there.request('GET', principals)).status).toBe(200);
    const meta = await p.root.get<{ version: number }>(`/v1/api-keys/${id}`);
    await p.root.patch(`/v1/api-keys/${id}`, { role: 'viewer', expected_version: meta.version });
    const write = await there.request('POST', principals, { body: { external_subject_id: `demoted-${id}`, principal_type: 'service', display_name: 'd' } });
    expect(write.status).toBe(403);

    const prin = await newPrincipal(p.root, wsA, 'suspended-elsewhere');
    const c = await p.root.post<{ secret: string }>(`/v1/principals/${prin}/access-credentials`, {}, { idempotencyKey: 'cred-two-api' });
    const bearer = via(other.baseUrl, c.secret);
    expect((await bearer.request('GET', '/v1/support/capabilities')).status).toBe(200);
    // Read twice (the second answered from the read cache's shared copy as stored), then changed:
    // every read shows the Principal as it is now.
    const read = async () => (await p.root.get<{ status: string; version: number }>(`/v1/principals/${prin}`));
    const before = await read();
    expect(await read()).toEqual(before);
    await p.root.post(`/v1/principals/${prin}/suspend`, {});
    expect(await read()).toMatchObject({ status: 'suspended', version: before.version + 1 });
    expect(await read()).toMatchObject({ status: 'suspended', version: before.version + 1 });
    expect((await bearer.request('GET', '/v1/support/capabilities')).status).toBe(401);
    await p.root.post(`/v1/principals/${prin}/resume`, {});
    expect(await read()).toMatchObject({ status: 'active', version: before.version + 2 });
    expect((await bearer.request('GET', '/v1/support/capabilities')).status).toBe(200);

    const ws = await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name: 'disabled-elsewhere' });
    const wsKey = via(other.baseUrl, (await newKey('developer', ws.id)).secret);
    expect((await wsKey.request('GET', '/v1/support/capabilities')).status).toBe(200);
    await p.root.patch(`/v1/organizations/workspaces/${ws.id}`, { status: 'disabled' });
    const refused = await wsKey.request('GET', '/v1/support/capabilities');
    expect(refused.status).toBe(403);
    expect(errType(refused)).toBe('auth.disabled_tenancy');
    await p.root.patch(`/v1/organizations/workspaces/${ws.id}`, { status: 'active' });
    expect((await wsKey.request('GET', '/v1/support/capabilities')).status).toBe(200);
  });
});
