import { describe, expect, it } from 'vitest';
import { ApiError, newId, nowIso } from '@agentplane/core';
import { VersionedStore, type Environment } from '@agentplane/domain';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { createdId, createVersioned, earlierAttempt, priorAttempt } from './keyed-create.js';
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
const keyed = (keptMs: number): KeyedRequest => {
  const id = (kind: string, name = ''): string => `env_${Buffer.from(`${kind}${name}`).toString('hex').padEnd(32, '0').slice(0, 32)}`;
  return { id, fingerprint: 'fp', keptMs, write: (kind) => ({ token: id(kind, 'fp'), keptMs }) };
};

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

describe('earlierAttempt', () => {
  const refused = (f: () => unknown): unknown => {
    try {
      f();
      return null;
    } catch (err) {
      return err;
    }
  };

  it('nothing under the derived id: create it; the first attempt\'s resource, unchanged and young: answer it', () => {
    expect(earlierAttempt(null, keyed(60_000))).toBeNull();
    const found = { id: 'x', version: 1, created_at: nowIso() };
    expect(earlierAttempt(found, keyed(60_000))).toBe(found);
  });

  it('a resource changed since its create, or older than the key\'s record lifetime, refuses the request as a reused key', () => {
    for (const found of [{ version: 2, created_at: nowIso() }, { version: 1, created_at: new Date(Date.now() - 120_000).toISOString() }]) {
      const err = refused(() => earlierAttempt(found, keyed(60_000)));
      expect(err).toBeInstanceOf(ApiError);
      expect([(err as ApiError).type, (err as ApiError).status]).toEqual(['idempotency.conflict', 409]);
    }
  });

  it('createdId: derived from the key and the request with a key, a new id without one', () => {
    expect(createdId('environment', keyed(60_000))).toBe(keyed(60_000).id('environment', 'fp'));
    expect(createdId('environment', undefined)).toMatch(/^env_[0-9a-f]{32}$/);
    expect(createdId('environment', undefined)).not.toBe(createdId('environment', undefined));
  });

  it('priorAttempt: with a key, looks under the derived id and applies the same rule; without one, a new id and no read', async () => {
    const found = { id: 'x', version: 1, created_at: nowIso() };
    const looked: string[] = [];
    const find = async (id: string) => {
      looked.push(id);
      return id === createdId('environment', keyed(60_000)) ? found : null;
    };
    expect(await priorAttempt('environment', keyed(60_000), find)).toEqual({ id: keyed(60_000).id('environment', 'fp'), earlier: found });
    const changed = await priorAttempt('environment', keyed(60_000), async () => ({ ...found, version: 2 })).then(() => null, (e: unknown) => e);
    expect([(changed as ApiError).type, (changed as ApiError).status]).toEqual(['idempotency.conflict', 409]);
    const unkeyed = await priorAttempt('environment', undefined, find);
    expect(unkeyed.earlier).toBeNull();
    expect(unkeyed.id).toMatch(/^env_[0-9a-f]{32}$/);
    expect(looked).toEqual([keyed(60_000).id('environment', 'fp')]);
  });
});
