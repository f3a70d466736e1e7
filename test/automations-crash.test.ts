import { existsSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { waitFor } from './harness/platform.js';
import { useCrashPlatforms, type CrashPlatform } from './harness/crash-platform.js';

/**
 * Subscription events and schedule ticks whose work fails or whose api dies (crash points
 * `automation-event-claimed`, `automation-tick-failed`, `webhook-endpoint-disabled`): an event's
 * firing is made by a BullMQ job, retried a bounded number of times and recorded `failed` after
 * the last; a tick whose work threw has its run again queued before its job is failed; an
 * endpoint's disablement is announced again by the delivery step run again after its api died
 * between the disable and the announcement. Each fires exactly once.
 * Subscriptions here are to `webhook_endpoint.disabled`: an endpoint whose receiver answers 410
 * is disabled at its first delivery, no runner needed. The service Principal holds no `invoke`
 * grant, so every firing is refused at admission, which finishes it without a turn.
 */
const crash = useCrashPlatforms('automations-crash');
let c: CrashPlatform;
let api: HttpClient;
let receiver: Server;
let envId: string;
let agentId: string;
let service: string;

interface Firing { id: string; status: string; error: string | null; source: { kind: string; scheduled_at?: string; event_type?: string; event_id?: string } }

beforeAll(async () => {
  c = await crash.start(['automation-event-claimed', 'automation-tick-failed'], { env: { AGENTPLANE_MODE: 'development', AUTOMATION_SWEEP_MS: '500', WEBHOOK_MAX_ATTEMPTS: '1' } });
  api = c.p.root.with({ workspaceId: c.p.bootstrap.workspace_id });
  service = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${c.p.bootstrap.workspace_id}/principals`, {
    external_subject_id: `robot-${Math.random()}`, principal_type: 'service', display_name: 'robot',
  })).id;
  envId = (await api.post<{ id: string }>('/v1/environments', {
    name: 'sandbox', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
  })).id;
  agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'watched', model: 'default' })).id;
  receiver = createServer((req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(410).end());
  });
  await new Promise<void>((r) => receiver.listen(0, '127.0.0.1', () => r()));
}, 120_000);
afterAll(() => {
  receiver?.close();
});

const firingsOf = async (id: string) => (await api.get<{ data: Firing[] }>(`/v1/automations/${id}/firings`, { limit: 100 })).data;

/** A subscription Automation to the disablement of a new endpoint, and what disables that endpoint. */
async function subscribed(prompt = 'look at {{event}}'): Promise<{ automation: string; endpoint: string; disable: () => Promise<void> }> {
  const port = (receiver.address() as { port: number }).port;
  const endpoint = (await api.post<{ id: string }>('/v1/webhook-endpoints', { url: `http://127.0.0.1:${port}/hook`, event_types: ['user.message'] })).id;
  const automation = (await api.post<{ id: string }>('/v1/automations', {
    name: 'on disable', principal_id: service, agent: agentId, environment_id: envId, prompt,
    trigger: { type: 'subscription', event: 'webhook_endpoint.disabled', filter: { webhook_endpoint_ids: [endpoint] } },
  })).id;
  const disable = async () => {
    await api.post('/v1/sessions', { agent: agentId, environment_id: envId, initial_events: [{ type: 'user.message', payload: { content: 'ping', authored_by: service, caused_by: { kind: 'api' } } }] });
  };
  return { automation, endpoint, disable };
}

/** Until `restore` is called, no firing receipt can be written: the firing outbox answers WRONGTYPE. */
async function breakReceipts(): Promise<() => Promise<void>> {
  const redis = c.redis();
  const outbox = 'ap:{g:firing_outbox}:firing_outbox';
  const held = (await redis.exists(outbox)) === 1;
  if (held) await redis.rename(outbox, `${outbox}:aside`);
  await redis.set(outbox, 'not a zset');
  return async () => {
    await redis.del(outbox);
    if (held) await redis.rename(`${outbox}:aside`, outbox);
  };
}

/** Whether an event job of the Automation waits to run again after a failed run. */
async function eventRetryPending(automation: string): Promise<true | undefined> {
  const delayed = await c.redis().zrange('ap:{q:automations}:automations:delayed', 0, -1);
  return delayed.some((m) => m.startsWith(`event-${automation}-`)) ? true : undefined;
}

describe('subscription events', () => {
  // First: the crash point is armed for the first event job of the platform.
  it('an event whose api died before it fired still fires, once', async () => {
    const s = await subscribed();
    const before = c.p.pids().api;
    await s.disable();
    await waitFor('the api died with the event', () => (existsSync(c.marker('automation-event-claimed')) ? true : undefined), 60_000);
    await c.apiRestarted(before, { client: api, path: '/v1/automations' });
    // BullMQ's stalled check gives the event's job to the new api once the dead one's lock expired.
    const f = await waitFor('the event\'s firing settled', async () => (await firingsOf(s.automation)).find((x) => x.status !== 'pending'), 150_000);
    expect([f.status, f.source]).toEqual(['refused', { kind: 'subscription', event_type: 'webhook_endpoint.disabled', event_id: s.endpoint }]);
    expect(await firingsOf(s.automation)).toHaveLength(1);
  }, 240_000);

  it('an event whose firing could not be written at first fires once it can, once', async () => {
    const s = await subscribed();
    const restore = await breakReceipts();
    try {
      await s.disable();
      await waitFor('the event\'s first run failed', () => eventRetryPending(s.automation), 60_000);
    } finally {
      await restore();
    }
    const f = await waitFor('the event\'s firing settled', async () => (await firingsOf(s.automation)).find((x) => x.status !== 'pending'), 60_000);
    expect([f.status, f.source]).toEqual(['refused', { kind: 'subscription', event_type: 'webhook_endpoint.disabled', event_id: s.endpoint }]);
    expect(await firingsOf(s.automation)).toHaveLength(1);
  }, 180_000);

  it('an event whose firing fails at every attempt is recorded as a failed firing after the last, once', async () => {
    const s = await subscribed();
    const restore = await breakReceipts();
    let f: Firing;
    try {
      await s.disable();
      f = await waitFor('the failed firing', async () => (await firingsOf(s.automation))[0], 90_000);
    } finally {
      await restore();
    }
    expect([f.status, f.error, f.source]).toEqual(['failed', 'fire_failed', { kind: 'subscription', event_type: 'webhook_endpoint.disabled', event_id: s.endpoint }]);
    expect((await api.get<{ metrics: Record<string, number> }>(`/v1/automations/${s.automation}`)).metrics).toMatchObject({ fires: 1, failures: 1 });
    expect(await firingsOf(s.automation)).toHaveLength(1);
  }, 180_000);

  it('an event whose prompt is too long once expanded is recorded as a failed firing at once', async () => {
    // 64 KiB as authored; the event's JSON makes it longer.
    const s = await subscribed(`${'x'.repeat(64 * 1024 - 9)}{{event}}`);
    await s.disable();
    const f = await waitFor('the failed firing', async () => (await firingsOf(s.automation))[0], 60_000);
    expect([f.status, f.error]).toEqual(['failed', 'validation.malformed']);
    expect(await firingsOf(s.automation)).toHaveLength(1);
  }, 120_000);
});

describe('schedule ticks', () => {
  it('a tick whose prompt is empty once expanded is recorded as a failed firing at once, not retried unseen', async () => {
    const a = await api.post<{ id: string }>('/v1/automations', {
      name: 'empty ticks', principal_id: service, agent: agentId, environment_id: envId, prompt: '{{event.nothing}}', trigger: { type: 'schedule', interval_seconds: 2 },
    });
    const f = await waitFor('the failed firing', async () => (await firingsOf(a.id))[0], 60_000);
    expect([f.status, f.error, f.source.kind]).toEqual(['failed', 'validation.malformed', 'schedule']);
    const metrics = (await api.get<{ metrics: Record<string, number> }>(`/v1/automations/${a.id}`)).metrics;
    expect(metrics.failures).toBeGreaterThanOrEqual(1);
    expect(metrics.failures).toBe(metrics.fires);
    // No run again of the tick was queued for a refusal no run again changes.
    const again = await c.redis().keys(`ap:{q:automations}:automations:tick-again-${a.id}-*`);
    expect(again).toEqual([]);
    await api.request('DELETE', `/v1/automations/${a.id}`);
  }, 120_000);

  it('a tick whose work failed as its api died still fires, late, once, with its due time', async () => {
    const a = await api.post<{ id: string }>('/v1/automations', {
      name: 'ticks', principal_id: service, agent: agentId, environment_id: envId, prompt: 'look at {{event}}', trigger: { type: 'schedule', interval_seconds: 2 },
    });
    const redis = c.redis();
    // The Automation's document does not parse until a tick has failed on it (and the api died there).
    const doc = `ap:{w:${c.p.bootstrap.workspace_id}}:doc:${a.id}`;
    const saved = String(await redis.get(doc));
    const before = c.p.pids().api;
    await redis.set(doc, '{not json');
    let due: string;
    try {
      await waitFor('the api died as the tick failed', () => (existsSync(c.marker('automation-tick-failed')) ? true : undefined), 60_000);
      const failed = (await redis.zrange('ap:{q:automations}:automations:failed', 0, -1)).filter((m) => m.startsWith(`repeat:automation-${a.id}:`));
      due = new Date(Math.min(...failed.map((m) => Number(m.split(':').at(-1))))).toISOString();
    } finally {
      await redis.set(doc, saved);
    }
    await c.apiRestarted(before, { client: api, path: '/v1/automations' });
    await waitFor('the failed tick\'s firing', async () => ((await firingsOf(a.id)).some((f) => f.source.scheduled_at === due) ? true : undefined), 60_000);
    await api.request('DELETE', `/v1/automations/${a.id}`);
    expect((await firingsOf(a.id)).filter((f) => f.source.scheduled_at === due)).toHaveLength(1);
  }, 240_000);
});

describe('an endpoint disabled as its api died', () => {
  it('still fires its webhook_endpoint.disabled subscriptions, once', async () => {
    const d = await crash.start(['webhook-endpoint-disabled'], { env: { AGENTPLANE_MODE: 'development', AUTOMATION_SWEEP_MS: '500', WEBHOOK_MAX_ATTEMPTS: '1' } });
    const there = d.p.root.with({ workspaceId: d.p.bootstrap.workspace_id });
    const robot = (await there.post<{ id: string }>(`/v1/organizations/workspaces/${d.p.bootstrap.workspace_id}/principals`, {
      external_subject_id: `robot-${Math.random()}`, principal_type: 'service', display_name: 'robot',
    })).id;
    const env = (await there.post<{ id: string }>('/v1/environments', {
      name: 'sandbox', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    })).id;
    const agent = (await there.post<{ id: string }>('/v1/agents', { name: 'watched', model: 'default' })).id;
    const port = (receiver.address() as { port: number }).port;
    const endpoint = (await there.post<{ id: string }>('/v1/webhook-endpoints', { url: `http://127.0.0.1:${port}/hook`, event_types: ['user.message'] })).id;
    const automation = (await there.post<{ id: string }>('/v1/automations', {
      name: 'on disable', principal_id: robot, agent, environment_id: env, prompt: 'look at {{event}}',
      trigger: { type: 'subscription', event: 'webhook_endpoint.disabled', filter: { webhook_endpoint_ids: [endpoint] } },
    })).id;
    const before = d.p.pids().api;
    await there.post('/v1/sessions', { agent, environment_id: env, initial_events: [{ type: 'user.message', payload: { content: 'ping', authored_by: robot, caused_by: { kind: 'api' } } }] });
    await waitFor('the api died as the endpoint was disabled', () => (existsSync(d.marker('webhook-endpoint-disabled')) ? true : undefined), 60_000);
    await d.apiRestarted(before, { client: there, path: '/v1/automations' });
    expect(await there.get(`/v1/webhook-endpoints/${endpoint}`)).toMatchObject({ status: 'disabled', disabled_reason: 'delivery_failed' });
    const listed = async () => (await there.get<{ data: Firing[] }>(`/v1/automations/${automation}/firings`, { limit: 100 })).data;
    // BullMQ's stalled check gives the delivery's job to the new api once the dead one's lock expired.
    const f = await waitFor('the disablement\'s firing settled', async () => (await listed()).find((x) => x.status !== 'pending'), 150_000);
    expect([f.status, f.source]).toEqual(['refused', { kind: 'subscription', event_type: 'webhook_endpoint.disabled', event_id: endpoint }]);
    expect(await listed()).toHaveLength(1);
  }, 300_000);
});
