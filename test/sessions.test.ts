import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createHash } from 'node:crypto';
import { Redis } from 'ioredis';
import { HttpClient, streamEvents, type SseFrame } from '@agentplane/client';
import { EnqueueOutbox, SessionStore, ThreadRuntime, recordOnlyTurnScheduler, sessionTag, type RunDoc, type SessionDoc, type WaitKind } from '@agentplane/domain';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { createCredential, createPrincipal } from './harness/governance.js';

let p: Platform;
let redis: Redis;
let store: SessionStore;
let runtime: ThreadRuntime;
let api: HttpClient;
let principal: string;
let envId: string;
let agentId: string;

const errType = (r: { body: unknown }) => (r.body as { error?: { type?: string } }).error?.type;
const errMsg = (r: { body: unknown }) => (r.body as { error?: { message?: string } }).error?.message ?? '';
type Json = Record<string, unknown>;

beforeAll(async () => {
  p = await startPlatform();
  redis = new Redis(p.redisUrl());
  store = new SessionStore(redis);
  runtime = new ThreadRuntime(store, () => recordOnlyTurnScheduler);
  const ws = p.bootstrap.workspace_id;
  // A workspace-bound developer key, as applications use.
  const key = await p.root.post<{ secret: string }>(`/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
    display_name: 'app', role: 'developer', scope: { type: 'workspace', workspace_id: ws },
  }, { idempotencyKey: 'sessions-dev-key' });
  api = new HttpClient({ baseUrl: p.baseUrl, token: key.secret });
  principal = (await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
    external_subject_id: 'user-1', principal_type: 'person', display_name: 'User One',
  })).id;
  envId = (await api.post<{ id: string }>('/v1/environments', { name: 'default', image: 'agentplane/sandbox:1' })).id;
  agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'helper', model: 'default', system: 'Be brief.', tools: [{ type: 'builtin', name: 'bash' }] })).id;
});
afterAll(async () => {
  redis?.disconnect();
  await p?.stop();
});

const msg = (content: string, extra: Json = {}) => ({
  type: 'user.message', payload: { content, authored_by: principal, caused_by: { kind: 'api' }, ...extra },
});
const interrupt = (extra: Json = {}) => ({
  type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' }, ...extra },
});
async function newSession(extra: Json = {}): Promise<Json & { id: string }> {
  return api.post<Json & { id: string }>('/v1/sessions', { agent: agentId, environment_id: envId, ...extra });
}
async function sessionDoc(id: string): Promise<SessionDoc> {
  return store.get(p.bootstrap.workspace_id, id);
}
/** Take up to n frames (fewer if the stream ends or the time runs out) without closing the stream. */
async function collect(it: AsyncGenerator<SseFrame>, n: number, timeoutMs = 10_000): Promise<SseFrame[]> {
  const out: SseFrame[] = [];
  const deadline = Date.now() + timeoutMs;
  while (out.length < n) {
    const left = deadline - Date.now();
    if (left <= 0) break;
    let timer: NodeJS.Timeout | undefined;
    const r = await Promise.race([
      it.next(),
      new Promise<'timeout'>((resolve) => { timer = setTimeout(() => resolve('timeout'), left); }),
    ]);
    clearTimeout(timer);
    if (r === 'timeout' || r.done) break;
    out.push(r.value);
  }
  return out;
}
/**
 * Open a stream now (the client generator connects on its first read) and wait until it is live:
 * its headers come once it is subscribed and has read the log.
 */
async function open(path: string, opts: Parameters<typeof streamEvents>[2] = {}, client: HttpClient = api): Promise<AsyncGenerator<SseFrame>> {
  let opened!: () => void;
  const live = new Promise<void>((resolve) => { opened = resolve; });
  const it = streamEvents(client, path, { ...opts, onOpen: opened });
  const first = it.next();
  await Promise.race([live, first]);
  async function* rest(): AsyncGenerator<SseFrame> {
    const f = await first;
    if (f.done) return;
    yield f.value;
    yield* it;
  }
  return rest();
}

describe('agents and environments', () => {
  it('an Agent whose model names no routing profile of its Workspace is refused where it is written (422 model.no_eligible_model)', async () => {
    const refused = async (r: { status: number; body: unknown }, field: string) => {
      expect([r.status, errType(r)]).toEqual([422, 'model.no_eligible_model']);
      expect((r.body as { error: { message: string } }).error.message).toContain(`${field}: no model routing profile`);
    };
    await refused(await api.request('POST', '/v1/agents', { body: { name: 'typo', model: 'defualt' } }), 'body.model');
    // Inline agents of a Session create too, and nothing is left behind.
    const before = (await api.get<{ data: Json[] }>('/v1/agents', { limit: 100 })).data.length;
    await refused(await api.request('POST', '/v1/sessions', { body: { agent: { name: 'typo', model: 'no-such-profile' }, environment_id: envId } }), 'body.agent.model');
    expect((await api.get<{ data: Json[] }>('/v1/agents', { limit: 100 })).data.length).toBe(before);
    // A new version may not switch to one either.
    const a = await api.post<{ id: string }>('/v1/agents', { name: 'ok', model: 'default' });
    await refused(await api.request('POST', `/v1/agents/${a.id}`, { body: { expected_version: 1, model: 'nope' } }), 'body.model');
    // The built-in `default` profile works, and so does a profile created later, once it exists.
    const prof = await p.root.request('POST', `/v1/organizations/workspaces/${p.bootstrap.workspace_id}/model-routing-profiles`, {
      body: { key: 'later', candidates: [{ credential_key: 'default', provider_model: 'scripted-1' }] } });
    expect(prof.status).toBe(201);
    expect((await api.request('POST', `/v1/agents/${a.id}`, { body: { expected_version: 1, model: 'later' } })).status).toBe(200);
  });

  it('agent versions are immutable; a new version never changes an old one', async () => {
    const a = await api.post<Json & { id: string; version: number }>('/v1/agents', { name: 'v', model: 'default' });
    expect(a).toMatchObject({ type: 'agent', version: 1, tools: [], mcp_servers: [], archived_at: null });
    // Reads of the head go through the read cache: each write shows on the next read.
    expect(await api.get(`/v1/agents/${a.id}`)).toMatchObject({ version: 1 });
    expect(await api.get(`/v1/agents/${a.id}`)).toMatchObject({ version: 1 });
    const v2 = await api.post<Json>(`/v1/agents/${a.id}`, { expected_version: 1, system: 'new' });
    expect(v2).toMatchObject({ version: 2, system: 'new' });
    expect(await api.get(`/v1/agents/${a.id}`)).toMatchObject({ version: 2, system: 'new' });
    expect(await api.post<Json>(`/v1/agents/${a.id}`, { expected_version: 2, system: 'newer' })).toMatchObject({ version: 3 });
    expect(await api.get(`/v1/agents/${a.id}`)).toMatchObject({ version: 3, system: 'newer' });
    const stale = await api.request('POST', `/v1/agents/${a.id}`, { body: { expected_version: 1, system: 'x' } });
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('validation.conflict');
    expect(errMsg(stale)).toBe('version 1 is stale; the current version is 3');
    // A version never written is not called stale.
    const ahead = await api.request('POST', `/v1/agents/${a.id}`, { body: { expected_version: 9, system: 'x' } });
    expect([ahead.status, errMsg(ahead)]).toEqual([409, 'version 9 is ahead of the current one (never written); the current version is 3']);
    expect(await api.get(`/v1/agents/${a.id}/versions/1`)).toMatchObject({ version: 1, system: null });
    const versions = await api.get<{ data: Json[] }>(`/v1/agents/${a.id}/versions`);
    expect(versions.data.map((v) => v.version)).toEqual([1, 2, 3]);
    const archived = await api.post<Json>(`/v1/agents/${a.id}/archive`);
    expect(archived.archived_at).not.toBeNull();
    expect(await api.get(`/v1/agents/${a.id}`)).toMatchObject({ version: 3, archived_at: archived.archived_at });
    expect(await api.post<Json>(`/v1/agents/${a.id}/archive`)).toEqual(archived);
    const list = await api.get<{ data: Json[] }>('/v1/agents', { limit: 100 });
    expect(list.data.some((x) => x.id === a.id)).toBe(false);
  });

  it('environments: defaults, versions, schema checks', async () => {
    const e = await api.post<Json & { id: string }>('/v1/environments', { name: 'e', image: 'img:1' });
    expect(e).toMatchObject({ network: { mode: 'none' }, retention_mode: 'durable', driver: 'docker', tier: 'container', version: 1 });
    expect(await api.post(`/v1/environments/${e.id}`, { expected_version: 1, resources: { cpu_millis: 2000, memory_mib: 512, disk_mib: 1024, max_duration_seconds: 60 } })).toMatchObject({ version: 2 });
    const bad = await api.request('POST', '/v1/environments', { body: { name: 'x', image: 'img', network: { mode: 'open' } } });
    expect(bad.status).toBe(400);
    // Resources may be given in part: the rest are the defaults on a create, the current version's on an update.
    const some = await api.post<Json & { id: string }>('/v1/environments', { name: 'part', image: 'img:1', resources: { memory_mib: 2048 } });
    expect(some.resources).toEqual({ cpu_millis: 1000, memory_mib: 2048, disk_mib: 4096, max_duration_seconds: 3600 });
    expect((await api.post<Json>(`/v1/environments/${e.id}`, { expected_version: 2, resources: { cpu_millis: 500 } })).resources)
      .toEqual({ cpu_millis: 500, memory_mib: 512, disk_mib: 1024, max_duration_seconds: 60 });
    for (const resources of [{}, { memory_mib: 1 }, { gpu: 1 }]) {
      const r = await api.request('POST', '/v1/environments', { body: { name: 'x', image: 'img', resources } });
      expect(r.status, JSON.stringify(resources)).toBe(400);
    }
  });
});

describe('sessions', () => {
  it('creates with a resolved agent snapshot and replays on Idempotency-Key', async () => {
    const body = { agent: { id: agentId, version: 1 }, environment_id: envId, title: 'T', metadata: { a: '1' } };
    const a = await api.request<Json>('POST', '/v1/sessions', { body, idempotencyKey: 'create-1' });
    expect(a.status).toBe(201);
    expect(a.body).toMatchObject({ type: 'session', title: 'T', status: 'idle', archived_at: null, environment_id: envId, agent: { id: agentId, version: 1, type: 'agent', tools: [{ name: 'bash', permission: 'always_allow' }] } });
    expect(a.body.id).toMatch(/^sess_[0-9a-f]{32}$/);
    const b = await api.request<Json>('POST', '/v1/sessions', { body, idempotencyKey: 'create-1' });
    expect(b.body.id).toBe(a.body.id);
    const inline = await api.post<Json>('/v1/sessions', { agent: { name: 'inline', model: 'default' }, environment_id: envId });
    expect(inline).toMatchObject({ agent: { name: 'inline', version: 1 } });
  });

  it("a create refused for its initial define writes no inline agent's Agent, keyed or not", async () => {
    const agents = async () => (await api.get<{ data: { id: string }[] }>('/v1/agents', { limit: 100 })).data.map((a) => a.id);
    const define = (payload: Json) => ({ type: 'user.define_outcome', payload: { description: 'Do it.', authored_by: principal, caused_by: { kind: 'api' }, ...payload } });
    const before = await agents();
    const refusals = [
      [{ rubric: '- ok', grader_model: 'no-such-profile' }, 422, 'model.no_eligible_model'],
      [{ rubric: { type: 'file', file_id: `file_${'0'.repeat(32)}` } }, 404, 'validation.not_found'],
    ] as const;
    for (const [payload, status, type] of refusals) {
      const body = { agent: { name: 'inline-refused', model: 'default' }, environment_id: envId, initial_events: [define(payload)] };
      // Unkeyed, then keyed twice (the retry takes the Agent its first attempt would have written, were there one).
      for (const key of [undefined, `refused-${type}`, `refused-${type}`]) {
        const r = await api.request('POST', '/v1/sessions', { body, ...(key ? { idempotencyKey: key } : {}) });
        expect([r.status, errType(r)]).toEqual([status, type]);
      }
    }
    expect(await agents()).toEqual(before);
  });

  it('rejects principal and unknown fields; limits: initial_events 50, metadata 16', async () => {
    const r1 = await api.request('POST', '/v1/sessions', { body: { agent: agentId, environment_id: envId, principal: principal } });
    expect(r1.status).toBe(400);
    expect(errMsg(r1)).toContain('principal');
    const meta = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`k${i}`, 'v']));
    expect((await api.request('POST', '/v1/sessions', { body: { agent: agentId, environment_id: envId, metadata: meta(16) } })).status).toBe(201);
    const r2 = await api.request('POST', '/v1/sessions', { body: { agent: agentId, environment_id: envId, metadata: meta(17) } });
    expect(r2.status).toBe(400);
    expect(errType(r2)).toBe('validation.malformed');
    const events = (n: number) => Array.from({ length: n }, (_, i) => msg(`m${i}`));
    const ok = await api.request<Json & { id: string }>('POST', '/v1/sessions', { body: { agent: agentId, environment_id: envId, initial_events: events(50) } });
    expect(ok.status).toBe(201);
    const r3 = await api.request('POST', '/v1/sessions', { body: { agent: agentId, environment_id: envId, initial_events: events(51) } });
    expect(r3.status).toBe(400);
    // The 50 initial messages: the first starts a turn, the rest queue for the next ones.
    const page = await api.get<{ data: Json[] }>(`/v1/sessions/${ok.body.id}/threads`);
    const primary = page.data[0] as Json & { id: string };
    const evs = await api.get<{ data: Json[] }>(`/v1/sessions/${ok.body.id}/threads/${primary.id}/events`, { limit: 1000 });
    expect(evs.data.filter((e) => e.type === 'user.message')).toHaveLength(50);
    expect(primary.status).toBe('running');
    const badAuthor = await api.request('POST', '/v1/sessions', { body: { agent: agentId, environment_id: envId, initial_events: [{ type: 'user.message', payload: { content: 'x', authored_by: `prin_${'0'.repeat(32)}`, caused_by: { kind: 'api' } } }] } });
    expect(badAuthor.status).toBe(404);
  });

  it('lists newest first with next_page/prev_page and filters', async () => {
    const agent2 = (await api.post<{ id: string }>('/v1/agents', { name: 'lister', model: 'default' })).id;
    const made: string[] = [];
    for (let i = 0; i < 5; i++) {
      made.push((await api.post<{ id: string }>('/v1/sessions', { agent: agent2, environment_id: envId })).id);
      await new Promise((r) => setTimeout(r, 3));
    }
    const p1 = await api.get<{ data: Json[]; next_page: string | null; prev_page: string | null }>('/v1/sessions', { agent_id: agent2, limit: 2 });
    expect(p1.data.map((s) => s.id)).toEqual([made[4], made[3]]);
    expect(p1.prev_page).toBeNull();
    const p2 = await api.get<{ data: Json[]; next_page: string | null; prev_page: string | null }>('/v1/sessions', { agent_id: agent2, limit: 2, page: p1.next_page ?? '' });
    expect(p2.data.map((s) => s.id)).toEqual([made[2], made[1]]);
    const back = await api.get<{ data: Json[]; prev_page: string | null }>('/v1/sessions', { agent_id: agent2, limit: 2, page: p2.prev_page ?? '' });
    expect(back.data.map((s) => s.id)).toEqual([made[4], made[3]]);
    expect(back.prev_page).toBeNull();
    await api.post(`/v1/sessions/${made[4]}/archive`);
    const live = await api.get<{ data: Json[] }>('/v1/sessions', { agent_id: agent2 });
    expect(live.data.map((s) => s.id)).not.toContain(made[4]);
    const all = await api.get<{ data: Json[] }>('/v1/sessions', { agent_id: agent2, include_archived: true });
    expect(all.data.map((s) => s.id)).toContain(made[4]);
    const asc = await api.get<{ data: Json[] }>('/v1/sessions', { agent_id: agent2, order: 'asc', limit: 1 });
    expect(asc.data[0]?.id).toBe(made[0]);
    const after = await api.get<{ data: Json[] }>('/v1/sessions', { agent_id: agent2, created_after: new Date(Date.now() + 60_000).toISOString() });
    expect(after.data).toEqual([]);
  });

  it('a list cursor continues only the query that issued it: another order or other filters is 400', async () => {
    const agent3 = (await api.post<{ id: string }>('/v1/agents', { name: 'cursor-lister', model: 'default' })).id;
    const made: string[] = [];
    for (let i = 0; i < 3; i++) made.push((await api.post<{ id: string }>('/v1/sessions', { agent: agent3, environment_id: envId })).id);
    const first = await api.get<{ next_page: string }>('/v1/sessions', { agent_id: agent3, limit: 1 });
    expect(first.next_page).toEqual(expect.any(String));
    // The query that issued it continues with it (limit may change).
    const more = await api.get<{ data: Json[] }>('/v1/sessions', { agent_id: agent3, limit: 5, page: first.next_page });
    expect(more.data).toHaveLength(2);
    // So does the same query with its defaults spelled out.
    const spelled = await api.get<{ data: Json[] }>('/v1/sessions', { agent_id: agent3, order: 'desc', include_archived: false, page: first.next_page });
    expect(spelled.data.map((x) => x.id)).toEqual(more.data.map((x) => x.id));
    for (const query of [
      { agent_id: agent3, order: 'asc' },
      { agent_id: agentId },
      {},
      { agent_id: agent3, include_archived: true },
      { agent_id: agent3, created_after: '2000-01-01T00:00:00Z' },
    ]) {
      const r = await api.request('GET', '/v1/sessions', { query: { ...query, page: first.next_page } });
      expect([query, r.status, errType(r)]).toEqual([query, 400, 'validation.malformed']);
    }
  });

  it('update replaces collections; agent changes govern later Runs only', async () => {
    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'session-vault' })).id;
    const s = await newSession({ metadata: { a: '1', b: '2' }, vault_ids: [vault] });
    const u = await api.post<Json>(`/v1/sessions/${s.id}`, { metadata: { c: '3' }, agent: { tools: [] }, title: 'new' });
    expect(u).toMatchObject({ metadata: { c: '3' }, title: 'new', agent: { tools: [] }, vault_ids: [vault] });
    // vault_ids name Vaults of the Workspace.
    const unknown = await api.request('POST', `/v1/sessions/${s.id}`, { body: { vault_ids: [`vlt_${'1'.repeat(32)}`] } });
    expect(unknown.status).toBe(404);
    expect((await api.request('POST', `/v1/sessions/${s.id}`, { body: { agent: { name: 'x' } } })).status).toBe(400);
  });

  it('archive is one-way and retry-safe, keeps reads, refuses drive events', async () => {
    const s = await newSession();
    const a1 = await api.post<Json>(`/v1/sessions/${s.id}/archive`);
    const a2 = await api.post<Json>(`/v1/sessions/${s.id}/archive`);
    expect(a1.archived_at).toBeTruthy();
    expect(a2.archived_at).toBe(a1.archived_at);
    expect((await api.request('GET', `/v1/sessions/${s.id}`)).status).toBe(200);
    const r = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: msg('hi') });
    expect(r.status).toBe(409);
    expect(errType(r)).toBe('runtime.invalid_transition');
  });

  it('an archived Session takes no new message, but the turn it still runs can be interrupted', async () => {
    const s = await newSession();
    await api.post(`/v1/sessions/${s.id}/events`, msg('a long job'));
    const doc = await sessionDoc(s.id);
    const runId = (await store.thread(s.id, doc._primary_thread_id))._active_run_id ?? '';
    expect((await store.run(s.id, runId))?.status).toBe('queued');
    await api.post(`/v1/sessions/${s.id}/archive`);
    expect(errType(await api.request('POST', `/v1/sessions/${s.id}/events`, { body: msg('more') }))).toBe('runtime.invalid_transition');
    const r = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: interrupt() });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ type: 'user.interrupt' });
    // The queued Run never runs: the turn ends interrupted, nothing starts after it, and the
    // archived Session, its last turn over, ends canceled.
    expect((await store.run(s.id, runId))?.status).toBe('canceled');
    const t = await store.thread(s.id, doc._primary_thread_id);
    expect([t.status, t._stop_reason, t._active_run_id, t._closed]).toEqual(['idle', { type: 'interrupted' }, null, true]);
    const types = (await store.log.range(s.id, 0, 100)).map((e) => e.type);
    expect(types).toEqual(['user.message', 'session.status_running', 'user.interrupt', 'session.status_idle', 'session.status_canceled']);
  });

  it('resources sub-routes', async () => {
    const s = await newSession({ resources: [{ type: 'repository', url: 'https://example.com/r.git' }] });
    const list = await api.get<{ data: Json[] }>(`/v1/sessions/${s.id}/resources`);
    expect(list.data).toHaveLength(1);
    const missing = await api.request('POST', `/v1/sessions/${s.id}/resources`, { body: { type: 'memory', memory_store_id: `memstore_${'2'.repeat(32)}` } });
    expect(missing.status).toBe(404);
    const store = (await api.post<{ id: string }>('/v1/memory-stores', { name: 'session-store' })).id;
    const added = await api.post<Json & { id: string }>(`/v1/sessions/${s.id}/resources`, { type: 'memory', memory_store_id: store });
    expect(added).toMatchObject({ type: 'memory', access: 'read_only' });
    // A store is one resource of a Session at most: added again, or twice in a new Session.
    const again = await api.request('POST', `/v1/sessions/${s.id}/resources`, { body: { type: 'memory', memory_store_id: store, access: 'read_write' } });
    expect([again.status, errType(again)]).toEqual([400, 'validation.malformed']);
    expect(errMsg(again)).toContain('already a resource of this session');
    const twice = await api.request('POST', '/v1/sessions', { body: { agent: agentId, environment_id: envId, resources: [{ type: 'memory', memory_store_id: store }, { type: 'memory', memory_store_id: store, access: 'read_write' }] } });
    expect([twice.status, errType(twice)]).toEqual([400, 'validation.malformed']);
    expect(errMsg(twice)).toContain('resources[1]');
    expect(await api.post(`/v1/sessions/${s.id}/resources/${added.id}`, { access: 'read_write' })).toMatchObject({ access: 'read_write' });
    expect((await api.request('POST', `/v1/sessions/${s.id}/resources/${added.id}`, { body: { ref: 'main' } })).status).toBe(400);
    expect(await api.get(`/v1/sessions/${s.id}/resources/${added.id}`)).toMatchObject({ id: added.id });
    expect(await api.delete(`/v1/sessions/${s.id}/resources/${added.id}`)).toEqual({ id: added.id, type: 'session_resource_deleted' });
    expect((await api.request('GET', `/v1/sessions/${s.id}/resources/${added.id}`)).status).toBe(404);
    // Where a resource goes is checked when it is written, not when a Run first places it.
    const repo = 'https://example.com/r.git';
    for (const [resource, field] of [
      [{ type: 'repository', url: repo, mount_path: '/../../etc' }, 'resources[0].mount_path'],
      [{ type: 'repository', url: repo, mount_path: '/workspace/.agentplane/materialized.json' }, 'resources[0].mount_path'],
      [{ type: 'repository', url: repo, mount_path: '/a/./b' }, 'resources[0].mount_path'],
      // A NUL ends a name where the runner's archive reads it: `/..\0` would be the sandbox's root.
      [{ type: 'repository', url: repo, mount_path: '/..\u0000' }, 'resources[0].mount_path'],
      [{ type: 'repository', url: repo, mount_path: '/.agentplane\u0000' }, 'resources[0].mount_path'],
      [{ type: 'repository', url: repo, mount_path: '/x\ny' }, 'resources[0].mount_path'],
      [{ type: 'repository', url: repo, mount_path: `/${'a'.repeat(256)}` }, 'resources[0].mount_path'],
    ] as const) {
      const r = await api.request('POST', '/v1/sessions', { body: { agent: agentId, environment_id: envId, resources: [resource] } });
      expect([resource.mount_path, r.status, errType(r)]).toEqual([resource.mount_path, 400, 'validation.malformed']);
      expect(errMsg(r)).toContain(field);
    }
    const root = await api.request('POST', `/v1/sessions/${s.id}/resources`, { body: { type: 'repository', url: repo, mount_path: '/workspace' } });
    expect(root.status).toBe(201);
    const moved = await api.request('POST', `/v1/sessions/${s.id}/resources/${(root.body as { id: string }).id}`, { body: { mount_path: '/x/../../y' } });
    expect([moved.status, errType(moved)]).toEqual([400, 'validation.malformed']);
    const nul = await api.request('POST', `/v1/sessions/${s.id}/resources/${(root.body as { id: string }).id}`, { body: { mount_path: '/..\u0000' } });
    expect([nul.status, errType(nul)]).toEqual([400, 'validation.malformed']);
    // A name a file system takes (255 bytes, here in two-byte characters) is accepted.
    expect((await api.request('POST', '/v1/sessions', { body: { agent: agentId, environment_id: envId, resources: [{ type: 'repository', url: repo, mount_path: `/${'é'.repeat(127)}` }] } })).status).toBe(201);
  });

  it('two workspaces cannot see each other’s sessions', async () => {
    const ws2 = await p.root.post<{ id: string }>(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'other' });
    const key2 = await p.root.post<{ secret: string }>(`/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
      display_name: 'other', role: 'developer', scope: { type: 'workspace', workspace_id: ws2.id },
    }, { idempotencyKey: 'sessions-other-key' });
    const other = new HttpClient({ baseUrl: p.baseUrl, token: key2.secret });
    const mine = await newSession();
    for (const [m, path] of [['GET', `/v1/sessions/${mine.id}`], ['POST', `/v1/sessions/${mine.id}/archive`], ['DELETE', `/v1/sessions/${mine.id}`], ['GET', `/v1/sessions/${mine.id}/threads`]] as const) {
      const r = await other.request(m, path);
      expect(r.status, `${m} ${path}`).toBe(404);
      expect(errType(r)).toBe('validation.not_found');
    }
    const stream = await fetch(other.url(`/v1/sessions/${mine.id}/events/stream`), { headers: other.headers() });
    expect(stream.status).toBe(404);
    const list = await other.get<{ data: Json[] }>('/v1/sessions');
    expect(list.data).toEqual([]);
    // Another workspace's environment and agent are unknown here too.
    expect((await other.request('POST', '/v1/sessions', { body: { agent: agentId, environment_id: envId } })).status).toBe(404);
    // And their principals cannot author here.
    const r = await api.request('POST', `/v1/sessions/${mine.id}/events`, { body: msg('x') });
    expect(r.status).toBe(201);
  });

  it('a child thread spawned while the Session is deleted is refused: nothing of it outlives the erase', async () => {
    const s = await newSession();
    const doc = await sessionDoc(s.id);
    const before = await store.spawnChild(doc);
    expect((await api.request('DELETE', `/v1/sessions/${s.id}`)).status).toBe(200);
    // The coordinator's spawn, racing the delete, lands after the erase.
    const late = await store.spawnChild(doc).then((t) => t.id, (e: unknown) => e as Error & { type?: string });
    expect(late).toMatchObject({ type: 'validation.not_found' });
    // The Session's tombstone and its log's erased marker stay, and nothing else.
    const left = await redis.keys(`*{s:${s.id}}*`);
    expect(left.some((k) => k.includes(before.id))).toBe(false);
    expect(left).toHaveLength(2);
  });

  it('a keyed replay of an archive, a thread archive or a Resource write answers as it is now: after delete it is 404, never the erased content', async () => {
    const s = await newSession({ title: 'erase-me title' });
    const child = await store.spawnChild(await sessionDoc(s.id));
    const add = () => api.request('POST', `/v1/sessions/${s.id}/resources`, { body: { type: 'repository', url: 'https://example.com/erase-me.git' }, idempotencyKey: `add-${s.id}` });
    const added = await add();
    expect(added.status).toBe(201);
    const rid = (added.body as { id: string }).id;
    const update = () => api.request('POST', `/v1/sessions/${s.id}/resources/${rid}`, { body: { ref: 'erase-me-branch' }, idempotencyKey: `update-${s.id}` });
    const archiveThread = () => api.request('POST', `/v1/sessions/${s.id}/threads/${child.id}/archive`, { body: {}, idempotencyKey: `thread-${s.id}` });
    const archive = () => api.request('POST', `/v1/sessions/${s.id}/archive`, { body: {}, idempotencyKey: `archive-${s.id}` });
    const calls = [['add', add, 201], ['update', update, 200], ['archive thread', archiveThread, 200], ['archive', archive, 200]] as const;
    for (const [, call, status] of calls.slice(1)) expect((await call()).status).toBe(status);
    // Before the delete a replay answers as the first call did.
    for (const [name, call, status] of calls) {
      const r = await call();
      expect([name, r.status, (r.body as { id?: string }).id]).toEqual([name, status, name === 'archive thread' ? child.id : name === 'archive' ? s.id : rid]);
    }
    expect((await api.request('DELETE', `/v1/sessions/${s.id}`)).status).toBe(200);
    for (const [name, call] of calls) {
      const r = await call();
      expect([name, r.status, errType(r)]).toEqual([name, 404, 'validation.not_found']);
      expect(JSON.stringify(r.body)).not.toMatch(/erase-me/);
    }
  });

  it('delete erases the log: session_deleted, retry-safe, stream reports a gap and never old content', async () => {
    const created = { agent: agentId, environment_id: envId, title: 'secret title', initial_events: [msg('secret words')] };
    const s = (await api.request<Json & { id: string }>('POST', '/v1/sessions', { body: created, idempotencyKey: 'erased-create' })).body;
    const threadId = (await sessionDoc(s.id))._primary_thread_id;
    const sent = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: msg('secret send'), idempotencyKey: 'erased-send' });
    expect(sent.status).toBe(201);
    expect(await api.delete(`/v1/sessions/${s.id}`)).toEqual({ id: s.id, type: 'session_deleted' });
    // A retry under the same Idempotency-Key answers what is there now: nothing of the erased content.
    for (const [path, body, key] of [['/v1/sessions', created, 'erased-create'], [`/v1/sessions/${s.id}/events`, msg('secret send'), 'erased-send']] as const) {
      const again = await api.request('POST', path, { body, idempotencyKey: key });
      expect([path, again.status, errType(again)]).toEqual([path, 404, 'validation.not_found']);
      expect(JSON.stringify(again.body)).not.toMatch(/secret/);
    }
    expect(await api.delete(`/v1/sessions/${s.id}`)).toEqual({ id: s.id, type: 'session_deleted' });
    // An erased Session, its threads and its events are absent resources: 404 of the catalog,
    // whose message says that the Session was deleted.
    const reads: Array<[string, string, Json | undefined]> = [
      ['GET', `/v1/sessions/${s.id}`, undefined],
      ['POST', `/v1/sessions/${s.id}/events`, msg('x')],
      ['GET', `/v1/sessions/${s.id}/threads`, undefined],
      ['GET', `/v1/sessions/${s.id}/threads/${threadId}`, undefined],
      ['GET', `/v1/sessions/${s.id}/threads/${threadId}/events`, undefined],
      ['GET', `/v1/sessions/${s.id}/runs`, undefined],
      ['GET', `/v1/sessions/${s.id}/usage`, undefined],
      ['POST', `/v1/sessions/${s.id}/archive`, undefined],
    ];
    for (const [method, path, body] of reads) {
      const r = await api.request(method, path, body === undefined ? {} : { body });
      expect([r.status, errType(r)], `${method} ${path}`).toEqual([404, 'validation.not_found']);
      expect((r.body as { error: { message: string } }).error.message, `${method} ${path}`).toMatch(/deleted/);
    }
    const frames = await collect(streamEvents(api, `/v1/sessions/${s.id}/events/stream`), 10, 3000);
    expect(frames).toHaveLength(1);
    expect(frames[0]?.event).toBe('gap');
    expect(JSON.parse(frames[0]?.data ?? '{}')).toMatchObject({ from_seq: 1, reason: 'erased' });
    expect(frames.map((f) => f.data).join('')).not.toContain('secret words');
  });
});

describe('drive events', () => {
  it('user.message on an idle thread starts a turn (queued Run); during a turn it queues for the next', async () => {
    const s = await newSession();
    const e1 = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: msg('first') });
    expect(e1.status).toBe(201);
    expect(e1.body).toMatchObject({ type: 'user.message', seq: 1, session_id: s.id, payload: { content: 'first', authored_by: principal } });
    const doc = await sessionDoc(s.id);
    const t = await store.thread(s.id, doc._primary_thread_id);
    expect(t.status).toBe('running');
    const run = await store.run(s.id, t._active_run_id ?? '');
    expect(run).toMatchObject({ status: 'queued', input_event_ids: [e1.body.id], agent: { id: agentId } });
    const e2 = await api.post<Json & { id: string }>(`/v1/sessions/${s.id}/events`, msg('second'));
    const e3 = await api.post<Json & { id: string }>(`/v1/sessions/${s.id}/events`, msg('third'));
    expect(await store.queuedInputs(s.id, t.id)).toEqual([e2.id, e3.id]);
    // The turn ends: the queued messages, in arrival order, start the next Run together.
    await runtime.endTurn(doc, t.id, { type: 'end_turn' });
    const t2 = await store.thread(s.id, t.id);
    expect(t2.status).toBe('running');
    expect(t2._active_run_id).not.toBe(t._active_run_id);
    expect((await store.run(s.id, t2._active_run_id ?? ''))?.input_event_ids).toEqual([e2.id, e3.id]);
    // A turn that ends with nothing queued leaves the thread idle; an archived session starts nothing.
    await runtime.endTurn(doc, t.id, { type: 'end_turn' });
    expect((await store.thread(s.id, t.id)).status).toBe('idle');
  });

  it('user.interrupt on an idle thread is recorded as sent and changes nothing', async () => {
    const s = await newSession();
    const doc = await sessionDoc(s.id);
    const before = await store.thread(s.id, doc._primary_thread_id);
    const r = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: interrupt() });
    expect(r.status).toBe(201);
    expect(r.body).toMatchObject({ type: 'user.interrupt', seq: 1, session_thread_id: doc._primary_thread_id });
    const after = await store.thread(s.id, doc._primary_thread_id);
    expect([after.status, after.version, after._stop_reason]).toEqual(['idle', before.version, null]);
    expect((await api.get<{ data: Json[] }>(`/v1/sessions/${s.id}/runs`)).data).toEqual([]);
    // It is not held against the next turn: a message starts one as usual.
    await api.post(`/v1/sessions/${s.id}/events`, msg('go on'));
    const t = await store.thread(s.id, doc._primary_thread_id);
    expect(t.status).toBe('running');
    expect((await store.run(s.id, t._active_run_id ?? ''))?.status).toBe('queued');
    expect((await store.log.range(s.id, 0, 100)).map((e) => e.type)).toEqual(['user.interrupt', 'user.message', 'session.status_running']);
  });

  /**
   * The turn of `threadId` ends `requires_action` on `waits` as a runner's end reports it: its Run
   * succeeded, and the thread keeps it while it waits. Returns that Run's id.
   */
  async function waitOn(sessionId: string, threadId: string, waits: { tool_use_id: string; kind: WaitKind }[]): Promise<string> {
    const runId = (await store.thread(sessionId, threadId))._active_run_id ?? '';
    await store.docs.update<RunDoc>(sessionTag(sessionId), runId, (r) => ({ ...r, status: 'succeeded' }));
    await runtime.endTurn(await sessionDoc(sessionId), threadId, { type: 'requires_action', tool_use_ids: waits.map((w) => w.tool_use_id) }, waits, { runId });
    return runId;
  }
  const answerOf = (kind: WaitKind, toolUseId: string, extra: Json = {}) => {
    const common = { tool_use_id: toolUseId, authored_by: principal, caused_by: { kind: 'api' }, ...extra };
    if (kind === 'custom_tool') return { type: 'user.custom_tool_result', payload: { ...common, result: 'late' } };
    if (kind === 'confirmation') return { type: 'user.tool_confirmation', payload: { ...common, result: 'allow' } };
    return { type: 'user.question_answer', payload: { ...common, answers: [{ text: 'late' }] } };
  };
  const pendingWaits = (t: { _wait_generation: number; _waits: Record<string, { generation: number; answered_event_id: string | null }> }) =>
    Object.entries(t._waits).filter(([, w]) => w.generation === t._wait_generation && w.answered_event_id === null).map(([id]) => id);

  it('user.interrupt ends a wait on an action (custom tool, confirmation, question): idle interrupted, a late answer is no longer current, a repeat changes nothing, the next message starts a turn', async () => {
    for (const kind of ['custom_tool', 'confirmation', 'question'] as const) {
      const s = await newSession({ initial_events: [msg('go')] });
      const primary = (await sessionDoc(s.id))._primary_thread_id;
      const toolUseId = `toolu_${kind.replace('_', '')}`;
      const runId = await waitOn(s.id, primary, [{ tool_use_id: toolUseId, kind }]);
      const before = (await store.log.range(s.id, 0, 100)).length;

      const r = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: interrupt() });
      expect(r.status).toBe(201);
      const t = await store.thread(s.id, primary);
      expect([t.status, t._active_run_id, t._stop_reason, pendingWaits(t)]).toEqual(['idle', null, { type: 'interrupted' }, []]);
      // The interrupt, the use closed as interrupted and the turn's end, in that order; no Run started.
      const after = (await store.log.range(s.id, before, 100)).map((e) => [e.type, e.payload]);
      expect(after).toEqual([
        ['user.interrupt', expect.objectContaining({ authored_by: principal })],
        ['agent.tool_result', { tool_use_id: toolUseId, content: expect.stringContaining('Interrupted') as unknown, is_error: true, interrupted: true }],
        ['session.status_idle', { stop_reason: { type: 'interrupted' } }],
      ]);
      expect((await api.get<{ data: Json[] }>(`/v1/sessions/${s.id}/runs`)).data.map((x) => [x.id, x.status])).toEqual([[runId, 'succeeded']]);

      // A late answer is refused as one to a wait that is no longer current, with or without the thread.
      for (const extra of [{}, { session_thread_id: primary }]) {
        const late = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: answerOf(kind, toolUseId, extra) });
        expect([late.status, errType(late)]).toEqual([409, 'runtime.invalid_transition']);
        expect(errMsg(late)).toContain('no longer current');
      }

      // A repeated interrupt is recorded and changes nothing more.
      const seen = (await store.log.range(s.id, 0, 100)).length;
      expect((await api.request('POST', `/v1/sessions/${s.id}/events`, { body: interrupt() })).status).toBe(201);
      expect((await store.thread(s.id, primary)).version).toBe(t.version);
      expect((await store.log.range(s.id, seen, 100)).map((e) => e.type)).toEqual(['user.interrupt']);

      // The next message starts a new turn, not a continuation of the interrupted one.
      const next = await api.post<Json & { id: string }>(`/v1/sessions/${s.id}/events`, msg('something else'));
      const t2 = await store.thread(s.id, primary);
      expect(t2.status).toBe('running');
      const run = await store.run(s.id, t2._active_run_id ?? '');
      expect(run).toMatchObject({ status: 'queued', input_event_ids: [next.id] });
      expect(run?.continues_run_id ?? null).toBeNull();
    }
  });

  it('user.interrupt on a wait whose answers are partly in: every use of the generation is closed; a message queued during the wait starts the next turn', async () => {
    const s = await newSession({ initial_events: [msg('go')] });
    const primary = (await sessionDoc(s.id))._primary_thread_id;
    const runId = await waitOn(s.id, primary, [{ tool_use_id: 'toolu_a', kind: 'custom_tool' }, { tool_use_id: 'toolu_b', kind: 'confirmation' }]);
    expect((await api.request('POST', `/v1/sessions/${s.id}/events`, { body: answerOf('custom_tool', 'toolu_a') })).status).toBe(201);
    const queued = await api.post<Json & { id: string }>(`/v1/sessions/${s.id}/events`, msg('meanwhile'));
    expect((await store.thread(s.id, primary))._active_run_id).toBe(runId);

    await api.post(`/v1/sessions/${s.id}/events`, interrupt());
    const evs = await store.log.range(s.id, 0, 100);
    expect(evs.filter((e) => e.type === 'agent.tool_result').map((e) => [(e.payload as Json).tool_use_id, (e.payload as Json).interrupted])).toEqual([['toolu_a', true], ['toolu_b', true]]);
    expect(evs.filter((e) => e.type === 'session.status_idle').map((e) => (e.payload as { stop_reason: Json }).stop_reason.type)).toEqual(['requires_action', 'interrupted']);
    // The queued message is the next turn's input, as after any turn end other than requires_action.
    const t = await store.thread(s.id, primary);
    expect(t.status).toBe('running');
    expect(t._active_run_id).not.toBe(runId);
    expect(await store.run(s.id, t._active_run_id ?? '')).toMatchObject({ status: 'queued', input_event_ids: [queued.id] });
    const late = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: answerOf('confirmation', 'toolu_b') });
    expect([late.status, errType(late)]).toEqual([409, 'runtime.invalid_transition']);
  });

  it('a message sent while the API still takes the thread for idle (another process started a turn) is queued, not a second turn', async () => {
    const s = await newSession();
    const doc = await sessionDoc(s.id);
    // The API created the Session and knows its thread as idle; another process starts a turn.
    const other = await store.log.append(s.id, [{ type: 'user.message', payload: { content: 'elsewhere', authored_by: principal, caused_by: { kind: 'api' } }, session_thread_id: doc._primary_thread_id }]);
    if (!other.ok) throw new Error('append failed');
    await runtime.submitUserMessage(doc, doc._primary_thread_id, other.events[0]?.id ?? '');
    const t = await store.thread(s.id, doc._primary_thread_id);
    expect(t.status).toBe('running');
    const e = await api.request<Json & { id: string }>('POST', `/v1/sessions/${s.id}/events`, { body: msg('here') });
    expect(e.status).toBe(201);
    expect(await store.queuedInputs(s.id, t.id)).toEqual([e.body.id]);
    expect((await store.thread(s.id, t.id))._active_run_id).toBe(t._active_run_id);
    const types = (await store.log.range(s.id, 0, 100)).map((x) => x.type);
    expect(types.filter((x) => x === 'session.status_running')).toHaveLength(1);
  });

  it('requires authored_by of a live Principal of this workspace and caused_by', async () => {
    const s = await newSession();
    const r1 = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: { type: 'user.message', payload: { content: 'x', caused_by: { kind: 'api' } } } });
    expect(r1.status).toBe(400);
    expect(errMsg(r1)).toContain('authored_by');
    const r2 = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: { type: 'user.message', payload: { content: 'x', authored_by: principal } } });
    expect(r2.status).toBe(400);
    const r3 = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: msg('x', { authored_by: `prin_${'f'.repeat(32)}` }) });
    expect(r3.status).toBe(404);
    const r4 = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: { type: 'user.bogus', payload: {} } });
    expect(r4.status).toBe(400);
    const r5 = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: msg('x', { extra: 1 }) });
    expect(r5.status).toBe(400);
  });

  it('Idempotency-Key on a drive event never duplicates it', async () => {
    const s = await newSession();
    const a = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: msg('once'), idempotencyKey: 'drive-1' });
    const b = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: msg('once'), idempotencyKey: 'drive-1' });
    expect(b.body).toEqual(a.body);
    const doc = await sessionDoc(s.id);
    const evs = await api.get<{ data: Json[] }>(`/v1/sessions/${s.id}/threads/${doc._primary_thread_id}/events`);
    expect(evs.data.filter((e) => e.type === 'user.message')).toHaveLength(1);
  });

  it('an Idempotency-Key used again after its record has gone sends the new message, not the old one', async () => {
    const s = await newSession();
    const a = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: msg('first'), idempotencyKey: 'drive-expired' });
    expect(a.status).toBe(201);
    // The record's day is over (its key removed, as its TTL would): the log's own guard, which
    // lives a week, must not answer a different message with the first one.
    const records = await redis.keys(`*:idem:${createHash('sha256').update('drive-expired').digest('hex')}`);
    expect(records).toHaveLength(1);
    await redis.del(...records);
    const b = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: msg('second'), idempotencyKey: 'drive-expired' });
    expect(b.status).toBe(201);
    expect(b.body.id).not.toBe(a.body.id);
    const doc = await sessionDoc(s.id);
    const evs = await api.get<{ data: Json[] }>(`/v1/sessions/${s.id}/threads/${doc._primary_thread_id}/events`);
    const sent = evs.data.filter((e) => e.type === 'user.message').map((e) => JSON.stringify(e.payload));
    expect(sent).toHaveLength(2);
    expect([sent[0]?.includes('first'), sent[1]?.includes('second')]).toEqual([true, true]);
  });

  it('tool results only for the exact current wait generation; exact replay returns the original', async () => {
    const s = await newSession({ initial_events: [msg('go')] });
    const doc = await sessionDoc(s.id);
    const primary = doc._primary_thread_id;
    const answer = (tool: string, result: string, extra: Json = {}) => ({
      type: 'user.tool_confirmation', payload: { tool_use_id: tool, result, authored_by: principal, caused_by: { kind: 'api' }, ...extra },
    });
    const none = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: answer('toolu_1', 'allow') });
    expect(none.status).toBe(409);
    expect(errType(none)).toBe('runtime.invalid_transition');
    await runtime.endTurn(doc, primary, { type: 'requires_action', tool_use_ids: ['toolu_1'] }, [{ tool_use_id: 'toolu_1', kind: 'confirmation' }]);
    const wrongKind = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: { type: 'user.custom_tool_result', payload: { tool_use_id: 'toolu_1', result: 'x', authored_by: principal, caused_by: { kind: 'api' } } } });
    expect(wrongKind.status).toBe(409);
    const ok = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: answer('toolu_1', 'allow') });
    expect(ok.status).toBe(201);
    const replay = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: answer('toolu_1', 'allow') });
    expect(replay.status).toBe(200);
    expect(replay.body).toEqual(ok.body);
    const other = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: answer('toolu_1', 'deny') });
    expect(other.status).toBe(409);
    expect(errType(other)).toBe('validation.conflict');
    // A newer generation supersedes an unanswered older wait.
    await runtime.endTurn(doc, primary, { type: 'requires_action', tool_use_ids: ['toolu_2'] }, [{ tool_use_id: 'toolu_2', kind: 'confirmation' }]);
    await runtime.endTurn(doc, primary, { type: 'requires_action', tool_use_ids: ['toolu_3'] }, [{ tool_use_id: 'toolu_3', kind: 'confirmation' }]);
    const stale = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: answer('toolu_2', 'allow') });
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('runtime.invalid_transition');
  });

  it('the same answer sent several times at once is one event: one 201, every other the original with 200; a different one is 409', async () => {
    const s = await newSession({ initial_events: [msg('go')] });
    const doc = await sessionDoc(s.id);
    const primary = doc._primary_thread_id;
    await runtime.endTurn(doc, primary, { type: 'requires_action', tool_use_ids: ['toolu_same'] }, [{ tool_use_id: 'toolu_same', kind: 'confirmation' }]);
    const answer = (result: string) => ({ type: 'user.tool_confirmation', payload: { tool_use_id: 'toolu_same', result, authored_by: principal, caused_by: { kind: 'api' } } });
    const rs = await Promise.all(Array.from({ length: 6 }, () => api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: answer('allow') })));
    expect(rs.map((r) => r.status).sort()).toEqual([200, 200, 200, 200, 200, 201]);
    for (const r of rs) expect(r.body).toEqual(rs[0]?.body);
    const other = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: answer('deny') });
    expect([other.status, errType(other)]).toEqual([409, 'validation.conflict']);
    expect((await store.log.range(s.id, 0, 100)).filter((e) => e.type === 'user.tool_confirmation')).toHaveLength(1);
  });

  it('session_thread_id is required when several children wait on the same tool_use_id', async () => {
    const s = await newSession();
    const doc = await sessionDoc(s.id);
    const c1 = await store.spawnChild(doc);
    const c2 = await store.spawnChild(doc);
    for (const c of [c1, c2]) await runtime.endTurn(doc, c.id, { type: 'requires_action', tool_use_ids: ['toolu_same'] }, [{ tool_use_id: 'toolu_same', kind: 'custom_tool' }]);
    const body = (extra: Json = {}) => ({ type: 'user.custom_tool_result', payload: { tool_use_id: 'toolu_same', result: { ok: true }, authored_by: principal, caused_by: { kind: 'api' }, ...extra } });
    const ambiguous = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: body() });
    expect(ambiguous.status).toBe(400);
    expect(errMsg(ambiguous)).toContain('session_thread_id');
    const ok = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: body({ session_thread_id: c2.id }) });
    expect(ok.status).toBe(201);
    expect(ok.body.session_thread_id).toBe(c2.id);
    // Only one child still waits: no thread id needed now.
    const rest = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: body() });
    expect(rest.status).toBe(201);
    expect(rest.body.session_thread_id).toBe(c1.id);
  });
});

describe('threads', () => {
  it('a child thread waiting on an action is archived after user.interrupt naming it; the primary is left as it is', async () => {
    const s = await newSession();
    const doc = await sessionDoc(s.id);
    const child = await store.spawnChild(doc);
    await api.post(`/v1/sessions/${s.id}/events`, msg('work', { session_thread_id: child.id }));
    const runId = (await store.thread(s.id, child.id))._active_run_id ?? '';
    await store.docs.update<RunDoc>(sessionTag(s.id), runId, (r) => ({ ...r, status: 'succeeded' }));
    await runtime.endTurn(doc, child.id, { type: 'requires_action', tool_use_ids: ['toolu_c'] }, [{ tool_use_id: 'toolu_c', kind: 'question' }], { runId });
    const arch = () => api.request<Json>('POST', `/v1/sessions/${s.id}/threads/${child.id}/archive`);
    const refused = await arch();
    expect([refused.status, errType(refused)]).toEqual([409, 'runtime.invalid_transition']);

    const primaryBefore = await store.thread(s.id, doc._primary_thread_id);
    const r = await api.request<Json>('POST', `/v1/sessions/${s.id}/events`, { body: interrupt({ session_thread_id: child.id }) });
    expect(r.status).toBe(201);
    const t = await store.thread(s.id, child.id);
    expect([t.status, t._active_run_id, t._stop_reason]).toEqual(['idle', null, { type: 'interrupted' }]);
    const stops = (await api.get<{ data: Json[] }>(`/v1/sessions/${s.id}/threads/${child.id}/events`)).data
      .filter((e) => e.type === 'session.status_idle').map((e) => (e.payload as { stop_reason: Json }).stop_reason.type);
    expect(stops).toEqual(['requires_action', 'interrupted']);
    expect((await store.thread(s.id, doc._primary_thread_id)).version).toBe(primaryBefore.version);
    const late = await api.request('POST', `/v1/sessions/${s.id}/events`, {
      body: { type: 'user.question_answer', payload: { tool_use_id: 'toolu_c', declined: true, authored_by: principal, caused_by: { kind: 'api' } } },
    });
    expect([late.status, errType(late)]).toEqual([409, 'runtime.invalid_transition']);

    const archived = await arch();
    expect(archived.status).toBe(200);
    expect(archived.body).toMatchObject({ status: 'terminated' });
  });

  it('list: primary first then spawn order; limit cap 1,000; foreign thread is 404', async () => {
    const s = await newSession();
    const doc = await sessionDoc(s.id);
    const c1 = await store.spawnChild(doc);
    const c2 = await store.spawnChild(doc);
    const page = await api.get<{ data: Json[]; next_page: string | null }>(`/v1/sessions/${s.id}/threads`);
    expect(page.data.map((t) => t.id)).toEqual([doc._primary_thread_id, c1.id, c2.id]);
    expect(page.data[0]).toMatchObject({ type: 'session_thread', parent_thread_id: null, session_id: s.id, status: 'idle' });
    expect(page.data[1]).toMatchObject({ parent_thread_id: doc._primary_thread_id });
    const p1 = await api.get<{ data: Json[]; next_page: string | null }>(`/v1/sessions/${s.id}/threads`, { limit: 2 });
    const p2 = await api.get<{ data: Json[]; next_page: string | null }>(`/v1/sessions/${s.id}/threads`, { limit: 2, page: p1.next_page ?? '' });
    expect(p2.data.map((t) => t.id)).toEqual([c2.id]);
    expect(p2.next_page).toBeNull();
    expect((await api.request('GET', `/v1/sessions/${s.id}/threads`, { query: { limit: 1000 } })).status).toBe(200);
    expect((await api.request('GET', `/v1/sessions/${s.id}/threads`, { query: { limit: 1001 } })).status).toBe(400);
    const s2 = await newSession();
    const r = await api.request('GET', `/v1/sessions/${s2.id}/threads/${c1.id}`);
    expect(r.status).toBe(404);
    expect(errType(r)).toBe('validation.not_found');
  });

  it('archive follows the SessionThread state table', async () => {
    const s = await newSession();
    const doc = await sessionDoc(s.id);
    const arch = (id: string) => api.request<Json>('POST', `/v1/sessions/${s.id}/threads/${id}/archive`);
    // primary thread → 409 runtime.primary_thread
    const prim = await arch(doc._primary_thread_id);
    expect(prim.status).toBe(409);
    expect(errType(prim)).toBe('runtime.primary_thread');
    // running child → 409 invalid_transition
    const running = await store.spawnChild(doc);
    const runId = `run_${'7'.repeat(32)}`;
    await store.updateThread(s.id, running.id, (t) => ({ ...t, status: 'running', _active_run_id: runId, _running_since_ms: Date.now() }));
    expect(errType(await arch(running.id))).toBe('runtime.invalid_transition');
    // running → rescheduling (transient failure) emits the rescheduled event, naming the Run's
    // lost attempt and why; archive still 409
    await runtime.reschedule(doc, running.id, 1, 'lease lost');
    expect((await store.thread(s.id, running.id)).status).toBe('rescheduling');
    const rescheduled = (await store.log.range(s.id, 0, 100)).filter((e) => e.type === 'session.thread_status_rescheduled');
    expect(rescheduled.map((e) => [e.session_thread_id, e.payload])).toEqual([[running.id, { run_id: runId, attempt: 1, cause: 'lease lost' }]]);
    expect(errType(await arch(running.id))).toBe('runtime.invalid_transition');
    // rescheduling → retries exhausted → idle with stop_reason retries_exhausted, still addressable
    const idle = await runtime.retriesExhausted(doc, running.id);
    expect(idle.status).toBe('idle');
    expect(idle._stop_reason).toEqual({ type: 'retries_exhausted' });
    expect((await api.request('GET', `/v1/sessions/${s.id}/threads/${running.id}`)).status).toBe(200);
    // waiting on an action → 409
    const waiting = await store.spawnChild(doc);
    await runtime.endTurn(doc, waiting.id, { type: 'requires_action', tool_use_ids: ['toolu_w'] }, [{ tool_use_id: 'toolu_w', kind: 'confirmation' }]);
    expect(errType(await arch(waiting.id))).toBe('runtime.invalid_transition');
    // idle child → terminated, archived_at set, stats frozen; repeat returns the same resource
    await store.updateThread(s.id, running.id, (t) => ({ ...t, _running_ms_total: 1500 }));
    const a1 = await arch(running.id);
    expect(a1.status).toBe(200);
    expect(a1.body).toMatchObject({ status: 'terminated', stats: { running_seconds: 1.5 } });
    expect(a1.body.archived_at).toBeTruthy();
    await store.updateThread(s.id, running.id, (t) => ({ ...t, _running_ms_total: 99_000 }));
    const a2 = await arch(running.id);
    expect(a2.status).toBe(200);
    expect(a2.body.stats).toEqual(a1.body.stats);
    expect(a2.body.archived_at).toBe(a1.body.archived_at);
    expect(a2.body.status).toBe('terminated');
    // any → terminated on an unrecoverable error; archive then just records archived_at
    const doomed = await store.spawnChild(doc);
    await runtime.terminate(doc, doomed.id);
    const a3 = await arch(doomed.id);
    expect(a3.body).toMatchObject({ status: 'terminated' });
    // the rescheduled and terminal status events are in the log
    const evs = await api.get<{ data: Json[] }>(`/v1/sessions/${s.id}/threads/${running.id}/events`);
    expect(evs.data.map((e) => e.type)).toEqual(['session.thread_status_rescheduled', 'session.status_idle']);
  });

  it('a user.message into a terminated, missing or foreign thread is refused and appends nothing', async () => {
    const s = await newSession();
    const other = await newSession();
    const doc = await sessionDoc(s.id);
    const otherDoc = await sessionDoc(other.id);
    const child = await store.spawnChild(doc);
    await runtime.terminate(doc, child.id);
    const seq = async () => (await store.log.state(s.id)).seq;
    const before = await seq();
    // Sent at once after the change (this API may not have the thread in its read cache yet),
    // and again: refused both times, by the same error, with nothing appended.
    for (let i = 0; i < 2; i++) {
      const dead = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: msg('late', { session_thread_id: child.id }) });
      expect(dead.status).toBe(409);
      expect(errType(dead)).toBe('runtime.invalid_transition');
      const foreign = await api.request('POST', `/v1/sessions/${s.id}/events`, { body: msg('x', { session_thread_id: otherDoc._primary_thread_id }) });
      expect(foreign.status).toBe(404);
      expect(errType(foreign)).toBe('validation.not_found');
    }
    expect(await seq()).toBe(before);
    expect(await store.queuedInputs(s.id, child.id)).toEqual([]);
    // The live primary thread still takes messages.
    expect((await api.request('POST', `/v1/sessions/${s.id}/events`, { body: msg('hi') })).status).toBe(201);
    expect(await seq()).toBeGreaterThan(before);
  });

  it('messages into a busy thread are queued without recording a start intent', async () => {
    const s = await newSession();
    const doc = await sessionDoc(s.id);
    // The first message starts a turn (its Run waits: no runner serves it here); the rest queue behind it.
    expect((await api.request('POST', `/v1/sessions/${s.id}/events`, { body: msg('first') })).status).toBe(201);
    for (let i = 0; i < 5; i++) expect((await api.request('POST', `/v1/sessions/${s.id}/events`, { body: msg(`more ${i}`) })).status).toBe(201);
    expect(await store.queuedInputs(s.id, doc._primary_thread_id)).toHaveLength(5);
    // No intent left behind for the repair to drop: the API knew the thread was busy.
    const pending = (await new EnqueueOutbox(redis).due(-60_000)).filter((e) => e.session_id === s.id);
    expect(pending).toEqual([]);
  });

  it('events: after vs page (never both), primary condensed, child complete', async () => {
    const s = await newSession({ initial_events: [msg('a')] });
    const doc = await sessionDoc(s.id);
    const child = await store.spawnChild(doc);
    await store.log.append(s.id, [
      { type: 'agent.message', payload: { content: 'inner' }, session_thread_id: child.id },
      { type: 'session.status_idle', payload: { stop_reason: { type: 'end_turn' } }, session_thread_id: child.id },
    ]);
    const both = await api.request('GET', `/v1/sessions/${s.id}/threads/${child.id}/events`, { query: { after: 1, page: 'c1_00' } });
    expect(both.status).toBe(400);
    const childEvs = await api.get<{ data: Json[] }>(`/v1/sessions/${s.id}/threads/${child.id}/events`);
    expect(childEvs.data.map((e) => e.type)).toEqual(['agent.message', 'session.status_idle']);
    const prim = await api.get<{ data: Json[] }>(`/v1/sessions/${s.id}/threads/${doc._primary_thread_id}/events`);
    expect(prim.data.map((e) => e.type)).toEqual(['user.message', 'session.status_running', 'session.status_idle']);
    const p1 = await api.get<{ data: Json[]; next_page: string }>(`/v1/sessions/${s.id}/threads/${doc._primary_thread_id}/events`, { limit: 1 });
    const p2 = await api.get<{ data: Json[] }>(`/v1/sessions/${s.id}/threads/${doc._primary_thread_id}/events`, { limit: 1, page: p1.next_page });
    expect(p2.data[0]?.type).toBe('session.status_running');
    const after = await api.get<{ data: Json[] }>(`/v1/sessions/${s.id}/threads/${doc._primary_thread_id}/events`, { after: 2 });
    expect(after.data.map((e) => e.seq)).toEqual([4]);
    // A cursor past what an integer can say exactly is refused, never handed to storage.
    for (const huge of ['1e21', '18446744073709551615', '9007199254740993']) {
      const r = await api.request('GET', `/v1/sessions/${s.id}/threads/${child.id}/events`, { query: { after: huge } });
      expect([huge, r.status, errType(r)]).toEqual([huge, 400, 'validation.malformed']);
    }
  });

  it('a page of thread events ends early at 4 MiB of events; walking the pages reads each event once', async () => {
    const s = await newSession();
    const child = await store.spawnChild(await sessionDoc(s.id));
    const big = (i: number) => ({ type: 'agent.message', payload: { content: `${i}${'b'.repeat(1_500_000)}` }, session_thread_id: child.id });
    await store.log.append(s.id, [big(1), big(2), big(3), big(4), big(5)]);
    const seen: number[] = [];
    let page: string | null = null;
    let pages = 0;
    do {
      const r: { data: { seq: number }[]; next_page: string | null } = await api.get(`/v1/sessions/${s.id}/threads/${child.id}/events`, { limit: 100, ...(page ? { page } : {}) });
      expect(r.data.length).toBeLessThanOrEqual(2);
      seen.push(...r.data.map((e) => e.seq));
      page = r.next_page;
      pages++;
    } while (page !== null);
    expect(seen).toHaveLength(5);
    expect(new Set(seen).size).toBe(5);
    expect(pages).toBe(3);
  });

  it('a page cursor continues only the list that issued it: another thread\'s or Session\'s cursor is 400', async () => {
    const [a, b] = await Promise.all([newSession(), newSession()]);
    const [da, db] = await Promise.all([sessionDoc(a.id), sessionDoc(b.id)]);
    const [ca, cb] = [await store.spawnChild(da), await store.spawnChild(db)];
    await store.spawnChild(da);
    await store.spawnChild(db);
    for (const [s, t] of [[a.id, ca.id], [b.id, cb.id]] as const) {
      await store.log.append(s, [1, 2, 3].map((i) => ({ type: 'agent.message', payload: { content: `m${i}` }, session_thread_id: t })));
    }
    const events = await api.get<{ next_page: string }>(`/v1/sessions/${a.id}/threads/${ca.id}/events`, { limit: 1 });
    const threads = await api.get<{ next_page: string }>(`/v1/sessions/${a.id}/threads`, { limit: 1 });
    // The issuing lists continue with them.
    expect((await api.get<{ data: Json[] }>(`/v1/sessions/${a.id}/threads/${ca.id}/events`, { limit: 1, page: events.next_page })).data[0]?.payload).toEqual({ content: 'm2' });
    expect((await api.get<{ data: Json[] }>(`/v1/sessions/${a.id}/threads`, { limit: 1, page: threads.next_page })).data[0]?.id).toBe(ca.id);
    for (const [path, page] of [
      [`/v1/sessions/${b.id}/threads/${cb.id}/events`, events.next_page],
      [`/v1/sessions/${a.id}/threads/${da._primary_thread_id}/events`, events.next_page],
      [`/v1/sessions/${b.id}/threads`, threads.next_page],
      [`/v1/sessions/${a.id}/threads/${ca.id}/events`, threads.next_page],
      [`/v1/sessions/${a.id}/threads`, events.next_page],
    ] as const) {
      const r = await api.request('GET', path, { query: { limit: 1, page } });
      expect([path, r.status, errType(r)]).toEqual([path, 400, 'validation.malformed']);
    }
  });

  it('usage names only the Session\'s own threads and Runs', async () => {
    const mine = await newSession();
    const other = await newSession();
    const otherThread = (await sessionDoc(other.id))._primary_thread_id;
    const ownThread = (await sessionDoc(mine.id))._primary_thread_id;
    expect((await api.request('GET', `/v1/sessions/${mine.id}/usage`, { query: { thread_id: ownThread } })).status).toBe(200);
    for (const query of [{ thread_id: otherThread }, { run_id: 'run_00000000000000000000000000000000' }]) {
      const r = await api.request('GET', `/v1/sessions/${mine.id}/usage`, { query });
      expect([JSON.stringify(query), r.status, errType(r)]).toEqual([JSON.stringify(query), 404, 'validation.not_found']);
    }
  });

  it('error answers to an authenticated caller name its Workspace, as successes do', async () => {
    const s = await newSession();
    const cases: Array<[string, string, Json | undefined, number]> = [
      ['GET', `/v1/sessions/sess_00000000000000000000000000000000`, undefined, 404],
      ['GET', `/v1/sessions/${s.id}/threads/x`, undefined, 400],
      ['POST', `/v1/agents/${agentId}`, { expected_version: 99, description: 'stale' }, 409],
    ];
    for (const [method, path, body, status] of cases) {
      const r = await api.request(method, path, body === undefined ? {} : { body });
      expect([path, r.status, r.headers.get('service-workspace-id')]).toEqual([path, status, p.bootstrap.workspace_id]);
    }
  });
});

describe('SSE', () => {
  it('replays then goes live; ids are sequence numbers; keep-alive does not break parsing', async () => {
    const s = await newSession({ initial_events: [msg('one')] });
    const ac = new AbortController();
    const it = streamEvents(api, `/v1/sessions/${s.id}/events/stream`, { signal: ac.signal });
    const first = await collect(it, 2);
    expect(first.map((f) => f.id)).toEqual(['1', '2']);
    expect(first[0]?.event).toBe('user.message');
    await store.log.append(s.id, [{ type: 'agent.message', payload: { content: 'hi' } }]);
    const next = await collect(it, 1);
    expect(next[0]).toMatchObject({ id: '3', event: 'agent.message' });
    ac.abort();
  });

  it('reconnect with Last-Event-ID mid-stream under concurrent appends: no gap, no duplicate', async () => {
    const s = await newSession();
    const total = 1000;
    let appended = 0;
    let reconnectsWhileWriting = 0;
    // The writer paces itself so that reconnects happen while appends are still arriving.
    const writer = (async () => {
      while (appended < total) {
        const n = Math.min(5, total - appended);
        await store.log.append(s.id, Array.from({ length: n }, (_, i) => ({ type: 'agent.message', payload: { i: appended + i } })));
        appended += n;
        await new Promise((r) => setTimeout(r, 2));
      }
    })();
    const seen: number[] = [];
    let last: string | undefined;
    // Several short connections, each cut mid-stream, each resumed from the last id it saw.
    while (seen.length < total) {
      if (appended < total) reconnectsWhileWriting++;
      const ac = new AbortController();
      const it = streamEvents(api, `/v1/sessions/${s.id}/events/stream`, { signal: ac.signal, ...(last ? { lastEventId: last } : {}) });
      const take = 37 + Math.floor(Math.random() * 60);
      let got = 0;
      try {
        for await (const f of it) {
          seen.push(Number(f.id));
          last = f.id;
          if (++got >= take || seen.length >= total) break;
        }
      } finally {
        ac.abort();
      }
    }
    await writer;
    expect(seen).toEqual(Array.from({ length: total }, (_, i) => i + 1));
    expect(reconnectsWhileWriting).toBeGreaterThan(2);
  });

  it('the switch from replay to live loses nothing when appends race the connect', async () => {
    for (let round = 0; round < 5; round++) {
      const s = await newSession();
      await store.log.append(s.id, Array.from({ length: 50 }, () => ({ type: 'agent.message', payload: {} })));
      const ac = new AbortController();
      const it = streamEvents(api, `/v1/sessions/${s.id}/events/stream`, { signal: ac.signal });
      const racing = (async () => {
        for (let i = 0; i < 20; i++) await store.log.append(s.id, [{ type: 'agent.message', payload: { i } }]);
      })();
      const frames = await collect(it, 70);
      await racing;
      ac.abort();
      expect(frames.map((f) => Number(f.id))).toEqual(Array.from({ length: 70 }, (_, i) => i + 1));
    }
  });

  it('a long replay to a slow reader is paced, not cut off', async () => {
    const s = await newSession();
    const big = 'x'.repeat(4096);
    for (let i = 0; i < 3000; i += 250) {
      await store.log.append(s.id, Array.from({ length: 250 }, (_, k) => ({ type: 'agent.message', payload: { i: i + k, big } })));
    }
    const it = streamEvents(api, `/v1/sessions/${s.id}/events/stream`);
    const first = await it.next();
    await new Promise((r) => setTimeout(r, 1500)); // ~12 MiB of replay waits for this reader
    const rest = await collect(it, 2999, 30_000);
    expect(first.value?.id).toBe('1');
    expect(rest.map((f) => Number(f.id))).toEqual(Array.from({ length: 2999 }, (_, i) => i + 2));
  });

  it('HEAD on a stream answers its headers and ends, instead of holding the request open', async () => {
    const s = await newSession({ initial_events: [msg('head')] });
    const threadId = (await sessionDoc(s.id))._primary_thread_id;
    for (const path of [`/v1/sessions/${s.id}/events/stream`, `/v1/sessions/${s.id}/threads/${threadId}/stream`]) {
      const r = await fetch(`${p.baseUrl}${path}`, { method: 'HEAD', headers: api.headers(), signal: AbortSignal.timeout(15_000) });
      expect([path, r.status, r.headers.get('content-type')]).toEqual([path, 200, 'text/event-stream; charset=utf-8']);
      expect(await r.text()).toBe('');
    }
  });

  it('Last-Event-ID header and last_event_id query; malformed cursor is 400', async () => {
    const s = await newSession();
    await store.log.append(s.id, Array.from({ length: 5 }, () => ({ type: 'agent.message', payload: {} })));
    const a = await collect(streamEvents(api, `/v1/sessions/${s.id}/events/stream`, { lastEventId: '3' }), 2);
    expect(a.map((f) => f.id)).toEqual(['4', '5']);
    const b = await collect(streamEvents(api, `/v1/sessions/${s.id}/events/stream`, { query: { last_event_id: 4 } }), 1);
    expect(b.map((f) => f.id)).toEqual(['5']);
    const bad = await fetch(api.url(`/v1/sessions/${s.id}/events/stream`), { headers: api.headers({ 'last-event-id': 'abc' }) });
    expect(bad.status).toBe(400);
    const beyond = await fetch(api.url(`/v1/sessions/${s.id}/events/stream`), { headers: api.headers({ 'last-event-id': '6' }) });
    expect(beyond.status).toBe(400);
    await beyond.text();
  });

  it('event_deltas adds uncursored preview frames local to that stream', async () => {
    const s = await newSession();
    const withDeltas = new AbortController();
    const plain = new AbortController();
    const itD = streamEvents(api, `/v1/sessions/${s.id}/events/stream`, { signal: withDeltas.signal, query: { event_deltas: 'agent.message' } });
    const itP = streamEvents(api, `/v1/sessions/${s.id}/events/stream`, { signal: plain.signal });
    // Previews are not kept: a stream sees those published after it subscribed. A stream
    // subscribes before it reads the log, so its first frame says it is live.
    await store.log.append(s.id, [{ type: 'agent.message', payload: { content: 'first' } }]);
    expect(await collect(itD, 1)).toMatchObject([{ id: '1', event: 'agent.message' }]);
    expect(await collect(itP, 1)).toMatchObject([{ id: '1', event: 'agent.message' }]);
    await store.log.publishDelta(s.id, { session_thread_id: null, type: 'agent.message', message_id: 'm1', index: 0, text: 'Hel' });
    await store.log.publishDelta(s.id, { session_thread_id: null, type: 'agent.thinking', message_id: 'm1', index: 0, text: 'hmm' });
    await store.log.append(s.id, [{ type: 'agent.message', payload: { content: 'Hello' } }]);
    const d = await collect(itD, 2);
    expect(d[0]).toMatchObject({ id: undefined, event: 'agent.message.delta' });
    expect(d[1]).toMatchObject({ id: '2', event: 'agent.message' });
    const pl = await collect(itP, 1);
    expect(pl[0]).toMatchObject({ id: '2', event: 'agent.message' });
    withDeltas.abort();
    plain.abort();
    expect((await api.request('GET', `/v1/sessions/${s.id}/events/stream`, { query: { event_deltas: 'agent.tool_use' } })).status).toBe(400);
  });

  it('a stream that has its headers is subscribed: a preview published at once is shown', async () => {
    for (let i = 0; i < 5; i++) {
      const s = await newSession();
      const ac = new AbortController();
      const it = await open(`/v1/sessions/${s.id}/events/stream`, { signal: ac.signal, query: { event_deltas: 'agent.message' } });
      await store.log.publishDelta(s.id, { session_thread_id: null, type: 'agent.message', message_id: `m${i}`, index: 0, text: 'Hel' });
      expect(await collect(it, 1)).toMatchObject([{ id: undefined, event: 'agent.message.delta' }]);
      ac.abort();
    }
  });

  it('retention trims show up as a gap frame; a live erase ends the stream with a gap, even for a viewer that had seen everything', async () => {
    const s = await newSession();
    await store.log.append(s.id, Array.from({ length: 6 }, () => ({ type: 'agent.message', payload: {} })));
    await store.log.trimThrough(s.id, 4);
    const frames = await collect(streamEvents(api, `/v1/sessions/${s.id}/events/stream`, { lastEventId: '1' }), 3);
    expect(frames[0]).toMatchObject({ event: 'gap', id: '4' });
    expect(JSON.parse(frames[0]?.data ?? '{}')).toEqual({ type: 'gap', from_seq: 2, to_seq: 4, reason: 'retention' });
    expect(frames.slice(1).map((f) => f.id)).toEqual(['5', '6']);
    const it = await open(`/v1/sessions/${s.id}/events/stream`, { lastEventId: '6' });
    const pending = collect(it, 5, 8000);
    const started = Date.now();
    await api.delete(`/v1/sessions/${s.id}`);
    // Nothing unread was lost for this viewer, yet it learns why the stream ends: one closing gap
    // frame of reason erased, its range empty (its id the cursor it holds), well before the deadline.
    const closing = await pending;
    expect(closing).toHaveLength(1);
    expect(closing[0]).toMatchObject({ event: 'gap', id: '6' });
    expect(JSON.parse(closing[0]?.data ?? '{}')).toEqual({ type: 'gap', from_seq: 7, to_seq: 6, reason: 'erased' });
    expect(Date.now() - started).toBeLessThan(5000);
    const behind = await collect(streamEvents(api, `/v1/sessions/${s.id}/events/stream`, { lastEventId: '2' }), 5, 5000);
    expect(behind).toHaveLength(1);
    expect(behind[0]).toMatchObject({ event: 'gap', id: '6' });
    expect(JSON.parse(behind[0]?.data ?? '{}')).toMatchObject({ from_seq: 3, to_seq: 6, reason: 'erased' });
    // A reconnect at the end of the erased log is never an empty answer: the same closing frame.
    const again = await collect(streamEvents(api, `/v1/sessions/${s.id}/events/stream`, { lastEventId: '6' }), 5, 5000);
    expect(again).toHaveLength(1);
    expect(again[0]).toMatchObject({ event: 'gap', id: '6' });
    expect(JSON.parse(again[0]?.data ?? '{}')).toEqual({ type: 'gap', from_seq: 7, to_seq: 6, reason: 'erased' });
  });

  it('thread stream shows that thread only and resumes with Last-Event-ID', async () => {
    const s = await newSession();
    const doc = await sessionDoc(s.id);
    const child = await store.spawnChild(doc);
    await store.log.append(s.id, [
      { type: 'agent.message', payload: { n: 1 }, session_thread_id: child.id },
      { type: 'agent.message', payload: { n: 2 }, session_thread_id: doc._primary_thread_id },
      { type: 'agent.message', payload: { n: 3 }, session_thread_id: child.id },
    ]);
    const f = await collect(streamEvents(api, `/v1/sessions/${s.id}/threads/${child.id}/stream`), 2);
    expect(f.map((x) => x.id)).toEqual(['1', '3']);
    const g = await collect(streamEvents(api, `/v1/sessions/${s.id}/threads/${child.id}/stream`, { lastEventId: '1' }), 1);
    expect(g.map((x) => x.id)).toEqual(['3']);
  });

  it('capabilities report the sessions area as served', async () => {
    const caps = await p.root.get<{ data: { area: string; readiness: string }[] }>('/v1/support/capabilities');
    expect(caps.data.find((a) => a.area === 'sessions')?.readiness).toBe('alpha');
    const doc = await (await fetch(`${p.baseUrl}/v1/openapi.json`)).json() as { paths: Record<string, Record<string, unknown>> };
    for (const path of ['/v1/sessions', '/v1/sessions/{session_id}/events', '/v1/sessions/{session_id}/events/stream', '/v1/sessions/{session_id}/threads/{thread_id}/archive', '/v1/agents/{agent_id}/versions/{version}', '/v1/environments']) {
      expect(doc.paths[path], path).toBeDefined();
    }
  });
});

describe('fan-out and shutdown', () => {
  it('many viewers share one subscriber connection and its one pattern subscription: no channel subscribed per session', async () => {
    const s1 = await newSession();
    const s2 = await newSession();
    const acs: AbortController[] = [];
    const its: AsyncGenerator<SseFrame>[] = [];
    its.push(...(await Promise.all(Array.from({ length: 30 }, (_, i) => {
      const ac = new AbortController();
      acs.push(ac);
      return open(`/v1/sessions/${i % 3 === 0 ? s2.id : s1.id}/events/stream`, { signal: ac.signal });
    }))));
    await store.log.append(s1.id, [{ type: 'agent.message', payload: {} }]);
    await store.log.append(s2.id, [{ type: 'agent.message', payload: {} }]);
    const got = await Promise.all(its.map((it) => collect(it, 1)));
    expect(got.every((f) => f.length === 1 && f[0]?.id === '1')).toBe(true);
    // The hub's connection holds one pattern subscription (every Session's live channel), which
    // also feeds the api's event tap: no other api connection subscribes to a pattern. Its plain
    // channels are previews (`event_deltas`) of earlier tests' viewers, left in a batch shortly
    // after those viewers went: waited for, none is this test's.
    const clients = await waitFor('the hub to hold its pattern subscription alone', async () => {
      const list = (await redis.client('LIST')) as string;
      const hub = list.split('\n').filter((l) => l.includes('name=agentplane:api:events'));
      expect(hub).toHaveLength(1);
      return / sub=0 psub=1 /.test(hub[0] ?? '') ? list : undefined;
    }, 10_000);
    expect(clients.split('\n').filter((l) => / psub=[1-9]/.test(l) && l.includes('name=agentplane:api'))).toHaveLength(1);
    const numsub = (await redis.pubsub('NUMSUB', `ap:{s:${s1.id}}:live`, `ap:{s:${s2.id}}:live`)) as (string | number)[];
    expect(numsub.map(String)).toEqual([`ap:{s:${s1.id}}:live`, '0', `ap:{s:${s2.id}}:live`, '0']);
    for (const ac of acs) ac.abort();
  });

  it('open streams end cleanly when the API shuts down; idle streams get keep-alive comments', async () => {
    const q = await startPlatform({ env: { SSE_KEEPALIVE_MS: '200' } });
    try {
      const env = await q.root.post<{ id: string }>('/v1/environments', { name: 'e', image: 'img:1' });
      const s = await q.root.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: env.id });
      // Raw read: the client library hides comments.
      const raw = await fetch(q.root.url(`/v1/sessions/${s.id}/events/stream`), { headers: q.root.headers() });
      expect(raw.headers.get('content-type')).toContain('text/event-stream');
      const reader = raw.body?.getReader();
      let text = '';
      const until = Date.now() + 3000;
      while (!text.includes(': keep-alive') && Date.now() < until) {
        const chunk = await reader?.read();
        if (!chunk || chunk.done) break;
        text += new TextDecoder().decode(chunk.value);
      }
      expect(text).toContain(': keep-alive\n\n');
      await reader?.cancel();
      // A stream opened with a key that is then revoked ends at its next keep-alive.
      const key = await q.root.post<{ id: string; secret: string }>(`/v1/organizations/${q.bootstrap.organization_id}/api-keys`, {
        display_name: 'watcher', role: 'viewer', scope: { type: 'workspace', workspace_id: q.bootstrap.workspace_id },
      }, { idempotencyKey: 'sse-watcher' });
      const watched = await fetch(q.root.url(`/v1/sessions/${s.id}/events/stream`), { headers: { ...q.root.headers(), authorization: `Bearer ${key.secret}` } });
      expect(watched.status).toBe(200);
      const watcher = watched.body?.getReader();
      const first = await watcher?.read();
      expect(first?.done).toBe(false);
      await q.root.post(`/v1/api-keys/${key.id}/revoke`, {});
      const endedAt = Date.now() + 10_000;
      let done = false;
      while (!done && Date.now() < endedAt) done = (await watcher?.read())?.done ?? true;
      expect(done).toBe(true);
      // A Principal's stream ends at the next keep-alive once its `observe` grant is gone.
      const prin = await createPrincipal(q.root, q.bootstrap.workspace_id, 'stream-watcher');
      const assignment = await q.root.post<{ id: string }>('/v1/permission-assignments', { principal_id: prin, target: { type: 'session', id: s.id }, actions: ['observe'] });
      const secret = (await createCredential(q.root, prin, 'api_mcp')).secret;
      const granted = await fetch(q.root.url(`/v1/sessions/${s.id}/events/stream`), { headers: { ...q.root.headers(), authorization: `Bearer ${secret}` } });
      expect(granted.status).toBe(200);
      const viewer = granted.body?.getReader();
      expect((await viewer?.read())?.done).toBe(false);
      await q.root.request('DELETE', `/v1/permission-assignments/${assignment.id}`);
      const cutAt = Date.now() + 10_000;
      let cut = false;
      while (!cut && Date.now() < cutAt) cut = (await viewer?.read())?.done ?? true;
      expect(cut).toBe(true);
      // So does a key's stream once its role no longer admits the read (a new request is refused too).
      const reRoled = await q.root.post<{ id: string; secret: string }>(`/v1/organizations/${q.bootstrap.organization_id}/api-keys`, {
        display_name: 're-roled', role: 'viewer', scope: { type: 'workspace', workspace_id: q.bootstrap.workspace_id },
      }, { idempotencyKey: 'sse-re-roled' });
      const reRoledHeaders = { ...q.root.headers(), authorization: `Bearer ${reRoled.secret}` };
      const before = await fetch(q.root.url(`/v1/sessions/${s.id}/events/stream`), { headers: reRoledHeaders });
      expect(before.status).toBe(200);
      const reader2 = before.body?.getReader();
      expect((await reader2?.read())?.done).toBe(false);
      expect((await q.root.request('PATCH', `/v1/api-keys/${reRoled.id}`, { body: { role: 'runner' } })).status).toBe(200);
      expect((await fetch(q.root.url(`/v1/sessions/${s.id}`), { headers: reRoledHeaders })).status).toBe(403);
      const droppedAt = Date.now() + 10_000;
      let dropped = false;
      while (!dropped && Date.now() < droppedAt) dropped = (await reader2?.read())?.done ?? true;
      expect(dropped).toBe(true);
      // Several streams at once: every one of them ends.
      const streams = await Promise.all([1, 2, 3].map(() => open(`/v1/sessions/${s.id}/events/stream`, {}, q.root)));
      const firsts = streams.map((st) => st.next());
      const started = Date.now();
      const stopped = q.stop();
      const ended = Promise.all(firsts.map((f) => f.then(() => 'ended', () => 'ended'))).then(() => 'ended');
      const r = await Promise.race([ended, new Promise((res) => setTimeout(() => res('hung'), 8000))]);
      expect(r).toBe('ended');
      const streamEndedMs = Date.now() - started;
      await stopped;
      expect(streamEndedMs).toBeLessThan(3000);
      // Well inside the 10 s grace period: the stream did not hold the shutdown open.
      expect(Date.now() - started).toBeLessThan(8000);
    } finally {
      await q.stop();
    }
  });
});
