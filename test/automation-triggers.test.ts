import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Webhook } from 'standardwebhooks';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { developerWorkspace } from './harness/turns.js';
import { errType } from './harness/governance.js';

/**
 * Automation triggers as written, against a real platform (no runner: nothing here needs a turn):
 * cron expressions the api refuses, a cron time in a time zone whose clock skips it, and where
 * a disabled Workspace comes in the order of an ingest delivery's checks.
 */
let p: Platform;
let api: HttpClient;
let envId: string;
let agentId: string;
let service: string;

beforeAll(async () => {
  p = await startPlatform({ env: { AGENTPLANE_MODE: 'development' } });
  ({ api, envId } = await developerWorkspace(p, 'automation-triggers'));
  agentId = (await api.post<{ id: string }>('/v1/agents', { name: 'triggered', model: 'default' })).id;
  service = (await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: 'trigger-bot', principal_type: 'service', display_name: 'bot',
  })).id;
}, 120_000);
afterAll(async () => {
  await p?.stop();
});

const create = (trigger: Record<string, unknown>) => api.request<{ next_fire_at: string | null; error?: { message: string } }>('POST', '/v1/automations', {
  body: { name: 'scheduled', principal_id: service, agent: agentId, environment_id: envId, prompt: 'tick {{event}}', trigger },
});

/**
 * The soonest local date (within a year and a half) whose midnight the clock of one of these
 * zones skips (its change to summer time is at 00:00), with the zone.
 */
function nextSkippedMidnight(): { tz: string; day: string } {
  let best: { tz: string; day: string; at: number } | null = null;
  for (const tz of ['America/Santiago', 'America/Havana', 'Africa/Cairo', 'Asia/Beirut', 'America/Asuncion']) {
    const fmt = new Intl.DateTimeFormat('sv-SE', { timeZone: tz, year: 'numeric', month: '2-digit', day: '2-digit', hour: '2-digit', hourCycle: 'h23' });
    for (let t = Date.now() + 3_600_000; t < Date.now() + 550 * 86_400_000 && (!best || t < best.at); t += 3_600_000) {
      const [before, after] = [fmt.format(new Date(t - 3_600_000)), fmt.format(new Date(t))];
      if (before.endsWith(' 23') && after.endsWith(' 01')) {
        best = { tz, day: after.slice(0, 10), at: t };
        break;
      }
    }
  }
  if (!best) throw new Error('no zone skips its midnight within the search');
  return { tz: best.tz, day: best.day };
}

describe('cron schedules as written', () => {
  it('refuses an expression with a missing or an extra field (or a predefined one), and a hashed value (H), with 400; accepts 5 and 6 fields', async () => {
    for (const [cron, message] of [
      ['0 9 1-5 *', /5 fields .* or 6 .*not 4/],
      ['0 0 9 * * * 2027', /not 7/],
      ['@midnight', /not 1/],
      ['H * * * *', /minute field uses H/],
      ['0 0 * * H', /day of week field uses H/],
    ] as const) {
      const r = await create({ type: 'schedule', cron, timezone: 'UTC' });
      expect([cron, r.status, errType(r)]).toEqual([cron, 400, 'validation.malformed']);
      expect(r.body.error?.message).toMatch(message);
    }
    for (const cron of ['0 9 * * MON-FRI', '0 0 * * THU', '*/30 0 9 * * *', '0 0 L * *']) {
      const r = await create({ type: 'schedule', cron, timezone: 'Europe/Paris' });
      expect([cron, r.status]).toEqual([cron, 201]);
    }
  });

  it('schedules a local time the clock skips on its own day (at the change), not a year later', async () => {
    const { tz, day } = nextSkippedMidnight();
    const [, month, date] = day.split('-').map(Number);
    const a = await create({ type: 'schedule', cron: `0 0 ${date} ${month} *`, timezone: tz });
    expect(a.status).toBe(201);
    const next = new Date(String(a.body.next_fire_at));
    expect([tz, next.toLocaleString('sv-SE', { timeZone: tz })]).toEqual([tz, `${day} 01:00:00`]);
  });
});

describe('signed deliveries to a disabled Workspace', () => {
  it('are refused 403 before the body is read as JSON or the webhook-id is looked up', async () => {
    const ws = await p.root.post<{ id: string; version: number }>(`/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { name: 'disabled-ingest' });
    const inWs = p.root.with({ workspaceId: ws.id });
    const bot = (await inWs.post<{ id: string }>(`/v1/organizations/workspaces/${ws.id}/principals`, { external_subject_id: 'ingest-bot', principal_type: 'service', display_name: 'bot' })).id;
    const env = (await inWs.post<{ id: string }>('/v1/environments', { name: 'e', image: 'agentplane/sandbox:latest' })).id;
    const agent = (await inWs.post<{ id: string }>('/v1/agents', { name: 'a', model: 'default' })).id;
    const hook = await inWs.post<{ signing_secret: string; webhook: { ingest_path: string } }>('/v1/automations', {
      name: 'hook', principal_id: bot, agent, environment_id: env, prompt: 'p {{event}}', trigger: { type: 'webhook' },
    });
    const send = async (body: string, id: string) => {
      const at = new Date();
      const res = await fetch(`${p.baseUrl}${hook.webhook.ingest_path}`, {
        method: 'POST', body,
        headers: { 'webhook-id': id, 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)), 'webhook-signature': new Webhook(hook.signing_secret).sign(id, at, body) },
      });
      return [res.status, ((await res.json()) as { error?: { type: string } }).error?.type ?? null];
    };
    expect(await send('{"n":1}', 'msg_before_disable')).toEqual([202, null]);
    const off = await p.root.request('PATCH', `/v1/organizations/workspaces/${ws.id}`, { body: { expected_version: ws.version, status: 'disabled' } });
    expect(off.status).toBe(200);
    expect(await send('{not json', 'msg_malformed')).toEqual([403, 'auth.disabled_tenancy']);
    expect(await send('{"n":1}', 'msg_before_disable')).toEqual([403, 'auth.disabled_tenancy']);
  });
});
