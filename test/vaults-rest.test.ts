import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPlatform, type Platform } from './harness/platform.js';
import { errType } from './harness/governance.js';

/**
 * Vault secrets over REST only (no runner): the compare-and-swap on a secret's generation.
 * The end-to-end uses of vault secrets (git, MCP headers) are in vaults.test.ts.
 */
type Json = Record<string, unknown>;
interface VaultView { id: string; version: number; secrets: Json[] }

let p: Platform;
beforeAll(async () => {
  p = await startPlatform();
}, 120_000);
afterAll(async () => {
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
