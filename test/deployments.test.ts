import { spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HttpClient, type ApiResponse } from '@agentplane/client';
import { RUNNER_CLI, startDaemon } from './harness/daemon.js';
import { waitFor, type Platform } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnPlatform } from './harness/turns.js';

/**
 * Agent deployments (docs/DEPLOYMENTS.md): profiles with immutable revisions, deployment heads
 * and their state table, revisions under compare-and-swap with replay, connection bindings,
 * cross-workspace deploy, and a Session pinned to a revision running on the revision's pool in
 * the revision's topology.
 */
let p: Platform;
let dev: HttpClient;
let admin: HttpClient;
let viewer: HttpClient;
let ws: string;
let org: string;
let principal: string;
let msg: TurnPlatform['msg'];
const children: ChildProcess[] = [];

const errType = (r: ApiResponse<unknown>) => (r.body as { error?: { type?: string } }).error?.type;
const errMessage = (r: ApiResponse<unknown>) => (r.body as { error?: { message?: string } }).error?.message;
type Head = { id: string; key: string; status: string; current_revision_number: number; resource_version: number; archived_at: string | null; display_name: string | null };
type Rev = { id: string; revision_number: number; resolved_configuration_sha256: string; published_by: Json; execution_target: Json; connection_binding_selections: Json[] };

async function key(role: string, name: string): Promise<HttpClient> {
  const k = await p.root.post<{ secret: string }>(`/v1/organizations/${org}/api-keys`, {
    display_name: name, role, scope: { type: 'workspace', workspace_id: ws },
  }, { idempotencyKey: `deploy-${name}` });
  return new HttpClient({ baseUrl: p.baseUrl, token: k.secret });
}

let hprof: string;
let sprof: string;
let mrp: string;
async function agent(name: string, extra: Json = {}): Promise<string> {
  return (await dev.post<{ id: string }>('/v1/agents', { name, model: 'default', ...extra })).id;
}
function revisionBody(expected: number, over: Json = {}): Json {
  return {
    expected_resource_version: expected, agent_release_number: 1,
    model_routing: { model_routing_profile_id: mrp, model_routing_profile_revision_number: 1 },
    execution_target: { type: 'managed', harness_profile_id: hprof, harness_profile_revision_number: 1, sandbox_profile_id: sprof, sandbox_profile_revision_number: 1, runner_pool_id: null, harness_topology: 'split' },
    skill_selections: [], connection_binding_selections: [], ...over,
  };
}

beforeAll(async () => {
  ({ p, api: dev, principal, msg } = await startTurnPlatform({ name: 'deployments' }));
  ws = p.bootstrap.workspace_id;
  org = p.bootstrap.organization_id;
  admin = await key('admin', 'admin');
  viewer = await key('viewer', 'viewer');
  hprof = (await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/harness-profiles`, { key: 'default', kind: 'builtin' })).id;
  sprof = (await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/sandbox-profiles`, {
    key: 'default', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
  })).id;
  const profiles = await admin.get<{ data: { id: string; key: string }[] }>(`/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key: 'default' });
  mrp = profiles.data[0]?.id ?? '';
}, 150_000);
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await p?.stop();
});

describe('harness and sandbox profiles', () => {
  it('have immutable numbered revisions, a Workspace-unique key and CAS on expected_revision_number', async () => {
    const h = await admin.get<{ revision_number: number; supported_topologies: string[]; kind: string }>(`/v1/harness-profiles/${hprof}`);
    expect(h).toMatchObject({ revision_number: 1, kind: 'builtin', supported_topologies: ['split', 'colocated'] });
    const s = await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/sandbox-profiles`, { key: 'revs', image: 'agentplane/sandbox:latest' });
    const r2 = await admin.request<{ revision_number: number; image: string }>('POST', `/v1/sandbox-profiles/${s.id}/revisions`, { body: { expected_revision_number: 1, image: 'agentplane/sandbox:v2' } });
    expect(r2.status).toBe(201);
    expect(r2.body).toMatchObject({ revision_number: 2, image: 'agentplane/sandbox:v2' });
    expect((await admin.get<{ image: string }>(`/v1/sandbox-profiles/${s.id}/revisions/1`)).image).toBe('agentplane/sandbox:latest');
    const stale = await admin.request('POST', `/v1/sandbox-profiles/${s.id}/revisions`, { body: { expected_revision_number: 1, image: 'x' } });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);
    const dup = await admin.request('POST', `/v1/organizations/workspaces/${ws}/sandbox-profiles`, { body: { key: 'revs', image: 'x' } });
    expect([dup.status, errType(dup)]).toEqual([409, 'validation.conflict']);
    const byKey = await viewer.get<{ data: { id: string }[] }>(`/v1/organizations/workspaces/${ws}/sandbox-profiles`, { key: 'revs' });
    expect(byKey.data.map((x) => x.id)).toEqual([s.id]);
    const denied = await dev.request('POST', `/v1/organizations/workspaces/${ws}/harness-profiles`, { body: { key: 'x', kind: 'builtin' } });
    expect([denied.status, errType(denied)]).toEqual([403, 'policy.denied']);
    // Existing Environment routes keep working beside them.
    expect((await dev.request('POST', '/v1/environments', { body: { name: 'still', image: 'agentplane/sandbox:latest' } })).status).toBe(201);
  });
});

describe('deployment heads: the route table and the state table', () => {
  it('create, get, list with key/status filters and a cursor; writes need root or admin', async () => {
    const a = await agent('head-a');
    const created = await admin.request<Head>('POST', `/v1/organizations/workspaces/${ws}/agent-deployments`, { body: { agent_id: a, key: 'head-a', display_name: 'Head A' } });
    expect(created.status).toBe(201);
    expect(created.body).toMatchObject({ key: 'head-a', status: 'active', current_revision_number: 0, resource_version: 1, archived_at: null, agent_id: a, workspace_id: ws });
    expect(created.body.id).toMatch(/^adep_[0-9a-f]{32}$/);
    // Deterministic over (Workspace, Agent): a second head for the same Agent is a conflict.
    const again = await admin.request('POST', `/v1/organizations/workspaces/${ws}/agent-deployments`, { body: { agent_id: a, key: 'head-a2' } });
    expect([again.status, errType(again)]).toEqual([409, 'validation.conflict']);
    const b = await agent('head-b');
    const clash = await admin.request('POST', `/v1/organizations/workspaces/${ws}/agent-deployments`, { body: { agent_id: b, key: 'head-a' } });
    expect([clash.status, errType(clash)]).toEqual([409, 'validation.conflict']);
    await admin.post(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: b, key: 'head-b' });
    for (const who of [dev, viewer]) {
      const denied = await who.request('POST', `/v1/organizations/workspaces/${ws}/agent-deployments`, { body: { agent_id: b, key: 'x' } });
      expect([denied.status, errType(denied)]).toEqual([403, 'policy.denied']);
    }
    expect((await viewer.get<Head>(`/v1/agent-deployments/${created.body.id}`)).key).toBe('head-a');
    expect((await p.root.get<Head>(`/v1/agent-deployments/${created.body.id}`)).key).toBe('head-a');
    const byKey = await viewer.get<{ data: Head[] }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { key: 'head-b' });
    expect(byKey.data.map((d) => d.key)).toEqual(['head-b']);
    const page1 = await dev.get<{ data: Head[]; next_page: string | null }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { limit: 1 });
    expect(page1.data).toHaveLength(1);
    expect(page1.next_page).toMatch(/^c1_/);
    const page2 = await dev.get<{ data: Head[] }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { limit: 1, page: page1.next_page ?? '' });
    expect(page2.data[0]?.id).not.toBe(page1.data[0]?.id);
    const unknown = await viewer.request('GET', `/v1/agent-deployments/adep_${'0'.repeat(32)}`);
    expect([unknown.status, errType(unknown)]).toEqual([404, 'validation.not_found']);
    const wrong = await viewer.request('GET', `/v1/agent-deployments/sess_${'0'.repeat(32)}`);
    expect([wrong.status, errType(wrong)]).toEqual([400, 'validation.malformed']);
  });

  it('PATCH is fenced on expected_resource_version; archive is terminal', async () => {
    const a = await agent('state');
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: a, key: 'state' });
    const renamed = await admin.request<Head>('PATCH', `/v1/agent-deployments/${head.id}`, { body: { expected_resource_version: 1, display_name: 'Renamed' } });
    expect(renamed.status).toBe(200);
    expect(renamed.body).toMatchObject({ display_name: 'Renamed', resource_version: 2, status: 'active' });
    const stale = await admin.request('PATCH', `/v1/agent-deployments/${head.id}`, { body: { expected_resource_version: 1, display_name: 'Late' } });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);
    const onlyVersion = await admin.request('PATCH', `/v1/agent-deployments/${head.id}`, { body: { expected_resource_version: 2 } });
    expect([onlyVersion.status, errType(onlyVersion), errMessage(onlyVersion)]).toEqual([400, 'validation.malformed', "body: nothing to change: set at least one of 'display_name', 'status'"]);
    // A PATCH to the values the head already has writes nothing: same resource_version and updated_at.
    for (const body of [{ expected_resource_version: 2, display_name: 'Renamed' }, { expected_resource_version: 2, status: 'active' }]) {
      const same = await admin.request<Head & { updated_at: string }>('PATCH', `/v1/agent-deployments/${head.id}`, { body });
      expect(same.status).toBe(200);
      expect(same.body).toMatchObject({ display_name: 'Renamed', resource_version: 2, updated_at: (renamed.body as Head & { updated_at: string }).updated_at });
    }
    const denied = await dev.request('PATCH', `/v1/agent-deployments/${head.id}`, { body: { expected_resource_version: 2, display_name: 'x' } });
    expect([denied.status, errType(denied)]).toEqual([403, 'policy.denied']);
    const archived = await admin.request<Head>('PATCH', `/v1/agent-deployments/${head.id}`, { body: { expected_resource_version: 2, status: 'archived' } });
    expect(archived.status).toBe(200);
    expect(archived.body.status).toBe('archived');
    expect(archived.body.archived_at).not.toBeNull();
    for (const body of [{ expected_resource_version: 3, status: 'active' }, { expected_resource_version: 3, display_name: 'again' }]) {
      const r = await admin.request('PATCH', `/v1/agent-deployments/${head.id}`, { body });
      expect([r.status, errType(r)]).toEqual([409, 'runtime.invalid_transition']);
    }
    const publish = await admin.request('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revisionBody(3) });
    expect([publish.status, errType(publish)]).toEqual([409, 'runtime.invalid_transition']);
    const filtered = await viewer.get<{ data: Head[] }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { status: 'archived' });
    expect(filtered.data.map((d) => d.id)).toEqual([head.id]);
  });
});

describe('an organization key on a path that names another Workspace', () => {
  it('acts in that Workspace: the response and the audit record name it, not the selected one', async () => {
    const other = (await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name: 'named-in-path' })).id;
    const selectors: Record<string, string>[] = [{}, { 'service-workspace-id': ws }];
    for (const headers of selectors) {
      const key = `hp-${Object.keys(headers).length}`;
      const created = await p.root.request<{ id: string; workspace_id: string }>('POST', `/v1/organizations/workspaces/${other}/harness-profiles`, { headers, body: { key, kind: 'builtin' } });
      expect([created.status, created.body.workspace_id, created.headers.get('service-workspace-id')]).toEqual([201, other, other]);
      const listed = await p.root.request('GET', `/v1/organizations/workspaces/${other}/agent-deployments`, { headers });
      expect([listed.status, listed.headers.get('service-workspace-id')]).toEqual([200, other]);
      const audited = async (workspaceId: string) => (await p.root.with({ workspaceId }).post<{ data: { target: string | null }[] }>('/v1/audit/export', {
        action: 'harnessProfiles.createHarnessProfile', target: created.body.id,
      })).data.length;
      expect([await audited(other), await audited(ws)]).toEqual([1, 0]);
    }
    const outside = await admin.request('GET', `/v1/organizations/workspaces/${other}/agent-deployments`);
    expect([outside.status, errType(outside)]).toEqual([404, 'validation.not_found']);
  });
});

describe('revisions', () => {
  it('publish advances the head; an identical replay is idempotent; stale is 409; reads take version 2026-08-24', async () => {
    const a = await agent('revs');
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: a, key: 'revs' });
    const first = await admin.request<Rev>('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revisionBody(1) });
    expect(first.status).toBe(201);
    expect(first.body).toMatchObject({ revision_number: 1, agent_deployment_id: head.id, agent_release_number: 1, published_by: { kind: 'api_key' } });
    expect(first.body.id).toMatch(/^adrev_[0-9a-f]{32}$/);
    expect(first.body.resolved_configuration_sha256).toMatch(/^sha256:[0-9a-f]{64}$/);
    expect(await admin.get<Head>(`/v1/agent-deployments/${head.id}`)).toMatchObject({ current_revision_number: 1, resource_version: 2 });
    const replay = await admin.request<Rev>('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revisionBody(1) });
    expect(replay.status).toBe(200);
    expect(replay.body).toEqual(first.body);
    const different = await admin.request('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revisionBody(1, { execution_target: { ...(revisionBody(1).execution_target as Json), harness_topology: 'colocated' } }) });
    expect([different.status, errType(different)]).toEqual([409, 'validation.conflict']);
    expect((await admin.get<Head>(`/v1/agent-deployments/${head.id}`)).current_revision_number).toBe(1);
    const old = dev.with({ version: '2026-08-24' });
    expect((await old.get<Rev>(`/v1/agent-deployments/${head.id}/revisions/1`)).id).toBe(first.body.id);
    expect((await old.get<{ data: Rev[] }>(`/v1/agent-deployments/${head.id}/revisions`)).data.map((r) => r.revision_number)).toEqual([1]);
    const badVersion = await dev.with({ version: '2020-01-01' }).request('GET', `/v1/agent-deployments/${head.id}/revisions/1`);
    expect([badVersion.status, errType(badVersion)]).toEqual([400, 'validation.malformed']);
    const zero = await viewer.request('GET', `/v1/agent-deployments/${head.id}/revisions/0`);
    expect([zero.status, errType(zero)]).toEqual([400, 'validation.malformed']);
    const missing = await viewer.request('GET', `/v1/agent-deployments/${head.id}/revisions/9`);
    expect([missing.status, errType(missing)]).toEqual([404, 'validation.not_found']);
  });

  it('a publish of the configuration the current revision has answers that revision and writes nothing', async () => {
    const a = await agent('same-again');
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: a, key: 'same-again' });
    const first = await admin.request<Rev>('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revisionBody(1) });
    expect(first.status).toBe(201);
    const again = await admin.request<Rev>('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revisionBody(2) });
    expect([again.status, again.body]).toEqual([200, first.body]);
    expect(await admin.get<Head>(`/v1/agent-deployments/${head.id}`)).toMatchObject({ current_revision_number: 1, resource_version: 2 });
    // A different configuration is a new revision, and going back to the first one is one more.
    const colocated = revisionBody(2, { execution_target: { ...(revisionBody(2).execution_target as Json), harness_topology: 'colocated' } });
    expect((await admin.request<Rev>('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: colocated })).status).toBe(201);
    const back = await admin.request<Rev>('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revisionBody(3) });
    expect([back.status, back.body.revision_number, back.body.resolved_configuration_sha256]).toEqual([201, 3, first.body.resolved_configuration_sha256]);
  });

  it('an archived deployment refuses a publish as archived, whatever the publish names', async () => {
    const a = await agent('archived-pub');
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: a, key: 'archived-pub' });
    expect((await admin.request('PATCH', `/v1/agent-deployments/${head.id}`, { body: { expected_resource_version: 1, status: 'archived' } })).status).toBe(200);
    const target = revisionBody(2).execution_target as Json;
    for (const body of [revisionBody(2), revisionBody(2, { agent_release_number: 99 }), revisionBody(2, { execution_target: { ...target, runner_pool_id: `rpool_${'0'.repeat(32)}` } })]) {
      const r = await admin.request('POST', `/v1/agent-deployments/${head.id}/revisions`, { body });
      expect([r.status, errType(r)], JSON.stringify(body)).toEqual([409, 'runtime.invalid_transition']);
    }
  });

  it('validates the snapshot: closed execution_target union, pins that exist, topology the harness supports', async () => {
    const a = await agent('valid');
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: a, key: 'valid' });
    const post = (body: Json) => admin.request('POST', `/v1/agent-deployments/${head.id}/revisions`, { body });
    const target = revisionBody(1).execution_target as Json;
    const cases: [Json, number, string][] = [
      [revisionBody(1, { execution_target: { ...target, type: 'remote' } }), 400, 'validation.malformed'],
      [revisionBody(1, { execution_target: { ...target, extra: 1 } }), 400, 'validation.malformed'],
      [revisionBody(1, { agent_release_number: 7 }), 404, 'validation.not_found'],
      [revisionBody(1, { execution_target: { ...target, sandbox_profile_revision_number: 5 } }), 404, 'validation.not_found'],
      [revisionBody(1, { execution_target: { ...target, runner_pool_id: `rpool_${'0'.repeat(32)}` } }), 404, 'validation.not_found'],
      [revisionBody(1, { execution_target: { type: 'connected', connected_harness_id: `chrn_${'0'.repeat(32)}`, capability_set_digest: `sha256:${'a'.repeat(64)}`, harness_topology: 'connected' } }), 404, 'validation.not_found'],
      [revisionBody(1, { roster_snapshot: { entries: [] } }), 400, 'validation.malformed'],
    ];
    for (const [body, status, type] of cases) {
      const r = await post(body);
      expect([r.status, errType(r)], JSON.stringify(body)).toEqual([status, type]);
    }
    // A routing revision document above its profile's latest revision (left by an older two-step
    // publish) is no revision: a pin of it is 404.
    const routing = await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key: 'pinned-above', candidates: [{ credential_key: 'default', provider_model: 'one' }] });
    const redis = new Redis(p.redisUrl());
    try {
      await redis.set(`ap:{w:${ws}}:mrp_rev:${routing.id}:2`, JSON.stringify({
        type: 'model_routing_profile_revision', model_routing_profile_id: routing.id, workspace_id: ws, revision_number: 2,
        candidates: [{ credential_key: 'default', provider_model: 'orphan' }], created_at: new Date().toISOString(),
      }));
    } finally {
      redis.disconnect();
    }
    const above = await post(revisionBody(1, { model_routing: { model_routing_profile_id: routing.id, model_routing_profile_revision_number: 2 } }));
    expect([above.status, errType(above)]).toEqual([404, 'validation.not_found']);
    // An unknown target type is named as such, with the types there are.
    const remote = await post(revisionBody(1, { execution_target: { ...target, type: 'remote' } }));
    expect(errMessage(remote)).toBe("body.execution_target.type: must be one of 'managed', 'connected'");
    const splitOnly = await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/harness-profiles`, { key: 'split-only', kind: 'builtin', supported_topologies: ['split'] });
    const colocated = await post(revisionBody(1, { execution_target: { ...target, harness_profile_id: splitOnly.id, harness_topology: 'colocated' } }));
    expect([colocated.status, errType(colocated)]).toEqual([400, 'validation.malformed']);
    const digest = `sha256:${'b'.repeat(64)}`;
    const ch = await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/connected-harnesses`, { key: 'laptop', capability_set_digest: digest });
    const mismatch = await post(revisionBody(1, { execution_target: { type: 'connected', connected_harness_id: ch.id, capability_set_digest: `sha256:${'c'.repeat(64)}`, harness_topology: 'connected' } }));
    expect([mismatch.status, errType(mismatch)]).toEqual([409, 'validation.conflict']);
    const connected = await admin.request<Rev>('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revisionBody(1, { execution_target: { type: 'connected', connected_harness_id: ch.id, capability_set_digest: digest, harness_topology: 'connected' } }) });
    expect(connected.status).toBe(201);
    expect(connected.body.execution_target).toEqual({ type: 'connected', connected_harness_id: ch.id, capability_set_digest: digest, harness_topology: 'connected' });
    // Sessions on a connected harness are not served yet: refused, never run elsewhere.
    const s = await dev.request('POST', `/v1/agent-deployments/${head.id}/sessions`, { body: {} });
    expect([s.status, errType(s)]).toEqual([409, 'runtime.invalid_transition']);
  });

  it('the revision listing takes only the cursors it issued: any other is 400', async () => {
    const a = await agent('revs-cursor');
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: a, key: 'revs-cursor' });
    await admin.post(`/v1/agent-deployments/${head.id}/revisions`, revisionBody(1));
    await admin.post(`/v1/agent-deployments/${head.id}/revisions`, revisionBody(2, { execution_target: { ...(revisionBody(2).execution_target as Json), harness_topology: 'colocated' } }));
    const first = await viewer.get<{ data: Rev[]; next_page: string | null }>(`/v1/agent-deployments/${head.id}/revisions`, { limit: 1 });
    expect(first.data.map((r) => r.revision_number)).toEqual([1]);
    expect(first.next_page).not.toBeNull();
    const second = await viewer.get<{ data: Rev[]; next_page: string | null }>(`/v1/agent-deployments/${head.id}/revisions`, { limit: 1, page: first.next_page ?? '' });
    expect([second.data.map((r) => r.revision_number), second.next_page]).toEqual([[2], null]);
    // Past the last revision, revision 0, a leading zero, a number too large, not base 36: none was issued.
    for (const page of ['c1_zz', 'c1_3', 'c1_0', 'c1_01', `c1_${'z'.repeat(40)}`, 'c1_', 'c1_A', 'x1_1']) {
      const r = await viewer.request('GET', `/v1/agent-deployments/${head.id}/revisions`, { query: { page } });
      expect([page, r.status, errType(r)]).toEqual([page, 400, 'validation.malformed']);
    }
  });

  it('CAS race: two publishers from the same resource_version, one wins', async () => {
    const a = await agent('race');
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: a, key: 'race' });
    const target = revisionBody(1).execution_target as Json;
    // Each round's two configurations differ from each other and from the current revision's
    // (a publish of the current configuration changes nothing): they alternate between pools.
    const pool = (await admin.get<{ data: { id: string; name: string }[] }>('/v1/runner-pools')).data.find((x) => x.name === 'default')?.id;
    expect(pool).toBeDefined();
    for (let round = 0; round < 5; round++) {
      const cur = await admin.get<Head>(`/v1/agent-deployments/${head.id}`);
      const runner_pool_id = round % 2 === 0 ? null : pool;
      const [x, y] = await Promise.all([
        admin.request('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revisionBody(cur.resource_version, { execution_target: { ...target, runner_pool_id, harness_topology: 'split' } }) }),
        admin.request('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revisionBody(cur.resource_version, { execution_target: { ...target, runner_pool_id, harness_topology: 'colocated' } }) }),
      ]);
      expect([x.status, y.status].sort()).toEqual([201, 409]);
      expect(errType(x.status === 409 ? x : y)).toBe('validation.conflict');
      expect((await admin.get<Head>(`/v1/agent-deployments/${head.id}`)).current_revision_number).toBe(round + 1);
    }
  });
});

describe('connection bindings', () => {
  it('a binding revision takes effect for new Sessions only after a new deployment revision selects it', async () => {
    const conn = await admin.post<{ id: string }>('/v1/connections', { name: 'tools', url: 'https://mcp.example.test/mcp' });
    const a = await agent('bound');
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: a, key: 'bound' });
    const mismatch = await admin.request('POST', `/v1/agent-deployments/${head.id}/connection-bindings`, { body: { agent_deployment_id: `adep_${'1'.repeat(32)}`, integration_connection_id: conn.id, key: 'tools' } });
    expect([mismatch.status, errType(mismatch)]).toEqual([400, 'validation.malformed']);
    const binding = await admin.request<Head & { integration_connection_id: string }>('POST', `/v1/agent-deployments/${head.id}/connection-bindings`, {
      body: { agent_deployment_id: head.id, integration_connection_id: conn.id, key: 'tools', display_name: 'Tools' },
    });
    expect(binding.status).toBe(201);
    expect(binding.body).toMatchObject({ key: 'tools', status: 'active', resource_version: 1, integration_connection_id: conn.id });
    const bid = binding.body.id;
    expect(bid).toMatch(/^adcb_[0-9a-f]{32}$/);
    const r1 = await admin.request<Json>('POST', `/v1/agent-deployment-connection-bindings/${bid}/revisions`, { body: { expected_resource_version: 1, tool_selection: ['search'], tool_aliases: { search: 'find' }, argument_policy: 'strict' } });
    expect(r1.status).toBe(201);
    expect(r1.body).toMatchObject({ binding_revision_number: 1, argument_policy: 'strict', tool_aliases: { search: 'find' } });
    const replay = await admin.request('POST', `/v1/agent-deployment-connection-bindings/${bid}/revisions`, { body: { expected_resource_version: 1, tool_selection: ['search'], tool_aliases: { search: 'find' }, argument_policy: 'strict' } });
    expect(replay.status).toBe(200);
    const badAlias = await admin.request('POST', `/v1/agent-deployment-connection-bindings/${bid}/revisions`, { body: { tool_selection: [], tool_aliases: { x: 'y' }, argument_policy: 'default' } });
    expect([badAlias.status, errType(badAlias)]).toEqual([400, 'validation.malformed']);
    const sel = (n: number) => [{ agent_deployment_connection_binding_id: bid, binding_revision_number: n }];
    await admin.post(`/v1/agent-deployments/${head.id}/revisions`, revisionBody(1, { connection_binding_selections: sel(1) }));
    const pinned = async () => (await dev.post<{ agent_deployment: { connection_binding_selections: Json[] } }>(`/v1/agent-deployments/${head.id}/sessions`, {})).agent_deployment.connection_binding_selections;
    expect(await pinned()).toEqual(sel(1));
    const r2 = await admin.request('POST', `/v1/agent-deployment-connection-bindings/${bid}/revisions`, { body: { expected_resource_version: 2, tool_selection: ['search', 'fetch'], tool_aliases: {}, argument_policy: 'default' } });
    expect(r2.status).toBe(201);
    expect(await pinned()).toEqual(sel(1));
    await admin.post(`/v1/agent-deployments/${head.id}/revisions`, revisionBody(2, { connection_binding_selections: sel(2) }));
    expect(await pinned()).toEqual(sel(2));
    expect((await viewer.get<Json>(`/v1/agent-deployment-connection-bindings/${bid}/revisions/1`)).tool_selection).toEqual(['search']);
    expect(await viewer.get<Head>(`/v1/agent-deployment-connection-bindings/${bid}`)).toMatchObject({ id: bid, current_revision_number: 2, resource_version: 3, status: 'active' });
    // The key is unique within the deployment: the same key on another deployment is free.
    const clash = await admin.request('POST', `/v1/agent-deployments/${head.id}/connection-bindings`, { body: { agent_deployment_id: head.id, integration_connection_id: conn.id, key: 'tools' } });
    expect([clash.status, errType(clash), errMessage(clash)]).toEqual([409, 'validation.conflict', `the key 'tools' is taken by another connection binding of agent deployment ${head.id}`]);
    const other = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: await agent('bound-other'), key: 'bound-other' });
    const elsewhere = await admin.request('POST', `/v1/agent-deployments/${other.id}/connection-bindings`, { body: { agent_deployment_id: other.id, integration_connection_id: conn.id, key: 'tools' } });
    expect(elsewhere.status).toBe(201);
    const empty = await admin.request('PATCH', `/v1/agent-deployment-connection-bindings/${bid}`, { body: {} });
    expect([empty.status, errType(empty), errMessage(empty)]).toEqual([400, 'validation.malformed', "body: missing required field 'expected_resource_version'"]);
    const devPatch = await dev.request('PATCH', `/v1/agent-deployment-connection-bindings/${bid}`, { body: { expected_resource_version: 3, display_name: 'x' } });
    expect([devPatch.status, errType(devPatch)]).toEqual([403, 'policy.denied']);
    const missingRev = await viewer.request('GET', `/v1/agent-deployment-connection-bindings/${bid}/revisions/3`);
    expect([missingRev.status, errType(missingRev)]).toEqual([404, 'validation.not_found']);
    const stale = await admin.request('PATCH', `/v1/agent-deployment-connection-bindings/${bid}`, { body: { expected_resource_version: 1, display_name: 'x' } });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);
    for (const body of [{ expected_resource_version: 3 }, { expected_resource_version: 3, display_name: 'Tools', status: 'active' }]) {
      const same = await admin.request<Head>('PATCH', `/v1/agent-deployment-connection-bindings/${bid}`, { body });
      expect([same.status, same.body.resource_version, same.body.display_name]).toEqual([200, 3, 'Tools']);
    }
    const patched = await admin.request<Head>('PATCH', `/v1/agent-deployment-connection-bindings/${bid}`, { body: { expected_resource_version: 3, status: 'archived' } });
    expect([patched.status, patched.body.status]).toEqual([200, 'archived']);
    const unsel = await admin.request('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: revisionBody(3, { connection_binding_selections: sel(2) }) });
    expect([unsel.status, errType(unsel)]).toEqual([409, 'runtime.invalid_transition']);
  });
});

describe('a deployment revision replay after a pin it selected was archived', () => {
  it('still answers the revision (200): the replay is recognised before the pins are checked again', async () => {
    const conn = await admin.post<{ id: string }>('/v1/connections', { name: 'tools-replay', url: 'https://mcp.example.test/mcp' });
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: await agent('replay-pin'), key: 'replay-pin' });
    const binding = await admin.post<Head>(`/v1/agent-deployments/${head.id}/connection-bindings`, { agent_deployment_id: head.id, integration_connection_id: conn.id, key: 'tools' });
    await admin.post(`/v1/agent-deployment-connection-bindings/${binding.id}/revisions`, { tool_selection: ['search'], tool_aliases: {}, argument_policy: 'default' });
    const body = revisionBody(1, { connection_binding_selections: [{ agent_deployment_connection_binding_id: binding.id, binding_revision_number: 1 }] });
    const first = await admin.request<Rev>('POST', `/v1/agent-deployments/${head.id}/revisions`, { body });
    expect(first.status).toBe(201);
    const archived = await admin.request<Head>('PATCH', `/v1/agent-deployment-connection-bindings/${binding.id}`, { body: { expected_resource_version: 2, status: 'archived' } });
    expect([archived.status, archived.body.status]).toEqual([200, 'archived']);
    const replay = await admin.request<Rev>('POST', `/v1/agent-deployments/${head.id}/revisions`, { body });
    expect([replay.status, replay.body]).toEqual([200, first.body]);
    // A new publish that selects the archived binding is still refused.
    const fresh = await admin.request('POST', `/v1/agent-deployments/${head.id}/revisions`, { body: { ...body, expected_resource_version: 2 } });
    expect([fresh.status, errType(fresh)]).toEqual([409, 'runtime.invalid_transition']);
    expect((await viewer.get<Head>(`/v1/agent-deployments/${head.id}`)).current_revision_number).toBe(1);
  });
});

describe('binding revision names that are also Object.prototype members', () => {
  it('are tool names like any other: an alias onto another selected tool is still a clash (400)', async () => {
    const conn = await admin.post<{ id: string }>('/v1/connections', { name: 'tools-proto', url: 'https://mcp.example.test/mcp' });
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: await agent('proto-names'), key: 'proto-names' });
    const binding = await admin.post<Head>(`/v1/agent-deployments/${head.id}/connection-bindings`, { agent_deployment_id: head.id, integration_connection_id: conn.id, key: 'tools' });
    const clash = await admin.request('POST', `/v1/agent-deployment-connection-bindings/${binding.id}/revisions`, {
      body: { tool_selection: ['constructor', 'toString'], tool_aliases: { constructor: 'toString' }, argument_policy: 'default' },
    });
    expect([clash.status, errType(clash), errMessage(clash)]).toEqual([400, 'validation.malformed', "body.tool_aliases: two selected tools would both be offered as 'toString'"]);
    expect((await viewer.get<Head>(`/v1/agent-deployment-connection-bindings/${binding.id}`)).current_revision_number).toBe(0);
    const plain = await admin.request('POST', `/v1/agent-deployment-connection-bindings/${binding.id}/revisions`, {
      body: { tool_selection: ['constructor', 'toString'], tool_aliases: {}, argument_policy: 'default' },
    });
    expect(plain.status).toBe(201);
  });
});

describe('a keyed deployment Session create, replayed', () => {
  it('answers the Session as it is now, and once the Session is deleted is its 404, never the erased content', async () => {
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: await agent('session-replay'), key: 'session-replay' });
    await admin.post(`/v1/agent-deployments/${head.id}/revisions`, revisionBody(1));
    const body = { title: 'private title', metadata: { note: 'private' } };
    const created = await dev.request<{ id: string; title: string }>('POST', `/v1/agent-deployments/${head.id}/sessions`, { body, idempotencyKey: 'deployment-session-replay' });
    expect(created.status).toBe(201);
    const again = await dev.request<{ id: string; title: string }>('POST', `/v1/agent-deployments/${head.id}/sessions`, { body, idempotencyKey: 'deployment-session-replay' });
    expect([again.status, again.body.id, again.body.title]).toEqual([201, created.body.id, 'private title']);
    const deleted = await dev.request('DELETE', `/v1/sessions/${created.body.id}`);
    expect(deleted.status).toBe(200);
    const replay = await dev.request('POST', `/v1/agent-deployments/${head.id}/sessions`, { body, idempotencyKey: 'deployment-session-replay' });
    expect([replay.status, errType(replay)]).toEqual([404, 'validation.not_found']);
    expect(JSON.stringify(replay.body)).not.toContain('private');
  });
});

describe('connection bindings of an archived deployment', () => {
  it('take no change: PATCH and a new revision are 409 runtime.invalid_transition; a replay of a revision still answers it', async () => {
    const conn = await admin.post<{ id: string }>('/v1/connections', { name: 'tools-archived', url: 'https://mcp.example.test/mcp' });
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: await agent('bound-archived'), key: 'bound-archived' });
    const binding = await admin.post<Head>(`/v1/agent-deployments/${head.id}/connection-bindings`, { agent_deployment_id: head.id, integration_connection_id: conn.id, key: 'tools' });
    const content = { tool_selection: ['search'], tool_aliases: {}, argument_policy: 'default' };
    const r1 = await admin.request<Json>('POST', `/v1/agent-deployment-connection-bindings/${binding.id}/revisions`, { body: { expected_resource_version: 1, ...content } });
    expect(r1.status).toBe(201);
    const archived = await admin.request<Head>('PATCH', `/v1/agent-deployments/${head.id}`, { body: { expected_resource_version: 1, status: 'archived' } });
    expect([archived.status, archived.body.status]).toEqual([200, 'archived']);
    for (const body of [{ expected_resource_version: 2, display_name: 'x' }, { expected_resource_version: 2, status: 'archived' }]) {
      const r = await admin.request('PATCH', `/v1/agent-deployment-connection-bindings/${binding.id}`, { body });
      expect([r.status, errType(r), errMessage(r)]).toEqual([409, 'runtime.invalid_transition', 'the deployment is archived (terminal)']);
    }
    for (const body of [{ expected_resource_version: 2, ...content, tool_selection: ['fetch'] }, { ...content, tool_selection: ['fetch'] }]) {
      const r = await admin.request('POST', `/v1/agent-deployment-connection-bindings/${binding.id}/revisions`, { body });
      expect([r.status, errType(r), errMessage(r)]).toEqual([409, 'runtime.invalid_transition', 'the deployment is archived (terminal)']);
    }
    // The publish that made revision 1, repeated: its revision, as for a deployment revision.
    const replay = await admin.request<Json>('POST', `/v1/agent-deployment-connection-bindings/${binding.id}/revisions`, { body: { expected_resource_version: 1, ...content } });
    expect([replay.status, replay.body]).toEqual([200, r1.body]);
    expect(await viewer.get<Head>(`/v1/agent-deployment-connection-bindings/${binding.id}`)).toMatchObject({ status: 'active', current_revision_number: 1, resource_version: 2, display_name: null });
  });
});

describe('POST /v1/agents/{id}/deploy', () => {
  it('head only while the target lacks a profile the release names; then an exact pin; repeating converges', async () => {
    const target = (await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name: 'deploy-target' })).id;
    const a = await agent('shipped', { metadata: { sandbox_profile_key: 'box' } });
    const deploy = () => p.root.request<{ outcome: string; agent_deployment: Head; revision: Rev | null; missing_profiles: string[] }>('POST', `/v1/agents/${a}/deploy`, {
      body: { agent_release_number: 1, target_workspace_id: target },
    });
    const wsOnly = await admin.request('POST', `/v1/agents/${a}/deploy`, { body: { agent_release_number: 1, target_workspace_id: target } });
    expect([wsOnly.status, errType(wsOnly)]).toEqual([403, 'policy.denied']);
    const first = await deploy();
    expect(first.status).toBe(200);
    expect(first.body).toMatchObject({ outcome: 'head_only', revision: null });
    expect(first.body.missing_profiles.sort()).toEqual(['harness_profile:default', 'sandbox_profile:box']);
    expect(first.body.agent_deployment).toMatchObject({ key: `agent-${a}`, current_revision_number: 0, workspace_id: target });
    const inTarget = { headers: { 'service-workspace-id': target } };
    await p.root.request('POST', `/v1/organizations/workspaces/${target}/harness-profiles`, { body: { key: 'default', kind: 'builtin' } });
    const stillMissing = await deploy();
    expect(stillMissing.body).toMatchObject({ outcome: 'head_only', missing_profiles: ['sandbox_profile:box'] });
    await p.root.request('POST', `/v1/organizations/workspaces/${target}/sandbox-profiles`, { body: { key: 'box', image: 'agentplane/sandbox:latest' } });
    const published = await deploy();
    expect(published.body.outcome).toBe('published');
    expect(published.body.revision).toMatchObject({ revision_number: 1, agent_release_number: 1, published_by: { kind: 'system' }, execution_target: { type: 'managed', harness_topology: 'split', runner_pool_id: null } });
    expect(published.body.agent_deployment).toMatchObject({ id: first.body.agent_deployment.id, current_revision_number: 1 });
    const repeat = await deploy();
    expect(repeat.body).toMatchObject({ outcome: 'unchanged', agent_deployment: { id: first.body.agent_deployment.id, current_revision_number: 1 } });
    expect(repeat.body.revision?.id).toBe(published.body.revision?.id);
    const list = await p.root.request<{ data: Head[] }>('GET', `/v1/organizations/workspaces/${target}/agent-deployments`, inTarget);
    expect(list.body.data.map((d) => d.id)).toEqual([first.body.agent_deployment.id]);
    const other = await p.root.request('POST', `/v1/agents/${a}/deploy`, { body: { agent_release_number: 1, target_workspace_id: `wrkspc_${'0'.repeat(32)}` } });
    expect([other.status, errType(other)]).toEqual([404, 'validation.not_found']);
    // A disabled target takes no deployment.
    expect((await p.root.request('PATCH', `/v1/organizations/workspaces/${target}`, { body: { status: 'disabled' } })).status).toBe(200);
    const disabled = await deploy();
    expect([disabled.status, errType(disabled)]).toEqual([403, 'auth.disabled_tenancy']);
    expect((await p.root.request('PATCH', `/v1/organizations/workspaces/${target}`, { body: { status: 'active' } })).status).toBe(200);
    // The target Workspace's audit log holds every deploy into it, naming the deployment made
    // there; the attempts it never saw (a key of another Workspace, an unknown target) are not in it.
    const records = await p.root.with({ workspaceId: target }).post<{ data: { action: string; target: string | null; outcome: string; status: number }[] }>('/v1/audit/export', { action: 'agents.deployAgent', limit: 100 });
    const dep = first.body.agent_deployment.id;
    expect(records.data.map((r) => [r.target, r.outcome, r.status])).toEqual([[dep, 'succeeded', 200], [dep, 'succeeded', 200], [dep, 'succeeded', 200], [dep, 'succeeded', 200], [null, 'denied', 403]]);
  });
});

describe('concurrent deploys of one release', () => {
  it('one publishes; the others find that revision and answer unchanged', async () => {
    const target = (await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name: 'deploy-race' })).id;
    await p.root.request('POST', `/v1/organizations/workspaces/${target}/harness-profiles`, { body: { key: 'default', kind: 'builtin' } });
    await p.root.request('POST', `/v1/organizations/workspaces/${target}/sandbox-profiles`, { body: { key: 'default', image: 'agentplane/sandbox:latest' } });
    const b = await agent('raced');
    const rs = await Promise.all(Array.from({ length: 6 }, () => p.root.request<{ outcome: string; revision: Rev | null }>('POST', `/v1/agents/${b}/deploy`, {
      body: { agent_release_number: 1, target_workspace_id: target },
    })));
    for (const r of rs) expect(r.status).toBe(200);
    const outcomes = rs.map((r) => r.body.outcome);
    expect(outcomes.filter((o) => o === 'published')).toHaveLength(1);
    expect(outcomes.filter((o) => o === 'unchanged')).toHaveLength(5);
    expect(new Set(rs.map((r) => r.body.revision?.id)).size).toBe(1);
  });
});

describe("ActionPolicies on a deployment Session's first messages", () => {
  it('each decision is an audit record naming the Session the request created', async () => {
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: await agent('governed'), key: 'governed' });
    await admin.post(`/v1/agent-deployments/${head.id}/revisions`, revisionBody(1));
    const rule = (await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'allow', tool: { kind: 'drive', name: 'user.message' }, principal_id: principal })).id;
    let session: { id: string };
    try {
      session = await dev.post<{ id: string }>(`/v1/agent-deployments/${head.id}/sessions`, { initial_events: [msg('hello')] });
    } finally {
      await p.root.request('DELETE', `/v1/action-policies/${rule}`);
    }
    const audit = await p.root.post<{ data: { action: string; target: string | null; outcome: string; detail: string | null; request_id: string | null }[] }>('/v1/audit/export', {
      action: 'policy.drive:user.message', limit: 1000,
    });
    const decided = audit.data.filter((r) => r.detail === rule);
    expect(decided.map((r) => [r.target, r.outcome])).toEqual([[session.id, 'allowed']]);
    // The same request's own record names the same Session.
    const created = await p.root.post<{ data: { action: string; request_id: string | null }[] }>('/v1/audit/export', { target: session.id, action: 'agentDeployments.createDeploymentSession' });
    expect(created.data.map((r) => r.request_id)).toEqual([decided[0]?.request_id]);
  });
});

describe('a Session under a pinned revision', () => {
  it('runs on the named runner pool in the named topology, and its Run carries the revision', async () => {
    const pool = await p.root.post<{ id: string }>('/v1/runner-pools', { name: 'deploy-pool', placement: 'byoc' });
    const pair = await p.root.request<{ code: string }>('POST', '/v1/runner-pairings', {
      idempotencyKey: 'pair-deploy-pool', body: { principal_id: principal, machine_label: 'deploy-box', expires_in_seconds: 300 },
    });
    const dir = mkdtempSync(join(tmpdir(), 'runner-deploy-'));
    const out = spawnSync(process.execPath, [RUNNER_CLI, 'pair', '--code', pair.body.code, '--url', p.baseUrl, '--config-dir', dir, '--label', 'deploy-box', '--json', '--pool', pool.id], { encoding: 'utf8' });
    expect(out.status, out.stdout + out.stderr).toBe(0);
    const runnerId = (JSON.parse(out.stdout) as { runner_id: string }).runner_id;
    children.push(startDaemon(dir));
    await waitFor('the pool runner ready', async () => {
      const r = await p.root.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences');
      return r.data.some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined;
    }, 60_000);

    // A routing profile of its own: revision 1 serves, revision 2 (published after the pin) cannot.
    const routing = await admin.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/model-routing-profiles`, {
      key: 'pinned-model', candidates: [{ credential_key: 'default', provider_model: 'scripted-1' }],
    });
    const a = await agent('pinned', {
      model: 'pinned-model',
      system: SCRIPT([
        { when: { user_contains: 'where' }, then: [{ tool: 'bash', input: { command: 'ps -eo args' } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'done' }] },
      ]),
      tools: [{ type: 'builtin', name: 'bash' }],
    });
    const head = await admin.post<Head>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: a, key: 'pinned' });
    const noRevision = await dev.request('POST', `/v1/agent-deployments/${head.id}/sessions`, { body: {} });
    expect([noRevision.status, errType(noRevision)]).toEqual([409, 'runtime.invalid_transition']);
    const rev = await admin.post<Rev>(`/v1/agent-deployments/${head.id}/revisions`, revisionBody(1, {
      model_routing: { model_routing_profile_id: routing.id, model_routing_profile_revision_number: 1 },
      execution_target: { ...(revisionBody(1).execution_target as Json), runner_pool_id: pool.id, harness_topology: 'colocated' },
    }));
    const session = await dev.post<{ id: string; environment_id: string; agent: { id: string; version: number }; agent_deployment: Json }>(`/v1/agent-deployments/${head.id}/sessions`, { title: 'pinned' });
    expect(session.agent).toMatchObject({ id: a, version: 1 });
    expect(session.environment_id).toBe(sprof);
    expect(session.agent_deployment).toMatchObject({ agent_deployment_id: head.id, agent_deployment_revision_id: rev.id, revision_number: 1, runner_pool_id: pool.id, harness_topology: 'colocated' });
    await admin.post(`/v1/model-routing-profiles/${routing.id}/revisions`, { candidates: [{ credential_key: 'nobody', provider_model: 'none' }] });
    // The profile's latest revision cannot serve a step …
    const latest = await admin.request('POST', `/v1/organizations/workspaces/${ws}/model-steps`, { body: { routing_key: 'pinned-model', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }], tools: [] } });
    expect([latest.status, errType(latest)]).toEqual([422, 'model.no_eligible_model']);
    // … yet the Session's turn runs: its steps use the pinned routing revision 1.
    await dev.post(`/v1/sessions/${session.id}/events`, msg('where does the loop run?'));
    const events = await untilEvents(dev, session.id, (e) => idleCount(e) >= 1, 90_000);
    const result = events.find((e) => e.type === 'agent.tool_result');
    expect(result?.payload).toMatchObject({ is_error: false });
    // Colocated: the agent loop runs inside the sandbox, next to the tool.
    expect(String(result?.payload.content)).toContain('node /tmp/agentplane-harness.mjs');
    const runs = await dev.get<{ data: { runner_pool_id: string; attempts: { runner_id: string }[]; agent_deployment: Json }[] }>(`/v1/sessions/${session.id}/runs`);
    expect(runs.data).toHaveLength(1);
    expect(runs.data[0]?.runner_pool_id).toBe(pool.id);
    expect(runs.data[0]?.attempts.map((x) => x.runner_id)).toEqual([runnerId]);
    expect(runs.data[0]?.agent_deployment).toMatchObject({ agent_deployment_id: head.id, revision_number: 1, harness_topology: 'colocated' });
  }, 180_000);
});
