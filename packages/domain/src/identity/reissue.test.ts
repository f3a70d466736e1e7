import { beforeAll, describe, expect, it } from 'vitest';
import { ApiError, secretDigest } from '@agentplane/core';
import { DocumentStore, type Redis } from '@agentplane/store';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { CredentialIndex } from './credentials.js';
import { IdentityService } from './service.js';

let redis: Redis;
const testRedis = useEmbeddedRedis('identity-reissue');
beforeAll(() => {
  redis = testRedis();
});

const refusal = (p: Promise<unknown>): Promise<unknown> => p.then(() => null, (e: unknown) => e);

/**
 * The new first secret a keyed create's retry gets for the key or credential its first attempt
 * wrote (that attempt's secret was never shown): given only while what was found is still
 * unchanged. One changed between the retry's read and its re-issue (the retry holds version 1, the
 * store version 2) is refused as the reused key it now is, 409 `idempotency.conflict`, and keeps
 * its secret.
 */
describe('re-issuing a first secret', () => {
  it('an API key: the found version gets a new live secret; one changed since is refused and keeps its secret', async () => {
    const credentials = new CredentialIndex(redis);
    const identity = new IdentityService(new DocumentStore(redis), redis, credentials);
    const { org } = await identity.createOrganization('o', 'w');
    const made = await identity.createApiKey(org.id, { display_name: 'k', role: 'admin', scope: { type: 'organization' } });

    const again = await identity.reissueFirstApiKeySecret(org.id, made.key);
    expect([again.key.id, again.key.version, again.key.generation_number]).toEqual([made.key.id, 2, 1]);
    expect(await credentials.resolve(secretDigest(made.secret))).toBeNull();
    expect((await credentials.resolve(secretDigest(again.secret)))?.credential_id).toBe(made.key.id);

    const other = await identity.createApiKey(org.id, { display_name: 'k2', role: 'admin', scope: { type: 'organization' } });
    await identity.patchApiKey(org.id, other.key.id, { display_name: 'renamed' });
    const err = await refusal(identity.reissueFirstApiKeySecret(org.id, other.key));
    expect(err).toBeInstanceOf(ApiError);
    expect([(err as ApiError).type, (err as ApiError).status]).toEqual(['idempotency.conflict', 409]);
    expect((await credentials.resolve(secretDigest(other.secret)))?.credential_id).toBe(other.key.id);
  });

  it('a Principal access credential changed since (rotated) is refused the same way', async () => {
    const credentials = new CredentialIndex(redis);
    const identity = new IdentityService(new DocumentStore(redis), redis, credentials);
    const { org, workspace } = await identity.createOrganization('o', 'w');
    const p = await identity.createPrincipal(workspace.id, { external_subject_id: 's', principal_type: 'service', display_name: 'S' });
    const made = await identity.createPrincipalCredential(org.id, workspace.id, p.id, 'api_mcp');
    const again = await identity.reissueFirstCredentialSecret(org.id, made.credential);
    expect([again.credential.id, again.credential.version, again.credential.generation_number]).toEqual([made.credential.id, 2, 1]);
    expect((await credentials.resolve(secretDigest(again.secret)))?.credential_id).toBe(made.credential.id);
    // The retry read version 1; the credential is at version 2 now.
    const err = await refusal(identity.reissueFirstCredentialSecret(org.id, made.credential));
    expect([(err as ApiError).type, (err as ApiError).status]).toEqual(['idempotency.conflict', 409]);
    expect((await credentials.resolve(secretDigest(again.secret)))?.credential_id).toBe(made.credential.id);
  });
});
