import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { PresenceStore } from '@agentplane/gateway';
import { connectRedis, freePort, type Redis } from '@agentplane/store';
import { waitFor } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnPlatform } from './harness/turns.js';
import { sample } from './harness/metrics.js';

/**
 * An offer to a runner the directory still lists but that is connected nowhere (it closed its
 * socket since: here, a presence written for a runner that never connected) is answered at once
 * by the gateway node that finds no socket: the scheduler records it as rejected and offers the
 * next runner, instead of waiting out the offer window (long here: 30 s).
 */
let t: TurnPlatform;
let redis: Redis;
let schedulerUrl = '';

beforeAll(async () => {
  const schedulerPort = await freePort();
  schedulerUrl = `http://127.0.0.1:${schedulerPort}`;
  t = await startTurnPlatform({ name: 'offer-undelivered', env: { SCHEDULER_PORT: String(schedulerPort), OFFER_TIMEOUT_MS: '30000' } });
  redis = connectRedis(t.p.redisUrl(), { name: 'test' });
}, 150_000);
afterAll(async () => {
  redis?.disconnect();
  await t?.p.stop();
});

const offers = async (outcome: string): Promise<number> => sample(await (await fetch(`${schedulerUrl}/metrics`)).text(), 'agentplane_lease_offers_total', { outcome });

describe('an offer to a runner connected nowhere', () => {
  it('is rejected at once and the Run goes to the next runner, well inside the offer window', async () => {
    const ws = t.p.bootstrap.workspace_id;
    const presences = new PresenceStore(redis);
    const listed = await t.p.root.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences');
    const realId = listed.data.find((x) => x.status === 'ready')?.runner as string;
    const real = await presences.get(ws, realId);
    expect(real).not.toBeNull();
    // A ready runner with the most free slots (so it is offered first), routed to the node of the
    // real runner's socket, where no socket of its own exists.
    const ghostId = `runner_${randomBytes(16).toString('hex')}`;
    const ghost = structuredClone(real!);
    ghost.presence.runner = ghostId;
    ghost.presence.generation = 1;
    ghost.presence.capabilities = { ...ghost.presence.capabilities, available_slots: 64 } as typeof ghost.presence.capabilities;
    ghost.presence.last_seen_at = new Date().toISOString();
    ghost.presence.expires_at = new Date(Date.now() + 120_000).toISOString();
    expect(await presences.write(ws, ghost, 120_000)).toBe(true);
    await waitFor('the ghost listed', async () => {
      const r = await t.p.root.get<{ data: { runner: string }[] }>('/v1/runner-pools/presences');
      return r.data.some((x) => x.runner === ghostId) ? true : undefined;
    }, 10_000);

    const [rejected, timedOut, accepted] = [await offers('rejected'), await offers('timeout'), await offers('accepted')];
    const sessionId = (await t.api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'scripted', model: 'default', system: SCRIPT([{ when: { user_contains: 'hello' }, then: [{ reply: 'hi' }] }]) },
      environment_id: t.envId,
    })).id;
    const started = Date.now();
    expect((await t.api.request('POST', `/v1/sessions/${sessionId}/events`, { body: t.msg('hello') })).status).toBeLessThan(300);
    // Within a third of the offer window: a timed-out offer to the ghost alone would take all of it.
    const events = await untilEvents(t.api, sessionId, (e) => idleCount(e) >= 1, 20_000);
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(Date.now() - started).toBeLessThan(20_000);
    expect(await offers('rejected')).toBeGreaterThan(rejected);
    expect(await offers('accepted')).toBe(accepted + 1);
    expect(await offers('timeout')).toBe(timedOut);
  }, 60_000);
});
