import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { RedisRuntimeBearers } from '@agentplane/domain';
import { LeaseFence } from '@agentplane/lease';
import { startPlatform, type Platform } from './harness/platform.js';
import { errType } from './harness/governance.js';

/**
 * Vault secrets over REST only (no runner): the compare-and-swap on a secret's generation.
 * The end-to-end uses of vault secrets (git, MCP headers) are in vaults.test.ts.
 */
type Json = Record<string, unknown>;
interface VaultView { id: string; version: number; secrets: Json[] }

let p: Platform;
let redis: Redis;
beforeAll(async () => {
  p = await startPlatform();
  redis = new Redis(p.redisUrl());
}, 120_000);
afterAll(async () => {
  redis?.disconnect();
  await p?.stop();
});

const putSecret = (vault: string, name: string, body: Json) => p.root.request<VaultView>('PUT', `/v1/vaults/${vault}/secrets/${name}`, { body });

describe('vault secret generations', () => {
  it('a secret written again after a delete continues its generations: an expected_generation of the deleted one is stale', async () => {
    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'generations' })).id;
    const first = await putSecret(vault, 'peer', { kind: 'mcp_bearer', match: 'https://a.example.com', value: 'first-value-0123', expected_generation: 0 });
    expect(first.body.secrets).toEqual([expect.objectContaining({ name: 'peer', generation: 1 })]);
    // A writer read generation 1 of that secret; meanwhile it is deleted and written anew, for another use.
    expect((await p.root.request('DELETE', `/v1/vaults/${vault}/secrets/peer`)).status).toBe(200);
    const again = await putSecret(vault, 'peer', { kind: 'git_https', match: 'https://b.example.com', value: 'second-value-0123', expected_generation: 0 });
    expect(again.status).toBe(200);
    expect(again.body.secrets).toEqual([expect.objectContaining({ name: 'peer', kind: 'git_https', generation: 2 })]);
    // The writer's expectation names the deleted secret: it does not overwrite the new one.
    const stale = await putSecret(vault, 'peer', { kind: 'mcp_bearer', match: 'https://a.example.com', value: 'stale-writer-0123', expected_generation: 1 });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);
    const now = await p.root.get<VaultView>(`/v1/vaults/${vault}`);
    expect(now.secrets).toEqual([expect.objectContaining({ name: 'peer', kind: 'git_https', match: 'https://b.example.com', generation: 2 })]);
    // Only the vault's public head is shown: no bookkeeping of deleted secrets.
    expect(Object.keys(now).sort()).toEqual(['created_at', 'description', 'id', 'name', 'secrets', 'type', 'updated_at', 'version', 'workspace_id']);
    // The current generation still rotates it; creating it once more is refused while it exists.
    expect((await putSecret(vault, 'peer', { kind: 'git_https', match: 'https://b.example.com', value: 'third-value-0123', expected_generation: 2 })).body.secrets)
      .toEqual([expect.objectContaining({ generation: 3 })]);
    expect((await putSecret(vault, 'peer', { kind: 'git_https', match: 'https://b.example.com', value: 'fourth-value-012', expected_generation: 0 })).status).toBe(409);
    // Other names are unaffected: a new name starts at 1.
    expect((await putSecret(vault, 'other', { kind: 'mcp_bearer', match: 'https://c.example.com', value: 'other-value-0123' })).body.secrets)
      .toEqual(expect.arrayContaining([expect.objectContaining({ name: 'other', generation: 1 })]));
  });
});

describe('peer credential values', () => {
  it('a value with a field its kind does not take is 400 without quoting any of the value', async () => {
    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'peer-values' })).id;
    const misplaced = 'tok-9f2c41d7e0a8b6';
    const r = await p.root.request<{ error: { message: string } }>('PUT', `/v1/vaults/${vault}/secrets/peer`, {
      body: { kind: 'a2a_oauth2', match: 'https://peer.example.com', value: JSON.stringify({ access_token: 'a-token-value', [misplaced]: 'x' }) },
    });
    expect([r.status, errType(r)]).toEqual([400, 'validation.malformed']);
    expect(r.body.error.message).toContain('body.value');
    expect(JSON.stringify(r.body)).not.toContain(misplaced);
    expect(JSON.stringify(r.body)).not.toContain('a-token-value');
  });
});

describe('git credentials for a Run', () => {
  it('each answer past the runtime bearer is an audit record of the Run naming the request', async () => {
    const origin = 'https://git.example.com';
    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'git-release' })).id;
    expect((await putSecret(vault, 'git', { kind: 'git_https', match: origin, value: 'git-token-0123456789' })).status).toBe(200);
    const env = await p.root.post<{ id: string }>('/v1/environments', { name: 'git-env', image: 'agentplane/sandbox:1' });
    const repo = `${origin}/org/repo.git`;
    const session = (await p.root.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'git-agent', model: 'default' }, environment_id: env.id, vault_ids: [vault], resources: [{ type: 'repository', url: repo }],
    })).id;
    const run = `run_${randomBytes(16).toString('hex')}`;
    const leaseId = `lease_${randomBytes(8).toString('hex')}`;
    const fence = new LeaseFence(redis);
    expect(await fence.claim({ sessionId: session, token: leaseId, runnerId: 'runner_test', attempt: 1, runId: run }, 60_000)).toBe('ok');
    const bearer = await new RedisRuntimeBearers(redis, fence).mint({
      run_id: run, session_id: session, workspace_id: p.bootstrap.workspace_id, organization_id: p.bootstrap.organization_id,
      lease_id: leaseId, expires_at: new Date(Date.now() + 60_000).toISOString(), connections: {}, repositories: [repo],
    });
    const ask = (url: string) => fetch(`${p.baseUrl}/v1/runtime/git-credentials`, {
      method: 'POST', headers: { authorization: `Bearer ${bearer}`, 'content-type': 'application/json' }, body: JSON.stringify({ url }),
    });
    const released = await ask(repo);
    expect(released.status).toBe(200);
    expect(await released.json()).toMatchObject({ password: 'git-token-0123456789', vault_id: vault });
    const refused = await ask(`${origin}/org/other.git`);
    expect([refused.status, errType({ body: await refused.json() })]).toEqual([404, 'validation.not_found']);
    const records = (await p.root.post<{ data: Array<{ actor: Json; target: string; outcome: string; status: number; request_id: string | null }> }>(
      '/v1/audit/export', { action: 'vaults.releaseGitCredential', actor: run, limit: 100 },
    )).data;
    expect(records.map((r) => [r.actor, r.target, r.outcome, r.status, r.request_id])).toEqual([
      [{ id: run, credential_id: null }, vault, 'succeeded', 200, released.headers.get('request-id')],
      [{ id: run, credential_id: null }, session, 'failed', 404, refused.headers.get('request-id')],
    ]);
    // The record holds ids only, never the secret.
    expect(JSON.stringify(records)).not.toContain('git-token-0123456789');
  });
});
