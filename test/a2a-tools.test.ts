import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPlatform, type Platform } from './harness/platform.js';
import { errMsg, errType } from './harness/governance.js';
import { cardJson, signCard, signingKey, startCardPeer, type CardPeer, type SigningKey } from './harness/a2a-peer.js';

type Json = Record<string, unknown>;
type Source = { id: string; revision: number; version: number; sync: { state: string; rejection: { reason: string } | null }; tools: { name: string; approval: string }[]; discovery: Json | null };

let p: Platform;
let peer: CardPeer;
let key: SigningKey;

const post = <T = Json>(path: string, body: unknown) => p.root.request<T>('POST', path, { body });

beforeAll(async () => {
  [p, peer, key] = await Promise.all([startPlatform({ env: { AGENTPLANE_MODE: 'development' } }), startCardPeer(), signingKey('peer-2026')]);
});
afterAll(async () => {
  await Promise.all([p?.stop(), peer?.close()]);
});

describe('External A2A tool sources: provider packages and sync', () => {
  let pkgId: string;

  it('publishes reviewed provider packages: immutable, monotonically versioned, one origin', async () => {
    const pkg = await post<Json>('/v1/provider-packages', { name: 'peer', package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl, review_note: 'reviewed' });
    expect(pkg.status, JSON.stringify(pkg.body)).toBe(201);
    expect(pkg.body).toMatchObject({
      type: 'provider_package', name: 'peer', package_version: 1, origin: peer.base,
      egress: [{ method: 'GET', url: peer.cardUrl }, { method: 'POST', url: peer.rpcUrl }], review_note: 'reviewed',
    });
    expect(pkg.body.id).toMatch(/^ppkg_[0-9a-f]{32}$/);
    expect(pkg.body.digest).toMatch(/^sha256:/);
    pkgId = pkg.body.id as string;

    const again = await post('/v1/provider-packages', { name: 'peer', package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
    expect([again.status, errType(again)]).toEqual([409, 'validation.conflict']);
    const twoHosts = await post('/v1/provider-packages', { name: 'other', package_version: 1, card_url: peer.cardUrl, rpc_url: 'http://localhost:1/a2a' });
    expect([twoHosts.status, errType(twoHosts)]).toEqual([400, 'validation.malformed']);
    const patch = await p.root.request('PATCH', `/v1/provider-packages/${pkgId}`, { body: { review_note: 'x' } });
    expect([404, 405]).toContain(patch.status);
    expect((await p.root.request<Json>('GET', `/v1/provider-packages/${pkgId}`)).body.review_note).toBe('reviewed');
  });

  it('requires a reviewed package and keeps the source inside its card GET', async () => {
    const src = { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] };
    const noPkg = await post('/v1/tool-sources', { name: 'x', provider: 'unreviewed', source: src });
    expect([noPkg.status, errType(noPkg)]).toEqual([404, 'validation.not_found']);
    const outside = await post('/v1/tool-sources', { name: 'x', provider: 'peer', source: { ...src, card_url: `${peer.base}/other-card.json` } });
    expect([outside.status, errType(outside)]).toEqual([400, 'validation.malformed']);
    expect(errMsg(outside)).toContain('admits only the card GET');
    const privateKey = await post('/v1/tool-sources', { name: 'x', provider: 'peer', source: { ...src, verification_keys: [{ ...key.jwk, d: 'secret' }] } });
    expect([privateKey.status, errType(privateKey)]).toEqual([400, 'validation.malformed']);
  });

  it('syncs a signed card into always-ask tools and refuses a tampered or unsigned one, keeping the last good discovery', async () => {
    const created = await post<Source>('/v1/tool-sources', { name: 'peer', provider: 'peer', source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] } });
    expect(created.status, JSON.stringify(created.body)).toBe(201);
    expect(created.body).toMatchObject({ type: 'tool_source', provider: 'peer', provider_package: { id: pkgId, package_version: 1 }, revision: 1, sync: { state: 'pending' }, tools: [] });
    const id = created.body.id;
    expect(id).toMatch(/^tsrc_[0-9a-f]{32}$/);

    peer.card = await signCard(cardJson(peer.rpcUrl), key);
    const synced = await post<Source>(`/v1/tool-sources/${id}/sync`, {});
    expect(synced.status, JSON.stringify(synced.body)).toBe(200);
    expect(synced.body.sync).toMatchObject({ state: 'synced', rejection: null });
    expect(synced.body.discovery).toMatchObject({ key_id: 'peer-2026', interface: { url: peer.rpcUrl, protocol_binding: 'JSONRPC' }, streaming: false, security: { kind: 'bearer' } });
    expect(synced.body.tools).toEqual([
      { name: 'a2a_peer_summarize', skill_id: 'summarize', description: 'Summarizes text', approval: 'always_ask' },
      { name: 'a2a_peer_translate', skill_id: 'translate', description: 'Translates text', approval: 'always_ask' },
    ]);

    peer.card = { ...(await signCard(cardJson(peer.rpcUrl), key)), description: 'tampered after signing' };
    const tampered = await post(`/v1/tool-sources/${id}/sync`, {});
    expect([tampered.status, errType(tampered)]).toEqual([409, 'validation.conflict']);
    expect(errMsg(tampered)).toContain('bad_signature');
    const after = (await p.root.request<Source>('GET', `/v1/tool-sources/${id}`)).body;
    expect(after.sync).toMatchObject({ state: 'rejected', rejection: { reason: 'bad_signature' } });
    expect(after.tools).toHaveLength(2);
    expect(after.discovery).toEqual(synced.body.discovery);

    peer.card = cardJson(peer.rpcUrl);
    const unsigned = await post(`/v1/tool-sources/${id}/sync`, {});
    expect(errMsg(unsigned)).toContain('unsigned_card');
    peer.card = await signCard(cardJson(peer.rpcUrl, { securitySchemes: { k: { apiKeySecurityScheme: { name: 'k', location: 'header' } } }, securityRequirements: [{ schemes: { k: { list: [] } } }] }), key);
    expect(errMsg(await post(`/v1/tool-sources/${id}/sync`, {}))).toContain('unsupported_security');

    const list = await p.root.request<{ data: Source[] }>('GET', '/v1/tool-sources');
    expect(list.body.data.map((s) => s.id)).toEqual([id]);
  });

  it('rotates trust through a source revision: exact higher compatible package, current dependents, verified discovery', async () => {
    const list = await p.root.request<{ data: Source[] }>('GET', '/v1/tool-sources');
    const id = list.body.data[0]!.id;
    const before = (await p.root.request<Source & { provider_package: Json }>('GET', `/v1/tool-sources/${id}`)).body;
    const key2 = await signingKey('peer-2027');
    const v2 = (await post<Json>('/v1/provider-packages', { name: 'peer', package_version: 2, card_url: peer.cardUrl, rpc_url: peer.rpcUrl })).body;
    const moved = peer.base.replace('127.0.0.1', 'localhost');
    const v3 = (await post<Json>('/v1/provider-packages', { name: 'peer', package_version: 3, card_url: `${moved}/.well-known/agent-card.json`, rpc_url: `${moved}/a2a` })).body;
    const identity = (pkg: Json) => ({ id: pkg.id, package_version: pkg.package_version, digest: pkg.digest });
    const candidate = { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key2.jwk] };
    const rotate = (body: Json, idem: string | null = `rot-${Math.random()}`) =>
      p.root.request<Source & { provider_package: Json }>('POST', `/v1/tool-sources/${id}/source-revisions`, { body, ...(idem ? { idempotencyKey: idem } : {}) });
    const body = { source: candidate, provider_package: identity(v2), dependent_connections: [] as Json[] };

    expect((await rotate(body, null)).status).toBe(400);
    const stale = await rotate({ ...body, dependent_connections: [{ id: 'conn_00000000000000000000000000000001', version: 1 }] });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);
    expect(errMsg(stale)).toContain('stale');
    const notHigher = await rotate({ ...body, provider_package: before.provider_package });
    expect([notHigher.status, errType(notHigher)]).toEqual([409, 'validation.conflict']);
    const wrongDigest = await rotate({ ...body, provider_package: { ...identity(v2), digest: 'sha256:00' } });
    expect(wrongDigest.status).toBe(409);
    const otherOrigin = await rotate({ ...body, provider_package: identity(v3) });
    expect(errMsg(otherOrigin)).toContain('not compatible');

    // The peer still serves a card signed with the old key: the candidate's keys refuse it, nothing is published.
    peer.card = await signCard(cardJson(peer.rpcUrl), key);
    const gets = peer.cardGets;
    const unverified = await rotate(body);
    expect([unverified.status, errType(unverified)]).toEqual([409, 'validation.conflict']);
    expect(errMsg(unverified)).toContain('bad_signature');
    expect(peer.cardGets).toBe(gets + 1);
    expect((await p.root.request<Source>('GET', `/v1/tool-sources/${id}`)).body.revision).toBe(1);

    peer.card = await signCard(cardJson(peer.rpcUrl), key2);
    const ok = await rotate({ ...body, expected_version: before.version });
    expect(ok.status, JSON.stringify(ok.body)).toBe(201);
    expect(ok.body).toMatchObject({ revision: 2, provider_package: identity(v2), sync: { state: 'synced' }, discovery: { key_id: 'peer-2027' } });
    expect(ok.body.tools).toHaveLength(2);
    const fenced = await rotate({ ...body, expected_version: before.version });
    expect([fenced.status, errType(fenced)]).toEqual([409, 'validation.conflict']);
  });
});
