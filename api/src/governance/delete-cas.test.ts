import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { newId, type Logger } from '@agentplane/core';
import { DocumentStore, keys, tags, type Redis } from '@agentplane/store';
import type { AuditLog } from '../audit/store.js';
import { PermissionStore } from './permissions.js';
import { PolicyStore, type ActionPolicyInput } from './policies.js';

/**
 * A delete fenced on `expected_version` racing an update: the update is made to land between the
 * delete's read and its write (run from inside the deleter's own first read), the window a check
 * and a delete in two steps would lose it in.
 */
const testRedis = useEmbeddedRedis('governance-delete');
let redis: Redis;

beforeAll(() => {
  redis = testRedis();
});

/** A connection whose first GET, once answered, waits for `between` before its caller sees the answer. */
function racingConnection(between: () => Promise<unknown>): Redis {
  const conn = testRedis.connect(`racing-${newId('event')}`);
  const get = conn.get.bind(conn) as (...args: unknown[]) => Promise<string | null>;
  let armed = true;
  (conn as unknown as { get: (...args: unknown[]) => Promise<string | null> }).get = async (...args: unknown[]) => {
    const answer = await get(...args);
    if (armed) {
      armed = false;
      await between();
    }
    return answer;
  };
  return conn;
}

const noAudit = {} as AuditLog;
const noLog = { error: () => undefined } as unknown as Logger;
const rule = (effect: 'allow' | 'deny'): ActionPolicyInput => ({
  effect, tool: { kind: 'builtin', name: 'bash', connection_id: null }, arguments: { command_prefix: null, path_glob: null }, principal_id: null, description: null,
});

describe('deleting an ActionPolicy at an expected_version', () => {
  it('is refused with 409 when an update landed after its read, and the update stands', async () => {
    const ws = newId('workspace');
    const policies = new PolicyStore(redis, new DocumentStore(redis), noAudit, noLog);
    const p = await policies.create(ws, rule('deny'));
    const conn = racingConnection(() => policies.update(ws, p.id, rule('allow'), 1));
    const racing = new PolicyStore(conn, new DocumentStore(conn), noAudit, noLog);

    await expect(racing.remove(ws, p.id, 1)).rejects.toMatchObject({ type: 'validation.conflict', status: 409 });
    expect(await policies.get(ws, p.id)).toMatchObject({ version: 2, effect: 'allow' });
    expect(await redis.zrange(keys.index(tags.workspace(ws), 'action_policies'), 0, -1)).toEqual([p.id]);
    expect((await policies.current(ws)).evaluate({ kind: 'builtin', name: 'bash', input: { command: 'ls' } })).toMatchObject({ decision: 'allow', rule_id: p.id });

    // At the version it now has, the delete goes, with its index entry.
    await policies.remove(ws, p.id, 2);
    await expect(policies.get(ws, p.id)).rejects.toMatchObject({ type: 'validation.not_found' });
    expect(await redis.zrange(keys.index(tags.workspace(ws), 'action_policies'), 0, -1)).toEqual([]);
  });

  it('without an expected_version deletes whatever version is stored', async () => {
    const ws = newId('workspace');
    const policies = new PolicyStore(redis, new DocumentStore(redis), noAudit, noLog);
    const p = await policies.create(ws, rule('deny'));
    const conn = racingConnection(() => policies.update(ws, p.id, rule('allow'), 1));
    await new PolicyStore(conn, new DocumentStore(conn), noAudit, noLog).remove(ws, p.id, undefined);
    await expect(policies.get(ws, p.id)).rejects.toMatchObject({ type: 'validation.not_found' });
  });

  it('answers 404 when another delete took it after its read', async () => {
    const ws = newId('workspace');
    const policies = new PolicyStore(redis, new DocumentStore(redis), noAudit, noLog);
    const p = await policies.create(ws, rule('deny'));
    const conn = racingConnection(() => policies.remove(ws, p.id, 1));
    await expect(new PolicyStore(conn, new DocumentStore(conn), noAudit, noLog).remove(ws, p.id, 1)).rejects.toMatchObject({ type: 'validation.not_found', status: 404 });
  });
});

describe('deleting a PermissionAssignment at an expected_version', () => {
  it('is refused with 409 when an update landed after its read, and the update stands', async () => {
    const ws = newId('workspace');
    const principal = newId('principal');
    const permissions = new PermissionStore(redis, new DocumentStore(redis));
    const a = await permissions.create(ws, { principal_id: principal, target: { type: 'workspace', id: ws }, actions: ['read'] });
    const conn = racingConnection(() => permissions.update(ws, a.id, ['read', 'invoke'], 1));
    const racing = new PermissionStore(conn, new DocumentStore(conn));

    await expect(racing.remove(ws, a.id, 1)).rejects.toMatchObject({ type: 'validation.conflict', status: 409 });
    expect(await permissions.get(ws, a.id)).toMatchObject({ version: 2, actions: ['invoke', 'read'] });
    expect(await permissions.holds(ws, principal, 'invoke', { type: 'workspace', id: ws })).toBe(true);

    await permissions.remove(ws, a.id, 2);
    expect(await permissions.holds(ws, principal, 'read', { type: 'workspace', id: ws })).toBe(false);
    const tag = tags.workspace(ws);
    expect(await redis.zcard(keys.index(tag, 'permission_assignments'))).toBe(0);
    expect(await redis.zcard(keys.index(tag, `permission_assignments:principal:${principal}`))).toBe(0);
  });
});
