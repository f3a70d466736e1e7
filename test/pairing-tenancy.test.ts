import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';
import { errType } from './harness/governance.js';
import { connectRawRunner } from './harness/raw-runner.js';

// Pairing redemption against the tenancy behind its code, and machine labels claimed for
// credentials that were never written, black-box against a real platform.

type Issued = { runner_credential: { id: string; workspace_id: string; owner: { principal: string; machine_label: string } | null }; secret: string };

let p: Platform;
let org: string;
let redis: Redis;

beforeAll(async () => {
  p = await startPlatform();
  org = p.bootstrap.organization_id;
  redis = new Redis(p.redisUrl());
});
afterAll(async () => {
  redis?.disconnect();
  await p?.stop();
});

/** A new Workspace of the organization, a client acting in it and one of its Principals. */
async function workspaceWithPrincipal(name: string): Promise<{ ws: string; client: HttpClient; principal: string }> {
  const ws = (await p.root.post<{ id: string }>(`/v1/organizations/${org}/workspaces`, { name })).id;
  const client = p.root.with({ workspaceId: ws });
  const principal = (await client.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
    external_subject_id: `${name}-owner`, principal_type: 'person', display_name: 'Owner',
  })).id;
  return { ws, client, principal };
}

const pair = (client: HttpClient, principal: string, label: string) =>
  client.request<{ id: string; code: string }>('POST', '/v1/runner-pairings', { body: { principal_id: principal, machine_label: label }, idempotencyKey: `pair-${Math.random()}` });
const redeem = (code: string) => p.anon.request<Issued>('POST', '/v1/runner-pairings/redeem', { body: { code } });

describe('runner pairing redemption', () => {
  it('a code of a disabled Workspace mints nothing (403 auth.disabled_tenancy) and redeems once it is enabled again', async () => {
    const { ws, client, principal } = await workspaceWithPrincipal('pairing-disabled');
    const pairing = await pair(client, principal, 'laptop');
    expect(pairing.status).toBe(201);
    const setStatus = (status: string) => p.root.request('PATCH', `/v1/organizations/workspaces/${ws}`, { body: { status } });
    expect((await setStatus('disabled')).status).toBe(200);

    const refused = await redeem(pairing.body.code);
    expect([refused.status, errType(refused)]).toEqual([403, 'auth.disabled_tenancy']);
    const listed = await p.root.request<{ data: unknown[] }>('GET', '/v1/runner-credentials', { headers: { 'service-workspace-id': ws } });
    // The Workspace is disabled: its credentials are read once it is enabled again.
    expect(listed.status).toBe(403);

    expect((await setStatus('active')).status).toBe(200);
    expect((await client.get<{ data: unknown[] }>('/v1/runner-credentials')).data).toEqual([]);
    const redeemed = await redeem(pairing.body.code);
    expect(redeemed.status).toBe(201);
    expect(redeemed.body.runner_credential).toMatchObject({ workspace_id: ws, owner: { principal, machine_label: 'laptop' } });
    const again = await redeem(pairing.body.code);
    expect([again.status, errType(again)]).toEqual([401, 'auth.invalid_key']);
  });

  it('a machine label claimed for a credential that was never written is released by the next pairing', async () => {
    const { ws, client, principal } = await workspaceWithPrincipal('pairing-orphan-label');
    const labels = `ap:{w:${ws}}:uniq:runner_owner_labels`;
    await redis.hset(labels, `${principal}\u0000desktop`, `rcred_${'0'.repeat(32)}`);
    const pairing = await pair(client, principal, 'desktop');
    expect(pairing.status, JSON.stringify(pairing.body)).toBe(201);
    // Claimed again between the pairing and its redemption: released by the redemption too.
    await redis.hset(labels, `${principal}\u0000desktop`, `rcred_${'0'.repeat(32)}`);
    const redeemed = await redeem(pairing.body.code);
    expect(redeemed.status, JSON.stringify(redeemed.body)).toBe(201);
    expect(await redis.hget(labels, `${principal}\u0000desktop`)).toBe(redeemed.body.runner_credential.id);

    // Held by that live credential now: a second pairing of the machine is 409 until it is revoked.
    const second = await pair(client, principal, 'desktop');
    expect([second.status, errType(second)]).toEqual([409, 'validation.conflict']);
    expect((await client.request('POST', `/v1/runner-credentials/${redeemed.body.runner_credential.id}/revoke`)).status).toBe(200);
    expect((await pair(client, principal, 'desktop')).status).toBe(201);
  });
});

describe('runner credential revocation', () => {
  it("a repeated revocation of a machine's old credential leaves its new credential's label claimed", async () => {
    const { client, principal } = await workspaceWithPrincipal('pairing-revoke-again');
    const paired = async () => {
      const pairing = await pair(client, principal, 'workstation');
      expect(pairing.status, JSON.stringify(pairing.body)).toBe(201);
      const redeemed = await redeem(pairing.body.code);
      expect(redeemed.status).toBe(201);
      return redeemed.body.runner_credential.id;
    };
    const revoke = (id: string) => client.request<{ status: string }>('POST', `/v1/runner-credentials/${id}/revoke`);
    const first = await paired();
    expect((await revoke(first)).status).toBe(200);
    const second = await paired();
    // Retry-safe: the old credential's revocation answers again, and takes nothing of the new one.
    const again = await revoke(first);
    expect([again.status, again.body.status]).toEqual([200, 'revoked']);
    const third = await pair(client, principal, 'workstation');
    expect([third.status, errType(third)]).toEqual([409, 'validation.conflict']);
    expect((await revoke(second)).status).toBe(200);
    expect((await pair(client, principal, 'workstation')).status).toBe(201);
  });
});

describe('a Workspace disabled while its runners are connected', () => {
  it('closes their sockets 4403 at once, not at their next standing re-check (every 30 s)', async () => {
    const { ws, client, principal } = await workspaceWithPrincipal('disabled-live');
    const { code } = (await pair(client, principal, 'live-machine')).body;
    const { secret } = (await redeem(code)).body;
    const r = await connectRawRunner(p, secret);
    try {
      expect((await p.root.request('PATCH', `/v1/organizations/workspaces/${ws}`, { body: { status: 'disabled' } })).status).toBe(200);
      const closed = await Promise.race([r.closed, new Promise<string>((resolve) => setTimeout(() => resolve('still open after 10 s'), 10_000))]);
      expect(closed).toBe(4403);
      // A reconnect is refused while the Workspace stays disabled.
      await expect(connectRawRunner(p, secret)).rejects.toThrow();
    } finally {
      r.sock.terminate();
    }
  }, 30_000);
});
