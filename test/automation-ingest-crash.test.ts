import { existsSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { Webhook } from 'standardwebhooks';
import { waitFor } from './harness/platform.js';
import { useCrashPlatforms } from './harness/crash-platform.js';

/**
 * A signed delivery whose api died after claiming its webhook-id and before writing its receipt
 * (crash point `automation-delivery-claimed`): the sender's retry of it fires at once, under the
 * id the claim names, and a repeat after that answers that receipt. The service Principal holds
 * no `invoke` grant, so the firing is refused at admission, which finishes it without a turn.
 */
const crash = useCrashPlatforms('automation-ingest-crash');

describe('a delivery whose api died between claiming its webhook-id and writing its receipt', () => {
  it('fires at the sender\'s retry, at once, and once', async () => {
    const c = await crash.start(['automation-delivery-claimed'], { env: { AGENTPLANE_MODE: 'development', AUTOMATION_SWEEP_MS: '500' } });
    const api = c.p.root.with({ workspaceId: c.p.bootstrap.workspace_id });
    const service = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${c.p.bootstrap.workspace_id}/principals`, {
      external_subject_id: `robot-${Math.random()}`, principal_type: 'service', display_name: 'robot',
    })).id;
    const envId = (await api.post<{ id: string }>('/v1/environments', {
      name: 'sandbox', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    })).id;
    const agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'hooked', model: 'default' })).id;
    const a = await api.post<{ id: string; signing_secret: string; webhook: { ingest_path: string } }>('/v1/automations', {
      name: 'on delivery', principal_id: service, agent: agentId, environment_id: envId, prompt: 'look at {{event}}', trigger: { type: 'webhook' },
    });
    const body = JSON.stringify({ alert: 'disk full' });
    const at = new Date();
    const headers = { 'content-type': 'application/json', 'webhook-id': 'msg_crash', 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)), 'webhook-signature': new Webhook(a.signing_secret).sign('msg_crash', at, body) };
    const deliver = async () => {
      const res = await fetch(`${c.p.baseUrl}${a.webhook.ingest_path}`, { method: 'POST', headers, body });
      return { status: res.status, body: (await res.json()) as { id: string; duplicate?: boolean } };
    };
    const before = c.p.pids().api;
    await expect(deliver()).rejects.toThrow();
    expect(existsSync(c.marker('automation-delivery-claimed'))).toBe(true);
    await c.apiRestarted(before, { client: api, path: '/v1/automations' });
    const retry = await deliver();
    expect(retry.status).toBe(202);
    const again = await deliver();
    expect([again.status, again.body.id, again.body.duplicate]).toEqual([200, retry.body.id, true]);
    const firings = async () => (await api.get<{ data: { id: string; status: string }[] }>(`/v1/automations/${a.id}/firings`, { limit: 100 })).data;
    const f = await waitFor('the firing settled', async () => (await firings()).find((x) => x.status !== 'pending'), 60_000);
    expect([f.id, f.status]).toEqual([retry.body.id, 'refused']);
    expect(await firings()).toHaveLength(1);
  }, 180_000);
});
