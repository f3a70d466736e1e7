import { existsSync, rmSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { sha256Hex } from '@agentplane/core';
import { useCrashPlatforms } from './harness/crash-platform.js';
import type { Json } from './harness/turns.js';

/**
 * The API killed right after a keyed create of an Agent or an Environment wrote it (crash points
 * `agent-created`, `environment-created`), and the key's pending record gone as it goes once its
 * owner is dead (here removed, as its expiry would): the retry of the same request under the key
 * finds what its first attempt wrote (its id is derived from the key and the request) and answers
 * it, 201 as the first attempt would have; there is one of it, not two.
 */
describe('a crash inside a keyed Agent or Environment create', () => {
  const crash = useCrashPlatforms('keyed-create-crash');

  it.each([
    { what: 'Agent', path: '/v1/agents', point: 'agent-created', id: /^agent_[0-9a-f]{32}$/, body: (name: string): Json => ({ name, model: 'default', system: 'hi' }) },
    { what: 'Environment', path: '/v1/environments', point: 'environment-created', id: /^env_[0-9a-f]{32}$/, body: (name: string): Json => ({ name, image: 'agentplane/sandbox:latest' }) },
  ])('an $what is made once, answered to the retry', async ({ path, point, id, body }) => {
    const q = await crash.start([point], { env: { LOG_LEVEL: 'warn' } });
    const api = q.p.root;
    const ws = q.p.bootstrap.workspace_id;
    const named = async (name: string) => (await api.get<{ data: { id: string; name: string }[] }>(path, { limit: 100 })).data.filter((x) => x.name === name).map((x) => x.id);

    rmSync(q.marker(point), { force: true });
    const before = q.p.pids().api;
    await expect(api.request('POST', path, { body: body('one'), idempotencyKey: 'k-one' })).rejects.toThrow();
    expect(existsSync(q.marker(point))).toBe(true);
    await q.apiRestarted(before, { client: api, path });
    const record = `ap:{w:${ws}}:idem:${sha256Hex('k-one')}`;
    expect(await q.redis().get(record)).toContain('"pending"');
    expect(await q.redis().del(record)).toBe(1);
    // What the first attempt wrote is there, under its derived id.
    const written = await named('one');
    expect(written).toHaveLength(1);
    expect(written[0]).toMatch(id);

    const retry = await api.request<{ id: string; name: string; version: number }>('POST', path, { body: body('one'), idempotencyKey: 'k-one' });
    expect([retry.status, retry.body.id, retry.body.version]).toEqual([201, written[0], 1]);
    expect(await named('one')).toEqual(written);
    const replay = await api.request<{ id: string }>('POST', path, { body: body('one'), idempotencyKey: 'k-one' });
    expect([replay.status, replay.body.id, replay.headers.get('idempotent-replayed')]).toEqual([201, written[0], 'true']);
    // Without a key, each create makes its own.
    const a = await api.request<{ id: string }>('POST', path, { body: body('two') });
    const b = await api.request<{ id: string }>('POST', path, { body: body('two') });
    expect([a.status, b.status]).toEqual([201, 201]);
    expect(a.body.id).not.toBe(b.body.id);
  }, 180_000);
});
