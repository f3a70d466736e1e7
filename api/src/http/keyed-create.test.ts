import { describe, expect, it } from 'vitest';
import { ApiError, newId, nowIso } from '@agentplane/core';
import { VersionedStore, type Environment } from '@agentplane/domain';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { createVersioned } from './keyed-create.js';
import type { KeyedRequest } from './idempotency.js';

/**
 * A keyed create's derived id: the same request again answers what its first attempt wrote; a
 * resource under that id older than the key's record lifetime (an earlier use of the key) makes
 * the request a reused key, 409 `idempotency.conflict`, and nothing is written.
 */
const testRedis = useEmbeddedRedis('keyed-create');

const env = (ws: string, name: string): Environment => {
  const now = nowIso();
  return {
    id: newId('environment'), type: 'environment', workspace_id: ws, name, description: null, image: 'agentplane/sandbox:latest', driver: 'docker', tier: 'container',
    resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 60 }, network: { mode: 'none' }, retention_mode: 'durable',
    harness_topology: 'split', harness: null, packages: {}, browser: false, metadata: {}, version: 1, archived_at: null, created_at: now, updated_at: now,
  } as Environment;
};
const keyed = (keptMs: number): KeyedRequest => ({ id: (kind, name = '') => `env_${Buffer.from(`${kind}${name}`).toString('hex').padEnd(32, '0').slice(0, 32)}`, fingerprint: 'fp', keptMs });

describe('createVersioned', () => {
  it('answers the first attempt\'s resource to the same keyed request; past the key\'s lifetime the key is refused as reused', async () => {
    const store = new VersionedStore<Environment>(testRedis(), 'environments', 'environment');
    const ws = newId('workspace');
    const first = await createVersioned(store, ws, env(ws, 'one'), 'environment', keyed(60_000), 'environment-created');
    const again = await createVersioned(store, ws, env(ws, 'one'), 'environment', keyed(60_000), 'environment-created');
    expect(again.id).toBe(first.id);
    expect(again.created_at).toBe(first.created_at);
    await new Promise((r) => setTimeout(r, 20));
    const late = await createVersioned(store, ws, env(ws, 'one'), 'environment', keyed(10), 'environment-created').then(() => null, (e: unknown) => e);
    expect(late).toBeInstanceOf(ApiError);
    expect((late as ApiError).type).toBe('idempotency.conflict');
    expect((late as ApiError).status).toBe(409);
    expect((await store.getVersion(ws, first.id, 1)).name).toBe('one');
  });
});
