import { existsSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { useCrashPlatforms } from './harness/crash-platform.js';

type Credential = { id: string; active_generation_number: number };

/**
 * The API killed right as a ModelCredential is rotated (crash point `model-credential-rotated`):
 * whatever the request's fate, the credential is whole (one generation, its secret stored, none
 * other left), and the next rotation succeeds.
 */
describe('a crash while a model credential is rotated', () => {
  const crash = useCrashPlatforms('mcred-rotate-crash');

  it('leaves one generation and its secret, and the next rotation succeeds', async () => {
    const q = await crash.start(['model-credential-rotated'], { env: { LOG_LEVEL: 'warn' } });
    const c = q.p.root;
    const ws = q.p.bootstrap.workspace_id;
    const cred = await c.post<Credential>(`/v1/organizations/workspaces/${ws}/model-credentials`, {
      key: 'rotating', provider_key: 'openai', base_url: 'http://127.0.0.1:9/v1', secret: 'sk-one-0123456789abcdef',
    });
    const secrets = async () => (await q.redis().keys(`ap:{w:${ws}}:mcred_secret:${cred.id}:*`)).map((k) => Number(k.slice(k.lastIndexOf(':') + 1))).sort();

    const before = q.p.pids().api;
    await expect(c.request('POST', `/v1/model-credentials/${cred.id}/rotate`, { body: { secret: 'sk-two-0123456789abcdef' } })).rejects.toThrow();
    expect(existsSync(q.marker('model-credential-rotated'))).toBe(true);
    await q.apiRestarted(before, { client: c, path: `/v1/model-credentials/${cred.id}` });

    const after = await c.get<Credential>(`/v1/model-credentials/${cred.id}`);
    expect(await secrets()).toEqual([after.active_generation_number]);
    const next = await c.request<Credential>('POST', `/v1/model-credentials/${cred.id}/rotate`, { body: { secret: 'sk-three-0123456789abcdef' } });
    expect(next.status).toBe(200);
    expect(next.body.active_generation_number).toBe(after.active_generation_number + 1);
    expect(await secrets()).toEqual([next.body.active_generation_number]);
  }, 180_000);
});
