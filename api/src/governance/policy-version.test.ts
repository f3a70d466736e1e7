import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { newId, type Logger } from '@agentplane/core';
import { DocumentStore, keys, tags, type Redis } from '@agentplane/store';
import type { AuditLog } from '../audit/store.js';
import { POLICIES, PolicyStore, type ActionPolicyInput } from './policies.js';

/**
 * The policy-set version moves with every write that lands (in the write's own script), and with
 * no refused one.
 */
const testRedis = useEmbeddedRedis('governance-policy-version');
let redis: Redis;

beforeAll(() => {
  redis = testRedis();
});

const noAudit = {} as AuditLog;
const noLog = { error: () => undefined } as unknown as Logger;
const rule = (effect: 'allow' | 'deny'): ActionPolicyInput => ({
  effect, tool: { kind: 'builtin', name: 'bash', connection_id: null }, arguments: { command_prefix: null, path_glob: null }, principal_id: null, description: null,
});

describe('the policy-set version', () => {
  it('is bumped by each create, update and delete, and by no refused write', async () => {
    const ws = newId('workspace');
    const policies = new PolicyStore(redis, new DocumentStore(redis), noAudit, noLog);
    const version = async () => Number((await redis.get(keys.scoped(tags.workspace(ws), 'apol:version'))) ?? '0');
    const listed = () => redis.zrange(keys.index(tags.workspace(ws), POLICIES), 0, -1);

    const p = await policies.create(ws, rule('deny'));
    expect([await version(), await listed()]).toEqual([1, [p.id]]);
    expect((await policies.current(ws)).evaluate({ kind: 'builtin', name: 'bash', input: {} }).decision).toBe('deny');

    await expect(policies.update(ws, p.id, rule('allow'), 7)).rejects.toMatchObject({ type: 'validation.conflict' });
    expect(await version()).toBe(1);
    expect(await policies.update(ws, p.id, rule('allow'), 1)).toMatchObject({ version: 2, effect: 'allow' });
    expect(await version()).toBe(2);
    expect((await policies.current(ws)).evaluate({ kind: 'builtin', name: 'bash', input: {} }).decision).toBe('allow');
    // Without expected_version, the update applies to whatever version is stored.
    expect(await policies.update(ws, p.id, rule('deny'), undefined)).toMatchObject({ version: 3, effect: 'deny' });
    expect(await version()).toBe(3);

    await expect(policies.remove(ws, p.id, 2)).rejects.toMatchObject({ type: 'validation.conflict' });
    expect(await version()).toBe(3);
    await policies.remove(ws, p.id, 3);
    expect([await version(), await listed()]).toEqual([4, []]);
    await expect(policies.get(ws, p.id)).rejects.toMatchObject({ type: 'validation.not_found' });
    await expect(policies.remove(ws, p.id, undefined)).rejects.toMatchObject({ type: 'validation.not_found' });
    expect(await version()).toBe(4);
  });
});
