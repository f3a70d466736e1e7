import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { PresenceStore } from '@agentplane/gateway';
import { type Redis } from '@agentplane/store';
import { PresenceDirectory } from './presence-directory.js';

let redis: Redis;

const testRedis = useEmbeddedRedis('presence-dir');
beforeAll(async () => {
  redis = testRedis();
});

const WS = 'wrkspc_dir';
const POOL = 'rpool_dir';

async function present(runner: string, slots = 1, at = Date.now()): Promise<void> {
  const now = at;
  await new PresenceStore(redis).write(WS, {
    presence: {
      runner, runner_pool: POOL, generation: 1, placement: 'local', status: 'ready', placement_conformance_digests: [],
      capabilities: { protocol_versions: [1], available_slots: slots, drivers: ['docker'], plane_protocols: [], providers: [] },
      last_seen_at: new Date(now).toISOString(), expires_at: new Date(now + 60_000).toISOString(),
    },
    route: { node_id: 'gw_1', connection_id: 'c_1', credential_id: 'rcred_1' },
  }, 60_000);
}

const ids = (views: { runner_id: string }[]) => views.map((v) => v.runner_id).sort();

describe('the presence directory', () => {
  it('serves a view while it is refreshed in the background, shares one read between callers, and reads now when asked to', async () => {
    // Every view is past `cacheMs` at once, and served while a refresh runs for a minute.
    const directory = new PresenceDirectory(redis, () => WS, 0, 60_000);
    await present('runner_a');
    expect(ids(await directory.live(POOL))).toEqual(['runner_a']);

    await present('runner_b');
    // The view held is served at once; the refresh it started is the one both callers share.
    const [served, again] = await Promise.all([directory.live(POOL), directory.live(POOL)]);
    expect(ids(served)).toEqual(['runner_a']);
    expect(again).toBe(served);
    // Asked for a fresh view: the read under way (or a new one) is waited for.
    expect(ids(await directory.live(POOL, true))).toEqual(['runner_a', 'runner_b']);

    // A view older than `staleMs` is never served: the read is waited for.
    const strict = new PresenceDirectory(redis, () => WS, 0, 0);
    expect(ids(await strict.live(POOL))).toEqual(['runner_a', 'runner_b']);
    await present('runner_c');
    expect(ids(await strict.live(POOL))).toEqual(['runner_a', 'runner_b', 'runner_c']);
  });

  it('keeps the view of a runner whose presence did not change, and reads a changed one anew', async () => {
    const directory = new PresenceDirectory(redis, () => WS, 0, 0);
    const at = Date.now();
    await present('runner_k1', 2, at);
    await present('runner_k2', 2, at);
    const pool = POOL;
    const one = new Map((await directory.live(pool)).map((v) => [v.runner_id, v]));
    // runner_k2 reports a slot taken (a new presence); runner_k1's is written again as it was.
    await present('runner_k1', 2, at);
    await present('runner_k2', 1, at + 1);
    const two = new Map((await directory.live(pool)).map((v) => [v.runner_id, v]));
    expect(two.get('runner_k1')).toBe(one.get('runner_k1'));
    expect(two.get('runner_k1')?.capabilities).toBe(one.get('runner_k1')?.capabilities);
    expect(two.get('runner_k2')).not.toBe(one.get('runner_k2'));
    expect(two.get('runner_k2')?.capabilities.available_slots).toBe(1);
    expect(one.get('runner_k2')?.capabilities.available_slots).toBe(2);
    expect(two.get('runner_k2')?.seen_at).toBe(new Date(at + 1).toISOString());
  });
});
