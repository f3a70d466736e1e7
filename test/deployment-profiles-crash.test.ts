import { existsSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { afterAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { errType } from './harness/governance.js';

type Profile = { id: string; key: string; revision_number: number };

/**
 * The API killed right after a harness or sandbox profile's Workspace-unique key was claimed
 * (crash points `harness-profile-key-claimed`, `sandbox-profile-key-claimed`): the claim is made
 * in the script that writes revision 1 and the head, so whatever the request's fate, the key
 * names a whole profile, never a profile that does not exist (which would make every later
 * creation with that key 409 for good).
 */
describe('a crash while a harness or sandbox profile is created', () => {
  let q: Platform | undefined;
  let qRedis: Redis | undefined;
  let markers: string | undefined;
  afterAll(async () => {
    qRedis?.disconnect();
    await q?.stop();
    if (markers) rmSync(markers, { recursive: true, force: true });
  });

  /** Waits for the API that `before` named to be replaced and answering. */
  async function restarted(c: HttpClient, before: number | undefined, probe: string): Promise<void> {
    await waitFor('the API restarted', () => (q?.pids().api !== undefined && q.pids().api !== before ? true : undefined), 30_000);
    await waitFor('the API answering', async () => ((await c.request('GET', probe).catch(() => null))?.status === 200 ? true : undefined), 30_000);
  }

  it('leaves the key naming a whole profile, which takes its next revision', async () => {
    markers = mkdtempSync(join(tmpdir(), 'prof-crash-'));
    const harnessMarker = join(markers, 'harness');
    const sandboxMarker = join(markers, 'sandbox');
    q = await startPlatform({ env: { LOG_LEVEL: 'warn', AGENTPLANE_CRASH_AT: `harness-profile-key-claimed:${harnessMarker},sandbox-profile-key-claimed:${sandboxMarker}` } });
    qRedis = new Redis(q.redisUrl());
    const c = q.root;
    const ws = q.bootstrap.workspace_id;
    const cases = [
      { kind: 'harness', marker: harnessMarker, body: { key: 'crashy', kind: 'builtin' }, revision: { expected_revision_number: 1, kind: 'builtin' } },
      { kind: 'sandbox', marker: sandboxMarker, body: { key: 'crashy', image: 'agentplane/sandbox:latest' }, revision: { expected_revision_number: 1, image: 'agentplane/sandbox:v2' } },
    ];
    for (const k of cases) {
      const url = `/v1/organizations/workspaces/${ws}/${k.kind}-profiles`;
      const before = q.pids().api;
      await expect(c.request('POST', url, { body: k.body })).rejects.toThrow();
      expect(existsSync(k.marker)).toBe(true);
      await restarted(c, before, url);
      const listed = await c.get<{ data: Profile[] }>(url, { key: 'crashy' });
      expect([k.kind, listed.data]).toEqual([k.kind, [expect.objectContaining({ key: 'crashy', revision_number: 1 })]]);
      const id = listed.data[0]?.id ?? '';
      expect((await c.get<Profile>(`/v1/${k.kind}-profiles/${id}/revisions/1`)).id).toBe(id);
      // The client's retry learns the key is taken: by the profile its first attempt created.
      const retry = await c.request('POST', url, { body: k.body });
      expect([retry.status, errType(retry)]).toEqual([409, 'validation.conflict']);
      const next = await c.request<Profile>('POST', `/v1/${k.kind}-profiles/${id}/revisions`, { body: k.revision });
      expect([next.status, next.body.revision_number]).toEqual([201, 2]);
    }

    // A key claimed for a profile whose head was never written (what a creation that died between
    // two separate steps left before they were one script) is released by the next creation.
    const uniq = `ap:{w:${ws}}:uniq:sandbox_profile_keys`;
    await qRedis.hset(uniq, 'orphaned', `sprof_${'0'.repeat(32)}`);
    const url = `/v1/organizations/workspaces/${ws}/sandbox-profiles`;
    expect((await c.get<{ data: Profile[] }>(url, { key: 'orphaned' })).data).toEqual([]);
    const taken = await c.request<Profile>('POST', url, { body: { key: 'orphaned', image: 'agentplane/sandbox:latest' } });
    expect([taken.status, taken.body.key]).toEqual([201, 'orphaned']);
    expect(await qRedis.hget(uniq, 'orphaned')).toBe(taken.body.id);
    expect((await c.get<{ data: Profile[] }>(url, { key: 'orphaned' })).data.map((p) => p.id)).toEqual([taken.body.id]);
    const again = await c.request('POST', url, { body: { key: 'orphaned', image: 'agentplane/sandbox:latest' } });
    expect([again.status, errType(again)]).toEqual([409, 'validation.conflict']);
  }, 180_000);
});
