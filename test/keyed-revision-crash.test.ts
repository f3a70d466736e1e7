import { afterAll, describe, expect, it } from 'vitest';
import { sha256Hex } from '@agentplane/core';
import { cardJson, signCard, signingKey, startCardPeer, type CardPeer } from './harness/a2a-peer.js';
import { crashedKeyed, useCrashPlatforms, type CrashPlatform } from './harness/crash-platform.js';
import { waitFor } from './harness/platform.js';
import type { Json } from './harness/turns.js';

/**
 * The API killed right after a keyed request wrote a new version or revision of a resource that
 * already exists (crash points `new-version-written`: an Agent's update, a harness profile's
 * revision; `connection-binding-revision-published`; `tool-source-rotated`), the key's pending record gone as it goes
 * once its owner is dead (here removed, as its expiry would). The retry of the same request is
 * answered what its first attempt wrote: not refused as stale when it was fenced on the version
 * that attempt moved on from (an Agent, a harness profile), not written again as the next revision
 * when it was not fenced (a binding revision without `expected_resource_version`), not refused
 * for what the first attempt changed (a tool source rotation: its package no longer higher, its
 * dependents' versions moved by the migration).
 */
const POINTS = ['new-version-written', 'connection-binding-revision-published', 'tool-source-rotated'];

let peer: CardPeer | undefined;
afterAll(async () => {
  await peer?.close();
});
const identity = (pkg: Json) => ({ id: pkg.id, package_version: pkg.package_version, digest: pkg.digest });

/** `crashedKeyed` for a JSON POST at `path`. */
function crashedPost(q: CrashPlatform, point: string, path: string, body: Json, key: string): Promise<void> {
  return crashedKeyed(q, point, key, () => q.p.root.request('POST', path, { body, idempotencyKey: key }), { probePath: '/v1/agents' });
}

describe('a crash inside a keyed new version or revision', () => {
  const crash = useCrashPlatforms('keyed-revision-crash');

  it('an Agent update, a harness profile revision, a connection binding revision and a tool source rotation are each written once, answered to the retry', async () => {
    const [q, key] = await Promise.all([crash.start(POINTS, { env: { LOG_LEVEL: 'warn', AGENTPLANE_MODE: 'development' } }), signingKey('rotation')]);
    peer = await startCardPeer();
    peer.card = await signCard(cardJson(peer.rpcUrl), key);
    const api = q.p.root;
    const ws = q.p.bootstrap.workspace_id;

    // ---- An Agent's update, fenced on the version it starts from: the retry was refused 409 as stale.
    {
      const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'keyed', model: 'default', system: 'Be brief.' })).id;
      const body = { expected_version: 1, system: 'Be briefer.' };
      await crashedPost(q, 'new-version-written', `/v1/agents/${agent}`, body, 'k-agent');
      expect((await api.get<{ version: number; system: string }>(`/v1/agents/${agent}`))).toMatchObject({ version: 2, system: 'Be briefer.' });
      const retry = await api.request<{ id: string; version: number; system: string }>('POST', `/v1/agents/${agent}`, { body, idempotencyKey: 'k-agent' });
      expect([retry.status, retry.body.id, retry.body.version, retry.body.system]).toEqual([200, agent, 2, 'Be briefer.']);
      expect((await api.get<{ data: { version: number }[] }>(`/v1/agents/${agent}/versions`)).data.map((v) => v.version)).toEqual([1, 2]);
      // Another request fenced on the same version is still refused as stale; one on the latest writes its own.
      const stale = await api.request<{ error: { type: string } }>('POST', `/v1/agents/${agent}`, { body, idempotencyKey: 'k-agent-other' });
      expect([stale.status, stale.body.error?.type]).toEqual([409, 'validation.conflict']);
      const other = await api.request<{ version: number }>('POST', `/v1/agents/${agent}`, { body: { ...body, expected_version: 2 }, idempotencyKey: 'k-agent-next' });
      expect([other.status, other.body.version]).toEqual([200, 3]);
    }

    // ---- A harness profile's revision, fenced on the revision it starts from: the retry was refused 409 as stale.
    {
      const hprof = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/harness-profiles`, { key: 'keyed', kind: 'builtin' })).id;
      const body = { expected_revision_number: 1, kind: 'builtin', display_name: 'Second' };
      await crashedPost(q, 'new-version-written', `/v1/harness-profiles/${hprof}/revisions`, body, 'k-hprof');
      const retry = await api.request<{ id: string; revision_number: number; display_name: string }>('POST', `/v1/harness-profiles/${hprof}/revisions`, { body, idempotencyKey: 'k-hprof' });
      expect([retry.status, retry.body.id, retry.body.revision_number, retry.body.display_name]).toEqual([201, hprof, 2, 'Second']);
      expect((await api.get<{ revision_number: number }>(`/v1/harness-profiles/${hprof}`)).revision_number).toBe(2);
      // Another request fenced on the same revision is still refused as stale.
      const other = await api.request<{ error: { type: string } }>('POST', `/v1/harness-profiles/${hprof}/revisions`, { body, idempotencyKey: 'k-hprof-other' });
      expect([other.status, other.body.error?.type]).toEqual([409, 'validation.conflict']);
    }

    // ---- A connection binding's revision, not fenced: the retry was published again as revision 2.
    {
      const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'bound', model: 'default', system: 'Be brief.' })).id;
      const conn = (await api.post<{ id: string }>('/v1/connections', { name: 'upstream', url: 'https://mcp.example.test/mcp' })).id;
      const adep = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/agent-deployments`, { agent_id: agent, key: 'bound' })).id;
      const binding = (await api.post<{ id: string }>(`/v1/agent-deployments/${adep}/connection-bindings`, { agent_deployment_id: adep, integration_connection_id: conn, key: 'tools' })).id;
      const path = `/v1/agent-deployment-connection-bindings/${binding}/revisions`;
      const body = { tool_selection: ['search'], tool_aliases: {}, argument_policy: 'strict' };
      await crashedPost(q, 'connection-binding-revision-published', path, body, 'k-binding-rev');
      const retry = await api.request<{ binding_revision_number: number; argument_policy: string }>('POST', path, { body, idempotencyKey: 'k-binding-rev' });
      expect([retry.status, retry.body.binding_revision_number, retry.body.argument_policy]).toEqual([201, 1, 'strict']);
      const head = await api.get<{ current_revision_number: number; resource_version: number }>(`/v1/agent-deployment-connection-bindings/${binding}`);
      expect([head.current_revision_number, head.resource_version]).toEqual([1, 2]);
      // Another request publishes its own.
      const other = await api.request<{ binding_revision_number: number }>('POST', path, { body, idempotencyKey: 'k-binding-rev-other' });
      expect([other.status, other.body.binding_revision_number]).toEqual([201, 2]);
    }

    // ---- A tool source rotation with a dependent Connection: the retry was refused 409 (its package
    // no longer higher than the current one, its dependent's version moved by the migration).
    {
      const v1 = await api.post<Json>('/v1/provider-packages', { name: 'peer', package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
      const source = { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] };
      const id = (await api.post<{ id: string }>('/v1/tool-sources', { name: 'peer', provider: 'peer', provider_package_version: v1.package_version, source })).id;
      expect((await api.request('POST', `/v1/tool-sources/${id}/sync`, { body: {} })).status).toBe(200);
      const conn = await api.post<{ id: string; version: number }>(`/v1/tool-sources/${id}/connections`, { name: 'team' });
      const v2 = await api.post<Json>('/v1/provider-packages', { name: 'peer', package_version: 2, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
      const path = `/v1/tool-sources/${id}/source-revisions`;
      const body = { source, provider_package: identity(v2), dependent_connections: [{ id: conn.id, version: conn.version }] };
      await crashedPost(q, 'tool-source-rotated', path, body, 'k-rotate');
      // The migration the first attempt intended runs (the sweep finds it): the dependent moves on.
      const migrated = await waitFor('the rotation\'s migration to complete', async () => {
        const r = await api.get<{ revision: number; migration: { state: string } | null }>(`/v1/tool-sources/${id}`);
        return r.migration?.state === 'completed' ? r : undefined;
      }, 60_000);
      expect(migrated.revision).toBe(2);
      const retry = await api.request<{ id: string; revision: number; provider_package: Json }>('POST', path, { body, idempotencyKey: 'k-rotate' });
      expect([retry.status, retry.body.id, retry.body.revision, retry.body.provider_package]).toEqual([201, id, 2, identity(v2)]);
      // Another request for the same rotation is refused: the package is no longer higher.
      const other = await api.request<{ error: { type: string } }>('POST', path, { body, idempotencyKey: 'k-rotate-other' });
      expect([other.status, other.body.error?.type]).toEqual([409, 'validation.conflict']);
      // Once rotated again, the first request's key no longer answers: 409 idempotency.conflict, nothing written.
      const moved = (await api.get<{ data: { id: string; version: number }[] }>(`/v1/tool-sources/${id}/connections`)).data.map((c) => ({ id: c.id, version: c.version }));
      const v3 = await api.post<Json>('/v1/provider-packages', { name: 'peer', package_version: 3, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
      expect((await api.request('POST', path, { body: { ...body, provider_package: identity(v3), dependent_connections: moved }, idempotencyKey: 'k-rotate-3' })).status).toBe(201);
      await q.redis().del(`ap:{w:${ws}}:idem:${sha256Hex('k-rotate')}`);
      const stale = await api.request<{ error: { type: string } }>('POST', path, { body, idempotencyKey: 'k-rotate' });
      expect([stale.status, stale.body.error?.type]).toEqual([409, 'idempotency.conflict']);
      expect((await api.get<{ revision: number }>(`/v1/tool-sources/${id}`)).revision).toBe(3);
    }
  }, 240_000);
});
