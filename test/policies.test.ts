import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPlatform, type Platform } from './harness/platform.js';
import { mcpCall, toolBody } from './harness/mcp-call.js';
import { createPrincipal, errMsg, errType } from './harness/governance.js';

type Json = Record<string, unknown>;

let p: Platform;
let org: string;
let ws: string;
let envId: string;
let agent: string;

const principal = (name: string, inWs = ws): Promise<string> => createPrincipal(p.root, inWs, name);
async function policy(body: Json): Promise<{ id: string; version: number }> {
  const r = await p.root.request<{ id: string; version: number }>('POST', '/v1/action-policies', { body });
  expect(r.status).toBe(201);
  return r.body;
}
const drive = (author: string) => ({ type: 'user.message', payload: { content: 'hi', authored_by: author, caused_by: { kind: 'api' } } });

beforeAll(async () => {
  p = await startPlatform();
  org = p.bootstrap.organization_id;
  ws = p.bootstrap.workspace_id;
  envId = (await p.root.post<{ id: string }>('/v1/environments', { name: 'pol-env', image: 'agentplane/sandbox:1' })).id;
  agent = (await p.root.post<{ id: string }>('/v1/agents', { name: 'pol', model: 'default' })).id;
});
afterAll(async () => {
  await p?.stop();
});

describe('ActionPolicies', () => {
  it('CRUD with CAS versions; bad rules are refused and nothing is written', async () => {
    const count = async () => (await p.root.get<{ data: unknown[] }>('/v1/action-policies', { limit: 1000 })).data.length;
    const before = await count();
    const other = await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name: 'pol-other' });
    const theirPrincipal = await principal('theirs', other.id);
    const theirConn = await p.root.with({ workspaceId: other.id }).post<{ id: string }>('/v1/connections', { name: 'x', url: 'https://example.com/mcp' });
    const bad: [Json, number][] = [
      [{ effect: 'maybe', tool: { kind: 'builtin', name: 'bash' } }, 400],
      [{ effect: 'deny', tool: { kind: 'shell', name: 'bash' } }, 400],
      [{ effect: 'deny', tool: { kind: 'builtin', name: 'ba[' } }, 400],
      [{ effect: 'deny', tool: { kind: 'builtin', name: 'write' }, arguments: { path_glob: '/etc/{a,' } }, 400],
      [{ effect: 'deny', tool: { kind: 'builtin', name: 'read' }, arguments: { command_prefix: 'rm' } }, 400],
      // A path pattern on a tool that has no path argument could never match.
      [{ effect: 'deny', tool: { kind: 'builtin', name: 'bash' }, arguments: { path_glob: '/x/**' } }, 400],
      [{ effect: 'deny', tool: { kind: 'builtin', name: 'ba*' }, arguments: { path_glob: '/x/**' } }, 400],
      [{ effect: 'deny', tool: { kind: 'builtin', name: 'bash', connection_id: theirConn.id } }, 400],
      [{ effect: 'deny', tool: { kind: 'builtin', name: 'bash' }, surprise: 1 }, 400],
      [{ effect: 'deny', tool: { kind: 'builtin', name: 'bash' }, principal_id: theirPrincipal }, 404],
      [{ effect: 'deny', tool: { kind: 'mcp', name: 'x', connection_id: theirConn.id } }, 404],
    ];
    for (const [body, status] of bad) {
      const r = await p.root.request('POST', '/v1/action-policies', { body });
      expect([JSON.stringify(body), r.status]).toEqual([JSON.stringify(body), status]);
    }
    expect(await count()).toBe(before);

    const created = await policy({ effect: 'deny', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'rm' }, description: 'no rm' });
    expect(created.id).toMatch(/^apol_[0-9a-f]{32}$/);
    const read = await p.root.get<Json>(`/v1/action-policies/${created.id}`);
    expect(read).toMatchObject({ type: 'action_policy', effect: 'deny', tool: { kind: 'builtin', name: 'bash', connection_id: null }, arguments: { command_prefix: 'rm', path_glob: null }, principal_id: null, version: 1 });
    const stale = await p.root.request('POST', `/v1/action-policies/${created.id}`, { body: { effect: 'allow', tool: { kind: 'builtin', name: 'bash' }, expected_version: 9 } });
    expect(stale.status).toBe(409);
    const updated = await p.root.request<{ version: number; effect: string }>('POST', `/v1/action-policies/${created.id}`, { body: { effect: 'require_approval', tool: { kind: 'builtin', name: 'bash' }, expected_version: 1 } });
    expect(updated.body).toMatchObject({ version: 2, effect: 'require_approval' });
    expect((await p.root.request('DELETE', `/v1/action-policies/${created.id}`, { query: { expected_version: 1 } })).status).toBe(409);
    expect((await p.root.request('DELETE', `/v1/action-policies/${created.id}`)).body).toEqual({ id: created.id, type: 'action_policy_deleted' });
    expect((await p.root.request('GET', `/v1/action-policies/${created.id}`)).status).toBe(404);
  });

  it('the dry run explains which rule decided', async () => {
    const broad = await policy({ effect: 'require_approval', tool: { kind: 'builtin', name: 'bash' } });
    const narrow = await policy({ effect: 'allow', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'git status' } });
    const denyAll = await policy({ effect: 'deny', tool: { kind: 'any', name: 'danger_*' } });
    const ev = (tool: Json, input?: unknown) => p.root.post<{ decision: string; rule_id: string | null; explanation: string; matched: { rule_id: string }[] }>('/v1/action-policies/evaluate', { tool, ...(input !== undefined ? { input } : {}) });
    const git = await ev({ kind: 'builtin', name: 'bash' }, { command: 'git status' });
    expect(git).toMatchObject({ decision: 'allow', rule_id: narrow.id });
    expect(git.matched.map((m) => m.rule_id)).toEqual([narrow.id, broad.id]);
    expect(git.explanation).toContain('most specific');
    expect(await ev({ kind: 'builtin', name: 'bash' }, { command: 'git status; rm -rf /' })).toMatchObject({ decision: 'require_approval', rule_id: broad.id });
    const danger = await ev({ kind: 'custom', name: 'danger_zone' });
    expect(danger).toMatchObject({ decision: 'deny', rule_id: denyAll.id });
    expect(danger.explanation).toContain('deny wins');
    expect(await ev({ kind: 'custom', name: 'fine' })).toMatchObject({ decision: 'allow', rule_id: null, matched: [] });
    expect((await p.root.request('POST', '/v1/action-policies/evaluate', { body: { tool: { kind: 'nope', name: 'x' } } })).status).toBe(400);
    for (const r of [broad, narrow, denyAll]) await p.root.request('DELETE', `/v1/action-policies/${r.id}`);
  });

  it('a path_glob holds however the path is spelled: dot segments, repeated slashes and `..` neither escape a deny nor widen an allow', async () => {
    const deny = await policy({ effect: 'deny', tool: { kind: 'builtin', name: 'read' }, arguments: { path_glob: '/workspace/secrets/**' } });
    const allow = await policy({ effect: 'allow', tool: { kind: 'builtin', name: 'write' }, arguments: { path_glob: '/workspace/**' } });
    const gate = await policy({ effect: 'require_approval', tool: { kind: 'builtin', name: 'write' } });
    const ev = (name: string, path: string) => p.root.post<{ decision: string; rule_id: string | null }>('/v1/action-policies/evaluate', { tool: { kind: 'builtin', name }, input: { path } });
    for (const path of ['/workspace/secrets/key', '/workspace/./secrets/key', '/workspace//secrets/key', '/workspace/notes/../secrets/key', '/workspace/secrets/./a/../key']) {
      expect(await ev('read', path), path).toMatchObject({ decision: 'deny', rule_id: deny.id });
    }
    expect(await ev('read', '/workspace/notes/key')).toMatchObject({ decision: 'allow', rule_id: null });
    expect(await ev('write', '/workspace/out/report.md')).toMatchObject({ decision: 'allow', rule_id: allow.id });
    // Out of the allowed tree by `..`: the allow rule does not match, the broader gate decides.
    for (const path of ['/workspace/../etc/passwd', '/workspace/out/../../etc/passwd']) {
      expect(await ev('write', path), path).toMatchObject({ decision: 'require_approval', rule_id: gate.id });
    }
    for (const r of [deny, allow, gate]) await p.root.request('DELETE', `/v1/action-policies/${r.id}`);
  });

  it('a rule may name a MemoryStore: its memory tools are MCP tools of that store', async () => {
    const store = (await p.root.post<{ id: string }>('/v1/memory-stores', { name: 'governed-notes' })).id;
    const other = (await p.root.post<{ id: string }>('/v1/memory-stores', { name: 'other-notes' })).id;
    const rule = await policy({ effect: 'deny', tool: { kind: 'mcp', name: 'delete', connection_id: store } });
    expect((await p.root.get<{ tool: Json }>(`/v1/action-policies/${rule.id}`)).tool).toMatchObject({ kind: 'mcp', name: 'delete', connection_id: store });
    const ev = (connection: string) => p.root.post<{ decision: string; rule_id: string | null }>('/v1/action-policies/evaluate', { tool: { kind: 'mcp', name: 'delete', connection_id: connection } });
    expect(await ev(store)).toMatchObject({ decision: 'deny', rule_id: rule.id });
    expect((await ev(other)).rule_id).not.toBe(rule.id);
    // A store of no Workspace the caller reaches is not found.
    expect((await p.root.request('POST', '/v1/action-policies', { body: { effect: 'deny', tool: { kind: 'mcp', name: 'delete', connection_id: `memstore_${'0'.repeat(32)}` } } })).status).toBe(404);
    await p.root.request('DELETE', `/v1/action-policies/${rule.id}`);
  });

  it('MCP tools/call is checked by tool name, live', async () => {
    const rule = await policy({ effect: 'deny', tool: { kind: 'api', name: 'agents_*' } });
    const denied = await mcpCall(p.baseUrl, p.bootstrap.root_key, 'agents_getAgent', { path: { agent_id: agent } });
    expect(denied.result?.isError).toBe(true);
    const e = toolBody(denied.result).error as { type: string; message: string };
    expect(e.type).toBe('policy.denied');
    expect(e.message).toContain(rule.id);
    // REST is not the MCP edge.
    expect((await p.root.request('GET', `/v1/agents/${agent}`)).status).toBe(200);
    expect((await mcpCall(p.baseUrl, p.bootstrap.root_key, 'sessions_listSessions', {})).result?.isError).toBeFalsy();
    await p.root.request('DELETE', `/v1/action-policies/${rule.id}`);
    expect((await mcpCall(p.baseUrl, p.bootstrap.root_key, 'agents_getAgent', { path: { agent_id: agent } })).result?.isError).toBeFalsy();
  });

  it('session drive is checked per event type and author', async () => {
    const alice = await principal('alice');
    const bob = await principal('bob');
    const s = (await p.root.post<{ id: string }>('/v1/sessions', { agent, environment_id: envId })).id;
    const rule = await policy({ effect: 'deny', tool: { kind: 'drive', name: 'user.message' }, principal_id: alice });
    const byAlice = await p.root.request('POST', `/v1/sessions/${s}/events`, { body: drive(alice) });
    expect(byAlice.status).toBe(403);
    expect(errType(byAlice)).toBe('policy.denied');
    expect(errMsg(byAlice)).toContain(rule.id);
    expect((await p.root.request('POST', `/v1/sessions/${s}/events`, { body: drive(bob) })).status).toBe(201);
    const approval = await policy({ effect: 'require_approval', tool: { kind: 'drive', name: 'user.*' }, principal_id: bob });
    const held = await p.root.request('POST', `/v1/sessions/${s}/events`, { body: drive(bob) });
    expect(held.status).toBe(403);
    expect(errMsg(held)).toContain('approval');
    // No approval was asked for (none can be waited for here): the decision's record says denied.
    const records = await p.root.post<{ data: { action: string; outcome: string; detail: string | null; request_id: string | null }[] }>('/v1/audit/export', { limit: 1000 });
    expect(records.data.filter((r) => r.request_id === held.headers.get('request-id')).map((r) => [r.action, r.outcome, r.detail])).toEqual([
      ['policy.drive:user.message', 'denied', approval.id], ['sessions.sendEvent', 'denied', 'policy.denied'],
    ]);
    await p.root.request('DELETE', `/v1/action-policies/${rule.id}`);
    await p.root.request('DELETE', `/v1/action-policies/${approval.id}`);
    expect((await p.root.request('POST', `/v1/sessions/${s}/events`, { body: drive(alice) })).status).toBe(201);
  });
});

describe('an update racing a delete at the same expected_version', () => {
  it('never both succeed: the delete is one compare-and-delete, so it never erases an update it did not see', async () => {
    const probe = (effect: string) => ({ effect, tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'race-probe' } });
    const ids: string[] = [];
    for (let i = 0; i < 200; i++) ids.push((await policy(probe('deny'))).id);
    // The delete starts a few milliseconds after the update, at random, so that some land inside the other's read-to-write window.
    const outcomes = await Promise.all(ids.map(async (id) => {
      const [u, d] = await Promise.all([
        p.root.request('POST', `/v1/action-policies/${id}`, { body: { ...probe('allow'), expected_version: 1 } }),
        new Promise((r) => setTimeout(r, Math.random() * 6)).then(() => p.root.request('DELETE', `/v1/action-policies/${id}`, { query: { expected_version: 1 } })),
      ]);
      const after = await p.root.request<{ version: number; effect: string }>('GET', `/v1/action-policies/${id}`);
      return { id, update: u.status, del: d.status, after: after.status === 200 ? `${after.body.version}:${after.body.effect}` : String(after.status) };
    }));
    // Either the update came first (the delete is 409 and version 2 stands) or the delete did (the update is 404).
    const wrong = outcomes.filter((o) => !((o.update === 200 && o.del === 409 && o.after === '2:allow') || (o.del === 200 && o.update === 404 && o.after === '404')));
    expect(wrong).toEqual([]);
    for (const o of outcomes.filter((x) => x.del === 409)) expect((await p.root.request('DELETE', `/v1/action-policies/${o.id}`, { query: { expected_version: 2 } })).status).toBe(200);
  }, 120_000);
});
