import { existsSync, rmSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { sha256Hex } from '@agentplane/core';
import { useCrashPlatforms, type CrashPlatform } from './harness/crash-platform.js';
import { errType } from './harness/governance.js';
import { developerWorkspace, type Json } from './harness/turns.js';

type Session = { id: string; status: string; agent: { id: string } };
type Event = { id: string; type: string };

/**
 * The API killed inside a keyed create, right after a write (crash points `session-created`:
 * the Session written, not its initial events; `session-agent-created`: an inline agent's Agent
 * written, not the Session; `session-resource-added`: a Resource added), and the key's pending
 * record gone as it goes once its owner is dead (here removed, as its expiry would): the retry
 * under the key finds what its first attempt wrote (the ids are derived from the key), finishes
 * the rest once, and answers 201 as the first would have. Another request under the key is 409
 * `idempotency.conflict`, and leaves the key to the first.
 */
describe('a crash inside a keyed Session create', () => {
  const crash = useCrashPlatforms('session-create-crash');
  let q: CrashPlatform;
  let api: HttpClient;
  let principal: string;
  let envId: string;
  let ws: string;
  /**
   * A platform of its own for each test (a supervisor gives up on an API that dies five times in
   * a minute), with `points` armed.
   */
  const start = async (points: string[]) => {
    q = await crash.start(points, { env: { LOG_LEVEL: 'warn' } });
    ({ api, principal, envId } = await developerWorkspace(q.p, 'session-create-crash'));
    ws = q.p.bootstrap.workspace_id;
  };

  const msg = (content: string) => ({ type: 'user.message', payload: { content, authored_by: principal, caused_by: { kind: 'api' } } });
  /** Sends the create the API dies in (at `point`, armed again first); then drops the key's pending record, as its expiry would. */
  const crashing = async (key: string, b: Json, point = 'session-created', path = '/v1/sessions') => {
    rmSync(q.marker(point), { force: true });
    const before = q.p.pids().api;
    await expect(api.request('POST', path, { body: b, idempotencyKey: key })).rejects.toThrow();
    expect(existsSync(q.marker(point))).toBe(true);
    await q.apiRestarted(before, { client: api, path: '/v1/agents' });
    const record = `ap:{w:${ws}}:idem:${sha256Hex(key)}`;
    expect(await q.redis().get(record)).toContain('"pending"');
    expect(await q.redis().del(record)).toBe(1);
  };
  const sessions = async () => (await api.get<{ data: Session[] }>('/v1/sessions', { include_archived: true, limit: 100 })).data.map((s) => s.id);
  const agents = async () => (await api.get<{ data: { id: string }[] }>('/v1/agents', { limit: 100 })).data.map((a) => a.id);
  const messages = async (id: string) => {
    const threads = await api.get<{ data: { id: string }[] }>(`/v1/sessions/${id}/threads`);
    return (await api.get<{ data: Event[] }>(`/v1/sessions/${id}/threads/${threads.data[0]?.id}/events`)).data.filter((e) => e.type === 'user.message');
  };
  const runs = async (id: string) => (await api.get<{ data: unknown[] }>(`/v1/sessions/${id}/runs`)).data;

  it('makes one Session (one Resource), answered to the retry; another body under the key is a conflict', async () => {
    await start(['session-created', 'session-resource-added']);
    const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'a', model: 'default', system: 'hi' })).id;
    const body = (content: string): Json => ({ agent, environment_id: envId, title: content, initial_events: [msg(content), msg(`${content} again`)] });
    const already = await sessions();

    await crashing('k-one', body('one'));
    // The point fired once (its marker made): this create runs through, an answer to compare with.
    const plain = await api.request<Json>('POST', '/v1/sessions', { body: { agent, environment_id: envId } });
    expect(plain.status).toBe(201);
    const retry = await api.request<Session>('POST', '/v1/sessions', { body: body('one'), idempotencyKey: 'k-one' });
    expect(retry.status).toBe(201);
    expect(retry.body.id).toMatch(/^sess_[0-9a-f]{32}$/);
    expect(Object.keys(retry.body).sort()).toEqual(Object.keys(plain.body).sort());
    expect(retry.body).toMatchObject({ title: 'one' });
    const made = async () => (await sessions()).filter((id) => id !== plain.body.id && !already.includes(id));
    expect(await made()).toEqual([retry.body.id]);
    // Its initial events, appended once, and the turn of the first one started once.
    expect(await messages(retry.body.id)).toHaveLength(2);
    expect(await runs(retry.body.id)).toHaveLength(1);
    // The key's record is the retry's now: replayed.
    const replay = await api.request<Session>('POST', '/v1/sessions', { body: body('one'), idempotencyKey: 'k-one' });
    expect([replay.status, replay.body.id, replay.headers.get('idempotent-replayed')]).toEqual([201, retry.body.id, 'true']);

    // Under another key, another request after the crash is a conflict; the same one gets the Session.
    await crashing('k-two', body('two'));
    const other = await api.request('POST', '/v1/sessions', { body: body('other'), idempotencyKey: 'k-two' });
    expect([other.status, errType(other)]).toEqual([409, 'idempotency.conflict']);
    const [written] = (await made()).filter((id) => id !== retry.body.id);
    expect(written).toMatch(/^sess_[0-9a-f]{32}$/);
    const same = await api.request<Session>('POST', '/v1/sessions', { body: body('two'), idempotencyKey: 'k-two' });
    expect([same.status, same.body.id]).toEqual([201, written]);
    expect(await made()).toHaveLength(2);
    expect(await messages(same.body.id)).toHaveLength(2);
    expect(await runs(same.body.id)).toHaveLength(1);

    // A keyed Resource add, whose API dies right after the Resource was written.
    const resources = `/v1/sessions/${same.body.id}/resources`;
    const repo = (name: string) => ({ type: 'repository', url: `https://git.example.com/${name}.git` });
    const listed = async () => (await api.get<{ data: { id: string; url: string }[] }>(resources)).data;
    await crashing('r-one', repo('one'), 'session-resource-added', resources);
    const added = await api.request<{ id: string; url: string }>('POST', resources, { body: repo('one'), idempotencyKey: 'r-one' });
    expect([added.status, added.body.url]).toEqual([201, 'https://git.example.com/one.git']);
    expect(added.body.id).toMatch(/^sres_[0-9a-f]{32}$/);
    expect((await listed()).map((r) => r.id)).toEqual([added.body.id]);
    await crashing('r-two', repo('two'), 'session-resource-added', resources);
    const otherRepo = await api.request('POST', resources, { body: repo('other'), idempotencyKey: 'r-two' });
    expect([otherRepo.status, errType(otherRepo)]).toEqual([409, 'idempotency.conflict']);
    const sameRepo = await api.request<{ id: string }>('POST', resources, { body: repo('two'), idempotencyKey: 'r-two' });
    expect(sameRepo.status).toBe(201);
    expect((await listed()).map((r) => [r.id, r.url])).toEqual([[added.body.id, 'https://git.example.com/one.git'], [sameRepo.body.id, 'https://git.example.com/two.git']]);
  }, 180_000);

  it("writes an inline agent's Agent once, across a crash before the Session; none for a create refused for a spent budget", async () => {
    await start(['session-agent-created']);
    const body = { agent: { name: 'inline', model: 'default', system: 'inline' }, environment_id: envId, initial_events: [msg('go')] };
    const before = await agents();
    const beforeSessions = await sessions();
    await crashing('k-inline', body, 'session-agent-created');
    const retry = await api.request<Session>('POST', '/v1/sessions', { body, idempotencyKey: 'k-inline' });
    expect(retry.status).toBe(201);
    const made = (await agents()).filter((id) => !before.includes(id));
    expect(made).toEqual([retry.body.agent.id]);
    expect((await sessions()).filter((id) => !beforeSessions.includes(id))).toEqual([retry.body.id]);
    expect(await runs(retry.body.id)).toHaveLength(1);

    // Refused before anything is written: no Agent either (with the point armed again, one written would end the API).
    rmSync(q.marker('session-agent-created'));
    const refused = {
      agent: { name: 'refused', model: 'default' }, environment_id: envId, budget: { max_list_cost: { amount: 0 } }, initial_events: [msg('go')],
    };
    const all = await agents();
    for (const key of [undefined, 'k-refused', 'k-refused']) {
      const r = await api.request('POST', '/v1/sessions', { body: refused, ...(key ? { idempotencyKey: key } : {}) });
      expect([r.status, errType(r)]).toEqual([429, 'budget.exceeded']);
    }
    expect(await agents()).toEqual(all);
    expect(existsSync(q.marker('session-agent-created'))).toBe(false);
  }, 180_000);
  it("makes a deployment's Session once across a crash, answered to the retry", async () => {
    await start(['session-created']);
    const root = q.p.root;
    const agent = await api.post<{ id: string; version: number }>('/v1/agents', { name: 'deployed', model: 'default', system: 'hi' });
    const hprof = (await root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/harness-profiles`, { key: 'crash', kind: 'builtin' })).id;
    const sprof = (await root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/sandbox-profiles`, { key: 'crash', image: 'agentplane/sandbox:latest' })).id;
    const mrp = (await root.get<{ data: { id: string }[] }>(`/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key: 'default' })).data[0]?.id;
    const head = (await root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: agent.id, key: 'crash' })).id;
    await root.post(`/v1/agent-deployments/${head}/revisions`, {
      expected_resource_version: 1, agent_release_number: agent.version, model_routing: { model_routing_profile_id: mrp, model_routing_profile_revision_number: 1 },
      execution_target: { type: 'managed', harness_profile_id: hprof, harness_profile_revision_number: 1, sandbox_profile_id: sprof, sandbox_profile_revision_number: 1, harness_topology: 'split' },
      skill_selections: [], connection_binding_selections: [],
    });
    const path = `/v1/agent-deployments/${head}/sessions`;
    const body = { initial_events: [msg('deployed')] };
    const before = await sessions();
    await crashing('k-deployed', body, 'session-created', path);
    const retry = await api.request<Session>('POST', path, { body, idempotencyKey: 'k-deployed' });
    expect(retry.status).toBe(201);
    expect((await sessions()).filter((id) => !before.includes(id))).toEqual([retry.body.id]);
    expect(await messages(retry.body.id)).toHaveLength(1);
    expect(await runs(retry.body.id)).toHaveLength(1);
  }, 180_000);
});
