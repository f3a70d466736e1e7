import { randomBytes } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { ApiError, SecretBox, sha256Hex } from '@agentplane/core';
import { type Redis } from '@agentplane/store';
import { fingerprint, IdempotencyStore } from './idempotency.js';

let redis: Redis;
let store: IdempotencyStore;

const testRedis = useEmbeddedRedis('idem');
beforeAll(async () => {
  redis = testRedis();
  store = new IdempotencyStore(redis, new SecretBox(randomBytes(32)), 3600, randomBytes(32));
});

const typeOf = async (p: Promise<unknown>) => {
  try {
    await p;
    return 'ok';
  } catch (e) {
    return e instanceof ApiError ? e.type : 'other';
  }
};

describe('IdempotencyStore', () => {
  it('a second begin while the first is in flight is an idempotency conflict', async () => {
    const first = await store.begin('w:x', 'k1', 'fp-a');
    expect(first.kind).toBe('new');
    expect(await typeOf(store.begin('w:x', 'k1', 'fp-a'))).toBe('idempotency.conflict');
  });

  it('the same begin sent again (its answer lost with a connection) finds its own record, not a request in flight', async () => {
    expect((await store.begin('w:x', 'k-resent', 'fp-a', 'owner-1')).kind).toBe('new');
    expect((await store.begin('w:x', 'k-resent', 'fp-a', 'owner-1')).kind).toBe('new');
    expect(await typeOf(store.begin('w:x', 'k-resent', 'fp-a', 'owner-2'))).toBe('idempotency.conflict');
  });

  it('replays the stored response for the same fingerprint and rejects another', async () => {
    const b = await store.begin('w:x', 'k2', 'fp-a');
    if (b.kind !== 'new') throw new Error('expected new');
    await store.complete(b, { status: 201, body: { id: 'x1' } }, false);
    const again = await store.begin('w:x', 'k2', 'fp-a');
    expect(again).toMatchObject({ kind: 'replay', result: { status: 201, body: { id: 'x1' } } });
    expect(await typeOf(store.begin('w:x', 'k2', 'fp-b'))).toBe('idempotency.conflict');
  });

  it('seals sensitive bodies at rest and still replays them', async () => {
    const b = await store.begin('w:x', 'k3', 'fp');
    if (b.kind !== 'new') throw new Error('expected new');
    await store.complete(b, { status: 201, body: { secret: 'ap_key_topsecret' } }, true);
    const raw = await redis.get(b.recordKey);
    expect(raw).not.toContain('topsecret');
    const again = await store.begin('w:x', 'k3', 'fp');
    expect(again).toMatchObject({ kind: 'replay', result: { body: { secret: 'ap_key_topsecret' } } });
  });

  it('an abandoned request frees the key; keys are scoped per workspace', async () => {
    const b = await store.begin('w:x', 'k4', 'fp');
    if (b.kind !== 'new') throw new Error('expected new');
    await store.abandon(b);
    expect((await store.begin('w:x', 'k4', 'fp')).kind).toBe('new');
    expect((await store.begin('w:y', 'k4', 'other')).kind).toBe('new');
  });
});

describe('fingerprint', () => {
  const parts = (body: string) => ({ params: {}, query: {}, body: JSON.parse(body) as unknown, credential: 'key_1' });

  it('tells apart two bodies that differ only by a __proto__ key', () => {
    const plain = fingerprint('agents.createAgent', parts('{"name":"a","metadata":{"team":"x"}}'));
    expect(fingerprint('agents.createAgent', parts('{"name":"a","metadata":{"team":"x","__proto__":"y"}}'))).not.toBe(plain);
    expect(fingerprint('agents.createAgent', parts('{"__proto__":{"team":"x"},"name":"a","metadata":{"team":"x"}}'))).not.toBe(plain);
    expect(fingerprint('agents.createAgent', parts('{"metadata":{"team":"x"},"name":"a"}'))).toBe(plain);
  });

  it('derives ids from the key that are stable, well formed, scoped and unguessable without the master key', () => {
    const master = randomBytes(32);
    const a = new IdempotencyStore(redis, new SecretBox(randomBytes(32)), 3600, master);
    const again = new IdempotencyStore(redis, new SecretBox(randomBytes(32)), 3600, Buffer.from(master));
    const keyed = a.keyed('w:x', 'sessions.createSession', 'key-1', 'fp-a');
    const id = keyed.id('session');
    expect(id).toMatch(/^sess_[0-9a-f]{32}$/);
    expect([keyed.fingerprint, keyed.keptMs]).toEqual(['fp-a', 3_600_000]);
    // The same key, operation and Workspace: the same id, in any process that has the master key, whatever the body.
    expect(again.keyed('w:x', 'sessions.createSession', 'key-1', 'fp-b').id('session')).toBe(id);
    // Each of them, the kind and the name tell ids apart.
    const others = [
      a.keyed('w:y', 'sessions.createSession', 'key-1', 'fp-a').id('session'),
      a.keyed('w:x', 'agentDeployments.createDeploymentSession', 'key-1', 'fp-a').id('session'),
      a.keyed('w:x', 'sessions.createSession', 'key-2', 'fp-a').id('session'),
      keyed.id('session', 'second'),
      new IdempotencyStore(redis, new SecretBox(master), 3600, randomBytes(32)).keyed('w:x', 'sessions.createSession', 'key-1', 'fp-a').id('session'),
    ];
    expect(new Set([id, ...others]).size).toBe(6);
    expect(keyed.id('thread')).toMatch(/^sthr_[0-9a-f]{32}$/);
    // Nothing of the key's own digest shows.
    expect(sha256Hex('key-1')).not.toContain(id.slice(5, 13));
  });
  it('is stored keyed by a secret from the master key: a body carrying a secret cannot be guessed from it', () => {
    const master = randomBytes(32);
    const body = parts('{"name":"token","value":"1234"}');
    const stored = new IdempotencyStore(redis, new SecretBox(randomBytes(32)), 3600, master).fingerprint('vaults.addSecret', body);
    expect(stored).toMatch(/^[0-9a-f]{64}$/);
    // Not the bare digest a reader of Redis could test guesses of the value against …
    expect(stored).not.toBe(fingerprint('vaults.addSecret', body));
    // … the same in every process with the master key, and another under another key.
    expect(new IdempotencyStore(redis, new SecretBox(randomBytes(32)), 3600, Buffer.from(master)).fingerprint('vaults.addSecret', body)).toBe(stored);
    expect(new IdempotencyStore(redis, new SecretBox(randomBytes(32)), 3600, randomBytes(32)).fingerprint('vaults.addSecret', body)).not.toBe(stored);
  });
});
