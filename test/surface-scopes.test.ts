import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { createCredential, createPrincipal, errMsg, errType } from './harness/governance.js';
import { mcpCall, mcpToolNames, toolBody } from './harness/mcp-call.js';

type Json = Record<string, unknown>;
type Scope = { id: string; version: number; kind: string; parent_id: string | null; state: string; [k: string]: unknown };

let p: Platform;
let ws: string;
let envId: string;
let agentId: string;

const post = <T = Json>(path: string, body: unknown, headers?: Record<string, string>) => p.root.request<T>('POST', path, { body, ...(headers ? { headers } : {}) });
async function scope(body: Json): Promise<Scope> {
  const r = await post<Scope>('/v1/surface-scopes', body);
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return r.body;
}

beforeAll(async () => {
  p = await startPlatform();
  ws = p.bootstrap.workspace_id;
  envId = (await p.root.post<{ id: string }>('/v1/environments', { name: 'surf-env', image: 'agentplane/sandbox:1' })).id;
  agentId = (await p.root.post<{ id: string }>('/v1/agents', { name: 'surf-agent', model: 'default' })).id;
});
afterAll(async () => {
  await p?.stop();
});

describe('SurfaceScopes', () => {
  it('builds the tree root → team → channel plus personal under an external installation, with every field', async () => {
    const inst = await post<{ id: string; state: string }>('/v1/external-installations', { provider: 'slack', external_id: 'T0001', display_name: 'Acme Slack' });
    expect(inst.status).toBe(201);
    expect(inst.body.id).toMatch(/^exti_[0-9a-f]{32}$/);
    expect(inst.body.state).toBe('active');
    const dup = await post('/v1/external-installations', { provider: 'slack', external_id: 'T0001', display_name: 'again' });
    expect(dup.status).toBe(409);
    expect(errType(dup)).toBe('validation.conflict');

    const exti = inst.body.id;
    const root = await scope({ kind: 'root', external_installation_id: exti, external_id: 'T0001', display_name: 'Acme' });
    expect(root).toMatchObject({
      type: 'surface_scope', workspace_id: ws, external_installation_id: exti, external_id: 'T0001', kind: 'root', parent_id: null,
      visibility: 'public', membership: 'public', inheritance: 'inherit', state: 'active', version: 1,
      verified_member: null, membership_assertion: null,
      ambient_policy: { enabled: false, muted: false, max_responses_per_window: null, max_tokens_per_window: null, self_quiet_threshold: null },
    });
    expect(root.id).toMatch(/^surf_[0-9a-f]{32}$/);
    const second = await post('/v1/surface-scopes', { kind: 'root', external_installation_id: exti, display_name: 'again' });
    expect(second.status).toBe(409);
    expect(errMsg(second)).toContain('root');

    const team = await scope({ kind: 'team', parent_id: root.id, external_installation_id: exti, external_id: 'S-eng', display_name: 'Engineering' });
    const channel = await scope({
      kind: 'channel', parent_id: team.id, external_installation_id: exti, external_id: 'C-deploys', display_name: '#deploys',
      visibility: 'private', membership: 'invite_only', membership_assertion: { asserted_at: '2026-01-01T00:00:00.000Z', freshness_horizon_seconds: 300 },
      ambient_policy: { enabled: true, max_responses_per_window: 5 },
    });
    expect(channel).toMatchObject({ parent_id: team.id, visibility: 'private', membership: 'invite_only', membership_assertion: { freshness_horizon_seconds: 300 } });
    expect(channel.ambient_policy).toMatchObject({ enabled: true, max_responses_per_window: 5, muted: false });

    const member = await createPrincipal(p.root, ws, 'member');
    const personal = await scope({ kind: 'personal', parent_id: root.id, external_installation_id: exti, display_name: 'DM', verified_member: { principal_id: member, external_identity_link_id: 'U123' } });
    expect(personal).toMatchObject({ visibility: 'private', membership: 'verified', verified_member: { principal_id: member, external_identity_link_id: 'U123' } });
    expect(typeof (personal.verified_member as Json).paired_at).toBe('string');

    // Shape rules: a channel under a personal scope, a team without a parent, a personal scope without its member.
    for (const [body, text] of [
      [{ kind: 'channel', parent_id: personal.id, external_installation_id: exti, display_name: 'x' }, 'sits under'],
      [{ kind: 'team', external_installation_id: exti, display_name: 'x' }, 'needs a parent'],
      [{ kind: 'personal', parent_id: root.id, external_installation_id: exti, display_name: 'x' }, 'verified member'],
      [{ kind: 'team', parent_id: root.id, display_name: 'x' }, 'same external installation'],
    ] as const) {
      const r = await post('/v1/surface-scopes', body);
      expect(r.status, JSON.stringify(body)).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
      expect(errMsg(r)).toContain(text);
    }
    const unknownField = await post('/v1/surface-scopes', { kind: 'root', display_name: 'x', colour: 'red' });
    expect(unknownField.status).toBe(400);

    // List: version 2026-08-24 as the reference names it; filters by installation and by external id.
    const listed = await p.root.request<{ data: Scope[]; next_page: string | null }>('GET', `/v1/surface-scopes?external_installation_id=${exti}&limit=2`, { headers: { 'service-version': '2026-08-24' } });
    expect(listed.status).toBe(200);
    expect(listed.body.data.map((s) => s.id)).toEqual([root.id, team.id]);
    expect(listed.body.next_page).toMatch(/^c1_/);
    const page2 = await p.root.get<{ data: Scope[]; next_page: string | null }>(`/v1/surface-scopes?external_installation_id=${exti}&limit=2&page=${listed.body.next_page}`);
    expect(page2.data.map((s) => s.id)).toEqual([channel.id, personal.id]);
    const byExternal = await p.root.get<{ data: Scope[] }>(`/v1/surface-scopes?external_id=C-deploys`);
    expect(byExternal.data.map((s) => s.id)).toEqual([channel.id]);
    for (const bad of ['external_id=', `external_id=${'x'.repeat(513)}`, 'limit=0', 'external_installation_id=surf_00000000000000000000000000000000']) {
      const r = await p.root.request('GET', `/v1/surface-scopes?${bad}`);
      expect(r.status, bad).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
    const wrongVersion = await p.root.request('GET', '/v1/surface-scopes', { headers: { 'service-version': '2026-08-29' } });
    expect(wrongVersion.status).toBe(400);
  });

  it('updates under compare-and-swap and archives children before parents', async () => {
    const root = await scope({ kind: 'root', display_name: 'Native root' });
    const team = await scope({ kind: 'team', parent_id: root.id, display_name: 'Team' });
    const up = await post<Scope>(`/v1/surface-scopes/${team.id}`, { display_name: 'Team two', ambient_policy: { muted: true }, expected_version: 1 });
    expect(up.status).toBe(200);
    expect(up.body).toMatchObject({ display_name: 'Team two', version: 2, ambient_policy: { muted: true, enabled: false } });
    const stale = await post(`/v1/surface-scopes/${team.id}`, { display_name: 'Team three', expected_version: 1 });
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('validation.conflict');
    const fixed = await post(`/v1/surface-scopes/${team.id}`, { kind: 'channel' });
    expect(fixed.status).toBe(400);

    const early = await post(`/v1/surface-scopes/${root.id}/archive`, {});
    expect(early.status).toBe(409);
    expect(errType(early)).toBe('runtime.invalid_transition');
    const archived = await post<Scope>(`/v1/surface-scopes/${team.id}/archive`, {});
    expect(archived.body).toMatchObject({ state: 'archived', version: 3 });
    expect(typeof archived.body.archived_at).toBe('string');
    const again = await post<Scope>(`/v1/surface-scopes/${team.id}/archive`, {});
    expect(again.status).toBe(200);
    expect(again.body.version).toBe(3);
    const editArchived = await post(`/v1/surface-scopes/${team.id}`, { display_name: 'no' });
    expect(editArchived.status).toBe(409);
    const under = await post('/v1/surface-scopes', { kind: 'channel', parent_id: team.id, display_name: 'late' });
    expect(under.status).toBe(409);
    expect((await post(`/v1/surface-scopes/${root.id}/archive`, {})).status).toBe(200);
    const audit = await p.root.post<{ data: { action: string; target: string | null }[] }>('/v1/audit/export', { action: 'surfaceScopes.archiveSurfaceScope' });
    expect(audit.data.some((r) => r.target === team.id)).toBe(true);
  });

  it('permissions and the ambient policy flow down the tree while each step inherits; isolate cuts it', async () => {
    const inst = (await post<{ id: string }>('/v1/external-installations', { provider: 'teams', external_id: 'tenant-9', display_name: 'Teams' })).body.id;
    const root = await scope({ kind: 'root', external_installation_id: inst, display_name: 'R', ambient_policy: { enabled: true, max_tokens_per_window: 1000, max_responses_per_window: 10 } });
    const team = await scope({ kind: 'team', parent_id: root.id, external_installation_id: inst, display_name: 'T', ambient_policy: { enabled: true, max_tokens_per_window: 5000, muted: true } });
    const channel = await scope({ kind: 'channel', parent_id: team.id, external_installation_id: inst, display_name: 'C', ambient_policy: { enabled: true, max_responses_per_window: 3 } });
    const isolated = await scope({ kind: 'channel', parent_id: team.id, external_installation_id: inst, display_name: 'I', inheritance: 'isolate', ambient_policy: { enabled: true } });

    const eff = await p.root.get<Json>(`/v1/surface-scopes/${channel.id}/effective-policy`);
    expect(eff).toEqual({
      surface_scope_id: channel.id, inherits_from: [team.id, root.id],
      ambient_policy: { enabled: true, muted: true, max_responses_per_window: 3, max_tokens_per_window: 1000, self_quiet_threshold: null },
    });
    const effIso = await p.root.get<Json>(`/v1/surface-scopes/${isolated.id}/effective-policy`);
    expect(effIso).toMatchObject({ inherits_from: [], ambient_policy: { enabled: true, muted: false, max_tokens_per_window: null } });

    // A `read` on the root covers the channel (inherit → inherit), not the isolated channel.
    const prin = await createPrincipal(p.root, ws, 'scope-reader');
    const cred = await createCredential(p.root, prin);
    const as = new HttpClient({ baseUrl: p.baseUrl, token: cred.secret });
    expect((await as.request('GET', `/v1/surface-scopes/${channel.id}`)).status).toBe(403);
    const grant = await post<{ id: string }>('/v1/permission-assignments', { principal_id: prin, target: { type: 'surface_scope', id: root.id }, actions: ['read'] });
    expect(grant.status).toBe(201);
    expect((await as.request('GET', `/v1/surface-scopes/${root.id}`)).status).toBe(200);
    expect((await as.request('GET', `/v1/surface-scopes/${channel.id}`)).status).toBe(200);
    // The same read is a tool of the MCP Principal catalog, listed once an assignment allows it.
    expect(await mcpToolNames(p.baseUrl, cred.secret)).toContain('surfaceScopes_getSurfaceScope');
    const viaMcp = await mcpCall(p.baseUrl, cred.secret, 'surfaceScopes_getSurfaceScope', { path: { surface_scope_id: channel.id } });
    expect(viaMcp.result?.isError).toBeFalsy();
    expect(toolBody(viaMcp.result).id).toBe(channel.id);
    const cut = await as.request('GET', `/v1/surface-scopes/${isolated.id}`);
    expect(cut.status).toBe(403);
    expect(errType(cut)).toBe('policy.denied');
    // Switching the team to isolate cuts the team and its channel off from the root's grant, from the next request.
    expect((await post(`/v1/surface-scopes/${team.id}`, { inheritance: 'isolate' })).status).toBe(200);
    expect((await as.request('GET', `/v1/surface-scopes/${team.id}`)).status).toBe(403);
    expect((await as.request('GET', `/v1/surface-scopes/${channel.id}`)).status).toBe(403);
    // A grant on the team still reaches the channel (it inherits), until the channel isolates too.
    expect((await post('/v1/permission-assignments', { principal_id: prin, target: { type: 'surface_scope', id: team.id }, actions: ['read'] })).status).toBe(201);
    expect((await as.request('GET', `/v1/surface-scopes/${channel.id}`)).status).toBe(200);
    expect((await post(`/v1/surface-scopes/${channel.id}`, { inheritance: 'isolate' })).status).toBe(200);
    expect((await as.request('GET', `/v1/surface-scopes/${channel.id}`)).status).toBe(403);
  });
});

describe('AgentInstallations', () => {
  it('installs a pinned Agent version on SurfaceScopes as a service Principal, re-pins, and archives', async () => {
    const root = await scope({ kind: 'root', external_installation_id: (await post<{ id: string }>('/v1/external-installations', { provider: 'discord', external_id: 'g1', display_name: 'G' })).body.id, display_name: 'G' });
    const r = await post<Json>('/v1/agent-installations', { agent: { id: agentId }, environment_id: envId, surface_scope_ids: [root.id], display_name: 'Helper' });
    expect(r.status, JSON.stringify(r.body)).toBe(201);
    const inst = r.body as { id: string; principal_id: string; version: number };
    expect(inst.id).toMatch(/^aini_[0-9a-f]{32}$/);
    expect(r.body).toMatchObject({ type: 'agent_installation', agent: { id: agentId, version: 1 }, surface_scope_ids: [root.id], status: 'active', version: 1, display_name: 'Helper' });
    const prin = await p.root.get<Json>(`/v1/principals/${inst.principal_id}`);
    expect(prin).toMatchObject({ principal_type: 'service', status: 'active' });

    await p.root.post(`/v1/agents/${agentId}`, { name: 'surf-agent', model: 'default', system: 'v2', expected_version: 1 });
    const repin = await post<Json>(`/v1/agent-installations/${inst.id}`, { agent: { id: agentId, version: 2 }, expected_version: 1 });
    expect(repin.status, JSON.stringify(repin.body)).toBe(200);
    expect(repin.body).toMatchObject({ agent: { id: agentId, version: 2 }, version: 2 });
    const stale = await post(`/v1/agent-installations/${inst.id}`, { display_name: 'x', expected_version: 1 });
    expect(stale.status).toBe(409);
    const missingVersion = await post(`/v1/agent-installations/${inst.id}`, { agent: { id: agentId, version: 9 } });
    expect(missingVersion.status).toBe(404);

    const other = await scope({ kind: 'team', parent_id: root.id, external_installation_id: root.external_installation_id as string, display_name: 'other' });
    expect((await post(`/v1/agent-installations/${inst.id}`, { surface_scope_ids: [root.id, other.id] })).status).toBe(200);
    const onOther = await p.root.get<{ data: { id: string }[] }>(`/v1/agent-installations?surface_scope_id=${other.id}`);
    expect(onOther.data.map((x) => x.id)).toEqual([inst.id]);
    expect((await post(`/v1/agent-installations/${inst.id}`, { surface_scope_ids: [root.id] })).status).toBe(200);
    expect((await p.root.get<{ data: unknown[] }>(`/v1/agent-installations?surface_scope_id=${other.id}`)).data).toEqual([]);

    const archived = await post<Json>(`/v1/agent-installations/${inst.id}/archive`, {});
    expect(archived.body).toMatchObject({ status: 'archived' });
    expect((await post(`/v1/agent-installations/${inst.id}`, { display_name: 'late' })).status).toBe(409);
    const active = await p.root.get<{ data: { id: string }[] }>('/v1/agent-installations?status=active');
    expect(active.data.map((x) => x.id)).not.toContain(inst.id);

    const archivedScope = await scope({ kind: 'team', parent_id: root.id, external_installation_id: root.external_installation_id as string, display_name: 'gone' });
    await post(`/v1/surface-scopes/${archivedScope.id}/archive`, {});
    const onArchived = await post('/v1/agent-installations', { agent: { id: agentId }, environment_id: envId, surface_scope_ids: [archivedScope.id] });
    expect(onArchived.status).toBe(409);
    expect(errType(onArchived)).toBe('runtime.invalid_transition');
  });
});
