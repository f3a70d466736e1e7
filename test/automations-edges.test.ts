import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { errType } from './harness/governance.js';

/**
 * Automations without turns (no runner): the ids a subscription's filter names must be of the
 * Workspace, an Automation is deleted once, a feedback label's claim never outlives a failed
 * write of the label, a firing whose watcher failed once is still finished by the sweep, and a
 * schedule tick whose work failed still fires.
 */
let dataDir: string;
let p: Platform;
let api: HttpClient;
let redis: Redis;
let envId: string;
let agentId: string;
let service: string;
let person: string;
let invoker: string;

const base = () => ({ name: 'refs', principal_id: service, agent: agentId, environment_id: envId, prompt: 'look at {{event}}' });

beforeAll(async () => {
  dataDir = mkdtempSync(join(tmpdir(), 'agentplane-automations-edges-'));
  p = await startPlatform({ dataDir, env: { AGENTPLANE_MODE: 'development', AUTOMATION_SWEEP_MS: '500' } });
  api = p.root.with({ workspaceId: p.bootstrap.workspace_id });
  redis = new Redis(p.redisUrl());
  const principal = (principal_type: string, name: string) => api.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: `${name}-${Math.random()}`, principal_type, display_name: name,
  });
  // No `invoke` grant: every firing is refused at admission, which finishes it without a turn.
  service = (await principal('service', 'robot')).id;
  person = (await principal('person', 'reviewer')).id;
  envId = (await api.post<{ id: string }>('/v1/environments', {
    name: 'sandbox', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
  })).id;
  agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'watched', model: 'default' })).id;
  invoker = (await principal('service', 'invoker')).id;
  await api.post('/v1/permission-assignments', { principal_id: invoker, target: { type: 'agent', id: agentId }, actions: ['invoke'] });
}, 120_000);
afterAll(async () => {
  redis?.disconnect();
  await p?.stop();
  if (dataDir) rmSync(dataDir, { recursive: true, force: true });
});

describe('automations without turns', () => {
  it('a subscription filter naming an Agent or endpoint of another Workspace (or none) is 404, on create and on update', async () => {
    const other = (await p.root.post<{ id: string }>(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'refs-other' })).id;
    const there = p.root.with({ workspaceId: other });
    const foreignAgent = (await there.post<{ id: string }>('/v1/agents', { name: 'elsewhere', model: 'default' })).id;
    const foreignEndpoint = (await there.post<{ id: string }>('/v1/webhook-endpoints', { url: 'http://127.0.0.1:9/hook' })).id;
    const ownEndpoint = (await api.post<{ id: string }>('/v1/webhook-endpoints', { url: 'http://127.0.0.1:9/hook' })).id;
    const turns = (agent_ids: string[]) => ({ type: 'subscription', event: 'session.turn_ended', filter: { agent_ids } });
    const disabled = (webhook_endpoint_ids: string[]) => ({ type: 'subscription', event: 'webhook_endpoint.disabled', filter: { webhook_endpoint_ids } });
    for (const trigger of [turns([agentId, foreignAgent]), turns([`agent_${'0'.repeat(32)}`]), disabled([foreignEndpoint]), disabled([ownEndpoint, `whe_${'0'.repeat(32)}`])]) {
      const r = await api.request('POST', '/v1/automations', { body: { ...base(), trigger } });
      expect([trigger, r.status, errType(r)]).toEqual([trigger, 404, 'validation.not_found']);
    }
    const a = await api.post<{ id: string; version: number }>('/v1/automations', { ...base(), trigger: turns([agentId]) });
    const b = await api.post<{ id: string; version: number }>('/v1/automations', { ...base(), trigger: disabled([ownEndpoint]) });
    for (const [id, version, trigger] of [[a.id, a.version, turns([foreignAgent])], [b.id, b.version, disabled([foreignEndpoint])]] as const) {
      const r = await api.request('POST', `/v1/automations/${id}`, { body: { expected_version: version, trigger } });
      expect([r.status, errType(r)]).toEqual([404, 'validation.not_found']);
      expect((await api.get<{ version: number }>(`/v1/automations/${id}`)).version).toBe(version);
    }
  });

  it('an Automation is deleted once: of two deletes one answers and the other is 404; a stale expected_version is 409', async () => {
    for (let i = 0; i < 5; i++) {
      const a = await api.post<{ id: string }>('/v1/automations', { ...base(), trigger: { type: 'webhook' } });
      const both = await Promise.all([api.request('DELETE', `/v1/automations/${a.id}`), api.request('DELETE', `/v1/automations/${a.id}`)]);
      expect(both.map((r) => [r.status, errType(r) ?? null]).sort()).toEqual([[200, null], [404, 'validation.not_found']]);
    }
    const a = await api.post<{ id: string; version: number }>('/v1/automations', { ...base(), trigger: { type: 'webhook' } });
    await api.post(`/v1/automations/${a.id}`, { expected_version: a.version, name: 'renamed' });
    const stale = await api.request('DELETE', `/v1/automations/${a.id}`, { query: { expected_version: String(a.version) } });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);
    expect((await api.get<{ name: string }>(`/v1/automations/${a.id}`)).name).toBe('renamed');
    expect((await api.request('DELETE', `/v1/automations/${a.id}`, { query: { expected_version: String(a.version + 1) } })).status).toBe(200);
  });

  it('a Principal whose label claim was left without its label (a failed write) can still label the firing, once', async () => {
    const a = await api.post<{ id: string }>('/v1/automations', { ...base(), trigger: { type: 'webhook' } });
    const f = await api.post<{ id: string }>(`/v1/automations/${a.id}/fire`, {});
    await waitFor('the firing refused', async () => ((await api.get<{ status: string }>(`/v1/automation-firings/${f.id}`)).status === 'refused' ? true : undefined), 30_000);
    // What a request that claimed the label and then failed before writing it left behind.
    await redis.hset(`ap:{w:${p.bootstrap.workspace_id}}:uniq:firing_feedback:${f.id}`, person, 'x');
    const label = await api.request<{ id: string; disposition: string }>('POST', `/v1/automation-firings/${f.id}/feedback`, { body: { authored_by: person, disposition: 'useful' } });
    expect(label.status).toBe(201);
    const again = await api.request('POST', `/v1/automation-firings/${f.id}/feedback`, { body: { authored_by: person, disposition: 'noisy' } });
    expect([again.status, errType(again)]).toEqual([409, 'validation.conflict']);
    const list = await api.get<{ data: { id: string; disposition: string }[] }>(`/v1/automation-firings/${f.id}/feedback`);
    expect(list.data.map((l) => [l.id, l.disposition])).toEqual([[label.body.id, 'useful']]);
  });

  it('a running firing whose watcher failed once (a Redis error) is still finished by the sweep, and frees its slot', async () => {
    const a = await api.post<{ id: string }>('/v1/automations', { ...base(), principal_id: invoker, trigger: { type: 'webhook' } });
    const fired = await api.post<{ id: string }>(`/v1/automations/${a.id}/fire`, {});
    const f = await waitFor('the firing running', async () => {
      const cur = await api.get<{ status: string; session_id: string | null }>(`/v1/automation-firings/${fired.id}`);
      return cur.status === 'running' ? cur : undefined;
    }, 30_000);
    // The Session's log metadata answers WRONGTYPE until the watcher's next poll has failed; with
    // no attempts left, its job is failed.
    const meta = `ap:{s:${f.session_id}}:log`;
    await redis.rename(meta, `${meta}:aside`);
    await redis.set(meta, 'not a hash');
    try {
      await waitFor('the watch job failed', async () => ((await redis.zscore('ap:{q:automations}:automations:failed', `watch-${fired.id}`)) !== null ? true : undefined), 30_000);
    } finally {
      await redis.del(meta);
      await redis.rename(`${meta}:aside`, meta);
    }
    expect((await api.request('DELETE', `/v1/sessions/${f.session_id}`)).status).toBe(200);
    const done = await waitFor('the firing completed', async () => {
      const cur = await api.get<{ status: string; outcome: string | null; stop_reason: string | null }>(`/v1/automation-firings/${fired.id}`);
      return cur.status === 'completed' ? cur : undefined;
    }, 30_000);
    expect([done.outcome, done.stop_reason]).toEqual(['canceled', 'session_erased']);
    // Its slot (max_concurrent_firings 1) is free again: the next firing is admitted.
    const next = await api.post<{ id: string }>(`/v1/automations/${a.id}/fire`, {});
    const admitted = await waitFor('the next firing admitted', async () => {
      const cur = await api.get<{ status: string; admission: { disposition: string } }>(`/v1/automation-firings/${next.id}`);
      return cur.status !== 'pending' ? cur : undefined;
    }, 30_000);
    expect([admitted.status, admitted.admission.disposition]).toEqual(['running', 'admitted']);
  });

  it('a schedule tick whose work failed (a Redis error) still fires, late, once, with its due time', async () => {
    const a = await api.post<{ id: string }>('/v1/automations', { ...base(), trigger: { type: 'schedule', interval_seconds: 2 } });
    // The Automation's document does not parse until a tick has failed on it.
    const doc = `ap:{w:${p.bootstrap.workspace_id}}:doc:${a.id}`;
    const saved = String(await redis.get(doc));
    await redis.set(doc, '{not json');
    let failed: string;
    try {
      failed = await waitFor('a failed tick', async () => (await redis.zrange('ap:{q:automations}:automations:failed', 0, -1)).find((m) => m.startsWith(`repeat:automation-${a.id}:`)), 30_000);
    } finally {
      await redis.set(doc, saved);
    }
    const due = new Date(Number(failed.split(':').at(-1))).toISOString();
    const firingsOf = async () => (await api.get<{ data: { source: { scheduled_at?: string } }[] }>(`/v1/automations/${a.id}/firings`, { limit: 100 })).data;
    await waitFor('the failed tick\'s firing', async () => ((await firingsOf()).some((f) => f.source.scheduled_at === due) ? true : undefined), 30_000);
    await api.request('DELETE', `/v1/automations/${a.id}`);
    expect((await firingsOf()).filter((f) => f.source.scheduled_at === due)).toHaveLength(1);
  });
});
