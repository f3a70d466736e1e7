import { existsSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { useCrashPlatforms } from './harness/crash-platform.js';

type Credential = { id: string; key: string; status: string };

/**
 * The API killed right as a ModelCredential is revoked (crash point `model-credential-revoked`):
 * whatever the request's fate, the revocation is whole: the sealed secret is erased and the key
 * is free for a new credential, with no retry of the revoke needed.
 */
describe('a crash while a model credential is revoked', () => {
  const crash = useCrashPlatforms('mcred-revoke-crash');

  it('leaves no secret behind and the key free', async () => {
    const q = await crash.start(['model-credential-revoked'], { env: { LOG_LEVEL: 'warn' } });
    const c = q.p.root;
    const ws = q.p.bootstrap.workspace_id;
    const creds = `/v1/organizations/workspaces/${ws}/model-credentials`;
    const cred = await c.post<Credential>(creds, { key: 'crashy', provider_key: 'openai', base_url: 'http://127.0.0.1:9/v1', secret: 'sk-local-0123456789abcdef' });
    const secretKey = `ap:{w:${ws}}:mcred_secret:${cred.id}:1`;
    expect(await q.redis().exists(secretKey)).toBe(1);

    const before = q.p.pids().api;
    await expect(c.request('POST', `/v1/model-credentials/${cred.id}/revoke`, { body: {} })).rejects.toThrow();
    expect(existsSync(q.marker('model-credential-revoked'))).toBe(true);
    await q.apiRestarted(before, { client: c, path: `/v1/model-credentials/${cred.id}` });

    expect(await c.get<Credential>(`/v1/model-credentials/${cred.id}`)).toMatchObject({ status: 'revoked' });
    expect(await q.redis().exists(secretKey)).toBe(0);
    const again = await c.request<Credential>('POST', creds, { body: { key: 'crashy', provider_key: 'openai', base_url: 'http://127.0.0.1:9/v1', secret: 'sk-local-fedcba9876543210' } });
    expect(again.status).toBe(201);
    expect(again.body).toMatchObject({ key: 'crashy', status: 'active' });
  }, 180_000);
});
