import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnPlatform } from './harness/turns.js';

/**
 * A runner whose slots the control plane counts all taken (the slots of its last heartbeat, less
 * the offers it accepted since) reports a freed slot at once, not at its next heartbeat: with one
 * slot and a heartbeat a minute apart, a second Run queued behind the first is leased right after
 * the first ends. Without the early heartbeat it would wait for the runner's next regular one
 * (tens of seconds here).
 */
let t: TurnPlatform;

beforeAll(async () => {
  t = await startTurnPlatform({ name: 'slot-freed', env: { RUNNER_MAX_SLOTS: '1', RUNNER_HEARTBEAT_INTERVAL_MS: '60000', RUNNER_PRESENCE_TTL_MS: '240000' } });
}, 150_000);
afterAll(async () => {
  await t?.p.stop();
});

interface RunView { id: string; status: string; timestamps: { leased_at: string | null; ended_at: string | null } }

describe('a runner with every slot taken', () => {
  it('takes the next Run right after a turn ends, not at its next heartbeat', async () => {
    const agent = { name: 'scripted', model: 'default', system: SCRIPT([{ when: { user_contains: 'hello' }, then: [{ reply: 'hi' }] }]) };
    const [first, second] = await Promise.all([0, 1].map(async () => (await t.api.post<{ id: string }>('/v1/sessions', { agent, environment_id: t.envId })).id)) as [string, string];
    expect((await t.api.request('POST', `/v1/sessions/${first}/events`, { body: t.msg('hello') })).status).toBeLessThan(300);
    expect((await t.api.request('POST', `/v1/sessions/${second}/events`, { body: t.msg('hello') })).status).toBeLessThan(300);
    await untilEvents(t.api, first, (e) => idleCount(e) >= 1, 30_000);
    await untilEvents(t.api, second, (e) => idleCount(e) >= 1, 30_000);
    const runOf = async (session: string) => (await t.api.get<{ data: RunView[] }>(`/v1/sessions/${session}/runs`)).data[0] as RunView;
    const [a, b] = [await runOf(first), await runOf(second)];
    expect(a.status).toBe('succeeded');
    expect(b.status).toBe('succeeded');
    // One slot: the Runs went one after the other, in either order.
    const [earlier, later] = Date.parse(a.timestamps.leased_at ?? '') <= Date.parse(b.timestamps.leased_at ?? '') ? [a, b] : [b, a];
    const gap = Date.parse(later.timestamps.leased_at ?? '') - Date.parse(earlier.timestamps.ended_at ?? '');
    expect(gap).toBeLessThan(10_000);
  }, 90_000);
});
