import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { mcpCall, mcpToolNames, toolBody } from './harness/mcp-call.js';
import { createCredential, createPrincipal, errMsg, errType } from './harness/governance.js';

type Json = Record<string, unknown>;

let p: Platform;
let org: string;
let ws: string;
let envId: string;
let agentA: string;
let agentB: string;

const principal = (name: string): Promise<string> => createPrincipal(p.root, ws, name);
const credential = (prin: string, audience: 'api_mcp' | 'a2a' = 'api_mcp') => createCredential(p.root, prin, audience);
async function grant(prin: string, target: { type: string; id: string }, actions: string[]): Promise<{ id: string; version: number }> {
  const r = await p.root.request<{ id: string; version: number }>('POST', '/v1/permission-assignments', { body: { principal_id: prin, target, actions } });
  expect(r.status).toBe(201);
  return r.body;
}
const as = (secret: string) => new HttpClient({ baseUrl: p.baseUrl, token: secret });
const drive = (prin: string, content = 'hi') => ({ type: 'user.message', payload: { content, authored_by: prin, caused_by: { kind: 'api' } } });
async function session(agent = agentA): Promise<string> {
  return (await p.root.post<{ id: string }>('/v1/sessions', { agent, environment_id: envId })).id;
}

beforeAll(async () => {
  p = await startPlatform();
  org = p.bootstrap.organization_id;
  ws = p.bootstrap.workspace_id;
  envId = (await p.root.post<{ id: string }>('/v1/environments', { name: 'perm-env', image: 'agentplane/sandbox:1' })).id;
  agentA = (await p.root.post<{ id: string }>('/v1/agents', { name: 'perm-a', model: 'default' })).id;
  agentB = (await p.root.post<{ id: string }>('/v1/agents', { name: 'perm-b', model: 'default' })).id;
});
afterAll(async () => {
  await p?.stop();
});

describe('PermissionAssignments', () => {
  it('a Principal credential reads an Agent only with a live `read` assignment, over REST and MCP', async () => {
    const prin = await principal('reader');
    const cred = await credential(prin);
    const denied = await as(cred.secret).request('GET', `/v1/agents/${agentA}`);
    expect(denied.status).toBe(403);
    expect(errType(denied)).toBe('policy.denied');
    expect(errMsg(denied)).toContain("'read'");
    expect(errMsg(denied)).toContain(agentA);
    const mcpDenied = await mcpCall(p.baseUrl, cred.secret, 'agents_getAgent', { path: { agent_id: agentA } });
    expect(mcpDenied.result?.isError).toBe(true);
    expect((toolBody(mcpDenied.result).error as { type: string }).type).toBe('policy.denied');

    const a = await grant(prin, { type: 'agent', id: agentA }, ['read']);
    expect(a).toMatchObject({ type: 'permission_assignment', principal_id: prin, target: { type: 'agent', id: agentA }, actions: ['read'], version: 1 });
    expect(a.id).toMatch(/^perm_[0-9a-f]{32}$/);
    expect((await as(cred.secret).request('GET', `/v1/agents/${agentA}`)).status).toBe(200);
    const viaMcp = await mcpCall(p.baseUrl, cred.secret, 'agents_getAgent', { path: { agent_id: agentA } });
    expect(viaMcp.result?.isError).toBeFalsy();
    expect(toolBody(viaMcp.result).id).toBe(agentA);
    // The grant is on agent A only.
    expect((await as(cred.secret).request('GET', `/v1/agents/${agentB}`)).status).toBe(403);

    // Revoking denies the very next request, REST and MCP.
    const del = await p.root.request('DELETE', `/v1/permission-assignments/${a.id}`);
    expect(del.body).toEqual({ id: a.id, type: 'permission_assignment_deleted' });
    expect((await as(cred.secret).request('GET', `/v1/agents/${agentA}`)).status).toBe(403);
    expect((await mcpCall(p.baseUrl, cred.secret, 'agents_getAgent', { path: { agent_id: agentA } })).result?.isError).toBe(true);
    // A read on a MemoryStore lists exactly the MemoryStore reads of the catalog (the Agent grant is gone).
    const store = (await p.root.post<{ id: string }>('/v1/memory-stores', { name: 'catalog' })).id;
    const m = await grant(prin, { type: 'memory_store', id: store }, ['read']);
    expect((await mcpToolNames(p.baseUrl, cred.secret)).sort()).toEqual(['memoryStores_getDocument', 'memoryStores_getMemoryStore', 'memoryStores_searchMemory']);
    await p.root.request('DELETE', `/v1/permission-assignments/${m.id}`);
    // `approve` on the Workspace lists the ActionApproval reads (the approvals queue), nothing else.
    const ap = await grant(prin, { type: 'workspace', id: ws }, ['approve']);
    expect((await mcpToolNames(p.baseUrl, cred.secret)).sort()).toEqual(['approvals_getActionApproval', 'approvals_listActionApprovals', 'approvals_listSessionActionApprovals']);
    await p.root.request('DELETE', `/v1/permission-assignments/${ap.id}`);

    // A Workspace-wide grant covers every Agent.
    await grant(prin, { type: 'workspace', id: ws }, ['read']);
    expect((await as(cred.secret).request('GET', `/v1/agents/${agentB}`)).status).toBe(200);
  });

  it('an id absent from the Principal\'s Workspace is 404 for every kind, as for an API key', async () => {
    const other = (await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name: 'perm-other' })).id;
    const theirs = p.root.with({ workspaceId: other });
    const foreign = {
      agent: (await theirs.post<{ id: string }>('/v1/agents', { name: 'their-agent', model: 'default' })).id,
      store: (await theirs.post<{ id: string }>('/v1/memory-stores', { name: 'their-store' })).id,
    };
    const prin = await principal('wanderer');
    const cred = await credential(prin);
    const paths = [
      `/v1/agents/${foreign.agent}`, `/v1/agents/agent_${'0'.repeat(32)}`,
      `/v1/memory-stores/${foreign.store}`, `/v1/memory-stores/memstore_${'0'.repeat(32)}`,
    ];
    for (const path of paths) {
      const r = await as(cred.secret).request('GET', path);
      expect([path, r.status, errType(r)]).toEqual([path, 404, 'validation.not_found']);
    }
    // An id of its own Workspace it holds nothing on is still 403.
    expect((await as(cred.secret).request('GET', `/v1/agents/${agentA}`)).status).toBe(403);
  });

  it('drive needs `steer` on the Session (or its Agent); losing it mid-Session denies the next drive', async () => {
    const prin = await principal('driver');
    const cred = await credential(prin);
    const client = as(cred.secret);
    const s = await session();
    const before = await client.request('POST', `/v1/sessions/${s}/events`, { body: drive(prin) });
    expect(before.status).toBe(403);
    expect(errMsg(before)).toContain("'steer'");

    const a = await grant(prin, { type: 'session', id: s }, ['steer', 'observe']);
    const ok = await client.request('POST', `/v1/sessions/${s}/events`, { body: drive(prin, 'first') });
    expect(ok.status).toBe(201);
    expect((await client.request('GET', `/v1/sessions/${s}`)).status).toBe(200);
    // A Principal credential drives as its own Principal only.
    const other = await principal('someone-else');
    const impersonate = await client.request('POST', `/v1/sessions/${s}/events`, { body: drive(other) });
    expect(impersonate.status).toBe(403);
    expect(errType(impersonate)).toBe('policy.denied');

    // Narrow the assignment (CAS): a stale version conflicts and changes nothing.
    const stale = await p.root.request('POST', `/v1/permission-assignments/${a.id}`, { body: { actions: ['observe'], expected_version: 7 } });
    expect(stale.status).toBe(409);
    expect((await client.request('POST', `/v1/sessions/${s}/events`, { body: drive(prin, 'second') })).status).toBe(201);
    const narrowed = await p.root.request<{ version: number; actions: string[] }>('POST', `/v1/permission-assignments/${a.id}`, { body: { actions: ['observe'], expected_version: a.version } });
    expect(narrowed.status).toBe(200);
    expect(narrowed.body).toMatchObject({ version: 2, actions: ['observe'] });
    const after = await client.request('POST', `/v1/sessions/${s}/events`, { body: drive(prin, 'third') });
    expect(after.status).toBe(403);
    expect(errType(after)).toBe('policy.denied');
    // Still observable; the denial is in the audit log.
    expect((await client.request('GET', `/v1/sessions/${s}`)).status).toBe(200);
    const audit = await p.root.request<{ data: { outcome: string; detail: string; actor: { id: string } }[] }>('POST', '/v1/audit/export', { body: { target: s, actor: prin, action: 'sessions.sendEvent' } });
    expect(audit.body.data.map((r) => r.outcome)).toEqual(['denied', 'succeeded', 'denied', 'succeeded', 'denied']);
    expect(audit.body.data.at(-1)?.detail).toBe('policy.denied');

    // An API key keeps its role-based access (no assignment needed).
    expect((await p.root.request('POST', `/v1/sessions/${s}/events`, { body: drive(prin, 'by key') })).status).toBe(201);
  });

  it('creating a Session needs `invoke` on its Agent; an Agent-level grant covers the Agent\'s Sessions', async () => {
    const prin = await principal('invoker');
    const client = as((await credential(prin)).secret);
    const body = { agent: agentA, environment_id: envId };
    const denied = await client.request('POST', '/v1/sessions', { body });
    expect(denied.status).toBe(403);
    expect(errMsg(denied)).toContain("'invoke'");
    await grant(prin, { type: 'agent', id: agentA }, ['invoke', 'steer', 'observe']);
    const created = await client.request<{ id: string }>('POST', '/v1/sessions', { body });
    expect(created.status).toBe(201);
    expect((await client.request('POST', `/v1/sessions/${created.body.id}/events`, { body: drive(prin) })).status).toBe(201);
    expect((await client.request('POST', '/v1/sessions', { body: { agent: agentB, environment_id: envId } })).status).toBe(403);
    const sB = await session(agentB);
    expect((await client.request('GET', `/v1/sessions/${sB}`)).status).toBe(403);
  });

  it('a Session created with its first messages is governed as those messages: author, ActionPolicies, usage reads', async () => {
    const prin = await principal('first-messages');
    const other = await principal('someone-else');
    const client = as((await credential(prin)).secret);
    await grant(prin, { type: 'agent', id: agentA }, ['invoke', 'steer', 'observe']);
    const withFirst = (author: string) => ({ agent: agentA, environment_id: envId, initial_events: [drive(author, 'first')] });
    // As another Principal: refused, as the drive endpoint refuses it.
    const forged = await client.request('POST', '/v1/sessions', { body: withFirst(other) });
    expect([forged.status, errType(forged)]).toEqual([403, 'policy.denied']);
    const own = await client.request<{ id: string }>('POST', '/v1/sessions', { body: withFirst(prin) });
    expect(own.status).toBe(201);
    // A drive deny for this Principal holds for the first messages too, whoever sends them.
    const rule = await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'deny', tool: { kind: 'drive', name: 'user.message' }, principal_id: prin });
    try {
      expect((await client.request('POST', '/v1/sessions', { body: withFirst(prin) })).status).toBe(403);
      expect((await p.root.request('POST', '/v1/sessions', { body: withFirst(prin) })).status).toBe(403);
      expect((await p.root.request('POST', '/v1/sessions', { body: withFirst(other) })).status).toBe(201);
    } finally {
      await p.root.request('DELETE', `/v1/action-policies/${rule.id}`);
    }
    // Usage is read like the Session: `observe` on it.
    expect((await client.request('GET', `/v1/sessions/${own.body.id}/usage`)).status).toBe(200);
    const usage = await client.request('GET', `/v1/sessions/${await session(agentB)}/usage`);
    expect([usage.status, errType(usage)]).toEqual([403, 'policy.denied']);
  });

  it('a Principal attaches to its Session only what it could reach itself', async () => {
    const prin = await principal('attacher');
    const client = as((await credential(prin)).secret);
    await grant(prin, { type: 'agent', id: agentA }, ['invoke']);
    const store = (await p.root.post<{ id: string }>('/v1/memory-stores', { name: 'attach-me' })).id;
    const attach = (access: 'read_only' | 'read_write') => client.request('POST', '/v1/sessions', {
      body: { agent: agentA, environment_id: envId, resources: [{ type: 'memory', memory_store_id: store, access }] },
    });
    expect((await attach('read_only')).status).toBe(403);
    await grant(prin, { type: 'memory_store', id: store }, ['read']);
    expect((await attach('read_only')).status).toBe(201);
    expect((await attach('read_write')).status).toBe(403);
    await grant(prin, { type: 'memory_store', id: store }, ['manage']);
    expect((await attach('read_write')).status).toBe(201);
    // Vaults (credentials) need `manage` on the Workspace.
    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'attach-vault' })).id;
    const withVault = await client.request('POST', '/v1/sessions', { body: { agent: agentA, environment_id: envId, vault_ids: [vault] } });
    expect([withVault.status, errType(withVault)]).toEqual([403, 'policy.denied']);
  });

  it('an outcome whose rubric is a File is governed as that File attached: `manage` on the Workspace', async () => {
    const prin = await principal('rubric-reader');
    const client = as((await credential(prin)).secret);
    await grant(prin, { type: 'agent', id: agentA }, ['invoke', 'steer', 'observe']);
    const upload = await p.root.uploadFile<{ id: string }>('secret.md', new TextEncoder().encode('- the password is hunter2\n'), { contentType: 'text/markdown' });
    expect(upload.status).toBe(201);
    const file = upload.body.id;
    const define = (rubric: unknown) => ({
      type: 'user.define_outcome', payload: { description: 'done', rubric, max_iterations: 1, authored_by: prin, caused_by: { kind: 'api' } },
    });
    const s = await session();
    const byDrive = await client.request('POST', `/v1/sessions/${s}/events`, { body: define({ type: 'file', file_id: file }) });
    expect([byDrive.status, errType(byDrive)]).toEqual([403, 'policy.denied']);
    expect(errMsg(byDrive)).toContain("'manage'");
    const byCreate = await client.request('POST', '/v1/sessions', { body: { agent: agentA, environment_id: envId, initial_events: [define({ type: 'file', file_id: file })] } });
    expect([byCreate.status, errType(byCreate)]).toEqual([403, 'policy.denied']);
    // Nothing was defined by the refusals; a rubric written out is the Principal's own text.
    expect((await p.root.get<{ outcome_evaluations: unknown[] }>(`/v1/sessions/${s}`)).outcome_evaluations).toEqual([]);
    expect((await client.request('POST', `/v1/sessions/${s}/events`, { body: define('- says hello') })).status).toBe(201);
    // With `manage` on the Workspace, the File is the Principal's to use.
    await grant(prin, { type: 'workspace', id: ws }, ['manage']);
    const s2 = await session();
    expect((await client.request('POST', `/v1/sessions/${s2}/events`, { body: define({ type: 'file', file_id: file }) })).status).toBe(201);
  });

  it('rejects unknown actions, malformed targets and other Workspaces\' targets, writing nothing', async () => {
    const prin = await principal('bad-input');
    const count = async () => (await p.root.get<{ data: unknown[] }>('/v1/permission-assignments', { principal_id: prin, limit: 100 })).data.length;
    const other = await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name: 'perm-other' });
    const otherAgent = (await p.root.with({ workspaceId: other.id }).post<{ id: string }>('/v1/agents', { name: 'elsewhere', model: 'default' })).id;
    const otherPrin = (await p.root.with({ workspaceId: other.id }).post<{ id: string }>(`/v1/organizations/workspaces/${other.id}/principals`, {
      external_subject_id: 'x', principal_type: 'person', display_name: 'x',
    })).id;
    const cases: [Json, number][] = [
      [{ principal_id: prin, target: { type: 'agent', id: agentA }, actions: ['fly'] }, 400],
      [{ principal_id: prin, target: { type: 'agent', id: agentA }, actions: [] }, 400],
      [{ principal_id: prin, target: { type: 'agent', id: agentA }, actions: ['read', 'read'] }, 400],
      [{ principal_id: prin, target: { type: 'agent', id: s32('sess') }, actions: ['read'] }, 400],
      [{ principal_id: prin, target: { type: 'memory', id: agentA }, actions: ['read'] }, 400],
      [{ principal_id: prin, target: { type: 'agent', id: agentA }, actions: ['read'], extra: 1 }, 400],
      [{ principal_id: prin, target: { type: 'agent', id: otherAgent }, actions: ['read'] }, 404],
      [{ principal_id: prin, target: { type: 'workspace', id: other.id }, actions: ['read'] }, 404],
      [{ principal_id: prin, target: { type: 'session', id: s32('sess') }, actions: ['read'] }, 404],
      [{ principal_id: otherPrin, target: { type: 'agent', id: agentA }, actions: ['read'] }, 404],
    ];
    for (const [body, status] of cases) {
      const r = await p.root.request('POST', '/v1/permission-assignments', { body });
      expect([JSON.stringify(body), r.status]).toEqual([JSON.stringify(body), status]);
    }
    expect(await count()).toBe(0);
    const missing = await p.root.request('GET', `/v1/permission-assignments/${s32('perm')}`);
    expect(missing.status).toBe(404);
    // Another Workspace's assignment is not found from here.
    const theirs = await p.root.with({ workspaceId: other.id }).post<{ id: string }>('/v1/permission-assignments', {
      principal_id: otherPrin, target: { type: 'agent', id: otherAgent }, actions: ['read'],
    });
    expect((await p.root.request('GET', `/v1/permission-assignments/${theirs.id}`)).status).toBe(404);
    expect((await p.root.request('DELETE', `/v1/permission-assignments/${theirs.id}`)).status).toBe(404);
  });

  it('suspending or deleting a Principal denies the next REST and MCP request of every one of its credentials', async () => {
    const prin = await principal('suspendable');
    await grant(prin, { type: 'workspace', id: ws }, ['read']);
    const creds = [await credential(prin), await credential(prin)];
    const pairing = await p.root.request<{ code: string }>('POST', '/v1/runner-pairings', { idempotencyKey: `pr-${Math.random()}`, body: { principal_id: prin, machine_label: 'laptop', expires_in_seconds: 300 } });
    const redeemed = await p.anon.request<{ secret: string }>('POST', '/v1/runner-pairings/redeem', { body: { code: pairing.body.code } });
    expect(redeemed.status).toBe(201);
    const runner = as(redeemed.body.secret);

    const allWork = async (expected: number) => {
      for (const c of creds) {
        expect((await as(c.secret).request('GET', `/v1/agents/${agentA}`)).status).toBe(expected);
        const m = await mcpCall(p.baseUrl, c.secret, 'agents_getAgent', { path: { agent_id: agentA } });
        if (expected === 200) expect(m.result?.isError).toBeFalsy();
        else expect(m.status).toBe(401);
      }
      expect((await runner.request('GET', '/v1/support/capabilities')).status).toBe(expected);
    };
    await allWork(200);
    const suspended = await p.root.request('POST', `/v1/principals/${prin}/suspend`, { body: {} });
    expect(suspended.status).toBe(200);
    await allWork(401);
    expect((await p.root.request('POST', `/v1/principals/${prin}/resume`, { body: {} })).status).toBe(200);
    await allWork(200);
    expect((await p.root.request('DELETE', `/v1/principals/${prin}`)).status).toBe(200);
    await allWork(401);
  });

  it('the MCP Principal catalog lists only what the live assignments allow', async () => {
    const prin = await principal('catalog');
    const cred = await credential(prin);
    expect(await mcpToolNames(p.baseUrl, cred.secret)).toEqual([]);
    const a = await grant(prin, { type: 'agent', id: agentB }, ['read']);
    expect(await mcpToolNames(p.baseUrl, cred.secret)).toEqual(['agents_getAgent']);
    // Listed, but each call is still checked against its target.
    expect((await mcpCall(p.baseUrl, cred.secret, 'agents_getAgent', { path: { agent_id: agentA } })).result?.isError).toBe(true);
    // The closed catalog: mutations and unlisted reads are refused by name.
    const other = await mcpCall(p.baseUrl, cred.secret, 'sessions_createSession', { body: { agent: agentB, environment_id: envId } });
    expect(other.result?.isError).toBe(true);
    await p.root.request('DELETE', `/v1/permission-assignments/${a.id}`);
    expect(await mcpToolNames(p.baseUrl, cred.secret)).toEqual([]);
  });

  it('lists assignments by Principal and by target', async () => {
    const prin = await principal('lister');
    const a1 = await grant(prin, { type: 'agent', id: agentA }, ['read']);
    const a2 = await grant(prin, { type: 'agent', id: agentB }, ['invoke', 'read']);
    const all = await p.root.get<{ data: { id: string; actions: string[] }[] }>('/v1/permission-assignments', { principal_id: prin });
    expect(all.data.map((a) => a.id)).toEqual([a1.id, a2.id]);
    expect(all.data[1]?.actions).toEqual(['invoke', 'read']);
    const onB = await p.root.get<{ data: { id: string }[] }>('/v1/permission-assignments', { principal_id: prin, target_id: agentB });
    expect(onB.data.map((a) => a.id)).toEqual([a2.id]);
  });
});

describe('an update racing a delete at the same expected_version', () => {
  it('never both succeed: the delete is one compare-and-delete, so it never erases an update it did not see', async () => {
    const prin = await principal('racer');
    const ids: string[] = [];
    for (let i = 0; i < 200; i++) ids.push((await grant(prin, { type: 'agent', id: agentA }, ['read'])).id);
    // The delete starts a few milliseconds after the update, at random, so that some land inside the other's read-to-write window.
    const outcomes = await Promise.all(ids.map(async (id) => {
      const [u, d] = await Promise.all([
        p.root.request('POST', `/v1/permission-assignments/${id}`, { body: { actions: ['observe', 'read'], expected_version: 1 } }),
        new Promise((r) => setTimeout(r, Math.random() * 6)).then(() => p.root.request('DELETE', `/v1/permission-assignments/${id}`, { query: { expected_version: 1 } })),
      ]);
      const after = await p.root.request<{ version: number; actions: string[] }>('GET', `/v1/permission-assignments/${id}`);
      return { id, update: u.status, del: d.status, after: after.status === 200 ? `${after.body.version}:${after.body.actions.join(',')}` : String(after.status) };
    }));
    // Either the update came first (the delete is 409 and version 2 stands) or the delete did (the update is 404).
    const wrong = outcomes.filter((o) => !((o.update === 200 && o.del === 409 && o.after === '2:observe,read') || (o.del === 200 && o.update === 404 && o.after === '404')));
    expect(wrong).toEqual([]);
    // The Principal's listing holds exactly the assignments that stood.
    const listed: string[] = [];
    let page: string | undefined;
    do {
      const r = await p.root.get<{ data: { id: string }[]; next_page: string | null }>('/v1/permission-assignments', { principal_id: prin, limit: 100, page });
      listed.push(...r.data.map((a) => a.id));
      page = r.next_page ?? undefined;
    } while (page);
    expect(listed.sort()).toEqual(outcomes.filter((o) => o.del === 409).map((o) => o.id).sort());
  }, 120_000);
});

function s32(prefix: string): string {
  return `${prefix}_${'0'.repeat(32)}`;
}
