/**
 * An update that changes nothing keeps the resource's version (a client's retry, or a PATCH that
 * repeats what is stored, moves nothing); one that changes a field moves it by one. Black-box
 * against a real platform (no runner), for the resources whose updates write through the document
 * store's compare-and-swap: Workspaces, API keys, SurfaceScopes, Connections and Automations.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPlatform, type Platform } from './harness/platform.js';

type Doc = { id: string; version: number } & Record<string, unknown>;

let p: Platform;
let org: string;
let ws: string;

beforeAll(async () => {
  p = await startPlatform({ runner: false });
  org = p.bootstrap.organization_id;
  ws = p.bootstrap.workspace_id;
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

/** Same values twice (version kept, each answer the stored document), then a change (version + 1). */
async function expectKept(method: 'PATCH' | 'POST', path: string, same: Record<string, unknown>, changed: Record<string, unknown>, start: Doc): Promise<void> {
  for (let i = 0; i < 2; i++) {
    const r = await p.root.request<Doc>(method, path, { body: { ...same, expected_version: start.version } });
    expect([path, r.status, r.body.version], JSON.stringify(r.body)).toEqual([path, 200, start.version]);
    expect(r.body.updated_at).toBe(start.updated_at);
  }
  const moved = await p.root.request<Doc>(method, path, { body: { ...changed, expected_version: start.version } });
  expect([path, moved.status, moved.body.version]).toEqual([path, 200, start.version + 1]);
}

describe('an update that changes nothing keeps the version', () => {
  it('Workspaces, API keys, SurfaceScopes, Connections and Automations', async () => {
    const workspace = await p.root.get<Doc>(`/v1/organizations/workspaces/${ws}`);
    await expectKept('PATCH', `/v1/organizations/workspaces/${ws}`, { name: workspace.name }, { name: `${String(workspace.name)}-2` }, workspace);

    const key = await p.root.post<Doc>(`/v1/organizations/${org}/api-keys`, { display_name: 'k', role: 'viewer', scope: { type: 'workspace', workspace_id: ws } }, { idempotencyKey: `uk-${Math.random()}` });
    const keyDoc = await p.root.get<Doc>(`/v1/api-keys/${key.id}`);
    await expectKept('PATCH', `/v1/api-keys/${key.id}`, { display_name: 'k', role: 'viewer' }, { display_name: 'k2' }, keyDoc);

    const exti = await p.root.post<Doc>('/v1/external-installations', { provider: 'slack', external_id: 'T-UNCHANGED', display_name: 'Acme' });
    const scope = await p.root.post<Doc>('/v1/surface-scopes', { kind: 'root', external_installation_id: exti.id, display_name: 'Acme' });
    await expectKept('POST', `/v1/surface-scopes/${scope.id}`, { display_name: 'Acme' }, { display_name: 'Acme 2' }, scope);

    const conn = await p.root.post<Doc>('/v1/connections', { name: 'docs', url: 'https://mcp.example.com/mcp' });
    await expectKept('PATCH', `/v1/connections/${conn.id}`, { name: 'docs', url: 'https://mcp.example.com/mcp' }, { name: 'docs-2' }, conn);

    const service = await p.root.post<Doc>(`/v1/organizations/workspaces/${ws}/principals`, { external_subject_id: `svc-${Math.random()}`, principal_type: 'service', display_name: 'svc' });
    const env = await p.root.post<Doc>('/v1/environments', { name: 'e', image: 'agentplane/sandbox:latest' });
    const agent = await p.root.post<Doc>('/v1/agents', { name: 'a', model: 'default' });
    const auto = await p.root.post<Doc>('/v1/automations', { name: 'nightly', principal_id: service.id, agent: agent.id, environment_id: env.id, prompt: 'p', trigger: { type: 'webhook' } });
    const autoDoc = await p.root.get<Doc>(`/v1/automations/${auto.id}`);
    await expectKept('POST', `/v1/automations/${auto.id}`, { name: 'nightly', prompt: 'p' }, { prompt: 'q' }, autoDoc);
  });
});
