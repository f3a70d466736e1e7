import { writeFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Webhook } from 'standardwebhooks';
import { describe, expect, it } from 'vitest';
import { HttpClient } from '@agentplane/client';
import { signingKey } from './harness/a2a-peer.js';
import { crashedKeyed, useCrashPlatforms, type CrashPlatform } from './harness/crash-platform.js';
import type { Json } from './harness/turns.js';

/** `crashedKeyed` for a JSON create at `path`, whose list (`GET path`) is the probe. */
function crashedCreate(q: CrashPlatform, point: string, path: string, body: Json, key: string, scope?: string): Promise<void> {
  return crashedKeyed(q, point, key, () => q.p.root.request('POST', path, { body, idempotencyKey: key }), { probePath: path, ...(scope ? { scope } : {}) });
}

/**
 * The API killed right after a keyed create of an Agent, an Environment, a Vault, a Connection, a
 * runner pool, a MemoryStore, a skill source, a tool source, a ModelCredential, an external
 * installation, a SurfaceScope, a ConnectedHarness, a harness, sandbox or model routing profile or
 * an AgentInstallation wrote it (crash points `agent-created`, `environment-created`,
 * `vault-created`, `connection-created`, `runner-pool-created`, `memory-store-created`,
 * `skill-source-created`, `tool-source-created`, `model-credential-created`,
 * `external-installation-created`, `surface-scope-created`, `connected-harness-created`,
 * `harness-profile-key-claimed`, `sandbox-profile-key-claimed`, `model-routing-profile-created`,
 * `agent-installation-created`), and the key's pending record gone as it goes once its
 * owner is dead (here removed, as its expiry would): the retry of the same request under the key
 * finds what its first attempt wrote (its id is derived from the key and the request) and answers
 * it, 201 as the first attempt would have; there is one of it, not two.
 */
describe('a crash inside a keyed create of a resource written in one step', () => {
  const crash = useCrashPlatforms('keyed-create-crash');

  it.each([
    { what: 'Agent', path: '/v1/agents', point: 'agent-created', id: /^agent_[0-9a-f]{32}$/, body: (name: string): Json => ({ name, model: 'default', system: 'hi' }) },
    { what: 'Environment', path: '/v1/environments', point: 'environment-created', id: /^env_[0-9a-f]{32}$/, body: (name: string): Json => ({ name, image: 'agentplane/sandbox:latest' }) },
    { what: 'Vault', path: '/v1/vaults', point: 'vault-created', id: /^vlt_[0-9a-f]{32}$/, body: (name: string): Json => ({ name, description: 'kept secrets' }) },
    { what: 'Connection', path: '/v1/connections', point: 'connection-created', id: /^conn_[0-9a-f]{32}$/, body: (name: string): Json => ({ name, url: 'http://127.0.0.1:9/mcp', auth: { type: 'bearer', token: 'upstream-token' } }) },
    // A name is unique among runner pools: the retry was refused 409 before, now it is answered.
    { what: 'RunnerPool', path: '/v1/runner-pools', point: 'runner-pool-created', id: /^rpool_[0-9a-f]{32}$/, body: (name: string): Json => ({ name, placement: 'managed' }) },
    { what: 'MemoryStore', path: '/v1/memory-stores', point: 'memory-store-created', id: /^memstore_[0-9a-f]{32}$/, body: (name: string): Json => ({ name, description: 'notes' }) },
    { what: 'SkillSource', path: '/v1/skill-sources', point: 'skill-source-created', id: /^sksrc_[0-9a-f]{32}$/, body: (name: string): Json => ({ name, url: 'https://git.example.com/team/skills.git' }) },
  ])('$what: made once, answered to the retry', async ({ path, point, id, body }) => {
    const q = await crash.start([point], { env: { LOG_LEVEL: 'warn', AGENTPLANE_MODE: 'development' } });
    const api = q.p.root;
    const named = async (name: string) => (await api.get<{ data: { id: string; name: string }[] }>(path, { limit: 100 })).data.filter((x) => x.name === name).map((x) => x.id);

    await crashedCreate(q, point, path, body('one'), 'k-one');
    // What the first attempt wrote is there, under its derived id.
    const written = await named('one');
    expect(written).toHaveLength(1);
    expect(written[0]).toMatch(id);

    const retry = await api.request<{ id: string; name: string; version: number }>('POST', path, { body: body('one'), idempotencyKey: 'k-one' });
    expect([retry.status, retry.body.id, retry.body.version]).toEqual([201, written[0], 1]);
    expect(await named('one')).toEqual(written);
    const replay = await api.request<{ id: string }>('POST', path, { body: body('one'), idempotencyKey: 'k-one' });
    expect([replay.status, replay.body.id, replay.headers.get('idempotent-replayed')]).toEqual([201, written[0], 'true']);
    // Without a key, each create makes its own.
    const a = await api.request<{ id: string }>('POST', path, { body: body('two') });
    const b = await api.request<{ id: string }>('POST', path, { body: body('three') });
    expect([a.status, b.status]).toEqual([201, 201]);
    expect(a.body.id).not.toBe(b.body.id);
  }, 180_000);

  it('a tool source, a ModelCredential, an external installation and a SurfaceScope are each made once, answered to the retry', async () => {
    const q = await crash.start(['tool-source-created', 'model-credential-created', 'external-installation-created', 'surface-scope-created'], { env: { LOG_LEVEL: 'warn', AGENTPLANE_MODE: 'development' } });
    const api = q.p.root;
    const credentials = `/v1/organizations/workspaces/${q.p.bootstrap.workspace_id}/model-credentials`;
    const { jwk } = await signingKey('keyed');
    await api.post('/v1/provider-packages', { name: 'peer', package_version: 1, card_url: 'http://127.0.0.1:9/card', rpc_url: 'http://127.0.0.1:9/a2a' });
    // The Workspace's first models request seeds its `default` credential: past the point (its
    // marker made first), so that the point is reached by the create below.
    writeFileSync(q.marker('model-credential-created'), '');
    await api.get(credentials);
    const cases = [
      { path: '/v1/tool-sources', point: 'tool-source-created', body: { name: 'peer', provider: 'peer', source: { kind: 'a2a', card_url: 'http://127.0.0.1:9/card', verification_keys: [jwk] } }, field: 'name', value: 'peer' },
      // A key is unique among ModelCredentials: the retry was refused 409 before, now it is answered.
      { path: credentials, point: 'model-credential-created', body: { key: 'keyed', provider_key: 'openai', base_url: 'http://127.0.0.1:9/v1', secret: 'sk-test-keyed' }, field: 'key', value: 'keyed' },
      // So is a (provider, external_id) among installations, and a root among the native tree's scopes.
      { path: '/v1/external-installations', point: 'external-installation-created', body: { provider: 'slack', external_id: 'T-KEYED', display_name: 'Keyed' }, field: 'external_id', value: 'T-KEYED' },
      { path: '/v1/surface-scopes', point: 'surface-scope-created', body: { kind: 'root', display_name: 'Keyed root' }, field: 'display_name', value: 'Keyed root' },
    ];
    for (const { path, point, body, field, value } of cases) {
      const mine = async () => (await api.get<{ data: Record<string, unknown>[] }>(path, { limit: 100 })).data.filter((x) => x[field] === value).map((x) => x.id);
      await crashedCreate(q, point, path, body, `k-${point}`);
      const written = await mine();
      expect(written, path).toHaveLength(1);
      const retry = await api.request<{ id: string }>('POST', path, { body, idempotencyKey: `k-${point}` });
      expect([path, retry.status, retry.body.id]).toEqual([path, 201, written[0]]);
      expect(await mine()).toEqual(written);
    }
  }, 180_000);

  it('a harness, a sandbox and a model routing profile, whose key is unique in the Workspace, are each made once, answered to the retry', async () => {
    const points = ['harness-profile-key-claimed', 'sandbox-profile-key-claimed', 'model-routing-profile-created'];
    const q = await crash.start(points, { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const ws = `/v1/organizations/workspaces/${q.p.bootstrap.workspace_id}`;
    // The Workspace's first models request seeds its `default` routing profile: past the point (its
    // marker made first), so that the point is reached by the create below.
    writeFileSync(q.marker('model-routing-profile-created'), '');
    await api.get(`${ws}/model-routing-profiles`);
    // The retry was refused 409 for the key its first attempt had claimed; now it is answered.
    const cases = [
      { path: `${ws}/harness-profiles`, point: 'harness-profile-key-claimed', body: { key: 'keyed', kind: 'builtin' }, revision: 'revision_number' },
      { path: `${ws}/sandbox-profiles`, point: 'sandbox-profile-key-claimed', body: { key: 'keyed', image: 'agentplane/sandbox:latest' }, revision: 'revision_number' },
      { path: `${ws}/model-routing-profiles`, point: 'model-routing-profile-created', body: { key: 'keyed', candidates: [{ credential_key: 'default', provider_model: 'one' }] }, revision: 'latest_revision_number' },
    ];
    for (const { path, point, body, revision } of cases) {
      const mine = async () => (await api.get<{ data: { id: string }[] }>(path, { key: 'keyed' })).data.map((x) => x.id);
      await crashedCreate(q, point, path, body, `k-${point}`);
      const written = await mine();
      expect(written, path).toHaveLength(1);
      const retry = await api.request<Record<string, unknown>>('POST', path, { body, idempotencyKey: `k-${point}` });
      expect([path, retry.status, retry.body.id, retry.body[revision]]).toEqual([path, 201, written[0], 1]);
      expect(await mine()).toEqual(written);
      // Another key's create of the same key is still refused for it.
      const other = await api.request<{ error: { type: string } }>('POST', path, { body, idempotencyKey: `k-other-${point}` });
      expect([other.status, other.body.error?.type]).toEqual([409, 'validation.conflict']);
    }
  }, 180_000);

  it('a ConnectedHarness, whose key is unique in the Workspace, is made once, answered to the retry', async () => {
    const q = await crash.start(['connected-harness-created'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const path = `/v1/organizations/workspaces/${q.p.bootstrap.workspace_id}/connected-harnesses`;
    const body: Json = { key: 'keyed', capability_set_digest: `sha256:${'b'.repeat(64)}` };
    const mine = async () => (await api.get<{ data: { id: string; key: string }[] }>(path, { limit: 100 })).data.filter((x) => x.key === 'keyed').map((x) => x.id);
    await crashedCreate(q, 'connected-harness-created', path, body, 'k-harness');
    const written = await mine();
    expect(written).toHaveLength(1);
    // The retry was refused 409 for the key its first attempt had claimed; now it is answered.
    const retry = await api.request<{ id: string; resource_version: number }>('POST', path, { body, idempotencyKey: 'k-harness' });
    expect([retry.status, retry.body.id, retry.body.resource_version]).toEqual([201, written[0], 1]);
    expect(await mine()).toEqual(written);
  }, 180_000);

  it('an AgentInstallation is made once, with one service Principal, answered to the retry (also one cut off between the two)', async () => {
    const q = await crash.start(['agent-installation-created', 'agent-installation-principal-created'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'installed', model: 'default' })).id;
    const environment = (await api.post<{ id: string }>('/v1/environments', { name: 'e', image: 'agentplane/sandbox:latest' })).id;
    const scope = (await api.post<{ id: string }>('/v1/surface-scopes', { kind: 'root', display_name: 'Installed root' })).id;
    const path = '/v1/agent-installations';
    const body: Json = { agent: { id: agent }, environment_id: environment, surface_scope_ids: [scope], display_name: 'keyed-install' };
    const mine = async () => (await api.get<{ data: { id: string; display_name: string | null }[] }>(path, { limit: 100 })).data.filter((x) => x.display_name === 'keyed-install').map((x) => x.id);
    const installed = async () => (await api.get<{ data: { external_subject_id: string }[] }>(`/v1/organizations/workspaces/${q.p.bootstrap.workspace_id}/principals`, { limit: 100 }))
      .data.filter((x) => x.external_subject_id.startsWith('agent-installation:')).map((x) => x.external_subject_id);

    // Passed until its own case below (a point fires only while its marker is absent).
    writeFileSync(q.marker('agent-installation-principal-created'), '');
    await crashedCreate(q, 'agent-installation-created', path, body, 'k-install');
    const written = await mine();
    expect(written).toHaveLength(1);
    const retry = await api.request<{ id: string; version: number; principal_id: string }>('POST', path, { body, idempotencyKey: 'k-install' });
    expect([retry.status, retry.body.id, retry.body.version]).toEqual([201, written[0], 1]);
    expect(await mine()).toEqual(written);
    expect(await installed()).toEqual([`agent-installation:${written[0]}`]);

    // Cut off between its service Principal and itself: the retry takes that Principal.
    const second: Json = { ...body, display_name: 'keyed-install-2' };
    await crashedCreate(q, 'agent-installation-principal-created', path, second, 'k-install-2');
    expect(await installed()).toHaveLength(2);
    const finished = await api.request<{ id: string; version: number; principal_id: string }>('POST', path, { body: second, idempotencyKey: 'k-install-2' });
    expect([finished.status, finished.body.version]).toEqual([201, 1]);
    const listed = (await api.get<{ data: { id: string; display_name: string | null }[] }>(path, { limit: 100 })).data.filter((x) => x.display_name === 'keyed-install-2');
    expect(listed.map((x) => x.id)).toEqual([finished.body.id]);
    expect((await installed()).sort()).toEqual([`agent-installation:${written[0]}`, `agent-installation:${finished.body.id}`].sort());
    const principal = await api.request<{ external_subject_id: string }>('GET', `/v1/principals/${finished.body.principal_id}`);
    expect(principal.body.external_subject_id).toBe(`agent-installation:${finished.body.id}`);
  }, 180_000);

  it('a Workspace cut off between its document and its place in the Organization\'s list is answered to the retry, listed, one of it', async () => {
    const q = await crash.start(['workspace-created'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const org = q.p.bootstrap.organization_id;
    const path = `/v1/organizations/${org}/workspaces`;
    const named = async () => (await api.get<{ data: { id: string; name: string }[] }>(path, { limit: 100 })).data.filter((x) => x.name === 'keyed-ws').map((x) => x.id);
    await crashedCreate(q, 'workspace-created', path, { name: 'keyed-ws' }, 'k-ws', `o:${org}`);
    // Written, but not listed: the api died before its place in the list.
    expect(await named()).toEqual([]);
    const written = async () => {
      const found: string[] = [];
      for (const k of await q.redis().keys('ap:{w:wrkspc_*}:doc:wrkspc_*')) {
        const doc = JSON.parse(String(await q.redis().get(k))) as { id: string; name: string };
        if (doc.name === 'keyed-ws') found.push(doc.id);
      }
      return found;
    };
    const first = await written();
    expect(first).toHaveLength(1);
    const retry = await api.request<{ id: string; version: number }>('POST', path, { body: { name: 'keyed-ws' }, idempotencyKey: 'k-ws' });
    expect([retry.status, retry.body.id, retry.body.version]).toEqual([201, expect.stringMatching(/^wrkspc_[0-9a-f]{32}$/), 1]);
    expect(retry.body.id).toBe(first[0]);
    expect(await named()).toEqual(first);
    expect(await written()).toEqual(first);
    expect((await api.request<{ id: string }>('GET', `/v1/organizations/workspaces/${retry.body.id}`)).body.id).toBe(retry.body.id);
  }, 180_000);

  it('an API key cut off before or after its secret went live is answered to the retry with a new first secret that works, one of it', async () => {
    const q = await crash.start(['api-key-created', 'api-key-secret-live'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const org = q.p.bootstrap.organization_id;
    const path = `/v1/organizations/${org}/api-keys`;
    const body: Json = { display_name: 'keyed-key', role: 'admin', scope: { type: 'workspace', workspace_id: q.p.bootstrap.workspace_id } };
    const named = async () => (await api.get<{ data: { id: string; display_name: string }[] }>(path, { limit: 100 })).data.filter((x) => x.display_name === 'keyed-key').map((x) => x.id);
    await crashedCreate(q, 'api-key-created', path, body, 'k-key', `o:${org}`);
    const written = await named();
    expect(written).toHaveLength(1);
    const retry = await api.request<{ id: string; version: number; generation_number: number; secret: string }>('POST', path, { body, idempotencyKey: 'k-key' });
    expect([retry.status, retry.body.id, retry.body.generation_number]).toEqual([201, written[0], 1]);
    expect(await named()).toEqual(written);
    const asKey = new HttpClient({ baseUrl: q.p.baseUrl, token: retry.body.secret });
    expect((await asKey.request('GET', '/v1/agents')).status).toBe(200);
    // The replay shows the same secret while it lives.
    const replay = await api.request<{ id: string; secret: string }>('POST', path, { body, idempotencyKey: 'k-key' });
    expect([replay.status, replay.body.secret, replay.headers.get('idempotent-replayed')]).toEqual([201, retry.body.secret, 'true']);

    // A key changed since its crashed create is not given a new secret: 409, nothing written.
    const changedBody: Json = { ...body, display_name: 'keyed-key-2' };
    await crashedCreate(q, 'api-key-created', path, changedBody, 'k-key-2', `o:${org}`);
    const [changed] = (await api.get<{ data: { id: string; display_name: string }[] }>(path, { limit: 100 })).data.filter((x) => x.display_name === 'keyed-key-2');
    expect((await api.request<{ version: number }>('PATCH', `/v1/api-keys/${changed!.id}`, { body: { expected_version: 1, rate_limit_per_minute: 60 } })).body.version).toBe(2);
    const refused = await api.request<{ error: { type: string } }>('POST', path, { body: changedBody, idempotencyKey: 'k-key-2' });
    expect([refused.status, refused.body.error.type]).toEqual([409, 'idempotency.conflict']);
    const after = (await api.get<{ data: { id: string; display_name: string; version: number }[] }>(path, { limit: 100 })).data.filter((x) => x.display_name === 'keyed-key-2');
    expect(after.map((x) => [x.id, x.version])).toEqual([[changed!.id, 2]]);

    // Cut off after its secret went live, before its answer was kept: that secret was never
    // shown; the retry replaces it with one of the same generation (it was refused 409 before).
    const liveBody: Json = { ...body, display_name: 'keyed-key-3' };
    await crashedCreate(q, 'api-key-secret-live', path, liveBody, 'k-key-3', `o:${org}`);
    const third = (await api.get<{ data: { id: string; display_name: string }[] }>(path, { limit: 100 })).data.filter((x) => x.display_name === 'keyed-key-3').map((x) => x.id);
    expect(third).toHaveLength(1);
    const reissued = await api.request<{ id: string; generation_number: number; secret: string }>('POST', path, { body: liveBody, idempotencyKey: 'k-key-3' });
    expect([reissued.status, reissued.body.id, reissued.body.generation_number]).toEqual([201, third[0], 1]);
    expect((await new HttpClient({ baseUrl: q.p.baseUrl, token: reissued.body.secret }).request('GET', '/v1/agents')).status).toBe(200);
  }, 180_000);

  it('a Principal access credential cut off before or after its secret went live is answered to the retry with a new first secret that works, one of it', async () => {
    const q = await crash.start(['principal-credential-created', 'principal-credential-secret-live'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const principal = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${q.p.bootstrap.workspace_id}/principals`, {
      external_subject_id: 'holder', principal_type: 'service', display_name: 'Holder',
    })).id;
    const path = `/v1/principals/${principal}/access-credentials`;
    const mine = async () => (await api.get<{ data: { id: string }[] }>(path, { limit: 100 })).data.map((x) => x.id);
    await crashedCreate(q, 'principal-credential-created', path, { audience: 'api_mcp' }, 'k-cred');
    const written = await mine();
    expect(written).toHaveLength(1);
    const retry = await api.request<{ id: string; generation_number: number; secret: string }>('POST', path, { body: { audience: 'api_mcp' }, idempotencyKey: 'k-cred' });
    expect([retry.status, retry.body.id, retry.body.generation_number]).toEqual([201, written[0], 1]);
    expect(await mine()).toEqual(written);
    // The secret authenticates as the Principal (its Workspace's read, allowed or refused by its grants, not 401).
    const asPrincipal = await new HttpClient({ baseUrl: q.p.baseUrl, token: retry.body.secret }).request('GET', '/v1/agents');
    expect(asPrincipal.status).not.toBe(401);

    // Cut off after its secret went live: the retry replaces that never-shown secret.
    await crashedCreate(q, 'principal-credential-secret-live', path, { audience: 'a2a' }, 'k-cred-2');
    const second = (await mine()).filter((id) => !written.includes(id));
    expect(second).toHaveLength(1);
    const reissued = await api.request<{ id: string; generation_number: number; secret: string }>('POST', path, { body: { audience: 'a2a' }, idempotencyKey: 'k-cred-2' });
    expect([reissued.status, reissued.body.id, reissued.body.generation_number]).toEqual([201, second[0], 1]);
    expect((await mine()).filter((id) => !written.includes(id))).toEqual(second);
  }, 180_000);

  it('a resource changed since its first attempt is not answered to the retry (409); an Agent answers its version 1', async () => {
    const q = await crash.start(['connection-created', 'agent-created'], { env: { LOG_LEVEL: 'warn', AGENTPLANE_MODE: 'development' } });
    const api = q.p.root;
    const body: Json = { name: 'changed', url: 'http://127.0.0.1:9/mcp', auth: { type: 'bearer', token: 'upstream-token' } };
    await crashedCreate(q, 'connection-created', '/v1/connections', body, 'k-changed');
    const [conn] = (await api.get<{ data: { id: string; name: string }[] }>('/v1/connections', { limit: 100 })).data.filter((x) => x.name === 'changed');
    const patched = await api.request<{ version: number }>('PATCH', `/v1/connections/${conn!.id}`, { body: { expected_version: 1, name: 'renamed' } });
    expect([patched.status, patched.body]).toMatchObject([200, { version: 2 }]);
    const retry = await api.request<{ error: { type: string } }>('POST', '/v1/connections', { body, idempotencyKey: 'k-changed' });
    expect([retry.status, retry.body.error.type]).toEqual([409, 'idempotency.conflict']);
    const after = await api.get<{ data: { id: string; name: string; version: number }[] }>('/v1/connections', { limit: 100 });
    expect(after.data.filter((x) => x.name === 'changed' || x.name === 'renamed').map((x) => [x.id, x.version])).toEqual([[conn!.id, 2]]);

    // An Agent's versions never change: the retry answers version 1, as its first attempt would have.
    const agentBody: Json = { name: 'versioned', model: 'default', system: 'one' };
    await crashedCreate(q, 'agent-created', '/v1/agents', agentBody, 'k-agent');
    const [agent] = (await api.get<{ data: { id: string; name: string }[] }>('/v1/agents', { limit: 100 })).data.filter((x) => x.name === 'versioned');
    expect((await api.request<{ version: number }>('POST', `/v1/agents/${agent!.id}`, { body: { expected_version: 1, system: 'two' } })).body.version).toBe(2);
    const again = await api.request<{ id: string; version: number; system: string }>('POST', '/v1/agents', { body: agentBody, idempotencyKey: 'k-agent' });
    expect([again.status, again.body.id, again.body.version, again.body.system]).toEqual([201, agent!.id, 1, 'one']);
  }, 180_000);
});

/**
 * A grant or a rule made twice would outlive the revocation of the other: a keyed
 * PermissionAssignment or ActionPolicy whose first attempt died after writing (crash points
 * `permission-assignment-created`, `action-policy-created`) is answered to the retry, one of it;
 * so is a Principal (`principal-created`), whose retry was refused as a taken subject before.
 */
describe('a crash inside a keyed governance or identity create', () => {
  const crash = useCrashPlatforms('keyed-governance-create-crash');

  it('a PermissionAssignment, an ActionPolicy and a Principal are each made once, answered to the retry', async () => {
    const q = await crash.start(['principal-created', 'permission-assignment-created', 'action-policy-created'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const principals = `/v1/organizations/workspaces/${q.p.bootstrap.workspace_id}/principals`;
    const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'a', model: 'default' })).id;
    // In this order: the first Principal create after the start is the one that dies.
    const cases = [
      // A subject is unique among Principals: the retry was refused 409 before, now it is answered.
      { path: principals, point: 'principal-created', body: (): Json => ({ external_subject_id: 'keyed', principal_type: 'service', display_name: 'Keyed' }), field: 'external_subject_id', value: () => 'keyed' },
      { path: '/v1/permission-assignments', point: 'permission-assignment-created', body: (): Json => ({ principal_id: principal, target: { type: 'agent', id: agent }, actions: ['invoke'] }), field: 'principal_id', value: () => principal },
      { path: '/v1/action-policies', point: 'action-policy-created', body: (): Json => ({ effect: 'deny', tool: { kind: 'drive', name: 'user.message' }, principal_id: principal }), field: 'principal_id', value: () => principal },
    ];
    let principal = '';
    for (const { path, point, body: bodyOf, field, value } of cases) {
      const body = bodyOf();
      const mine = async () => (await api.get<{ data: Record<string, string>[] }>(path, { limit: 100 })).data.filter((x) => x[field] === value()).map((x) => x.id);
      await crashedCreate(q, point, path, body, `k-${point}`);
      const written = await mine();
      expect(written, path).toHaveLength(1);
      const retry = await api.request<{ id: string; version: number }>('POST', path, { body, idempotencyKey: `k-${point}` });
      expect([path, retry.status, retry.body.id, retry.body.version]).toEqual([path, 201, written[0], 1]);
      expect(await mine()).toEqual(written);
      if (path === principals) principal = retry.body.id;
    }
  }, 180_000);
});

/**
 * The same for the creates whose answer shows a signing secret once (crash points
 * `automation-created`, `webhook-endpoint-created`): the retry answers the resource its first
 * attempt wrote, with a new first secret (the first attempt's was never shown), and that secret is
 * the one the resource signs or verifies with.
 */
describe('a crash inside a keyed create that shows a signing secret', () => {
  const crash = useCrashPlatforms('keyed-secret-create-crash');
  interface Made { id: string; version: number; signing_secret?: string }

  it('an Automation with a webhook trigger is made once; the retry\'s secret verifies its deliveries', async () => {
    const q = await crash.start(['automation-created'], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const principal = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${q.p.bootstrap.workspace_id}/principals`, {
      external_subject_id: 'robot', principal_type: 'service', display_name: 'Robot',
    })).id;
    const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'a', model: 'default' })).id;
    const environment = (await api.post<{ id: string }>('/v1/environments', { name: 'e', image: 'agentplane/sandbox:latest' })).id;
    const body: Json = { name: 'keyed-hook', principal_id: principal, agent, environment_id: environment, prompt: 'handle {{event}}', trigger: { type: 'webhook' } };
    const named = async () => (await api.get<{ data: { id: string; name: string }[] }>('/v1/automations', { limit: 100 })).data.filter((x) => x.name === 'keyed-hook').map((x) => x.id);

    await crashedCreate(q, 'automation-created', '/v1/automations', body, 'k-hook');
    const written = await named();
    expect(written).toHaveLength(1);
    const retry = await api.request<Made & { webhook: { ingest_path: string } }>('POST', '/v1/automations', { body, idempotencyKey: 'k-hook' });
    expect([retry.status, retry.body.id, retry.body.version]).toEqual([201, written[0], 1]);
    expect(retry.body.signing_secret).toMatch(/^whsec_/);
    expect(await named()).toEqual(written);

    const delivery = JSON.stringify({ ticket: 1 });
    const deliver = (secret: string, msgId: string) => {
      const at = new Date();
      return fetch(`${q.p.baseUrl}${retry.body.webhook.ingest_path}`, {
        method: 'POST', body: delivery,
        headers: { 'content-type': 'application/json', 'webhook-id': msgId, 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)), 'webhook-signature': new Webhook(secret).sign(msgId, at, delivery) },
      });
    };
    expect((await deliver(`whsec_${Buffer.alloc(32, 7).toString('base64')}`, 'msg_other')).status).toBe(401);
    expect((await deliver(String(retry.body.signing_secret), 'msg_retry')).status).toBe(202);
    const replay = await api.request<Made>('POST', '/v1/automations', { body, idempotencyKey: 'k-hook' });
    expect([replay.status, replay.body.id, replay.body.signing_secret, replay.headers.get('idempotent-replayed')]).toEqual([201, written[0], retry.body.signing_secret, 'true']);
  }, 180_000);

  it('a webhook endpoint is made once; the retry\'s secret signs its deliveries', async () => {
    const got: { headers: IncomingHttpHeaders; body: string }[] = [];
    const rx = createServer((req, res) => {
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        got.push({ headers: req.headers, body: Buffer.concat(chunks).toString('utf8') });
        res.writeHead(200).end();
      });
    });
    await new Promise<void>((r) => rx.listen(0, '127.0.0.1', () => r()));
    try {
      const q = await crash.start(['webhook-endpoint-created'], { env: { LOG_LEVEL: 'warn', AGENTPLANE_MODE: 'development' } });
      const api = q.p.root;
      const body: Json = { url: `http://127.0.0.1:${(rx.address() as AddressInfo).port}/hook`, description: 'keyed-endpoint' };
      const named = async () => (await api.get<{ data: { id: string; description: string | null }[] }>('/v1/webhook-endpoints', { limit: 100 })).data.filter((x) => x.description === 'keyed-endpoint').map((x) => x.id);

      await crashedCreate(q, 'webhook-endpoint-created', '/v1/webhook-endpoints', body, 'k-endpoint');
      const written = await named();
      expect(written).toHaveLength(1);
      const retry = await api.request<Made>('POST', '/v1/webhook-endpoints', { body, idempotencyKey: 'k-endpoint' });
      expect([retry.status, retry.body.id, retry.body.version]).toEqual([201, written[0], 1]);
      expect(await named()).toEqual(written);

      expect(await api.post(`/v1/webhook-endpoints/${written[0]}/test`, { expected_version: 1 })).toEqual({ delivered: true, status_code: 200 });
      const sent = got.at(-1);
      const headers = { 'webhook-id': String(sent?.headers['webhook-id']), 'webhook-timestamp': String(sent?.headers['webhook-timestamp']), 'webhook-signature': String(sent?.headers['webhook-signature']) };
      expect(() => new Webhook(String(retry.body.signing_secret)).verify(String(sent?.body), headers)).not.toThrow();
      expect(() => new Webhook(`whsec_${Buffer.alloc(32, 7).toString('base64')}`).verify(String(sent?.body), headers)).toThrow();
    } finally {
      await new Promise((r) => rx.close(r));
    }
  }, 180_000);
});
