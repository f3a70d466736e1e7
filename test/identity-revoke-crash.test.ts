import { existsSync, rmSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { useCrashPlatforms } from './harness/crash-platform.js';
import { createCredential, createPrincipal, errType } from './harness/governance.js';

type Revocable = { id: string; status: string };

/**
 * The API killed between the two writes of a revocation (crash point `credential-secret-revoked`):
 * the secret is refused from the next request on, whatever the document says yet, and a retry of
 * the revocation records it.
 */
describe('a crash in the middle of a revocation', () => {
  const crash = useCrashPlatforms('identity-revoke-crash');

  it('leaves the secret refused, for an API key and for a Principal access credential', async () => {
    const q = await crash.start(['credential-secret-revoked'], { env: { LOG_LEVEL: 'warn' } });
    const root = q.p.root;
    const org = q.p.bootstrap.organization_id;
    const ws = q.p.bootstrap.workspace_id;
    const restarted = (before: number | undefined) => q.apiRestarted(before, { client: root, path: '/v1/vaults' });
    const statusWith = async (secret: string) => {
      const r = await q.p.anon.with({ token: secret }).request('GET', '/v1/vaults');
      return [r.status, errType(r)];
    };

    // An API key.
    const key = await root.post<{ id: string; secret: string }>(`/v1/organizations/${org}/api-keys`, {
      display_name: 'doomed', role: 'admin', scope: { type: 'workspace', workspace_id: ws },
    }, { idempotencyKey: `key-${Math.random()}` });
    expect((await statusWith(key.secret))[0]).toBe(200);
    let before = q.p.pids().api;
    await expect(root.request('POST', `/v1/api-keys/${key.id}/revoke`, { body: {} })).rejects.toThrow();
    expect(existsSync(q.marker('credential-secret-revoked'))).toBe(true);
    await restarted(before);
    expect(await statusWith(key.secret)).toEqual([401, 'auth.invalid_key']);
    const keyAgain = await root.request<Revocable>('POST', `/v1/api-keys/${key.id}/revoke`, { body: {} });
    expect([keyAgain.status, keyAgain.body.status]).toEqual([200, 'revoked']);
    expect(await statusWith(key.secret)).toEqual([401, 'auth.invalid_key']);

    // A Principal access credential (authenticated, it is refused this operation with 403).
    rmSync(q.marker('credential-secret-revoked'));
    const principal = await createPrincipal(root, ws, 'revoked-mid-way');
    const cred = await createCredential(root, principal);
    expect(await statusWith(cred.secret)).toEqual([403, 'policy.denied']);
    before = q.p.pids().api;
    await expect(root.request('POST', `/v1/principal-access-credentials/${cred.id}/revoke`, {
      body: { expected_generation_number: 1 }, idempotencyKey: `revoke-${Math.random()}`,
    })).rejects.toThrow();
    expect(existsSync(q.marker('credential-secret-revoked'))).toBe(true);
    await restarted(before);
    expect(await statusWith(cred.secret)).toEqual([401, 'auth.invalid_key']);
    const credAgain = await root.request<Revocable>('POST', `/v1/principal-access-credentials/${cred.id}/revoke`, {
      body: { expected_generation_number: 1 }, idempotencyKey: `revoke-${Math.random()}`,
    });
    expect([credAgain.status, credAgain.body.status]).toEqual([200, 'revoked']);
    expect(await statusWith(cred.secret)).toEqual([401, 'auth.invalid_key']);
  }, 120_000);
});
