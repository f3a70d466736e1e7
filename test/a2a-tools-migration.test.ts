import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { waitFor, type Platform } from './harness/platform.js';
import { useCrashPlatforms } from './harness/crash-platform.js';
import { errMsg, errType } from './harness/governance.js';
import { cardJson, signCard, signingKey, startCardPeer, type CardPeer, type SigningKey } from './harness/a2a-peer.js';

/**
 * Connections of kind `a2a_tool_source` are a tool source's dependents: a rotation must name
 * them all, sorted, with their current versions, and after the publish they are migrated to the
 * new revision by a durable job, one compare-and-swap each. The api is made to kill itself
 * (SIGKILL, at the crash point `tool-source-migration-step`) after the first Connection of a rotation; the
 * restarted api resumes the job and migrates each Connection exactly once.
 */
type Json = Record<string, unknown>;
interface Conn { id: string; version: number; source_revision: number; provider_package: { package_version: number }; kind: string }
interface Source { id: string; revision: number; version: number; provider_package: Json; migration: { revision: number; state: string } | null }

const crash = useCrashPlatforms('migration-crash');
let p: Platform;
let peer: CardPeer;
let key: SigningKey;

const post = <T = Json>(path: string, body: unknown, idempotencyKey?: string) => p.root.request<T>('POST', path, { body, ...(idempotencyKey ? { idempotencyKey } : {}) });
const identity = (pkg: Json) => ({ id: pkg.id, package_version: pkg.package_version, digest: pkg.digest });

beforeAll(async () => {
  [p, peer, key] = await Promise.all([
    crash.start(['tool-source-migration-step'], { env: { AGENTPLANE_MODE: 'development', A2A_TOOLS_MIGRATION_LOCK_MS: '2000', A2A_TOOLS_MIGRATION_SWEEP_MS: '500' } }).then((c) => c.p),
    startCardPeer(),
    signingKey('k1'),
  ]);
  peer.card = await signCard(cardJson(peer.rpcUrl), key);
}, 120_000);
afterAll(async () => {
  await peer?.close();
});

describe('tool source Connections and their migration on rotation', () => {
  it('refuses a stale dependent list; migrates two Connections across an api crash, each exactly once', async () => {
    const v1 = (await post<Json>('/v1/provider-packages', { name: 'peer', package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl })).body;
    const id = (await post<{ id: string }>('/v1/tool-sources', { name: 'peer', provider: 'peer', source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] } })).body.id;
    const unsynced = await post(`/v1/tool-sources/${id}/connections`, { name: 'early' });
    expect([unsynced.status, errType(unsynced)]).toEqual([409, 'validation.conflict']);
    expect((await post(`/v1/tool-sources/${id}/sync`, {})).status).toBe(200);

    const a = (await post<Conn>(`/v1/tool-sources/${id}/connections`, { name: 'team-a' })).body;
    const b = (await post<Conn>(`/v1/tool-sources/${id}/connections`, { name: 'team-b' })).body;
    expect(a).toMatchObject({ type: 'connection', kind: 'a2a_tool_source', tool_source_id: id, source_revision: 1, version: 1, provider_package: identity(v1) });
    // The /v1/connections routes serve MCP server Connections; these are read through their source.
    expect((await p.root.request('GET', `/v1/connections/${a.id}`)).status).toBe(404);
    const listed = await p.root.request<{ data: Conn[] }>('GET', `/v1/tool-sources/${id}/connections`);
    expect(listed.body.data.map((c) => c.id).sort()).toEqual([a.id, b.id].sort());

    const v2 = (await post<Json>('/v1/provider-packages', { name: 'peer', package_version: 2, card_url: peer.cardUrl, rpc_url: peer.rpcUrl })).body;
    const sorted = [a, b].sort((x, y) => (x.id < y.id ? -1 : 1)).map((c) => ({ id: c.id, version: c.version }));
    const body = (deps: Json[]) => ({ source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] }, provider_package: identity(v2), dependent_connections: deps });
    const rotate = (deps: Json[], idem = `rot-${Math.random()}`) => post<Source>(`/v1/tool-sources/${id}/source-revisions`, body(deps), idem);

    // Incomplete, stale or unsorted lists are refused; nothing is published.
    for (const deps of [[], [sorted[0]!], [sorted[0]!, { ...sorted[1]!, version: 2 }]]) {
      const r = await rotate(deps);
      expect([r.status, errType(r)]).toEqual([409, 'validation.conflict']);
      expect(errMsg(r)).toContain('stale');
      expect(errMsg(r)).toContain(sorted[0]!.id);
    }
    const unsorted = await rotate([sorted[1]!, sorted[0]!]);
    expect([unsorted.status, errType(unsorted)]).toEqual([400, 'validation.malformed']);
    expect((await p.root.request<Source>('GET', `/v1/tool-sources/${id}`)).body.revision).toBe(1);

    // The rotation: the api kills itself after the first Connection's step.
    const apiBefore = p.pids().api;
    const idem = 'rotation-with-dependents';
    const first = await rotate(sorted, idem).catch(() => null);
    if (first) expect([first.status, first.body.revision]).toEqual([201, 2]);
    await waitFor('the api to be killed and restarted', () => {
      try {
        const now = p.pids().api;
        return now !== undefined && now !== apiBefore ? true : undefined;
      } catch {
        return undefined;
      }
    }, 60_000);
    // The supervisor saw the api die of SIGKILL (the fault hook), and restarted it.
    expect(readFileSync(p.logFile, 'utf8')).toMatch(/"child":"api","code":null,"signal":"SIGKILL"/);

    const done = await waitFor('the migration to complete', async () => {
      const r = await p.root.request<Source>('GET', `/v1/tool-sources/${id}`).catch(() => null);
      return r?.status === 200 && r.body.migration?.state === 'completed' ? r.body : undefined;
    }, 60_000);
    expect(done).toMatchObject({ revision: 2, migration: { revision: 2, state: 'completed' }, provider_package: identity(v2) });
    const after = (await p.root.request<{ data: Conn[] }>('GET', `/v1/tool-sources/${id}/connections`)).body.data;
    // Each Connection moved once: version 1 → 2, pinned to revision 2 and package v2.
    expect(after.map((c) => [c.id, c.version, c.source_revision, c.provider_package.package_version]).sort()).toEqual(
      sorted.map((c) => [c.id, 2, 2, 2]).sort(),
    );

    // The next rotation needs the migrated versions.
    const v3 = (await post<Json>('/v1/provider-packages', { name: 'peer', package_version: 3, card_url: peer.cardUrl, rpc_url: peer.rpcUrl })).body;
    const staleAfter = await post(`/v1/tool-sources/${id}/source-revisions`, { ...body(sorted), provider_package: identity(v3) }, 'rot-3-stale');
    expect([staleAfter.status, errType(staleAfter)]).toEqual([409, 'validation.conflict']);
    const next = await post<Source>(`/v1/tool-sources/${id}/source-revisions`, { ...body(sorted.map((c) => ({ ...c, version: 2 }))), provider_package: identity(v3) }, 'rot-3');
    expect([next.status, next.body.revision]).toEqual([201, 3]);
    const third = await waitFor('the second migration', async () => {
      const r = (await p.root.request<{ data: Conn[] }>('GET', `/v1/tool-sources/${id}/connections`)).body.data;
      return r.every((c) => c.source_revision === 3) ? r : undefined;
    }, 30_000);
    expect(third.map((c) => c.version)).toEqual([3, 3]);
  });
});
