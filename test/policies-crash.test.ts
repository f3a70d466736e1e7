import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { startApiNode, type ApiNode } from './harness/cluster-platform.js';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';

/**
 * The API killed right after an ActionPolicy is created, replaced or deleted (crash points
 * `action-policy-created`, `action-policy-updated`, `action-policy-deleted`): the write and the
 * bump of the Workspace's policy-set version are one script, so another API process, which holds
 * the compiled rule set of the version it last read, decides the next call under the write
 * whatever became of the request that made it.
 */
describe('a crash while an ActionPolicy is written', () => {
  let q: Platform | undefined;
  let other: ApiNode | undefined;
  let markers: string | undefined;
  afterAll(async () => {
    await other?.stop();
    await q?.stop();
    if (markers) rmSync(markers, { recursive: true, force: true });
  });

  it('leaves every API process deciding under the write', async () => {
    markers = mkdtempSync(join(tmpdir(), 'apol-crash-'));
    const marker = (point: string) => join(markers ?? '', point);
    const points = ['action-policy-created', 'action-policy-updated', 'action-policy-deleted'];
    q = await startPlatform({ env: { LOG_LEVEL: 'warn', AGENTPLANE_CRASH_AT: points.map((pt) => `${pt}:${marker(pt)}`).join(',') } });
    other = await startApiNode(q, q.redisUrl(), 'api-other', { LOG_LEVEL: 'warn' });
    const node = other.root;
    const decision = async () => (await node.post<{ decision: string }>('/v1/action-policies/evaluate', { tool: { kind: 'builtin', name: 'bash' }, input: { command: 'ls' } })).decision;
    /** One write through the platform's API, which dies at `point`; then the API is back. */
    const crashing = async (point: string, method: string, path: string, opts: Parameters<HttpClient['request']>[2]) => {
      const before = q?.pids().api;
      await expect(q?.root.request(method, path, opts)).rejects.toThrow();
      expect(existsSync(marker(point))).toBe(true);
      await waitFor('the API restarted', () => (q?.pids().api !== undefined && q.pids().api !== before ? true : undefined), 30_000);
      await waitFor('the API answering', async () => ((await q?.root.request('GET', '/v1/action-policies').catch(() => null))?.status === 200 ? true : undefined), 30_000);
    };

    // The other process has compiled the Workspace's (empty) set.
    expect(await decision()).toBe('allow');

    await crashing('action-policy-created', 'POST', '/v1/action-policies', { body: { effect: 'deny', tool: { kind: 'builtin', name: 'bash' } } });
    const listed = await node.get<{ data: { id: string; version: number }[] }>('/v1/action-policies');
    expect(listed.data).toHaveLength(1);
    const id = listed.data[0]?.id ?? '';
    expect(await decision()).toBe('deny');

    await crashing('action-policy-updated', 'POST', `/v1/action-policies/${id}`, { body: { effect: 'require_approval', tool: { kind: 'builtin', name: 'bash' }, expected_version: 1 } });
    expect(await node.get(`/v1/action-policies/${id}`)).toMatchObject({ version: 2, effect: 'require_approval' });
    expect(await decision()).toBe('require_approval');

    await crashing('action-policy-deleted', 'DELETE', `/v1/action-policies/${id}`, { query: { expected_version: 2 } });
    expect((await node.request('GET', `/v1/action-policies/${id}`)).status).toBe(404);
    expect(await decision()).toBe('allow');
  }, 180_000);
});
