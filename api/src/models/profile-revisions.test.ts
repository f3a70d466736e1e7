import { randomBytes } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { createLogger, newId, SecretBox } from '@agentplane/core';
import { DocumentStore } from '@agentplane/store';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { createModelsModule, type ModelsModule } from './module.js';

/**
 * A keyed routing-profile publish is made once per request: two attempts of one request (the
 * second sent while the first is still in flight, once its key's pending record lapsed) publish
 * one revision, and both are answered it; another request under the same base is refused stale.
 */
const testRedis = useEmbeddedRedis('profile-revisions');
let models: ModelsModule;

beforeAll(() => {
  const redis = testRedis();
  models = createModelsModule({
    redis, docs: new DocumentStore(redis), secretBox: new SecretBox(randomBytes(32)), log: createLogger({ name: 'profile-revisions', level: 'silent' }),
    config: { providerTimeoutMs: 5_000 },
  });
});

const candidates = [{ credential_key: 'default', provider_model: 'scripted-default' }];

describe('a keyed routing profile revision', () => {
  it('racing another attempt of the same request past its lookup: both are answered the one revision published', async () => {
    const ws = newId('workspace');
    await models.profiles.ensureDefaults(ws);
    const profile = await models.profiles.create(ws, { key: 'racing', display_name: 'Racing', candidates });
    const keyed = { token: 'same-request', keptMs: 60_000 };
    // Both attempts read the head and find no record before either publishes.
    const [a, b] = await Promise.all([
      models.profiles.addRevision(ws, profile.id, candidates, undefined, keyed),
      models.profiles.addRevision(ws, profile.id, candidates, undefined, keyed),
    ]);
    expect([a.latest_revision_number, b.latest_revision_number]).toEqual([2, 2]);
    expect((await models.profiles.get(ws, profile.id)).latest_revision_number).toBe(2);

    // Two different requests racing on one base: one publishes, the other is refused stale.
    const racing = await Promise.allSettled([
      models.profiles.addRevision(ws, profile.id, candidates, undefined, { token: 'one', keptMs: 60_000 }),
      models.profiles.addRevision(ws, profile.id, candidates, undefined, { token: 'two', keptMs: 60_000 }),
    ]);
    expect(racing.map((r) => r.status).sort()).toEqual(['fulfilled', 'rejected']);
    expect(racing.find((r) => r.status === 'rejected')).toMatchObject({ reason: { type: 'validation.conflict' } });
    expect((await models.profiles.get(ws, profile.id)).latest_revision_number).toBe(3);
  });
});
