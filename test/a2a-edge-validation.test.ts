/**
 * The A2A edge's admission of what a request carries, black-box against a real platform (no
 * runner: tasks stay submitted, which is all these need): the JSON-RPC envelope, each method's
 * params against closed schemas, audit records of every refusal (an oversize body too),
 * ListTasks after a task's Session is deleted (the delete takes it out of the task index; a listing
 * repairs an id indexed after the delete), and messageId claims (concurrent continuations, a
 * claim left behind by a send that never finished).
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { createCredential, createPrincipal } from './harness/governance.js';

type Json = Record<string, unknown>;
interface AuditRecord { action: string; outcome: string; status: number; detail: string | null; request_id: string }

let p: Platform;
let api: HttpClient;
let redis: Redis;
let ws: string;
let agentId: string;
let envId: string;
let installationId: string;
let channelId: string;
let rootId: string;
let exti: string;
let prin: string;
let secret: string;
let endpoint: string;

async function grant(pr: string, target: { type: string; id: string }, actions: string[]): Promise<void> {
  const r = await p.root.request('POST', '/v1/permission-assignments', { body: { principal_id: pr, target, actions } });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
}

interface Answer { status: number; text: string; body: Json; requestId: string | null }
async function rpc(body: unknown, url = endpoint): Promise<Answer> {
  const r = await fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${secret}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
    body: typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let parsed: unknown = null;
  try {
    parsed = JSON.parse(text);
  } catch {
    // an SSE stream
  }
  return { status: r.status, text, body: (parsed ?? {}) as Json, requestId: r.headers.get('request-id') };
}

let n = 0;
const nextId = () => `m-${Date.now()}-${n++}`;
const message = (text: string, extra: Json = {}) => ({ role: 'ROLE_USER', messageId: nextId(), parts: [{ text }], ...extra });
const call = (method: string, params: unknown, id: unknown = 1) => ({ jsonrpc: '2.0', id, method, params });
const send = (text: string, extra: Json = {}) => call('SendMessage', { message: message(text, extra), configuration: { returnImmediately: true } });
const taskOf = (a: Answer): Json => {
  expect(a.body.error, a.text).toBeUndefined();
  return (a.body.result as Json).task as Json;
};
const errorOf = (a: Answer) => a.body.error as { code: number; message: string } | undefined;

async function auditOf(requestId: string | null): Promise<Array<Pick<AuditRecord, 'action' | 'outcome' | 'status' | 'detail'>>> {
  const records = (await p.root.post<{ data: AuditRecord[] }>('/v1/audit/export', { limit: 1000 })).data;
  return records.filter((r) => r.request_id === requestId).map(({ action, outcome, status, detail }) => ({ action, outcome, status, detail }));
}

async function listAll(params: Json = {}): Promise<{ tasks: Json[]; totalSize: number; nextPageToken: string }> {
  const r = await rpc(call('ListTasks', params));
  expect(r.body.error, r.text).toBeUndefined();
  return r.body.result as { tasks: Json[]; totalSize: number; nextPageToken: string };
}

beforeAll(async () => {
  // Requests that follow a task's log check their caller again at each keep-alive period.
  p = await startPlatform({ env: { SSE_KEEPALIVE_MS: '300' } });
  ws = p.bootstrap.workspace_id;
  redis = new Redis(p.redisUrl());
  const key = await p.root.post<{ secret: string }>(`/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
    display_name: 'app', role: 'developer', scope: { type: 'workspace', workspace_id: ws },
  }, { idempotencyKey: 'a2a-edge-dev-key' });
  api = new HttpClient({ baseUrl: p.baseUrl, token: key.secret });
  envId = (await api.post<{ id: string }>('/v1/environments', { name: 'sandbox', image: 'agentplane/sandbox:latest' })).id;
  agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'edge-agent', model: 'default' })).id;
  exti = (await p.root.post<{ id: string }>('/v1/external-installations', { provider: 'slack', external_id: 'T-EDGE', display_name: 'Acme' })).id;
  rootId = (await p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'root', external_installation_id: exti, display_name: 'Acme' })).id;
  channelId = (await p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'channel', parent_id: rootId, external_installation_id: exti, display_name: '#c' })).id;
  installationId = (await p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agentId }, environment_id: envId, surface_scope_ids: [channelId] })).id;
  endpoint = `${p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${installationId}/surface-scopes/${channelId}`;
  prin = await createPrincipal(p.root, ws, 'edge-user');
  await grant(prin, { type: 'agent', id: agentId }, ['invoke', 'steer', 'observe']);
  await grant(prin, { type: 'surface_scope', id: rootId }, ['invoke', 'steer', 'observe']);
  secret = (await createCredential(p.root, prin, 'a2a')).secret;
}, 120_000);
afterAll(async () => {
  redis?.disconnect();
  await p?.stop();
});

describe('A2A params', () => {
  it('malformed message parts are invalid params (-32602), audited as failed, never an internal error', async () => {
    const cases: Array<[unknown, RegExp]> = [
      [call('SendMessage', { message: { role: 'ROLE_USER', messageId: nextId(), parts: [null] }, configuration: { returnImmediately: true } }), /params\.message\.parts\.0: must be object/],
      [call('SendMessage', { message: { role: 'ROLE_USER', messageId: nextId(), parts: [{ raw: {} }] }, configuration: { returnImmediately: true } }), /params\.message\.parts\.0\.raw: must be string/],
      [call('SendMessage', { message: { role: 'ROLE_USER', messageId: nextId(), parts: [{ text: 'x', raw: 'AAEC' }] }, configuration: { returnImmediately: true } }), /parts\.0: a part carries exactly one of/],
      [call('SendMessage', { message: { role: 'ROLE_USER', messageId: nextId(), parts: [{ text: 5 }] }, configuration: { returnImmediately: true } }), /params\.message\.parts\.0\.text: must be string/],
      [call('SendStreamingMessage', { message: { role: 'ROLE_USER', messageId: nextId(), parts: [null] } }), /params\.message\.parts\.0: must be object/],
      [call('GetTask', { id: 'sess_00000000000000000000000000000000', message: { parts: [null] } }), /params: unknown field 'message'/],
      [call('ListTasks', { message: { parts: [7, null] } }), /params: unknown field 'message'/],
    ];
    for (const [body, says] of cases) {
      const r = await rpc(body);
      expect([r.status, errorOf(r)?.code], r.text).toEqual([200, -32602]);
      expect(errorOf(r)?.message).toMatch(says);
      const method = (body as { method: string }).method;
      expect(await auditOf(r.requestId)).toEqual([{ action: `a2a.${method}`, outcome: 'failed', status: 200, detail: 'InvalidParamsError' }]);
    }
  });

  it('each method’s params are typed, bounded and closed: refused with -32602 naming the field, not read leniently', async () => {
    const task = taskOf(await rpc(send('typed')));
    const id = task.id as string;
    const cfg = (configuration: Json) => call('SendMessage', { message: message('cfg'), configuration });
    const cases: Array<[unknown, RegExp]> = [
      [call('GetTask', { id, historyLength: 'abc' }), /params\.historyLength: must be integer/],
      [call('GetTask', { id, historyLength: -5 }), /params\.historyLength: must be >= 0/],
      [call('GetTask', { id, historyLength: 1.5 }), /params\.historyLength: must be integer/],
      [call('GetTask', { id: 12345 }), /params\.id: must be string/],
      [call('GetTask', { id, extra_field: 1 }), /params: unknown field 'extra_field'/],
      [call('GetTask', {}), /params: missing required field 'id'/],
      [call('CancelTask', { id, force: true }), /params: unknown field 'force'/],
      [call('SubscribeToTask', { id: null }), /params\.id: must be string/],
      [cfg({ returnImmediately: 'false' }), /params\.configuration\.returnImmediately: must be boolean/],
      [cfg({ historyLength: 'abc' }), /params\.configuration\.historyLength: must be integer/],
      [cfg({ blocking: false }), /params\.configuration: unknown field 'blocking'/],
      [call('SendMessage', { message: message('x', { bogus: 1 }) }), /params\.message: unknown field 'bogus'/],
      [call('SendMessage', { message: message('x'), bogus2: { a: 1 } }), /params: unknown field 'bogus2'/],
      [call('SendMessage', { message: { ...message('x'), parts: [{ text: 'x', note: 'y' }] } }), /params\.message\.parts\.0: unknown field 'note'/],
      [call('SendMessage', { message: message('x', { role: 'ROLE_AGENT' }) }), /params\.message\.role: must be 'ROLE_USER'/],
      [call('SendMessage', { message: 'hi' }), /params\.message: must be object/],
      [call('SendMessage', { message: null }), /params\.message: must be object/],
      [call('SendMessage', { message: { ...message('x'), parts: 'abc' } }), /params\.message\.parts: must be array/],
      [call('SendMessage', { message: message('x', { contextId: id, context_id: id }) }), /'contextId' and 'context_id' are the same field/],
      [call('SendMessage', {}), /params: missing required field 'message'/],
      [call('GetTask', undefined), /params: GetTask takes params/],
      [call('ListTasks', { pageSize: 0 }), /params\.pageSize: must be >= 1/],
      [call('ListTasks', { pageSize: 101 }), /params\.pageSize: must be <= 100/],
      [call('ListTasks', { pageSize: -3 }), /params\.pageSize: must be >= 1/],
      [call('ListTasks', { historyLength: 'x' }), /params\.historyLength: must be integer/],
      [call('ListTasks', { contextId: 123 }), /params\.contextId: must be string/],
      [call('ListTasks', { includeArtifacts: 'yes' }), /params\.includeArtifacts: must be boolean/],
      [call('ListTasks', { status: 'TASK_STATE_COMPLETED', statusTimestampAfter: 5 }), /params\.statusTimestampAfter: must be string/],
      [call('ListTasks', { status: 'DONE' }), /params\.status: must be one of 'TASK_STATE_UNSPECIFIED'/],
    ];
    for (const [body, says] of cases) {
      const r = await rpc(body);
      expect([r.status, errorOf(r)?.code], `${JSON.stringify(body)} => ${r.text}`).toEqual([200, -32602]);
      expect(errorOf(r)?.message, JSON.stringify(body)).toMatch(says);
    }
    // None of the refused sends started a task.
    expect((await listAll()).tasks.map((t) => t.id)).toEqual([id]);
    // The proto names the SDK reads are still accepted, and what the schema admits still works.
    const byProtoName = await rpc(call('SendMessage', { message: { role: 'ROLE_USER', message_id: nextId(), context_id: id, parts: [{ text: 'more', media_type: 'text/plain' }] }, configuration: { return_immediately: true, history_length: 0 } }));
    expect(taskOf(byProtoName)).toMatchObject({ id });
    expect(taskOf(byProtoName).history).toBeUndefined();
    expect((await listAll({ pageSize: 100, historyLength: 1 })).tasks).toHaveLength(1);
  });

  it('push configuration in either version’s name is refused as push notifications are (-32003)', async () => {
    for (const configuration of [{ pushNotificationConfig: { url: 'https://example.com/hook' }, returnImmediately: true }, { taskPushNotificationConfig: { authentication: null, url: 'x' } }]) {
      const r = await rpc(call('SendMessage', { message: message('push'), configuration }));
      expect([r.status, errorOf(r)?.code], r.text).toEqual([200, -32003]);
      expect(await auditOf(r.requestId)).toEqual([{ action: 'a2a.SendMessage', outcome: 'failed', status: 200, detail: 'PushNotificationNotSupportedError' }]);
    }
  });
});

describe('A2A envelope', () => {
  it('anything but one JSON-RPC 2.0 request object with a valid id is an invalid request (-32600, id null), audited', async () => {
    const cases: Array<[string, RegExp]> = [
      ['[]', /batch requests are not served/],
      [JSON.stringify([send('batch')]), /batch requests are not served/],
      ['"GetTask"', /must be a JSON-RPC request object/],
      [JSON.stringify({ jsonrpc: '2.0', id: { a: 1 }, method: 'GetTask', params: { id: 'x' } }), /request\.id/],
      [JSON.stringify({ jsonrpc: '2.0', id: [1], method: 'GetTask', params: { id: 'x' } }), /request\.id/],
      [JSON.stringify({ jsonrpc: '2.0', id: true, method: 'GetTask', params: { id: 'x' } }), /request\.id/],
      [JSON.stringify({ jsonrpc: '2.0', id: 1.5, method: 'GetTask', params: { id: 'x' } }), /request\.id/],
      [JSON.stringify({ jsonrpc: '1.0', id: 1, method: 'GetTask', params: { id: 'x' } }), /request\.jsonrpc: must be '2\.0'/],
      [JSON.stringify({ id: 1, method: 'GetTask', params: { id: 'x' } }), /missing required field 'jsonrpc'/],
      [JSON.stringify({ jsonrpc: '2.0', id: 1, params: { id: 'x' } }), /missing required field 'method'/],
      [JSON.stringify({ jsonrpc: '2.0', id: 1, method: 7, params: { id: 'x' } }), /request\.method: must be string/],
      [JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'GetTask', params: { id: 'x' }, extra: 1 }), /request: unknown field 'extra'/],
    ];
    for (const [body, says] of cases) {
      const r = await rpc(body);
      expect([r.status, r.body.jsonrpc, r.body.id, errorOf(r)?.code], `${body} => ${r.text}`).toEqual([200, '2.0', null, -32600]);
      expect(errorOf(r)?.message, body).toMatch(says);
      const records = await auditOf(r.requestId);
      expect(records.map((x) => [x.outcome, x.detail]), body).toEqual([['failed', 'InvalidRequestError']]);
    }
  });

  it('a notification (no id) is refused up front (-32600, id null) and not executed', async () => {
    const before = (await listAll()).totalSize;
    const body = send('notify me') as Json;
    delete body.id;
    const r = await rpc(body);
    expect([r.status, r.body.id, errorOf(r)?.code], r.text).toEqual([200, null, -32600]);
    expect(errorOf(r)?.message).toMatch(/notifications/);
    expect(await auditOf(r.requestId)).toEqual([{ action: 'a2a.SendMessage', outcome: 'failed', status: 200, detail: 'InvalidRequestError' }]);
    expect((await listAll()).totalSize).toBe(before);
    // A null id is a request (answered with id null), not a notification.
    const nullId = await rpc(call('ListTasks', {}, null));
    expect([nullId.body.id, nullId.body.error]).toEqual([null, undefined]);
  });

  it('an oversize body is 413 and writes its audit record (a2a.request, failed)', async () => {
    const big = JSON.stringify(call('SendMessage', { message: message('x'.repeat(5 * 1024 * 1024)) }));
    const r = await rpc(big);
    expect(r.status).toBe(413);
    expect((r.body.error as Json).type).toBe('validation.payload_too_large');
    expect(await auditOf(r.requestId)).toEqual([{ action: 'a2a.request', outcome: 'failed', status: 413, detail: 'validation.payload_too_large' }]);
  });
});

describe('A2A tasks', () => {
  it('a task belongs to the Principal the platform recorded: REST cannot write or replace whose task a Session is', async () => {
    const other = await createPrincipal(p.root, ws, 'forger');
    await grant(other, { type: 'agent', id: agentId }, ['invoke']);
    const forged = { a2a_installation_id: installationId, a2a_surface_scope_id: channelId, a2a_principal_id: prin };
    // A Session labelled as the Principal's task by another caller: refused, nothing created.
    const before = (await api.get<{ data: Json[] }>('/v1/sessions', { limit: 100 })).data.length;
    for (const metadata of [forged, { a2a_principal_id: prin }, { automation_firing_id: 'afir_00000000000000000000000000000000' }]) {
      const r = await api.request('POST', '/v1/sessions', { body: { agent: agentId, environment_id: envId, metadata } });
      expect([r.status, (r.body as { error?: { type?: string; message?: string } }).error?.type], JSON.stringify(r.body)).toEqual([400, 'validation.malformed']);
      expect(JSON.stringify(r.body)).toContain('written by the platform only');
    }
    expect((await api.get<{ data: Json[] }>('/v1/sessions', { limit: 100 })).data.length).toBe(before);
    // The Principal's own task: another caller's update cannot hand it over, and replacing its
    // metadata keeps whose task it is (the owner still reads it; the forger's label is refused).
    const task = taskOf(await rpc(send('mine'))).id as string;
    const handOver = await api.request('POST', `/v1/sessions/${task}`, { body: { metadata: { ...forged, a2a_principal_id: other } } });
    expect(handOver.status).toBe(400);
    const replaced = await api.post<{ metadata: Json }>(`/v1/sessions/${task}`, { metadata: { team: 'x' } });
    expect(replaced.metadata).toEqual({ ...forged, team: 'x' });
    const got = await rpc(call('GetTask', { id: task }));
    expect(errorOf(got), got.text).toBeUndefined();
    expect(((got.body.result as Json).id)).toBe(task);
  });

  it('a refused call that names a task is recorded with the task as target', async () => {
    const task = taskOf(await rpc(send('cancel me'))).id as string;
    const rule = await p.root.post<{ id: string }>('/v1/action-policies', { effect: 'deny', tool: { kind: 'drive', name: 'user.interrupt' }, principal_id: prin });
    try {
      const r = await rpc(call('CancelTask', { id: task }));
      expect(errorOf(r)).toBeDefined();
      const records = (await p.root.post<{ data: (AuditRecord & { target: string | null })[] }>('/v1/audit/export', { limit: 1000 })).data.filter((x) => x.request_id === r.requestId);
      expect(records.map((x) => [x.action, x.outcome, x.target])).toEqual([
        ['policy.drive:user.interrupt', 'denied', task], ['a2a.CancelTask', 'denied', task],
      ]);
    } finally {
      await p.root.request('DELETE', `/v1/action-policies/${rule.id}`);
    }
  });

  it('ListTasks counts and pages only tasks whose Session exists', async () => {
    // Its own placement: the other tests' tasks are not in its list.
    const scope = (await p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'channel', parent_id: rootId, external_installation_id: exti, display_name: '#list' })).id;
    const inst = (await p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agentId }, environment_id: envId, surface_scope_ids: [scope] })).id;
    const url = `${p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${inst}/surface-scopes/${scope}`;
    const keep = taskOf(await rpc(send('keep'), url)).id as string;
    const gone = taskOf(await rpc(send('delete me'), url)).id as string;
    const del = await p.root.request('DELETE', `/v1/sessions/${gone}`);
    expect(del.status).toBe(200);
    const list = async (params: Json) => (await rpc(call('ListTasks', params), url)).body.result as { tasks: Json[]; totalSize: number; nextPageToken: string };
    // The deleted task was the newest: the first page of one is the remaining task, and the last.
    const first = await list({ pageSize: 1 });
    expect({ ids: first.tasks.map((t) => t.id), total: first.totalSize, next: first.nextPageToken }).toEqual({ ids: [keep], total: 1, next: '' });
    const filtered = await list({ pageSize: 1, status: (first.tasks[0]?.status as Json).state });
    expect({ ids: filtered.tasks.map((t) => t.id), total: filtered.totalSize, next: filtered.nextPageToken }).toEqual({ ids: [keep], total: 1, next: '' });
    // The deleted Session's id left the index.
    const index = `ap:{w:${ws}}:idx:a2a_tasks:${inst}:${scope}:${prin}`;
    expect(await redis.zrange(index, 0, -1)).toEqual([keep]);
  });

  it('a deleted task leaves its caller\'s task index with the Session, before any listing', async () => {
    const scope = (await p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'channel', parent_id: rootId, external_installation_id: exti, display_name: '#delete' })).id;
    const inst = (await p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agentId }, environment_id: envId, surface_scope_ids: [scope] })).id;
    const url = `${p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${inst}/surface-scopes/${scope}`;
    const index = `ap:{w:${ws}}:idx:a2a_tasks:${inst}:${scope}:${prin}`;
    const keep = taskOf(await rpc(send('keep'), url)).id as string;
    const gone = taskOf(await rpc(send('delete me'), url)).id as string;
    expect(await redis.zrevrange(index, 0, -1)).toEqual([gone, keep]);
    expect((await p.root.request('DELETE', `/v1/sessions/${gone}`)).status).toBe(200);
    // No listing has run: the delete itself took the task out of the index.
    expect(await redis.zrange(index, 0, -1)).toEqual([keep]);
    // A retried delete (the Session is a tombstone now) changes nothing.
    expect((await p.root.request('DELETE', `/v1/sessions/${gone}`)).status).toBe(200);
    expect(await redis.zrange(index, 0, -1)).toEqual([keep]);
    const list = (await rpc(call('ListTasks', { pageSize: 1 }), url)).body.result as { tasks: Json[]; totalSize: number; nextPageToken: string };
    expect({ ids: list.tasks.map((t) => t.id), total: list.totalSize, next: list.nextPageToken }).toEqual({ ids: [keep], total: 1, next: '' });
    // A Session that is no A2A task leaves no task index behind either (and touches none).
    const plain = await api.post<{ id: string }>('/v1/sessions', { agent: { id: agentId }, environment_id: envId });
    expect((await p.root.request('DELETE', `/v1/sessions/${plain.id}`)).status).toBe(200);
    expect(await redis.zrange(index, 0, -1)).toEqual([keep]);
  });

  it('an unfiltered page reads its own tasks only; an id whose Session is gone leaves the index when a page meets it', async () => {
    const scope = (await p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'channel', parent_id: rootId, external_installation_id: exti, display_name: '#repair' })).id;
    const inst = (await p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agentId }, environment_id: envId, surface_scope_ids: [scope] })).id;
    const url = `${p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${inst}/surface-scopes/${scope}`;
    const index = `ap:{w:${ws}}:idx:a2a_tasks:${inst}:${scope}:${prin}`;
    const list = async (params: Json) => {
      const r = await rpc(call('ListTasks', params), url);
      expect(r.body.error, r.text).toBeUndefined();
      const body = r.body.result as { tasks: Json[]; totalSize: number; nextPageToken: string };
      return { ids: body.tasks.map((t) => t.id), total: body.totalSize, next: body.nextPageToken };
    };
    const ghost = taskOf(await rpc(send('indexed again after its delete'), url)).id as string;
    const oldest = taskOf(await rpc(send('oldest'), url)).id as string;
    const newest = taskOf(await rpc(send('newest'), url)).id as string;
    expect((await p.root.request('DELETE', `/v1/sessions/${ghost}`)).status).toBe(200);
    // A send that indexed its task after the task's deletion had taken it out (the race the
    // listing's repair is for): the deleted Session's id is back, once as the oldest entry.
    await redis.zadd(index, 1, ghost);
    // The first page reads its one task: the gone one, past the page, is not read (and still counted).
    const first = await list({ pageSize: 1 });
    expect(first).toMatchObject({ ids: [newest], total: 3 });
    expect(await redis.zscore(index, ghost)).not.toBeNull();
    // A task sent between two pages is on no later page, and moves nothing on them.
    const between = taskOf(await rpc(send('between pages'), url)).id as string;
    const second = await list({ pageSize: 1, pageToken: first.next });
    expect(second).toMatchObject({ ids: [oldest], total: 4 });
    // The page that meets it takes it out, then counts and pages what is left: nothing.
    expect(await list({ pageSize: 1, pageToken: second.next })).toEqual({ ids: [], total: 3, next: '' });
    expect(await redis.zrevrange(index, 0, -1)).toEqual([between, newest, oldest]);
    expect((await p.root.request('DELETE', `/v1/sessions/${between}`)).status).toBe(200);
    // Met on the first page (now the newest entry): the page is read again without it.
    await redis.zadd(index, Date.now() + 60_000, ghost);
    expect(await list({ pageSize: 1 })).toMatchObject({ ids: [newest], total: 2 });
    expect(await redis.zscore(index, ghost)).toBeNull();
    // A token this list did not issue is refused, not read as a position.
    const forged = await rpc(call('ListTasks', { pageSize: 1, pageToken: 'c1_zzzzzzzz' }), url);
    expect(errorOf(forged)?.code).toBe(-32602);
    // A listing by contextId of the gone task: nothing, and the id leaves the index.
    await redis.zadd(index, 1, ghost);
    expect(await list({ contextId: ghost })).toEqual({ ids: [], total: 0, next: '' });
    expect(await redis.zscore(index, ghost)).toBeNull();
    expect(await list({ contextId: oldest })).toEqual({ ids: [oldest], total: 1, next: '' });
  });

  it('concurrent continuations with one messageId append one message and return the same task, whatever the text', async () => {
    const id = taskOf(await rpc(send('first'))).id as string;
    const messageId = nextId();
    const again = (text: string) => rpc(call('SendMessage', { message: { role: 'ROLE_USER', messageId, contextId: id, parts: [{ text }] }, configuration: { returnImmediately: true } }));
    // Distinct texts (each would be its own drive event), sent together.
    const answers = await Promise.all(Array.from({ length: 16 }, (_, i) => again(i % 2 === 0 ? 'same' : `other ${i}`)));
    expect(answers.map((a) => taskOf(a).id)).toEqual(answers.map(() => id));
    const got = await rpc(call('GetTask', { id }));
    const carrying = ((got.body.result as Json).history as Json[]).filter((m) => m.messageId === messageId);
    expect(carrying).toHaveLength(1);

    // The same, made certain: the messageId is held by another send while the continuations
    // arrive (an undated claim), then released; they queue behind the claim, and one appends.
    const held = nextId();
    const hash = `ap:{w:${ws}}:uniq:a2a_messages:${installationId}:${channelId}:${prin}`;
    await redis.hset(hash, held, 'pending');
    const queued = Promise.all(Array.from({ length: 8 }, (_, i) => rpc(call('SendMessage', {
      message: { role: 'ROLE_USER', messageId: held, contextId: id, parts: [{ text: `queued ${i}` }] }, configuration: { returnImmediately: true },
    }))));
    await redis.hdel(hash, held);
    expect((await queued).map((a) => taskOf(a).id)).toEqual(Array.from({ length: 8 }, () => id));
    const after = await rpc(call('GetTask', { id }));
    expect(((after.body.result as Json).history as Json[]).filter((m) => m.messageId === held)).toHaveLength(1);
  });

  it('a messageId claim left behind by a send that never finished expires: the next send takes it over', async () => {
    const hash = `ap:{w:${ws}}:uniq:a2a_messages:${installationId}:${channelId}:${prin}`;
    // A new task, and a continuation, each under a claim dated long ago.
    const stale = `pending:${Date.now() - 10 * 60_000}:dead-sender`;
    const fresh = nextId();
    await redis.hset(hash, fresh, stale);
    const created = taskOf(await rpc(call('SendMessage', { message: { role: 'ROLE_USER', messageId: fresh, parts: [{ text: 'after a crash' }] }, configuration: { returnImmediately: true } })));
    expect(await redis.hget(hash, fresh)).toBe(created.id);
    const cont = nextId();
    await redis.hset(hash, cont, stale);
    const continued = taskOf(await rpc(call('SendMessage', { message: { role: 'ROLE_USER', messageId: cont, contextId: created.id, parts: [{ text: 'and more' }] }, configuration: { returnImmediately: true } })));
    expect(continued.id).toBe(created.id);
    expect(((continued.history as Json[]) ?? []).map((m) => m.messageId)).toEqual([fresh, cont]);

    // A live claim is waited for: it resolves to the task its holder made.
    const live = nextId();
    await redis.hset(hash, live, `pending:${Date.now()}:live-sender`);
    const waiting = rpc(call('SendMessage', { message: { role: 'ROLE_USER', messageId: live, parts: [{ text: 'wait' }] }, configuration: { returnImmediately: true } }));
    await redis.hset(hash, live, created.id as string);
    expect(taskOf(await waiting).id).toBe(created.id);
  });
});

describe('A2A stream audit', () => {
  it('a platform error before a stream’s first event is audited with its type', async () => {
    // An installation whose Environment is archived: Session admission refuses the task.
    const env = (await api.post<{ id: string }>('/v1/environments', { name: 'to-archive', image: 'agentplane/sandbox:latest' })).id;
    const scope = (await p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'channel', parent_id: rootId, external_installation_id: exti, display_name: '#archived-env' })).id;
    const inst = (await p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agentId }, environment_id: env, surface_scope_ids: [scope] })).id;
    await api.post(`/v1/environments/${env}/archive`, {});
    const url = `${p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${inst}/surface-scopes/${scope}`;
    const r = await rpc(call('SendStreamingMessage', { message: message('stream me') }), url);
    expect([r.status, errorOf(r)?.code], r.text).toEqual([200, -32603]);
    expect(errorOf(r)?.message).toMatch(/^runtime\.invalid_transition: /);
    expect(await auditOf(r.requestId)).toEqual([{ action: 'a2a.SendStreamingMessage', outcome: 'failed', status: 200, detail: 'runtime.invalid_transition' }]);
  });
});

describe('requests that follow a task', () => {
  /** A Principal of its own with every grant a task needs, and its a2a credential. */
  async function caller(name: string): Promise<{ principal: string; onAgent: string; secret: string }> {
    const principal = await createPrincipal(p.root, ws, name);
    const a = await p.root.post<{ id: string }>('/v1/permission-assignments', { principal_id: principal, target: { type: 'agent', id: agentId }, actions: ['invoke', 'steer', 'observe'] });
    await grant(principal, { type: 'surface_scope', id: rootId }, ['invoke', 'steer', 'observe']);
    return { principal, onAgent: a.id, secret: (await createCredential(p.root, principal, 'a2a')).secret };
  }
  const post = (token: string, body: unknown, signal?: AbortSignal) => fetch(endpoint, {
    method: 'POST', headers: { authorization: `Bearer ${token}`, 'a2a-version': '1.0', 'content-type': 'application/json' }, body: JSON.stringify(body), ...(signal ? { signal } : {}),
  });

  it('a stream ends once its grant is revoked, its last event naming the refusal, and is recorded denied', async () => {
    const c = await caller('stream-revoked');
    // No runner: the task stays working and the stream would follow it indefinitely.
    const r = await post(c.secret, call('SendStreamingMessage', { message: message('keep streaming') }));
    expect(r.headers.get('content-type')).toContain('text/event-stream');
    const reader = r.body?.getReader();
    const decoder = new TextDecoder();
    let text = decoder.decode((await reader?.read())?.value);
    expect(text).toContain('"task"');
    expect((await p.root.request('DELETE', `/v1/permission-assignments/${c.onAgent}`)).status).toBe(200);
    const until = Date.now() + 10_000;
    let ended = false;
    while (!ended && Date.now() < until) {
      const chunk = await Promise.race([reader?.read(), new Promise<'idle'>((res) => setTimeout(() => res('idle'), 1000))]);
      if (chunk === 'idle') continue;
      if (!chunk || chunk.done) ended = true;
      else text += decoder.decode(chunk.value);
    }
    expect(ended).toBe(true);
    await reader?.cancel();
    const last = JSON.parse(text.trim().split('\n').filter((l) => l.startsWith('data: ')).at(-1)?.slice('data: '.length) ?? 'null') as { error?: { message: string } };
    expect(last.error?.message).toMatch(/^policy\.denied: /);
    expect(await auditOf(r.headers.get('request-id'))).toEqual([{ action: 'a2a.SendStreamingMessage', outcome: 'denied', status: 200, detail: 'policy.denied' }]);
  });

  it('a blocking send answers the refusal once its Principal is suspended, not the task as it then stands', async () => {
    const c = await caller('blocking-suspended');
    const answer = post(c.secret, call('SendMessage', { message: message('wait for me') }));
    // The send is admitted and waits for the task to settle (it never does here).
    await new Promise((res) => setTimeout(res, 1000));
    expect((await p.root.request('POST', `/v1/principals/${c.principal}/suspend`, { body: {} })).status).toBe(200);
    const r = await Promise.race([answer, new Promise<null>((res) => setTimeout(() => res(null), 10_000))]);
    expect(r).not.toBeNull();
    const body = (await r?.json()) as { error: { type: string } };
    expect([r?.status, body.error.type]).toEqual([401, 'auth.invalid_key']);
    expect(await auditOf(r?.headers.get('request-id') ?? null)).toEqual([{ action: 'a2a.SendMessage', outcome: 'denied', status: 401, detail: 'auth.invalid_key' }]);
  });
});
