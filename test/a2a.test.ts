/**
 * The A2A v1.0 server, driven with the official `@a2a-js/sdk` client as a user's program would:
 * card (ETag round trip), blocking send, streaming with resume after a dropped connection,
 * cancel, list, every rejection, audience mismatch both ways, a suspended Principal. Real turns:
 * scheduler, local runner, Docker sandboxes, the scripted model.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { SendMessageRequest, TaskState, type StreamResponse, type Task } from '@a2a-js/sdk';
import { ClientFactory, ClientFactoryOptions, DefaultAgentCardResolver, JsonRpcTransportFactory, type Client } from '@a2a-js/sdk/client';
import { createCredential, createPrincipal } from './harness/governance.js';
import { SCRIPT, startTurnPlatform, type TurnPlatform } from './harness/turns.js';

type Json = Record<string, unknown>;

let t: TurnPlatform;
let ws: string;
let agentId: string;
let installationId: string;
let channelId: string;
let rootId: string;
let userPrincipal: string;
let userSecret: string;
let endpoint: string;
let cardUrl: string;

const SCRIPT_RULES = [
  { when: { user_contains: 'slow' }, then: [{ sleep_ms: 4000 }, { reply: 'Finished the slow job.' }] },
  { when: { user_contains: 'forever' }, then: [{ sleep_ms: 60_000 }, { reply: 'never' }] },
  { then: [{ reply: 'Echo: {{user}}' }] },
];

/** A fetch that adds the bearer (and lets a test bend the headers the SDK sends). */
function authFetch(secret: string, bend?: (h: Headers) => void): typeof fetch {
  return (input, init) => {
    const h = new Headers(init?.headers);
    h.set('authorization', `Bearer ${secret}`);
    bend?.(h);
    return fetch(input, { ...init, headers: h });
  };
}

async function clientFor(secret: string, bend?: (h: Headers) => void): Promise<Client> {
  const fetchImpl = authFetch(secret, bend);
  const factory = new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
    transports: [new JsonRpcTransportFactory({ fetchImpl })],
    cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
  }));
  // The card's URL is the resolver's base; '' keeps it whole.
  return factory.createFromUrl(cardUrl, '');
}

let counter = 0;
const msg = (text: string, extra: Json = {}, params: Json = {}) => SendMessageRequest.fromJSON({
  message: { role: 'ROLE_USER', messageId: `m-${Date.now()}-${counter++}`, parts: [{ text }], ...extra },
  ...params,
});

const asTask = (r: unknown): Task => {
  expect(r).toHaveProperty('status');
  return r as Task;
};
/** The types of a task's (Session's) log, oldest first. */
async function logTypes(sessionId: string): Promise<string[]> {
  const primary = (await t.api.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id;
  return (await t.api.get<{ data: { type: string }[] }>(`/v1/sessions/${sessionId}/threads/${primary}/events`, { limit: 1000 })).data.map((e) => e.type);
}
const rejected = async (p: Promise<unknown>, name: string) => {
  await expect(p).rejects.toMatchObject({ name });
};
const textOf = (t: Task): string => t.artifacts.flatMap((a) => a.parts.map((p) => (p.content?.$case === 'text' ? p.content.value : ''))).join('');

async function grant(prin: string, target: { type: string; id: string }, actions: string[]): Promise<void> {
  const r = await t.p.root.request('POST', '/v1/permission-assignments', { body: { principal_id: prin, target, actions } });
  expect(r.status).toBe(201);
}

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'a2a' });
  ws = t.p.bootstrap.workspace_id;
  agentId = (await t.api.post<{ id: string }>('/v1/agents', { name: 'a2a-helper', model: 'default', system: SCRIPT(SCRIPT_RULES) })).id;
  const exti = (await t.p.root.post<{ id: string }>('/v1/external-installations', { provider: 'slack', external_id: 'T-A2A', display_name: 'Acme' })).id;
  rootId = (await t.p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'root', external_installation_id: exti, display_name: 'Acme' })).id;
  const team = (await t.p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'team', parent_id: rootId, external_installation_id: exti, display_name: 'Eng' })).id;
  channelId = (await t.p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'channel', parent_id: team, external_installation_id: exti, display_name: '#help' })).id;
  installationId = (await t.p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agentId }, environment_id: t.envId, surface_scope_ids: [channelId] })).id;
  endpoint = `${t.p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${installationId}/surface-scopes/${channelId}`;
  cardUrl = `${endpoint}/agent-card.json`;
  userPrincipal = await createPrincipal(t.p.root, ws, 'a2a-user');
  // invoke/steer/observe on the agent, and on the root scope: the channel inherits it.
  await grant(userPrincipal, { type: 'agent', id: agentId }, ['invoke', 'steer', 'observe']);
  await grant(userPrincipal, { type: 'surface_scope', id: rootId }, ['invoke', 'steer', 'observe']);
  userSecret = (await createCredential(t.p.root, userPrincipal, 'a2a')).secret;
}, 180_000);
afterAll(async () => {
  await t?.p.stop();
});

describe('Agent Card', () => {
  it('is public, cacheable 60 s, carries an ETag (If-None-Match → 304), the exact endpoint, text modes, streaming and skills', async () => {
    const r = await fetch(cardUrl);
    expect(r.status).toBe(200);
    expect(r.headers.get('cache-control')).toBe('public, max-age=60');
    const etag = r.headers.get('etag');
    expect(etag).toMatch(/^".+"$/);
    const card = await r.json() as Json;
    expect(card).toMatchObject({
      name: 'a2a-helper', version: '1',
      supportedInterfaces: [{ url: endpoint, protocolBinding: 'JSONRPC', protocolVersion: '1.0' }],
      capabilities: { streaming: true, pushNotifications: false },
      defaultInputModes: ['text/plain'], defaultOutputModes: ['text/plain'],
    });
    expect((card.skills as Json[])[0]).toMatchObject({ name: 'a2a-helper', inputModes: ['text/plain'] });
    const again = await fetch(cardUrl, { headers: { 'if-none-match': etag as string } });
    expect(again.status).toBe(304);
    expect(again.headers.get('etag')).toBe(etag);
    const stale = await fetch(cardUrl, { headers: { 'if-none-match': '"other"' } });
    expect(stale.status).toBe(200);

    // The SDK resolves the same card and picks the JSON-RPC interface.
    const client = await clientFor(userSecret);
    const viaSdk = await client.getAgentCard();
    expect(viaSdk.supportedInterfaces[0]?.url).toBe(endpoint);

    // A mismatched placement is 404: the installation is not on the root scope.
    const wrong = await fetch(cardUrl.replace(channelId, rootId));
    expect(wrong.status).toBe(404);
    expect(((await wrong.json()) as { error: { type: string } }).error.type).toBe('validation.not_found');
  });

  it('is 404 for an archived installation and for an archived agent', async () => {
    const agent = (await t.api.post<{ id: string }>('/v1/agents', { name: 'short-lived', model: 'default' })).id;
    const inst = (await t.p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agent }, environment_id: t.envId, surface_scope_ids: [channelId] })).id;
    const url = `${t.p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${inst}/surface-scopes/${channelId}/agent-card.json`;
    expect((await fetch(url)).status).toBe(200);
    await t.api.post(`/v1/agents/${agent}/archive`, {});
    expect((await fetch(url)).status).toBe(404);
    const inst2 = (await t.p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agentId }, environment_id: t.envId, surface_scope_ids: [channelId] })).id;
    const url2 = url.replace(inst, inst2);
    expect((await fetch(url2)).status).toBe(200);
    await t.p.root.post(`/v1/agent-installations/${inst2}/archive`, {});
    expect((await fetch(url2)).status).toBe(404);
  });

  it('is 404 once the external installation its scope lives under is archived', async () => {
    const exti = (await t.p.root.post<{ id: string }>('/v1/external-installations', { provider: 'slack', external_id: `T-${Date.now()}`, display_name: 'Uninstalled' })).id;
    const root = (await t.p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'root', external_installation_id: exti, display_name: 'ws' })).id;
    const scope = (await t.p.root.post<{ id: string }>('/v1/surface-scopes', { kind: 'channel', parent_id: root, external_installation_id: exti, display_name: '#gone' })).id;
    const inst = (await t.p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agentId }, environment_id: t.envId, surface_scope_ids: [scope] })).id;
    const url = `${t.p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${inst}/surface-scopes/${scope}/agent-card.json`;
    expect((await fetch(url)).status).toBe(200);
    await t.p.root.post(`/v1/external-installations/${exti}/archive`, {});
    expect((await fetch(url)).status).toBe(404);
  });
});

describe('A2A JSON-RPC', () => {
  it('SendMessage blocks until the task completes with the agent text; a reused messageId returns the same task; contextId continues the Session', async () => {
    const client = await clientFor(userSecret);
    const req = msg('hello there');
    const task = asTask(await client.sendMessage(req));
    expect(task.id).toMatch(/^sess_[0-9a-f]{32}$/);
    expect(task.contextId).toBe(task.id);
    expect(task.status?.state).toBe(TaskState.TASK_STATE_COMPLETED);
    expect(textOf(task)).toBe('Echo: hello there');
    expect(task.history.map((m) => m.role)).toEqual([1, 2]);
    expect(task.history[0]?.messageId).toBe(req.message?.messageId);

    const replay = asTask(await client.sendMessage(req));
    expect(replay.id).toBe(task.id);
    expect(replay.history).toHaveLength(2);

    const next = asTask(await client.sendMessage(msg('second turn', { contextId: task.id }, { configuration: { historyLength: 1 } })));
    expect(next.id).toBe(task.id);
    expect(next.status?.state).toBe(TaskState.TASK_STATE_COMPLETED);
    expect(next.history).toHaveLength(1);
    expect(next.history[0]?.parts[0]?.content).toEqual({ $case: 'text', value: 'Echo: second turn' });

    const got = await client.getTask({ tenant: '', id: task.id, historyLength: 0 });
    expect(got.history).toEqual([]);
    expect(got.artifacts).toHaveLength(2);

    // The Session is an ordinary Session, authored by the caller and tagged with its placement.
    const s = await t.api.get<Json>(`/v1/sessions/${task.id}`);
    expect(s.metadata).toMatchObject({ a2a_installation_id: installationId, a2a_surface_scope_id: channelId, a2a_principal_id: userPrincipal });

    // Every request is audited.
    const audit = await t.p.root.post<{ data: { action: string; outcome: string; target: string | null; actor: { id: string } }[] }>('/v1/audit/export', { action: 'a2a.SendMessage' });
    expect(audit.data.filter((r) => r.target === task.id && r.outcome === 'succeeded' && r.actor.id === userPrincipal).length).toBeGreaterThanOrEqual(3);
  });

  it('a turn that waits on the caller (a custom tool) returns input-required: blocking ends at an interrupted state; CancelTask ends the wait', async () => {
    const agent = (await t.api.post<{ id: string }>('/v1/agents', {
      name: 'a2a-tools', model: 'default',
      system: SCRIPT([{ when: { user_contains: 'look' }, then: [{ tool: 'lookup', input: { q: '{{user}}' } }] }, { then: [{ reply: 'ok' }] }]),
      tools: [{ type: 'custom', name: 'lookup', description: 'Looks a thing up', input_schema: { type: 'object' } }],
    })).id;
    await grant(userPrincipal, { type: 'agent', id: agent }, ['invoke', 'steer', 'observe']);
    const inst = (await t.p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agent }, environment_id: t.envId, surface_scope_ids: [channelId] })).id;
    const url = `${t.p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${inst}/surface-scopes/${channelId}/agent-card.json`;
    const card = await (await fetch(url)).json() as { skills: Json[] };
    expect(card.skills).toEqual([expect.objectContaining({ id: 'tool:lookup', name: 'lookup', description: 'Looks a thing up', tags: ['custom'] })]);
    const fetchImpl = authFetch(userSecret);
    const client = await new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl })], cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
    })).createFromUrl(url, '');
    const task = asTask(await client.sendMessage(msg('look it up')));
    expect(task.status?.state).toBe(TaskState.TASK_STATE_INPUT_REQUIRED);
    // Nothing runs while the task waits on its caller: CancelTask (user.interrupt) ends the wait itself.
    const canceled = await client.cancelTask({ tenant: '', id: task.id, metadata: undefined });
    expect(canceled.status?.state).toBe(TaskState.TASK_STATE_CANCELED);
  });

  it('input-required: the status says what is asked; a reply answers it (a custom tool, a question) and the turn goes on', async () => {
    const agent = (await t.api.post<{ id: string }>('/v1/agents', {
      name: 'a2a-inputs', model: 'default',
      system: SCRIPT([
        { when: { user_contains: 'look' }, then: [{ tool: 'lookup', input: { q: 'the capital' } }] },
        { when: { user_contains: 'twice' }, then: [{ tool: 'ask_user', input: { questions: [{ question: 'One?' }, { question: 'Two?' }] } }] },
        { when: { user_contains: 'ask' }, then: [{ tool: 'ask_user', input: { questions: [{ question: 'Which city?' }] } }] },
        { when: { after_tool: 'lookup' }, then: [{ reply: 'Looked up: {{tool_result}}' }] },
        { when: { after_tool: 'ask_user' }, then: [{ reply: 'You said: {{tool_result}}' }] },
      ]),
      tools: [{ type: 'custom', name: 'lookup', description: 'Looks a thing up', input_schema: { type: 'object' } }, { type: 'builtin', name: 'ask_user' }],
    })).id;
    await grant(userPrincipal, { type: 'agent', id: agent }, ['invoke', 'steer', 'observe']);
    const inst = (await t.p.root.post<{ id: string }>('/v1/agent-installations', { agent: { id: agent }, environment_id: t.envId, surface_scope_ids: [channelId] })).id;
    const url = `${t.p.baseUrl}/a2a/v1/workspaces/${ws}/agent-installations/${inst}/surface-scopes/${channelId}/agent-card.json`;
    const fetchImpl = authFetch(userSecret);
    const client = await new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, {
      transports: [new JsonRpcTransportFactory({ fetchImpl })], cardResolver: new DefaultAgentCardResolver({ fetchImpl }),
    })).createFromUrl(url, '');
    const said = (task: Task) => task.status?.message?.parts.map((p) => (p.content?.$case === 'text' ? p.content.value : '')).join('') ?? '';

    // A custom tool: the status names the call; the reply is its result.
    const tool = asTask(await client.sendMessage(msg('look it up')));
    expect(tool.status?.state).toBe(TaskState.TASK_STATE_INPUT_REQUIRED);
    expect(said(tool)).toContain('The agent calls lookup with {"q":"the capital"}');
    // Subscribing to a task that waits on its caller shows it and ends (it is settled).
    const seen: StreamResponse[] = [];
    for await (const ev of client.resubscribeTask({ tenant: '', id: tool.id })) seen.push(ev);
    expect(seen.map((e) => e.payload?.$case)).toEqual(['task']);
    const answered = asTask(await client.sendMessage(msg('Paris', { contextId: tool.id })));
    expect(answered.status?.state).toBe(TaskState.TASK_STATE_COMPLETED);
    expect(textOf(answered)).toContain('Looked up: Paris');
    expect(answered.history.map((m) => m.parts[0]?.content)).toContainEqual({ $case: 'text', value: 'Paris' });

    // A question: the status asks it; the reply answers it.
    const question = asTask(await client.sendMessage(msg('ask me')));
    expect([question.status?.state, said(question)]).toEqual([TaskState.TASK_STATE_INPUT_REQUIRED, 'Which city?']);
    const reply = asTask(await client.sendMessage(msg('Lyon', { taskId: question.id })));
    expect(reply.status?.state).toBe(TaskState.TASK_STATE_COMPLETED);
    expect(textOf(reply)).toContain('Lyon');

    // Two questions at once cannot be answered by one text: refused, saying so; nothing queued.
    const two = asTask(await client.sendMessage(msg('ask twice')));
    expect(two.status?.state).toBe(TaskState.TASK_STATE_INPUT_REQUIRED);
    await rejected(client.sendMessage(msg('both', { contextId: two.id })), 'UnsupportedOperationError');
    expect((await logTypes(two.id)).filter((x) => x === 'user.message')).toHaveLength(1);
  });

  it('a messageId sent again returns its task as it is now; CancelTask with a message queued behind the turn is refused', async () => {
    const client = await clientFor(userSecret);
    const first = msg('first of many');
    const task = asTask(await client.sendMessage(first));
    expect(task.status?.state).toBe(TaskState.TASK_STATE_COMPLETED);
    // A slow turn, and a message queued behind it.
    asTask(await client.sendMessage(msg('slow one', { contextId: task.id }, { configuration: { returnImmediately: true } })));
    asTask(await client.sendMessage(msg('queued behind', { contextId: task.id }, { configuration: { returnImmediately: true } })));
    const again = asTask(await client.sendMessage(first));
    expect(again.id).toBe(task.id);
    expect(again.status?.state).not.toBe(TaskState.TASK_STATE_COMPLETED);
    expect(again.history.length).toBeGreaterThan(2);
    await rejected(client.cancelTask({ tenant: '', id: task.id, metadata: undefined }), 'TaskNotCancelableError');
    // Nothing was interrupted: the turns run to their ends.
    const states: TaskState[] = [];
    for await (const ev of client.resubscribeTask({ tenant: '', id: task.id })) {
      if (ev.payload?.$case === 'statusUpdate') states.push(ev.payload.value.status?.state ?? TaskState.TASK_STATE_UNSPECIFIED);
    }
    expect(states.at(-1)).toBe(TaskState.TASK_STATE_COMPLETED);
    expect(await logTypes(task.id)).not.toContain('user.interrupt');
  });

  it('returnImmediately returns the submitted or working task', async () => {
    const client = await clientFor(userSecret);
    const task = asTask(await client.sendMessage(msg('slow please', {}, { configuration: { returnImmediately: true } })));
    expect([TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING]).toContain(task.status?.state);
    // SubscribeToTask follows it to completion.
    const states: TaskState[] = [];
    for await (const ev of client.resubscribeTask({ tenant: '', id: task.id })) {
      if (ev.payload?.$case === 'statusUpdate') states.push(ev.payload.value.status?.state ?? TaskState.TASK_STATE_UNSPECIFIED);
    }
    expect(states.at(-1)).toBe(TaskState.TASK_STATE_COMPLETED);
  });

  it('streams a task, and resumes with SubscribeToTask after the connection drops', async () => {
    const client = await clientFor(userSecret);
    const ac = new AbortController();
    let taskId = '';
    const first: StreamResponse[] = [];
    try {
      for await (const ev of client.sendMessageStream(msg('slow stream'), { signal: ac.signal })) {
        first.push(ev);
        if (ev.payload?.$case === 'task') {
          taskId = ev.payload.value.id;
          expect([TaskState.TASK_STATE_SUBMITTED, TaskState.TASK_STATE_WORKING]).toContain(ev.payload.value.status?.state);
          ac.abort(); // the connection drops mid-task
        }
      }
    } catch (err) {
      if (!ac.signal.aborted) throw err;
    }
    expect(first[0]?.payload?.$case).toBe('task');
    expect(taskId).toMatch(/^sess_/);
    expect(ac.signal.aborted).toBe(true);

    const resumed: StreamResponse[] = [];
    for await (const ev of client.resubscribeTask({ tenant: '', id: taskId })) resumed.push(ev);
    expect(resumed[0]?.payload?.$case).toBe('task');
    const artifacts = resumed.flatMap((e) => (e.payload?.$case === 'artifactUpdate' ? [e.payload.value] : []));
    expect(artifacts.map((a) => a.artifact?.parts[0]?.content)).toEqual([{ $case: 'text', value: 'Finished the slow job.' }]);
    const last = resumed.at(-1);
    expect(last?.payload?.$case).toBe('statusUpdate');
    if (last?.payload?.$case === 'statusUpdate') expect(last.payload.value.status?.state).toBe(TaskState.TASK_STATE_COMPLETED);

    // A terminal task takes no subscription and no message naming it.
    await expect(async () => {
      for await (const ev of client.resubscribeTask({ tenant: '', id: taskId })) void ev;
    }).rejects.toMatchObject({ name: 'UnsupportedOperationError' });
    await expect(client.sendMessage(msg('more', { taskId }))).rejects.toMatchObject({ name: 'UnsupportedOperationError' });
  });

  it('CancelTask is user.interrupt: the working task ends canceled; a canceled task is not cancelable again', async () => {
    const client = await clientFor(userSecret);
    let taskId = '';
    for await (const ev of client.sendMessageStream(msg('run forever'))) {
      const state = ev.payload?.$case === 'task' ? ev.payload.value.status?.state : ev.payload?.$case === 'statusUpdate' ? ev.payload.value.status?.state : undefined;
      if (ev.payload?.$case === 'task') taskId = ev.payload.value.id;
      if (state === TaskState.TASK_STATE_WORKING) break;
    }
    const canceled = await client.cancelTask({ tenant: '', id: taskId, metadata: undefined });
    expect(canceled.status?.state).toBe(TaskState.TASK_STATE_CANCELED);
    const audit = await t.p.root.post<{ data: { target: string | null; outcome: string }[] }>('/v1/audit/export', { action: 'a2a.CancelTask' });
    expect(audit.data.some((r) => r.target === taskId && r.outcome === 'succeeded')).toBe(true);
    await expect(client.cancelTask({ tenant: '', id: taskId, metadata: undefined })).rejects.toMatchObject({ name: 'TaskNotCancelableError' });
  });

  it('ListTasks lists this Principal’s tasks on this placement, newest first, with filters and pages', async () => {
    const client = await clientFor(userSecret);
    const all = await client.listTasks({ tenant: '', contextId: '', status: TaskState.TASK_STATE_UNSPECIFIED, pageSize: 100, pageToken: '', historyLength: undefined, statusTimestampAfter: undefined, includeArtifacts: undefined });
    expect(all.tasks.length).toBeGreaterThanOrEqual(4);
    expect(all.totalSize).toBe(all.tasks.length);
    expect(all.tasks.every((x) => x.artifacts.length === 0)).toBe(true);
    const page = await client.listTasks({ tenant: '', contextId: '', status: TaskState.TASK_STATE_UNSPECIFIED, pageSize: 2, pageToken: '', historyLength: undefined, statusTimestampAfter: undefined, includeArtifacts: true });
    expect(page.tasks.map((x) => x.id)).toEqual(all.tasks.slice(0, 2).map((x) => x.id));
    expect(page.nextPageToken).not.toBe('');
    const page2 = await client.listTasks({ tenant: '', contextId: '', status: TaskState.TASK_STATE_UNSPECIFIED, pageSize: 2, pageToken: page.nextPageToken, historyLength: undefined, statusTimestampAfter: undefined, includeArtifacts: undefined });
    expect(page2.tasks.map((x) => x.id)).toEqual(all.tasks.slice(2, 4).map((x) => x.id));
    const canceled = await client.listTasks({ tenant: '', contextId: '', status: TaskState.TASK_STATE_CANCELED, pageSize: 50, pageToken: '', historyLength: undefined, statusTimestampAfter: undefined, includeArtifacts: undefined });
    expect(canceled.tasks.length).toBe(1);
    expect(canceled.tasks[0]?.status?.state).toBe(TaskState.TASK_STATE_CANCELED);

    // Another Principal with the same grants sees none of them, and cannot GetTask one.
    const other = await createPrincipal(t.p.root, ws, 'other-user');
    await grant(other, { type: 'agent', id: agentId }, ['invoke', 'steer', 'observe']);
    await grant(other, { type: 'surface_scope', id: channelId }, ['invoke', 'steer', 'observe']);
    const otherClient = await clientFor((await createCredential(t.p.root, other, 'a2a')).secret);
    const none = await otherClient.listTasks({ tenant: '', contextId: '', status: TaskState.TASK_STATE_UNSPECIFIED, pageSize: 50, pageToken: '', historyLength: undefined, statusTimestampAfter: undefined, includeArtifacts: undefined });
    expect(none.tasks).toEqual([]);
    await expect(otherClient.getTask({ tenant: '', id: all.tasks[0]?.id as string })).rejects.toMatchObject({ name: 'TaskNotFoundError' });
  });
});

describe('A2A rejections', () => {

  it('continuing a task needs steer however the message names it (contextId or context_id)', async () => {
    const invoker = await createPrincipal(t.p.root, ws, 'invoke-only');
    await grant(invoker, { type: 'agent', id: agentId }, ['invoke', 'observe']);
    await grant(invoker, { type: 'surface_scope', id: channelId }, ['invoke', 'observe']);
    const secret = (await createCredential(t.p.root, invoker, 'a2a')).secret;
    // Its own task: starting one needs invoke only.
    const first = asTask(await (await clientFor(secret)).sendMessage(msg('a task to continue')));
    for (const ref of [{ contextId: first.id }, { context_id: first.id }, { task_id: first.id }]) {
      const r = await fetch(endpoint, {
        method: 'POST', headers: { authorization: `Bearer ${secret}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 3, method: 'SendMessage', params: { message: { messageId: `m-${Object.keys(ref)[0]}`, role: 'ROLE_USER', parts: [{ text: 'more' }], ...ref } } }),
      });
      expect(r.status, JSON.stringify(ref)).toBe(403);
    }
  });

  it('refuses ListTasks params it cannot read, and a body that is not application/json, instead of answering as if none were given', async () => {
    const rpc = async (params: Record<string, unknown>, contentType = 'application/json') => {
      const r = await fetch(endpoint, {
        method: 'POST', headers: { authorization: `Bearer ${userSecret}`, 'a2a-version': '1.0', 'content-type': contentType },
        body: JSON.stringify({ jsonrpc: '2.0', id: 9, method: 'ListTasks', params }),
      });
      return { status: r.status, body: (await r.json()) as { error?: { code?: number }; result?: unknown } };
    };
    for (const params of [{ pageSize: 'abc' }, { status: 'zzz' }, { statusTimestampAfter: 'garbage' }]) {
      const r = await rpc(params);
      expect([r.status, r.body.error?.code], JSON.stringify(params)).toEqual([200, -32602]);
    }
    expect((await rpc({ pageSize: 5 })).body.result).toBeDefined();
    const plain = await rpc({}, 'text/plain');
    expect([plain.status, plain.body.error?.code, plain.body.result]).toEqual([200, -32700, undefined]);
  });

  it('refuses push notifications, extensions and extension URIs, referenceTaskIds, non-text parts, ZDR and the tenant field', async () => {
    const client = await clientFor(userSecret);
    await rejected(client.sendMessage(msg('x', {}, { configuration: { taskPushNotificationConfig: { url: 'https://example.com/hook' } } })), 'PushNotificationNotSupportedError');
    // The SDK client itself refuses push configuration against this card (pushNotifications: false); the server does too.
    await rejected(Promise.resolve().then(() => client.createTaskPushNotificationConfig({ tenant: '', id: 'p1', taskId: 'sess_00000000000000000000000000000000', url: 'https://example.com/hook', token: '', authentication: undefined })), 'PushNotificationNotSupportedError');
    const raw = await fetch(endpoint, {
      method: 'POST', headers: { authorization: `Bearer ${userSecret}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 7, method: 'CreateTaskPushNotificationConfig', params: { taskId: 'sess_00000000000000000000000000000000', url: 'https://example.com/hook' } }),
    });
    expect(raw.status).toBe(200);
    expect(await raw.json()).toMatchObject({ jsonrpc: '2.0', id: 7, error: { code: -32003 } });
    await rejected(client.sendMessage(msg('x', { extensions: ['https://example.com/ext/v1'] })), 'UnsupportedOperationError');
    await rejected(client.sendMessage(msg('x', { metadata: { 'https://example.com/ext/v1': { a: 1 } } })), 'UnsupportedOperationError');
    const extClient = await clientFor(userSecret, (h) => h.set('a2a-extensions', 'https://example.com/ext/v1'));
    await rejected(extClient.sendMessage(msg('x')), 'UnsupportedOperationError');
    await rejected(client.sendMessage(msg('x', { referenceTaskIds: ['sess_00000000000000000000000000000000'] })), 'UnsupportedOperationError');
    await rejected(client.sendMessage(msg('x', { parts: [{ data: { k: 1 } }] })), 'ContentTypeNotSupportedError');
    await rejected(client.sendMessage(msg('x', { parts: [{ url: 'https://example.com/a.png', mediaType: 'image/png' }] })), 'ContentTypeNotSupportedError');
    await rejected(client.sendMessage(msg('x', { parts: [{ text: 'x', mediaType: 'text/html' }] })), 'ContentTypeNotSupportedError');
    await rejected(client.sendMessage(msg('x', { metadata: { zdr: true } })), 'UnsupportedOperationError');
    // The text meets the same limits as a REST user.message.
    await rejected(client.sendMessage(msg('x'.repeat(1_000_001))), 'RequestMalformedError');
    await rejected(client.sendMessage(msg('x', {}, { tenant: 'acme' })), 'UnsupportedOperationError');
    await rejected(client.getTask({ tenant: 'acme', id: 'sess_00000000000000000000000000000000' }), 'UnsupportedOperationError');
    await rejected(client.getTask({ tenant: '', id: 'sess_00000000000000000000000000000000' }), 'TaskNotFoundError');
    // None of these started a Session.
    const tasks = await client.listTasks({ tenant: '', contextId: '', status: TaskState.TASK_STATE_UNSPECIFIED, pageSize: 100, pageToken: '', historyLength: undefined, statusTimestampAfter: undefined, includeArtifacts: undefined });
    expect(tasks.tasks.every((x) => textOf(x) !== 'Echo: x')).toBe(true);
  });

  it('audit records name methods from a closed set and errors by type, never by what the caller sent', async () => {
    const send = async (method: string, params: Record<string, unknown>) => {
      const r = await fetch(endpoint, {
        method: 'POST', headers: { authorization: `Bearer ${userSecret}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
        body: JSON.stringify({ jsonrpc: '2.0', id: 11, method, params }),
      });
      expect(r.status).toBe(200);
      return { id: r.headers.get('request-id'), body: await r.json() as { error?: { code: number } } };
    };
    const madeUp = await send('My secret note: hunter2', {});
    expect(madeUp.body.error?.code).toBe(-32601);
    // JSON-RPC lets a request leave its params out: an unknown method is still -32601.
    const bare = await fetch(endpoint, {
      method: 'POST', headers: { authorization: `Bearer ${userSecret}`, 'a2a-version': '1.0', 'content-type': 'application/json' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 12, method: 'Foo' }),
    });
    expect(await bare.json()).toEqual({ jsonrpc: '2.0', id: 12, error: { code: -32601, message: 'Method not found: Foo' } });
    const missing = await send('GetTask', { id: 'secret-content hunter2' });
    expect(missing.body.error?.code).toBe(-32001);
    const records = (await t.p.root.post<{ data: { action: string; detail: string | null; request_id: string }[] }>('/v1/audit/export', {})).data;
    const byRequest = (id: string | null) => records.filter((r) => r.request_id === id).map((r) => ({ action: r.action, detail: r.detail }));
    expect(byRequest(madeUp.id)).toEqual([{ action: 'a2a.other', detail: 'MethodNotFoundError' }]);
    expect(byRequest(missing.id)).toEqual([{ action: 'a2a.GetTask', detail: 'TaskNotFoundError' }]);
    expect(JSON.stringify(records)).not.toContain('hunter2');
  });

  it('a body that is not JSON is the JSON-RPC parse error (-32700), admitted and audited like any request', async () => {
    const post = (body: string, authorization = `Bearer ${userSecret}`) => fetch(endpoint, {
      method: 'POST', headers: { authorization, 'a2a-version': '1.0', 'content-type': 'application/json' }, body,
    });
    type Answer = { jsonrpc: string; id: unknown; error?: { code: number; message: string } };
    const cut = await post('{"jsonrpc":"2.0","id":5,"method":"GetTask","params":{"id":');
    expect(cut.status).toBe(200);
    // The envelope error alone: no A2A error detail (whose reason would name invalid params).
    expect(await cut.json() as Answer).toEqual({ jsonrpc: '2.0', id: null, error: { code: -32700, message: 'the request body is not valid JSON' } });
    const empty = await post('');
    expect(empty.status).toBe(200);
    expect(await empty.json() as Answer).toMatchObject({ id: null, error: { code: -32700 } });
    // JSON that is not a valid request keeps its own codes: params that are not an object are invalid params.
    const badParams = await post('{"jsonrpc":"2.0","id":6,"method":"GetTask","params":"x"}');
    expect(await badParams.json() as Answer).toMatchObject({ id: 6, error: { code: -32602 } });
    // Admission comes first: without a credential it is still 401, whatever the body.
    expect((await post('{not json', 'Bearer nope')).status).toBe(401);
    // Refused before a method could be read: `a2a.request`.
    const records = (await t.p.root.post<{ data: { action: string; outcome: string; detail: string | null; request_id: string }[] }>('/v1/audit/export', { action: 'a2a.request', limit: 1000 })).data;
    const of = (r: Response) => records.filter((x) => x.request_id === r.headers.get('request-id')).map((x) => ({ action: x.action, outcome: x.outcome, detail: x.detail }));
    expect(of(cut)).toEqual([{ action: 'a2a.request', outcome: 'failed', detail: 'JSONParseError' }]);
    expect(of(empty)).toEqual([{ action: 'a2a.request', outcome: 'failed', detail: 'JSONParseError' }]);
  });

  it('refuses a missing or wrong A2A-Version with VersionNotSupportedError', async () => {
    const missing = await clientFor(userSecret, (h) => h.delete('a2a-version'));
    await rejected(missing.sendMessage(msg('x')), 'VersionNotSupportedError');
    const old = await clientFor(userSecret, (h) => h.set('a2a-version', '0.3'));
    await rejected(old.getTask({ tenant: '', id: 'sess_00000000000000000000000000000000' }), 'VersionNotSupportedError');
  });

  it('audience both ways: an api_mcp bearer is refused here, an a2a bearer by /v1/mcp', async () => {
    const mcpSecret = (await createCredential(t.p.root, userPrincipal, 'api_mcp')).secret;
    const wrong = await clientFor(mcpSecret);
    await expect(wrong.sendMessage(msg('x'))).rejects.toThrow(/401[\s\S]*auth\.invalid_key[\s\S]*audience 'api_mcp'/);
    const mcp = await fetch(`${t.p.baseUrl}/v1/mcp`, {
      method: 'POST', headers: { authorization: `Bearer ${userSecret}`, 'content-type': 'application/json', accept: 'application/json, text/event-stream', 'mcp-protocol-version': '2025-06-18' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list', params: {} }),
    });
    expect(mcp.status).toBe(401);
    expect(JSON.stringify(await mcp.json())).toContain("audience 'a2a'");
    const apiKey = await clientFor(t.p.bootstrap.root_key);
    await expect(apiKey.sendMessage(msg('x'))).rejects.toThrow(/401[\s\S]*auth\.invalid_key/);
    const none = await fetch(endpoint, { method: 'POST', headers: { 'a2a-version': '1.0', 'content-type': 'application/json' }, body: '{"jsonrpc":"2.0","id":1,"method":"GetTask","params":{"id":"x"}}' });
    expect(none.status).toBe(401);
    expect(none.headers.get('www-authenticate')).toBe('Bearer');
  });

  it('a suspended Principal is refused from the next request; a missing assignment is policy.denied; an installed agent cannot call another', async () => {
    const prin = await createPrincipal(t.p.root, ws, 'to-suspend');
    const secret = (await createCredential(t.p.root, prin, 'a2a')).secret;
    const client = await clientFor(secret);
    // No assignments yet: 403 policy.denied, audited as denied.
    await expect(client.sendMessage(msg('x'))).rejects.toThrow(/403[\s\S]*policy\.denied[\s\S]*'invoke'/);
    const audit = await t.p.root.post<{ data: { outcome: string; actor: { id: string } }[] }>('/v1/audit/export', { action: 'a2a.SendMessage', actor: prin });
    expect(audit.data.map((r) => r.outcome)).toEqual(['denied']);
    await grant(prin, { type: 'agent', id: agentId }, ['observe']);
    await grant(prin, { type: 'surface_scope', id: channelId }, ['observe']);
    await expect(client.getTask({ tenant: '', id: 'sess_00000000000000000000000000000000' })).rejects.toMatchObject({ name: 'TaskNotFoundError' });
    await t.p.root.post(`/v1/principals/${prin}/suspend`, {});
    await expect(client.getTask({ tenant: '', id: 'sess_00000000000000000000000000000000' })).rejects.toThrow(/401[\s\S]*auth\.invalid_key/);

    // The installation's own service Principal, even with every grant, never drives another agent here.
    const inst = await t.p.root.get<{ principal_id: string }>(`/v1/agent-installations/${installationId}`);
    await grant(inst.principal_id, { type: 'workspace', id: ws }, ['invoke', 'steer', 'observe']);
    const agentClient = await clientFor((await createCredential(t.p.root, inst.principal_id, 'a2a')).secret);
    await expect(agentClient.sendMessage(msg('x'))).rejects.toThrow(/403[\s\S]*two agents/);
  });

  it('an ActionPolicy on the a2a kind denies a method', async () => {
    const rule = await t.p.root.request<{ id: string }>('POST', '/v1/action-policies', { body: { effect: 'deny', tool: { kind: 'a2a', name: 'ListTasks' }, description: 'no listing over A2A' } });
    expect(rule.status, JSON.stringify(rule.body)).toBe(201);
    const client = await clientFor(userSecret);
    await expect(client.listTasks({ tenant: '', contextId: '', status: TaskState.TASK_STATE_UNSPECIFIED, pageSize: 1, pageToken: '', historyLength: undefined, statusTimestampAfter: undefined, includeArtifacts: undefined }))
      .rejects.toThrow(/403[\s\S]*policy\.denied/);
    await t.p.root.request('DELETE', `/v1/action-policies/${rule.body.id}`);
  });
});
