import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { developerWorkspace, type Json } from './harness/turns.js';
import { errType } from './harness/governance.js';

/**
 * The tools an Agent version declares are offered to the model by name: each name once (a model
 * provider refuses two tools of one name, so such a version could never run), and a
 * coordinator's own tools never take a delegation tool's name, on a new version as on the first;
 * nor does a custom tool take the name of the built-in `skill` tool a Run offers beside them to
 * open its skills.
 */
let p: Platform;
let api: HttpClient;
let envId: string;

const custom = (name: string): Json => ({ type: 'custom', name, description: `the ${name} tool`, input_schema: { type: 'object' } });

beforeAll(async () => {
  p = await startPlatform();
  ({ api, envId } = await developerWorkspace(p, 'agents-tools'));
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

describe('agent tool names', () => {
  it('refuses a tool name declared twice on create, on a new version and inline in a Session', async () => {
    const twice: Json[][] = [
      [custom('lookup'), custom('lookup')],
      [{ type: 'builtin', name: 'bash' }, custom('bash')],
      [{ type: 'builtin', name: 'read' }, { type: 'builtin', name: 'read', permission: 'always_ask' }],
    ];
    for (const tools of twice) {
      const created = await api.request('POST', '/v1/agents', { body: { name: 'twice', model: 'default', tools } });
      expect([created.status, errType(created)], JSON.stringify(tools)).toEqual([400, 'validation.malformed']);
      const inline = await api.request('POST', '/v1/sessions', { body: { agent: { name: 'twice', model: 'default', tools }, environment_id: envId } });
      expect([inline.status, errType(inline)], JSON.stringify(tools)).toEqual([400, 'validation.malformed']);
    }
    const agent = await api.post<{ id: string; version: number }>('/v1/agents', { name: 'once', model: 'default', tools: [custom('lookup'), { type: 'builtin', name: 'bash' }] });
    const next = await api.request('POST', `/v1/agents/${agent.id}`, { body: { expected_version: agent.version, tools: [custom('lookup'), custom('lookup')] } });
    expect([next.status, errType(next)]).toEqual([400, 'validation.malformed']);
    expect((await api.get<{ version: number }>(`/v1/agents/${agent.id}`)).version).toBe(1);
    // Distinct names are fine.
    const ok = await api.request<{ version: number }>('POST', `/v1/agents/${agent.id}`, { body: { expected_version: agent.version, tools: [custom('lookup'), custom('fetch')] } });
    expect([ok.status, ok.body.version]).toEqual([200, 2]);
  });

  it('takes the built-in tools a runner offers, list among them, and refuses web tools no runner has', async () => {
    const offered = ['bash', 'read', 'write', 'edit', 'list', 'glob', 'grep', 'ask_user'].map((name) => ({ type: 'builtin', name }));
    expect((await api.request('POST', '/v1/agents', { body: { name: 'builtins', model: 'default', tools: offered } })).status).toBe(201);
    for (const name of ['web_fetch', 'web_search']) {
      const r = await api.request('POST', '/v1/agents', { body: { name: 'web', model: 'default', tools: [{ type: 'builtin', name }] } });
      expect([name, r.status, errType(r)]).toEqual([name, 400, 'validation.malformed']);
    }
  });

  it("refuses a delegation tool's name among a coordinator's tools on a new version", async () => {
    const member = await api.post<{ id: string; version: number }>('/v1/agents', { name: 'member', model: 'default' });
    const coordinator = await api.post<{ id: string; version: number }>('/v1/agents', {
      name: 'coordinator', model: 'default', multiagent: { roster: [{ agent_id: member.id, version: member.version }] },
    });
    const next = await api.request('POST', `/v1/agents/${coordinator.id}`, { body: { expected_version: coordinator.version, tools: [custom('start_thread')] } });
    expect([next.status, errType(next)]).toEqual([400, 'validation.malformed']);
    expect((await api.get<{ version: number }>(`/v1/agents/${coordinator.id}`)).version).toBe(1);
    // An Agent that is not a coordinator may name a tool so; making it one then checks its tools.
    const plain = await api.post<{ id: string; version: number }>('/v1/agents', { name: 'plain', model: 'default', tools: [custom('start_thread')] });
    const promoted = await api.request('POST', `/v1/agents/${plain.id}`, { body: { expected_version: plain.version, multiagent: { roster: [{ agent_id: member.id, version: member.version }] } } });
    expect([promoted.status, errType(promoted)]).toEqual([400, 'validation.malformed']);
  });

  it('refuses a custom tool named skill (the built-in tool skills are opened with) on create, on a new version and on a Session\'s agent', async () => {
    const tools = [custom('lookup'), custom('skill')];
    const created = await api.request('POST', '/v1/agents', { body: { name: 'skilled', model: 'default', tools } });
    expect([created.status, errType(created)]).toEqual([400, 'validation.malformed']);
    expect((created.body as { error: { message: string } }).error.message).toMatch(/tools\[1\]\.name: 'skill'/);
    const inline = await api.request('POST', '/v1/sessions', { body: { agent: { name: 'skilled', model: 'default', tools }, environment_id: envId } });
    expect([inline.status, errType(inline)]).toEqual([400, 'validation.malformed']);
    const agent = await api.post<{ id: string; version: number }>('/v1/agents', { name: 'skilled', model: 'default', tools: [custom('lookup')] });
    const next = await api.request('POST', `/v1/agents/${agent.id}`, { body: { expected_version: agent.version, tools } });
    expect([next.status, errType(next)]).toEqual([400, 'validation.malformed']);
    expect((await api.get<{ version: number }>(`/v1/agents/${agent.id}`)).version).toBe(1);
    const session = await api.post<{ id: string }>('/v1/sessions', { agent: agent.id, environment_id: envId });
    const changed = await api.request('POST', `/v1/sessions/${session.id}`, { body: { agent: { tools } } });
    expect([changed.status, errType(changed)]).toEqual([400, 'validation.malformed']);
    // Names that only resemble it are the Agent's own.
    const ok = await api.request<{ version: number }>('POST', `/v1/agents/${agent.id}`, { body: { expected_version: agent.version, tools: [custom('skills'), custom('skill_lookup')] } });
    expect([ok.status, ok.body.version]).toEqual([200, 2]);
  });
});
