import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ACTIVE_POOLS_KEY, POOL_MARKS_KEY } from '@agentplane/lease';
import { connectRedis, freePort, type Redis } from '@agentplane/store';
import { waitFor } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnPlatform } from './harness/turns.js';
import { sample } from './harness/metrics.js';

/**
 * A scheduler lets a pool go once no Run was queued in it for POOL_IDLE_MS and its queue is empty
 * (its worker's blocking connection closes, its sweeps stop), and serves it again when a Run comes;
 * a scheduler that starts serves every pool whose queue holds Runs, however old the pool's mark.
 */
let t: TurnPlatform;
let redis: Redis;
let schedulerUrl = '';

beforeAll(async () => {
  const port = await freePort();
  schedulerUrl = `http://127.0.0.1:${port}`;
  t = await startTurnPlatform({ name: 'idle-pools', env: { SCHEDULER_PORT: String(port), POOL_IDLE_MS: '2000', POOL_SCAN_MS: '200' } });
  redis = connectRedis(t.p.redisUrl(), { name: 'test' });
}, 150_000);
afterAll(async () => {
  redis?.disconnect();
  await t?.p.stop();
});

const dispatched = async (): Promise<number> => sample(await (await fetch(`${schedulerUrl}/metrics`)).text(), 'agentplane_scheduler_pools_dispatched');

async function turn(sessionId: string, text: string, idleBefore: number): Promise<void> {
  expect((await t.api.request('POST', `/v1/sessions/${sessionId}/events`, { body: t.msg(text) })).status).toBeLessThan(300);
  const events = await untilEvents(t.api, sessionId, (e) => idleCount(e) > idleBefore, 60_000);
  expect(idleCount(events), 'the turn ended').toBe(idleBefore + 1);
  expect(events.filter((e) => e.type === 'session.status_idle').at(-1)?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
}

describe('idle pools', () => {
  let sessionId = '';
  let pool = '';

  it('a pool with no Run for POOL_IDLE_MS is let go, and a new Run brings it back', async () => {
    sessionId = (await t.api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'scripted', model: 'default', system: SCRIPT([{ when: { user_contains: 'hello' }, then: [{ reply: 'hi' }] }]) },
      environment_id: t.envId,
    })).id;
    await turn(sessionId, 'hello 1', 0);
    pool = Object.keys(await redis.hgetall(ACTIVE_POOLS_KEY))[0] ?? '';
    expect(pool).toMatch(/^rpool_/);
    expect(await dispatched()).toBe(1);
    await waitFor('the idle pool let go', async () => ((await dispatched()) === 0 ? true : undefined), 20_000);

    await turn(sessionId, 'hello 2', 1);
    expect(await dispatched()).toBe(1);
  }, 120_000);

  it('a scheduler that starts serves a pool whose queue holds a Run, though the pool\'s mark is old', async () => {
    const scheduler = t.p.pids().scheduler as number;
    process.kill(scheduler, 'SIGSTOP');
    try {
      const sent = Number((await redis.time())[0]) * 1000;
      expect((await t.api.request('POST', `/v1/sessions/${sessionId}/events`, { body: t.msg('hello 3') })).status).toBeLessThan(300);
      // The Run's mark written: then aged past the idle window, as if queued before an outage.
      await waitFor('the pool marked', async () => (Number(await redis.zscore(POOL_MARKS_KEY, pool)) >= sent - 1000 ? true : undefined), 10_000);
      await redis.zadd(POOL_MARKS_KEY, 0, pool);
      process.kill(scheduler, 'SIGKILL');
      await waitFor('a new scheduler', () => (t.p.pids().scheduler !== scheduler ? true : undefined), 20_000);
      const events = await untilEvents(t.api, sessionId, (e) => idleCount(e) > 2, 60_000);
      expect(idleCount(events), 'the queued turn ran').toBe(3);
      expect(events.filter((e) => e.type === 'session.status_idle').at(-1)?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    } finally {
      try {
        process.kill(scheduler, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }, 120_000);
});
