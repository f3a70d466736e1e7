/**
 * The A2A edge's governance refusals, black-box with the official `@a2a-js/sdk` client and raw
 * JSON-RPC: an ActionPolicy refusing the answer a reply to `INPUT_REQUIRED` gives (403
 * `policy.denied`, recorded `denied`, nothing appended), a credential of a disabled Workspace
 * (403 `auth.disabled_tenancy`, recorded in that Workspace), and `GetExtendedAgentCard`
 * (`ExtendedAgentCardNotConfiguredError`, recorded). Real turns: scheduler, local runner, Docker
 * sandboxes, the scripted model.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SendMessageRequest, TaskState, type Task } from '@a2a-js/sdk';
import { ClientFactory, ClientFactoryOptions, DefaultAgentCardResolver, JsonRpcTransportFactory, type Client } from '@a2a-js/sdk/client';
import type { HttpClient } from '@agentplane/client';
import { createCredential, createPrincipal } from './harness/governance.js';
import { SCRIPT, startTurnPlatform, type TurnPlatform } from './harness/turns.js';

type Json = Record<string, unknown>;
interface AuditRecord { action: string; outcome: string; status: number; detail: string | null; target: string | null; request_id: string }

let t: TurnPlatform;
let ws: string;
let agentId: string;
let channelId: string;
let installationId: string;
let rootId: string;
let prin: string;
let secret: string;
let endpoint: string;

/** A fetch with the bearer and `A2A-Version: 1.0`. */
const authFetch = (bearer: string): typeof fetch => (input, init) => {
  const h = new Headers(init?.headers);
  h.set('authorization', `Bearer ${bearer}`);
  if (!h.has('a2a-version')) h.set('a2a-version', '1.0');
  return fetch(input, { ...init, headers: h });
};

async function clientFor(url: string): Promise<Client> {
  const fetchImpl = authFetch(secret);
  return new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new JsonRpcTransportFactory({ fetchImpl })], cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
  })).createFromUrl(`${url}/agent-card.json`, '');
}

interface Answer { status: number; text: string; body: Json; requestId: string | null; workspace: string | null }
async function rpc(url: string, body: unknown, bearer = secret): Promise<Answer> {
  const r = await fetch(url, {
    method: 'POST',
    headers: { authorization: `Bearer ${bearer}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  const text = await r.text();
  let parsed: unknown = null;
  try {
    parsed = JSON.parse(text);
  } catch {
    // an SSE stream
  }
  return { status: r.status, text, body: (parsed ?? {}) as Json, requestId: r.headers.get('request-id'), workspace: r.headers.get('service-workspace-id') };
}

let n = 0;
const nextId = () => `m-${Date.now()}-${n++}`;
const msg = (text: string, extra: Json = {}) => SendMessageRequest.fromJSON({ message: { role: 'ROLE_USER', messageId: nextId(), parts: [{ text }], ...extra } });
const asTask = (r: unknown): Task => {
  expect(r).toHaveProperty('status');
  return r as Task;
};

async function auditOf(requestId: string | null, client: HttpClient = t.p.root): Promise<Array<Omit<AuditRecord, 'request_id'>>> {
  expect(requestId).toBeTruthy();
  const records = (await client.post<{ data: AuditRecord[] }>('/v1/audit/export', { limit: 1000 })).data;
  // The request's own record (an ActionPolicy's decision has its own, `policy.…`).
  return records.filter((r) => r.request_id === requestId && r.action.startsWith('a2a.')).map(({ action, outcome, status, detail, target }) => ({ action, outcome, status, detail, target }));
}

async function logTypes(sessionId: string): Promise<string[]> {
  const primary = (await t.api.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id;
  return (await t.api.get<{ data: { type: string }[] }>(`/v1/sessions/${sessionId}/threads/${primary}/events`, { limit: 1000 })).data.map((e) => e.type);
}

async function grant(client: HttpClient, pr: string, target: { type: string; id: string }, actions: string[]): Promise<void> {
  const r = await client.request('POST', '/v1/permission-assignments', { body: { principal_id: pr, target, actions } });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
}

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'a2a-governance' });
  ws = t.p.bootstrap.workspace_id;
  agentId = (await t.api.post<{ id: string }>('/v1/agents', {
    name: 'a2a-asker', model: 'default',
    system: SCRIPT([
      { when: { user_contains: 'ask' }, then: [{ tool: 'ask_user', input: { questions: [{ question: 'Which city?' }] } }] },
      { when: { after_tool: 'ask_user' }, then: [{ reply: 'You said: {{tool_result}}' }] },
      { then: [{ reply: 'Echo: {{user}}' }] },
    ]),
    tools: [{ type: 'builtin', name: 'ask_user' }],
  })).id;
  const exti = (await t.p.root.post<{ id: string }>('/v1/external-installations', { provider: 'slack', external_id: 'T-GOV', display_name: 'Acme' })).id;
  rootId = (await t.p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'root', external_installation_id: exti, display_name: 'Acme' })).id;
  channelId = (await t.p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'channel', parent_id: rootId, external_installation_id: exti, display_name: '#help' })).id;
  installationId = (await t.p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agentId }, environment_id: t.envId, surface_scope_ids: [channelId] })).id;
  endpoint = `${t.p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${installationId}/surface-scopes/${channelId}`;
  prin = await createPrincipal(t.p.root, ws, 'gov-user');
  await grant(t.p.root, prin, { type: 'agent', id: agentId }, ['invoke', 'steer', 'observe']);
  await grant(t.p.root, prin, { type: 'surface_scope', id: rootId }, ['invoke', 'steer', 'observe']);
  secret = (await createCredential(t.p.root, prin, 'a2a')).secret;
}, 180_000);
afterAll(async () => {
  await t?.p.stop();
});

describe('A2A governance refusals', () => {
  it('an ActionPolicy refusing the answer a reply gives (deny, require_approval) is 403 policy.denied, recorded denied; nothing is appended', async () => {
    const client = await clientFor(endpoint);
    const question = asTask(await client.sendMessage(msg('ask me')));
    expect(question.status?.state).toBe(TaskState.TASK_STATE_INPUT_REQUIRED);
    const reply = { role: 'ROLE_USER', messageId: nextId(), taskId: question.id, parts: [{ text: 'Lyon' }] };
    for (const [effect, method] of [['deny', 'SendMessage'], ['require_approval', 'SendStreamingMessage']] as const) {
      const rule = await t.p.root.post<{ id: string }>('/v1/action-policies', { effect, tool: { kind: 'drive', name: 'user.question_answer' }, principal_id: prin });
      try {
        const r = await rpc(endpoint, { jsonrpc: '2.0', id: 9, method, params: { message: reply } });
        expect([r.status, (r.body.error as { type?: string } | undefined)?.type], r.text).toEqual([403, 'policy.denied']);
        expect(r.workspace).toBe(ws);
        expect(await auditOf(r.requestId)).toEqual([{ action: `a2a.${method}`, outcome: 'denied', status: 403, detail: 'policy.denied', target: question.id }]);
      } finally {
        await t.p.root.request('DELETE', `/v1/action-policies/${rule.id}`);
      }
    }
    // Nothing was appended, and the refused messageId was not kept: the same reply now answers.
    expect((await logTypes(question.id)).filter((x) => x === 'user.question_answer' || x === 'user.message')).toEqual(['user.message']);
    const answered = asTask(await client.sendMessage(SendMessageRequest.fromJSON({ message: reply })));
    expect(answered.id).toBe(question.id);
    expect(answered.status?.state).toBe(TaskState.TASK_STATE_COMPLETED);
  });

  it('a credential of a disabled Workspace is 403 auth.disabled_tenancy naming it, recorded denied in that Workspace; the card is 404', async () => {
    const w = (await t.p.root.post<{ id: string }>(`/v1/organizations/${t.p.bootstrap.organization_id}/workspaces`, { name: 'a2a-disabled' })).id;
    const admin = t.p.root.with({ workspaceId: w });
    const env = (await admin.post<{ id: string }>('/v1/environments', { name: 'sandbox', image: 'agentplane/sandbox:latest' })).id;
    const agent = (await admin.post<{ id: string }>('/v1/agents', { name: 'w2-agent', model: 'default' })).id;
    const exti = (await admin.post<{ id: string }>('/v1/external-installations', { provider: 'slack', external_id: 'T-W2', display_name: 'W2' })).id;
    const root = (await admin.post<{ id: string }>('/v1/surface-scopes', { kind: 'root', external_installation_id: exti, display_name: 'W2' })).id;
    const inst = (await admin.post<{ id: string }>('/v1/agent-installations', { agent: { id: agent }, environment_id: env, surface_scope_ids: [root] })).id;
    const p2 = await createPrincipal(t.p.root, w, 'w2-user');
    await grant(admin, p2, { type: 'workspace', id: w }, ['invoke', 'steer', 'observe']);
    const bearer = (await createCredential(admin, p2, 'a2a')).secret;
    const url = `${t.p.baseUrl}/a2a/v1/workspaces/${w}/agent-installations/${inst}/surface-scopes/${root}`;
    const list = { jsonrpc: '2.0', id: 1, method: 'ListTasks', params: {} };
    const before = await rpc(url, list, bearer);
    expect([before.status, before.body.error], before.text).toEqual([200, undefined]);

    const setStatus = (status: string) => t.p.root.request('PATCH', `/v1/organizations/workspaces/${w}`, { body: { status } });
    expect((await setStatus('disabled')).status).toBe(200);
    let refused: Answer;
    try {
      refused = await rpc(url, list, bearer);
      expect([refused.status, (refused.body.error as { type?: string } | undefined)?.type], refused.text).toEqual([403, 'auth.disabled_tenancy']);
      expect(refused.workspace).toBe(w);
      expect((await fetch(`${url}/agent-card.json`)).status).toBe(404);
    } finally {
      expect((await setStatus('active')).status).toBe(200);
    }
    expect(await auditOf(refused.requestId, admin)).toEqual([{ action: 'a2a.request', outcome: 'denied', status: 403, detail: 'auth.disabled_tenancy', target: inst }]);
  });

  it('GetExtendedAgentCard answers ExtendedAgentCardNotConfiguredError (-32007), recorded as a refusal', async () => {
    // The SDK's own transport names the error.
    const transport = await new JsonRpcTransportFactory({ fetchImpl: authFetch(secret) }).create(endpoint, await (await clientFor(endpoint)).getAgentCard());
    await expect(transport.getExtendedAgentCard({ tenant: '' })).rejects.toMatchObject({ name: 'ExtendedAgentCardNotConfiguredError' });
    for (const params of [{}, undefined]) {
      const r = await rpc(endpoint, { jsonrpc: '2.0', id: 3, method: 'GetExtendedAgentCard', ...(params ? { params } : {}) });
      expect([r.status, (r.body.error as { code?: number } | undefined)?.code], r.text).toEqual([200, -32007]);
      expect(r.body.id).toBe(3);
      expect(await auditOf(r.requestId)).toEqual([{ action: 'a2a.other', outcome: 'failed', status: 200, detail: 'ExtendedAgentCardNotConfiguredError', target: installationId }]);
    }
  });
});
