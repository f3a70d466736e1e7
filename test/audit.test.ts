import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { mcpCall, toolBody } from './harness/mcp-call.js';
import { createCredential, createPrincipal } from './harness/governance.js';

interface AuditRecord {
  id: number; workspace_id: string; actor: { id: string; credential_id: string | null }; action: string;
  target: string | null; outcome: string; status: number | null; detail: string | null; request_id: string | null; time: string;
}
interface ExportPage { data: AuditRecord[]; next_after: number | null }

let p: Platform;
let org: string;
let ws: string;

async function exportPage(client: HttpClient, body: Record<string, unknown>) {
  return client.request<ExportPage>('POST', '/v1/audit/export', { body });
}

/** Every record after `after`, paged with `limit`, following next_after to the end. */
async function exportAll(client: HttpClient, after: number, limit: number, filter: Record<string, unknown> = {}): Promise<{ records: AuditRecord[]; pages: number }> {
  const records: AuditRecord[] = [];
  let cursor: number | null = after;
  let pages = 0;
  while (cursor !== null) {
    const r = await exportPage(client, { ...filter, after: cursor, limit });
    expect(r.status).toBe(200);
    expect(r.body.data.length).toBeLessThanOrEqual(limit);
    records.push(...r.body.data);
    cursor = r.body.next_after;
    pages++;
    if (pages > 1000) throw new Error('export does not terminate');
  }
  return { records, pages };
}

async function lastId(): Promise<number> {
  const all = await exportAll(p.root, 0, 1000);
  return all.records.at(-1)?.id ?? 0;
}

beforeAll(async () => {
  p = await startPlatform();
  org = p.bootstrap.organization_id;
  ws = p.bootstrap.workspace_id;
});
afterAll(async () => {
  await p?.stop();
});

describe('audit log', () => {
  it('pages through every record of a scripted scenario with no gap and no duplicate', async () => {
    const start = await lastId();
    const expected: { action: string; outcome: string; target?: string }[] = [];

    const keyR = await p.root.request<{ id: string; secret: string }>('POST', `/v1/organizations/${org}/api-keys`, {
      body: { display_name: 'audited admin', role: 'admin', scope: { type: 'workspace', workspace_id: ws } }, idempotencyKey: `k-${Math.random()}`,
    });
    expect(keyR.status).toBe(201);
    expected.push({ action: 'apiKeys.createApiKey', outcome: 'succeeded', target: keyR.body.id });
    const admin = new HttpClient({ baseUrl: p.baseUrl, token: keyR.body.secret });

    const principals: string[] = [];
    for (let i = 0; i < 5; i++) {
      const r = await admin.request<{ id: string }>('POST', `/v1/organizations/workspaces/${ws}/principals`, {
        body: { external_subject_id: `audit-${i}-${Math.random()}`, principal_type: 'person', display_name: `p${i}` },
      });
      expect(r.status).toBe(201);
      principals.push(r.body.id);
      expected.push({ action: 'principals.createPrincipal', outcome: 'succeeded', target: r.body.id });
      const s = await admin.request('POST', `/v1/principals/${r.body.id}/suspend`, { body: {} });
      expect(s.status).toBe(200);
      expected.push({ action: 'principals.suspendPrincipal', outcome: 'succeeded', target: r.body.id });
    }
    // A refused mutation (schema rejection) is recorded as failed, with its error type.
    const bad = await admin.request('POST', `/v1/principals/${principals[0] as string}/resume`, { body: { nope: 1 } });
    expect(bad.status).toBe(400);
    expected.push({ action: 'principals.resumePrincipal', outcome: 'failed', target: principals[0] as string });
    // A mutation over MCP goes through the same pipeline and is recorded the same way.
    const viaMcp = await mcpCall(p.baseUrl, keyR.body.secret, 'principals_resumePrincipal', { path: { principal_id: principals[1] }, body: {}, idempotency_key: `mcp-${Math.random()}` });
    expect(viaMcp.result?.isError).toBeFalsy();
    expected.push({ action: 'principals.resumePrincipal', outcome: 'succeeded', target: principals[1] as string });
    // Reads are not recorded; an idempotent replay is not a second record.
    expect((await admin.request('GET', `/v1/principals/${principals[2] as string}`)).status).toBe(200);
    const idem = `audit-replay-${Math.random()}`;
    const once = await admin.request('POST', `/v1/principals/${principals[2] as string}/resume`, { body: {}, idempotencyKey: idem });
    const twice = await admin.request('POST', `/v1/principals/${principals[2] as string}/resume`, { body: {}, idempotencyKey: idem });
    expect(once.status).toBe(200);
    expect(twice.status).toBe(200);
    expected.push({ action: 'principals.resumePrincipal', outcome: 'succeeded', target: principals[2] as string });

    for (const limit of [1, 3, 7, 100]) {
      const { records, pages } = await exportAll(p.root, start, limit);
      expect(records.map((r) => r.id)).toEqual(expected.map((_, i) => start + 1 + i));
      expect(records.map((r) => ({ action: r.action, outcome: r.outcome, target: r.target }))).toEqual(
        expected.map((e) => ({ action: e.action, outcome: e.outcome, target: e.target })),
      );
      expect(pages).toBeGreaterThanOrEqual(Math.ceil(expected.length / limit));
    }
    const { records } = await exportAll(p.root, start, 100);
    const failed = records.find((r) => r.outcome === 'failed');
    expect(failed?.detail).toBe('validation.malformed');
    expect(failed?.status).toBe(400);
    for (const r of records.slice(1)) {
      expect(r.actor.credential_id).toBe(keyR.body.id);
      expect(r.workspace_id).toBe(ws);
      expect(r.request_id).toMatch(/^req_[0-9a-f]{24}$/);
    }
    // No secrets in the log.
    expect(JSON.stringify(records)).not.toContain(keyR.body.secret);
  });

  it('carries the Request-Id of the request it records', async () => {
    const r = await p.root.request<{ id: string }>('POST', `/v1/organizations/workspaces/${ws}/principals`, {
      body: { external_subject_id: `rid-${Math.random()}`, principal_type: 'service', display_name: 'rid' },
    });
    const rid = r.headers.get('request-id');
    expect(rid).toMatch(/^req_/);
    const { records } = await exportAll(p.root, 0, 1000, { action: 'principals.createPrincipal' });
    expect(records.at(-1)?.request_id).toBe(rid);
  });

  it('names a refused request\'s target only when its path holds a well-formed id of that kind', async () => {
    const s = await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
      external_subject_id: `tgt-${Math.random()}`, principal_type: 'service', display_name: 'tgt',
    });
    const sent = [
      [`/v1/sessions/${encodeURIComponent(`FORGED by admin sess_${'0'.repeat(32)}`)}/archive`, null],
      [`/v1/sessions/${s.id}/archive`, null],
      [`/v1/sessions/sess_${'0'.repeat(32)}/archive`, `sess_${'0'.repeat(32)}`],
    ] as const;
    for (const [path, target] of sent) {
      const r = await p.root.request('POST', path, { body: {} });
      expect(r.status).toBeGreaterThanOrEqual(400);
      const rid = r.headers.get('request-id');
      const { records } = await exportAll(p.root, 0, 1000, { action: 'sessions.archiveSession' });
      expect(records.filter((x) => x.request_id === rid).map((x) => [x.outcome, x.target])).toEqual([['failed', target]]);
    }
    // Refused before its path is read (no credential's right to act), a well-formed id is named.
    const viewer = await p.root.post<{ secret: string }>(`/v1/organizations/${org}/api-keys`, {
      display_name: 'tgt viewer', role: 'viewer', scope: { type: 'workspace', workspace_id: ws },
    }, { idempotencyKey: `tv-${Math.random()}` });
    const client = new HttpClient({ baseUrl: p.baseUrl, token: viewer.secret });
    for (const [id, target] of [[`sess_${'1'.repeat(32)}`, `sess_${'1'.repeat(32)}`], ['not an id at all', null]] as const) {
      const r = await client.request('POST', `/v1/sessions/${encodeURIComponent(id)}/archive`, { body: {} });
      expect(r.status).toBe(403);
      const { records } = await exportAll(p.root, 0, 1000, { action: 'sessions.archiveSession' });
      expect(records.filter((x) => x.request_id === r.headers.get('request-id')).map((x) => [x.outcome, x.target])).toEqual([['denied', target]]);
    }
  });

  it('filters by actor, target, action and time range', async () => {
    const before = new Date().toISOString();
    const prin = await p.root.request<{ id: string }>('POST', `/v1/organizations/workspaces/${ws}/principals`, {
      body: { external_subject_id: `f-${Math.random()}`, principal_type: 'person', display_name: 'f' },
    });
    await p.root.request('POST', `/v1/principals/${prin.body.id}/suspend`, { body: {} });
    await p.root.request('POST', `/v1/principals/${prin.body.id}/resume`, { body: {} });
    const byTarget = await exportAll(p.root, 0, 2, { target: prin.body.id });
    expect(byTarget.records.map((r) => r.action)).toEqual(['principals.createPrincipal', 'principals.suspendPrincipal', 'principals.resumePrincipal']);
    const byAction = await exportAll(p.root, 0, 50, { target: prin.body.id, action: 'principals.resumePrincipal' });
    expect(byAction.records).toHaveLength(1);
    const since = await exportAll(p.root, 0, 50, { since: before });
    expect(since.records.length).toBeGreaterThanOrEqual(3);
    for (const r of since.records) expect(Date.parse(r.time)).toBeGreaterThanOrEqual(Date.parse(before));
    const until = await exportAll(p.root, 0, 50, { until: before });
    for (const r of until.records) expect(Date.parse(r.time)).toBeLessThan(Date.parse(before));
    const rootActor = since.records[0]?.actor.id as string;
    const byActor = await exportAll(p.root, 0, 50, { actor: rootActor, since: before });
    expect(byActor.records.length).toBe(since.records.filter((r) => r.actor.id === rootActor).length);
    const nobody = await exportAll(p.root, 0, 50, { actor: 'prin_00000000000000000000000000000000' });
    expect(nobody.records).toEqual([]);
  });

  it('records a mutation a Principal credential is refused over MCP, as over REST', async () => {
    const prin = await createPrincipal(p.root, ws, 'mcp-refused');
    const cred = await createCredential(p.root, prin);
    const body = { principal_id: prin, target: { type: 'workspace', id: ws }, actions: ['manage'] };
    // Outside the Principal catalog over MCP (a mutation the credential is not admitted to).
    const viaMcp = await mcpCall(p.baseUrl, cred.secret, 'permissionAssignments_createPermissionAssignment', { body, idempotency_key: `pa-${Math.random()}` });
    expect(viaMcp.result?.isError).toBe(true);
    expect((toolBody(viaMcp.result).error as { type: string }).type).toBe('policy.denied');
    // One the credential is admitted to over REST, but not through the closed MCP catalog.
    const viaMcpSend = await mcpCall(p.baseUrl, cred.secret, 'sessions_archiveSession', { path: { session_id: 'sess_00000000000000000000000000000000' }, body: {}, idempotency_key: `ar-${Math.random()}` });
    expect(viaMcpSend.result?.isError).toBe(true);
    const viaRest = await new HttpClient({ baseUrl: p.baseUrl, token: cred.secret }).request('POST', '/v1/permission-assignments', { body });
    expect(viaRest.status).toBe(403);
    const { records } = await exportAll(p.root, 0, 1000, { actor: cred.id });
    expect(records.map((r) => [r.action, r.outcome, r.status, r.detail, r.actor.id])).toEqual([
      ['permissionAssignments.createPermissionAssignment', 'denied', 403, 'policy.denied', prin],
      ['sessions.archiveSession', 'denied', 403, 'policy.denied', prin],
      ['permissionAssignments.createPermissionAssignment', 'denied', 403, 'policy.denied', prin],
    ]);
    // Nothing was granted.
    const held = await p.root.get<{ data: unknown[] }>(`/v1/permission-assignments?principal_id=${prin}`);
    expect(held.data).toEqual([]);
  });

  it('records a mutation refused for the key\'s rate limit over MCP, as over REST', async () => {
    // Fixed one-minute windows: start early enough in one that the three requests share it.
    const second = new Date().getUTCSeconds();
    if (second > 45) await new Promise((r) => setTimeout(r, (61 - second) * 1000));
    const key = await p.root.post<{ id: string; secret: string }>(`/v1/organizations/${org}/api-keys`, {
      display_name: 'audit limited', role: 'developer', scope: { type: 'workspace', workspace_id: ws }, rate_limit_per_minute: 1,
    }, { idempotencyKey: 'audit-limited-key' });
    const dev = new HttpClient({ baseUrl: p.baseUrl, token: key.secret });
    expect((await dev.request('POST', '/v1/agents', { body: { name: 'limited-1', model: 'default' } })).status).toBe(201);
    const viaRest = await dev.request('POST', '/v1/agents', { body: { name: 'limited-2', model: 'default' } });
    expect(viaRest.status).toBe(429);
    const viaMcp = await mcpCall(p.baseUrl, key.secret, 'agents_createAgent', { body: { name: 'limited-3', model: 'default' } });
    expect(viaMcp.result?.isError).toBe(true);
    expect((toolBody(viaMcp.result).error as { type: string }).type).toBe('budget.exceeded');
    const { records } = await exportAll(p.root, 0, 1000, { actor: key.id });
    expect(records.map((r) => [r.action, r.outcome, r.status, r.detail])).toEqual([
      ['agents.createAgent', 'succeeded', 201, null],
      ['agents.createAgent', 'failed', 429, 'budget.exceeded'],
      ['agents.createAgent', 'failed', 429, 'budget.exceeded'],
    ]);
    // Nothing was created by the refused calls.
    const agents = await p.root.get<{ data: { name: string }[] }>('/v1/agents', { limit: 100 });
    expect(agents.data.map((a) => a.name).filter((n) => n.startsWith('limited-'))).toEqual(['limited-1']);
  });

  it('keeps Workspaces apart and rejects bad requests', async () => {
    const other = await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name: 'audit-other' });
    const inOther = p.root.with({ workspaceId: other.id });
    const { records } = await exportAll(inOther, 0, 100);
    for (const r of records) expect(r.workspace_id).toBe(other.id);
    expect(records.some((r) => r.workspace_id === ws)).toBe(false);

    for (const body of [{ after: -1 }, { limit: 0 }, { limit: 1001 }, { since: 'yesterday' }, { extra: true }, { after: 'c1_x' }]) {
      const r = await exportPage(p.root, body);
      expect(r.status).toBe(400);
    }
    const viewer = await p.root.request<{ secret: string }>('POST', `/v1/organizations/${org}/api-keys`, {
      body: { display_name: 'viewer', role: 'viewer', scope: { type: 'workspace', workspace_id: ws } }, idempotencyKey: `k-${Math.random()}`,
    });
    const denied = await exportPage(new HttpClient({ baseUrl: p.baseUrl, token: viewer.body.secret }), {});
    expect(denied.status).toBe(403);
    const via = await mcpCall(p.baseUrl, p.bootstrap.root_key, 'audit_exportAudit', { body: { limit: 1 } });
    expect(via.result?.isError).toBeFalsy();
    expect(Array.isArray(toolBody(via.result).data)).toBe(true);
  });
});
