import { beforeAll, describe, expect, it } from 'vitest';
import { newSecret, secretDigest } from '@agentplane/core';
import { keys, tags } from '@agentplane/store';
import { connectRawRunner, welcomeOf } from './harness/raw-runner.js';
import { crashedKeyed, useCrashPlatforms, type CrashPlatform } from './harness/crash-platform.js';
import type { Json } from './harness/turns.js';

/** `crashedKeyed` for a JSON create at `path` (neither create has a GET of its own path: the pools' list is the probe). */
function crashedCreate(q: CrashPlatform, point: string, path: string, body: Json, key: string): Promise<void> {
  return crashedKeyed(q, point, key, () => q.p.root.request('POST', path, { body, idempotencyKey: key }), { probePath: '/v1/runner-pools' });
}

interface Pairing { id: string; code: string; expires_at: string }
interface Issued {
  secret: string;
  connect_path: string;
  runner_credential: { id: string; runner_id: string; version: number; status: string; display_name: string; owner: { principal: string; machine_label: string } | null };
}
interface StoredPairing { id: string; machine_label: string; code_digest: string; status: string; expires_at: string; version: number }

/** How a pairing code is stored: the digest of its normalized form (packages/domain/src/runners/service.ts). */
const codeDigest = (code: string) => secretDigest(`runner-pairing\0${code.replace(/-/g, '')}`);
const codeKey = (digest: string) => keys.scoped(tags.global(`rpcode:${digest}`), 'runner_pairing_code');

/**
 * The API killed right after a keyed runner pairing or managed-pool enrollment wrote its pairing
 * or runner credential, before its code or secret was live (crash points `runner-pairing-created`,
 * `runner-enrolled`), and the key's pending record gone as it goes once its owner is dead (here
 * removed, as its expiry would): the retry of the same request under the key answers the pairing
 * or runner its first attempt wrote (its id derived from the key and the request), with a new
 * code or secret that works (the first attempt's was never shown); there is one of it, not two.
 */
describe('a crash inside a keyed runner pairing or managed-pool enrollment', () => {
  const crash = useCrashPlatforms('keyed-runner-create-crash');
  let q: CrashPlatform;
  let ws: string;

  beforeAll(async () => {
    q = await crash.start(['runner-pairing-created', 'runner-enrolled'], { env: { LOG_LEVEL: 'warn' } });
    ws = q.p.bootstrap.workspace_id;
  }, 120_000);

  /** The pairings stored in the Workspace for `label` (there is no list operation). */
  async function pairings(label: string): Promise<StoredPairing[]> {
    const ids = await q.redis().zrange(keys.index(tags.workspace(ws), 'runner_pairings'), 0, -1);
    const docs = await Promise.all(ids.map(async (id) => JSON.parse(String(await q.redis().get(keys.doc(tags.workspace(ws), id)))) as StoredPairing));
    return docs.filter((d) => d.machine_label === label);
  }

  it('a runner pairing is made once; the retry\'s new code redeems, the dead attempt\'s does not', async () => {
    const api = q.p.root;
    const principal = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
      external_subject_id: 'pairing-owner', principal_type: 'person', display_name: 'Owner',
    })).id;
    const body: Json = { principal_id: principal, machine_label: 'keyed-box', expires_in_seconds: 600 };
    await crashedCreate(q, 'runner-pairing-created', '/v1/runner-pairings', body, 'k-pair');
    const written = await pairings('keyed-box');
    expect(written.map((x) => [x.status, x.version])).toEqual([['pending', 1]]);
    const first = written[0]!;
    // As if the dead attempt had made its code live too (it died before it could answer it):
    // that code, never shown, must not redeem once the retry has answered.
    const dead = 'AAAA-BBBB-CCCC-DDDD';
    await q.redis().set(keys.doc(tags.workspace(ws), first.id), JSON.stringify({ ...first, code_digest: codeDigest(dead) }));
    await q.redis().set(codeKey(codeDigest(dead)), JSON.stringify({ workspace_id: ws, pairing_id: first.id }), 'PX', 600_000);

    const retry = await api.request<Pairing>('POST', '/v1/runner-pairings', { body, idempotencyKey: 'k-pair' });
    expect([retry.status, retry.body.id, retry.body.expires_at]).toEqual([201, first.id, first.expires_at]);
    expect(retry.body.code).toMatch(/^[0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{4}$/);
    expect(retry.body.code).not.toBe(dead);
    expect((await pairings('keyed-box')).map((x) => x.id)).toEqual([first.id]);
    // The replay shows the same code while the pairing is pending.
    const replay = await api.request<Pairing>('POST', '/v1/runner-pairings', { body, idempotencyKey: 'k-pair' });
    expect([replay.status, replay.body, replay.headers.get('idempotent-replayed')]).toEqual([201, retry.body, 'true']);

    const refused = await q.p.anon.request<{ error: { type: string } }>('POST', '/v1/runner-pairings/redeem', { body: { code: dead } });
    expect([refused.status, refused.body.error.type]).toEqual([401, 'auth.invalid_key']);
    const redeemed = await q.p.anon.request<Issued>('POST', '/v1/runner-pairings/redeem', { body: { code: retry.body.code } });
    expect(redeemed.status).toBe(201);
    expect(redeemed.body.runner_credential.owner).toEqual({ principal, machine_label: 'keyed-box' });
    expect((await pairings('keyed-box')).map((x) => [x.id, x.status])).toEqual([[first.id, 'redeemed']]);
    const runner = await connectRawRunner(q.p, redeemed.body.secret);
    expect(welcomeOf(runner).runner_id).toBe(redeemed.body.runner_credential.runner_id);
    runner.sock.terminate();

    // A pairing no longer pending and unexpired is not given a new code: 409, nothing written.
    const lapsedBody: Json = { ...body, machine_label: 'keyed-box-2' };
    await crashedCreate(q, 'runner-pairing-created', '/v1/runner-pairings', lapsedBody, 'k-pair-2');
    const [lapsed] = await pairings('keyed-box-2');
    await q.redis().set(keys.doc(tags.workspace(ws), lapsed!.id), JSON.stringify({ ...lapsed, expires_at: new Date(Date.now() - 1000).toISOString() }));
    const late = await api.request<{ error: { type: string } }>('POST', '/v1/runner-pairings', { body: lapsedBody, idempotencyKey: 'k-pair-2' });
    expect([late.status, late.body.error.type]).toEqual([409, 'idempotency.conflict']);
    expect((await pairings('keyed-box-2')).map((x) => [x.id, x.version, x.code_digest])).toEqual([[lapsed!.id, 1, lapsed!.code_digest]]);
  }, 180_000);

  it('a managed-pool enrollment makes its runner once; the retry\'s new secret connects', async () => {
    const api = q.p.root;
    const pool = (await api.post<{ id: string }>('/v1/runner-pools', { name: 'keyed-managed', placement: 'managed' })).id;
    const path = `/v1/runner-pools/${pool}/enrollments`;
    const credentials = async (label: string) => (await api.get<{ data: { id: string; runner_id: string; display_name: string; status: string }[] }>('/v1/runner-credentials', { runner_pool_id: pool, limit: 100 }))
      .data.filter((x) => x.display_name === label);

    await crashedCreate(q, 'runner-enrolled', path, { machine_label: 'keyed-ci' }, 'k-enroll');
    const written = await credentials('keyed-ci');
    expect(written).toHaveLength(1);
    // As if the dead attempt had made its secret live too (it died before it could answer it):
    // that secret, never shown, must stop working once the retry has answered.
    const dead = newSecret('ap_runner');
    await q.redis().set(keys.auth(secretDigest(dead)), JSON.stringify({
      kind: 'runner_credential', credential_id: written[0]!.id, organization_id: q.p.bootstrap.organization_id, workspace_id: ws,
      role: null, principal_id: null, audience: null, rate_limit_per_minute: null, generation_number: 1,
    }));
    await q.redis().set(keys.global(`digest:${written[0]!.id}`), `1 ${secretDigest(dead)}`);
    (await connectRawRunner(q.p, dead)).sock.terminate();

    const retry = await api.request<Issued>('POST', path, { body: { machine_label: 'keyed-ci' }, idempotencyKey: 'k-enroll' });
    expect([retry.status, retry.body.runner_credential.id, retry.body.runner_credential.runner_id, retry.body.runner_credential.status]).toEqual([201, written[0]!.id, written[0]!.runner_id, 'active']);
    expect(retry.body.secret).toMatch(/^ap_runner_/);
    expect((await credentials('keyed-ci')).map((x) => x.id)).toEqual([written[0]!.id]);
    const runner = await connectRawRunner(q.p, retry.body.secret);
    expect(welcomeOf(runner).runner_id).toBe(written[0]!.runner_id);
    runner.sock.terminate();
    await expect(connectRawRunner(q.p, dead)).rejects.toThrow();
    // The replay shows the same secret while the credential is live.
    const replay = await api.request<Issued>('POST', path, { body: { machine_label: 'keyed-ci' }, idempotencyKey: 'k-enroll' });
    expect([replay.status, replay.body.secret, replay.headers.get('idempotent-replayed')]).toEqual([201, retry.body.secret, 'true']);

    // A credential changed since its crashed enrollment (revoked) is not given a new secret: 409, nothing written.
    await crashedCreate(q, 'runner-enrolled', path, { machine_label: 'keyed-ci-2' }, 'k-enroll-2');
    const [revoked] = await credentials('keyed-ci-2');
    expect((await api.request<{ status: string }>('POST', `/v1/runner-credentials/${revoked!.id}/revoke`, { idempotencyKey: 'k-revoke' })).body.status).toBe('revoked');
    const refused = await api.request<{ error: { type: string } }>('POST', path, { body: { machine_label: 'keyed-ci-2' }, idempotencyKey: 'k-enroll-2' });
    expect([refused.status, refused.body.error.type]).toEqual([409, 'idempotency.conflict']);
    expect((await credentials('keyed-ci-2')).map((x) => [x.id, x.status])).toEqual([[revoked!.id, 'revoked']]);
  }, 180_000);
});
