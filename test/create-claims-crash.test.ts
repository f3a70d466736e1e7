import { existsSync, rmSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { useCrashPlatforms } from './harness/crash-platform.js';
import { errType } from './harness/governance.js';

type Credential = { id: string; key: string; provider_key: string; status: string; active_generation_number: number };
type Pool = { id: string; name: string; placement: string; status: string };

/**
 * The API killed right after a ModelCredential or a runner pool was created (crash points
 * `model-credential-created` and `runner-pool-created`): the key was claimed in the script that
 * wrote the resource, so the resource is whole, and the next create with its key is 409 with the
 * key held by that resource, never by nothing.
 */
describe('a crash right after a keyed create', () => {
  const crash = useCrashPlatforms('create-claims-crash');

  it('leaves the resource whole and its key held by it', async () => {
    const q = await crash.start(['model-credential-created', 'runner-pool-created'], { env: { LOG_LEVEL: 'warn' } });
    const c = q.p.root;
    const ws = q.p.bootstrap.workspace_id;
    const redis = q.redis();
    const restarted = (before: number | undefined) => q.apiRestarted(before, { client: c, path: '/v1/agents' });
    const credentials = `/v1/organizations/workspaces/${ws}/model-credentials`;
    const held = (collection: string, key: string) => redis.hget(`ap:{w:${ws}}:uniq:${collection}`, key);

    // The Workspace's first models request seeds its `default` credential: the API dies as it is created.
    let before = q.p.pids().api;
    await expect(c.request('GET', credentials)).rejects.toThrow();
    expect(existsSync(q.marker('model-credential-created'))).toBe(true);
    await restarted(before);
    const seeded = await c.get<{ data: Credential[] }>(credentials, { key: 'default' });
    expect(seeded.data).toEqual([expect.objectContaining({ key: 'default', provider_key: 'scripted', status: 'active' })]);
    const again = await c.request('POST', credentials, { body: { key: 'default', provider_key: 'scripted' } });
    expect([again.status, errType(again)]).toEqual([409, 'validation.conflict']);
    expect(await held('model_credentials', 'default')).toBe(seeded.data[0]?.id);

    // Armed again: a credential with a secret, whose API dies right after the create.
    rmSync(q.marker('model-credential-created'));
    before = q.p.pids().api;
    const body = { key: 'crashy', provider_key: 'openai', base_url: 'http://127.0.0.1:9/v1', secret: 'sk-test-crash' };
    await expect(c.request('POST', credentials, { body })).rejects.toThrow();
    expect(existsSync(q.marker('model-credential-created'))).toBe(true);
    await restarted(before);
    const listed = await c.get<{ data: Credential[] }>(credentials, { key: 'crashy' });
    expect(listed.data).toEqual([expect.objectContaining({ key: 'crashy', provider_key: 'openai', status: 'active', active_generation_number: 1 })]);
    const cred = listed.data[0] as Credential;
    expect(await c.get<Credential>(`/v1/model-credentials/${cred.id}`)).toMatchObject({ id: cred.id, key: 'crashy' });
    expect(await redis.exists(`ap:{w:${ws}}:mcred_secret:${cred.id}:1`)).toBe(1);
    const dup = await c.request('POST', credentials, { body });
    expect([dup.status, errType(dup)]).toEqual([409, 'validation.conflict']);
    expect(await held('model_credentials', 'crashy')).toBe(cred.id);

    // A runner pool whose API dies right after the create.
    before = q.p.pids().api;
    await expect(c.request('POST', '/v1/runner-pools', { body: { name: 'crashy', placement: 'managed' } })).rejects.toThrow();
    expect(existsSync(q.marker('runner-pool-created'))).toBe(true);
    await restarted(before);
    const pools = await c.get<{ data: Pool[] }>('/v1/runner-pools', { limit: 100 });
    const mine = pools.data.filter((p) => p.name === 'crashy');
    expect(mine).toEqual([expect.objectContaining({ name: 'crashy', placement: 'managed', status: 'active' })]);
    const pool = mine[0] as Pool;
    expect(await c.get<Pool>(`/v1/runner-pools/${pool.id}`)).toMatchObject({ id: pool.id, name: 'crashy' });
    const dupPool = await c.request('POST', '/v1/runner-pools', { body: { name: 'crashy', placement: 'byoc' } });
    expect([dupPool.status, errType(dupPool)]).toEqual([409, 'validation.conflict']);
    expect(await held('runner_pool_names', 'crashy')).toBe(pool.id);

    // A key or name claimed for a resource that was never written (what a create that died
    // between two separate steps left before they were one script) is released by the next create.
    await redis.hset(`ap:{w:${ws}}:uniq:model_credentials`, 'orphaned', `mcred_${'0'.repeat(32)}`);
    await redis.hset(`ap:{w:${ws}}:uniq:runner_pool_names`, 'orphaned', `rpool_${'0'.repeat(32)}`);
    const takenCred = await c.request<Credential>('POST', credentials, { body: { key: 'orphaned', provider_key: 'scripted' } });
    expect([takenCred.status, takenCred.body.key]).toEqual([201, 'orphaned']);
    expect(await held('model_credentials', 'orphaned')).toBe(takenCred.body.id);
    const takenPool = await c.request<Pool>('POST', '/v1/runner-pools', { body: { name: 'orphaned', placement: 'managed' } });
    expect([takenPool.status, takenPool.body.name]).toEqual([201, 'orphaned']);
    expect(await held('runner_pool_names', 'orphaned')).toBe(takenPool.body.id);
    // Held by them now: the next create with the key is 409.
    const credAgain = await c.request('POST', credentials, { body: { key: 'orphaned', provider_key: 'scripted' } });
    expect([credAgain.status, errType(credAgain)]).toEqual([409, 'validation.conflict']);
    const poolAgain = await c.request('POST', '/v1/runner-pools', { body: { name: 'orphaned', placement: 'managed' } });
    expect([poolAgain.status, errType(poolAgain)]).toEqual([409, 'validation.conflict']);
  }, 180_000);
});
