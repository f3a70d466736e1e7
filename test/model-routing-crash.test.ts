import { existsSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { sha256Hex } from '@agentplane/core';
import { crashedKeyed, useCrashPlatforms } from './harness/crash-platform.js';
import { errType } from './harness/governance.js';

type Profile = { id: string; key: string; latest_revision_number: number; candidates: { provider_model: string }[] };

/**
 * The API killed right after a routing profile's key, revision and head were written (crash
 * points `model-routing-profile-created` and `model-routing-revision-written`): whatever the
 * request's fate, the profile is whole, its key resolves, and the next publish goes on from the
 * revision its head names.
 */
describe('a crash while a model routing profile is created or revised', () => {
  const crash = useCrashPlatforms('mrp-crash');

  it('leaves a whole profile whose next publish succeeds', async () => {
    const q = await crash.start(['model-routing-profile-created', 'model-routing-revision-written'], { env: { LOG_LEVEL: 'warn' } });
    const created = q.marker('model-routing-profile-created');
    const written = q.marker('model-routing-revision-written');
    const c = q.p.root;
    /** Waits for the API that `before` named to be replaced and answering `probe`. */
    const restarted = (before: number | undefined, probe: string) => q.apiRestarted(before, { client: c, path: probe });
    const ws = q.p.bootstrap.workspace_id;
    const profiles = `/v1/organizations/workspaces/${ws}/model-routing-profiles`;
    const candidates = (model: string) => [{ credential_key: 'default', provider_model: model }];

    // The Workspace's first models request seeds its `default` profile: the API dies as it is created.
    let before = q.p.pids().api;
    await expect(c.request('GET', profiles)).rejects.toThrow();
    expect(existsSync(created)).toBe(true);
    await restarted(before, '/v1/agents');
    const seeded = await c.get<{ data: Profile[] }>(profiles, { key: 'default' });
    expect(seeded.data).toEqual([expect.objectContaining({ key: 'default', latest_revision_number: 1, candidates: [expect.objectContaining({ credential_key: 'default' })] })]);
    expect((await c.request('POST', profiles, { body: { key: 'default', candidates: candidates('x') } })).status).toBe(409);

    // The API dies right after a revision is published: the head names it, and publishing goes on.
    const prof = await c.post<Profile>(profiles, { key: 'crashy', candidates: candidates('one') });
    const revisions = `/v1/model-routing-profiles/${prof.id}/revisions`;
    before = q.p.pids().api;
    await expect(c.request('POST', revisions, { body: { expected_revision_number: 1, candidates: candidates('two') } })).rejects.toThrow();
    expect(existsSync(written)).toBe(true);
    await restarted(before, `/v1/model-routing-profiles/${prof.id}`);
    expect(await c.get<Profile>(`/v1/model-routing-profiles/${prof.id}`)).toMatchObject({ latest_revision_number: 2, candidates: [{ provider_model: 'two' }] });
    // The client's retry learns its publish landed (stale), and the next one builds on it.
    const retry = await c.request('POST', revisions, { body: { expected_revision_number: 1, candidates: candidates('two') } });
    expect([retry.status, errType(retry)]).toEqual([409, 'validation.conflict']);
    const third = await c.request<Profile>('POST', revisions, { body: { expected_revision_number: 2, candidates: candidates('three') } });
    expect([third.status, third.body.latest_revision_number]).toEqual([201, 3]);
    expect((await c.request('GET', `${revisions}/4`)).status).toBe(404);

    // A revision document above the head (what a publish that died between two separate writes
    // left before they were one script) does not block the number: the next publish replaces it.
    const orphanKey = `ap:{w:${ws}}:mrp_rev:${prof.id}:4`;
    await q.redis().set(orphanKey, JSON.stringify({ type: 'model_routing_profile_revision', model_routing_profile_id: prof.id, workspace_id: ws, revision_number: 4, candidates: candidates('orphan'), created_at: new Date().toISOString() }));
    const fourth = await c.request<Profile>('POST', revisions, { body: { expected_revision_number: 3, candidates: candidates('four') } });
    expect([fourth.status, fourth.body.latest_revision_number]).toEqual([201, 4]);
    expect(await c.get(`${revisions}/4`)).toMatchObject({ revision_number: 4, candidates: [{ provider_model: 'four' }] });
  }, 180_000);

  it('a keyed publish is answered to its retry the revision its first attempt published, not a second one', async () => {
    const q = await crash.start(['model-routing-revision-written'], { env: { LOG_LEVEL: 'warn' } });
    const c = q.p.root;
    const profiles = `/v1/organizations/workspaces/${q.p.bootstrap.workspace_id}/model-routing-profiles`;
    const candidates = (model: string) => [{ credential_key: 'default', provider_model: model }];
    const prof = await c.post<Profile>(profiles, { key: 'keyed', candidates: candidates('one') });
    const revisions = `/v1/model-routing-profiles/${prof.id}/revisions`;
    // No expected revision: the retry used to publish the same candidates again, as revision 3.
    const body = { candidates: candidates('two') };
    await crashedKeyed(q, 'model-routing-revision-written', 'k-publish', () => c.request('POST', revisions, { body, idempotencyKey: 'k-publish' }), { probePath: `/v1/model-routing-profiles/${prof.id}` });
    const retry = await c.request<Profile>('POST', revisions, { body, idempotencyKey: 'k-publish' });
    expect([retry.status, retry.body.latest_revision_number, retry.body.candidates[0]?.provider_model]).toEqual([201, 2, 'two']);
    expect((await c.request('GET', `${revisions}/3`)).status).toBe(404);
    // Another publish since: the first attempt's revision is no longer the latest, so a retry
    // (its stored answer gone as well) is refused, nothing written.
    expect((await c.request<Profile>('POST', revisions, { body: { candidates: candidates('three') } })).body.latest_revision_number).toBe(3);
    await q.redis().del(`ap:{w:${q.p.bootstrap.workspace_id}}:idem:${sha256Hex('k-publish')}`);
    const late = await c.request('POST', revisions, { body, idempotencyKey: 'k-publish' });
    expect([late.status, errType(late)]).toEqual([409, 'idempotency.conflict']);
    expect((await c.get<Profile>(`/v1/model-routing-profiles/${prof.id}`)).latest_revision_number).toBe(3);
  }, 180_000);
});
