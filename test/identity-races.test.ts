import { request as httpRequest } from 'node:http';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { HttpClient, SERVICE_VERSION } from '@agentplane/client';
import { startPlatform, type Platform } from './harness/platform.js';

// Credential races (rotate/patch/revoke), disabled default Workspaces, pairing redemption's audit
// record and its per-source rate limit, black-box against a real platform.

let p: Platform;
let org: string;
let wsA: string;

type Err = { error: { type: string } };
const errType = (r: { body: unknown }) => (r.body as Err).error?.type;
const client = (secret: string) => new HttpClient({ baseUrl: p.baseUrl, token: secret });
const readStatus = async (secret: string) => (await client(secret).request('GET', '/v1/vaults')).status;

async function newKey(role: string, workspaceId: string | null) {
  const scope = workspaceId ? { type: 'workspace', workspace_id: workspaceId } : { type: 'organization' };
  const r = await p.root.request<{ id: string; secret: string }>('POST', `/v1/organizations/${org}/api-keys`, {
    body: { display_name: `${role} key`, role, scope },
    idempotencyKey: `k-${Math.random()}`,
  });
  expect(r.status).toBe(201);
  return { id: r.body.id, secret: r.body.secret };
}

/** POST a junk pairing code from a chosen local address (the API sees it as the client address). */
function redeemFrom(localAddress: string): Promise<{ status: number; text: string }> {
  const url = new URL('/v1/runner-pairings/redeem', p.baseUrl);
  const payload = JSON.stringify({ code: `junk-${Math.random().toString(36).slice(2)}` });
  return new Promise((resolve, reject) => {
    const req = httpRequest({
      host: url.hostname, port: url.port, path: url.pathname, method: 'POST', localAddress, agent: false,
      headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(payload), 'service-version': SERVICE_VERSION },
    }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
    });
    req.on('error', reject);
    req.end(payload);
  });
}

beforeAll(async () => {
  p = await startPlatform();
  org = p.bootstrap.organization_id;
  wsA = p.bootstrap.workspace_id;
});
afterAll(async () => {
  await p?.stop();
});

describe('API key rotation races', () => {
  it('concurrent rotations leave exactly one live secret, which follows a re-role and dies with revocation', async () => {
    for (let round = 0; round < 5; round++) {
      const k = await newKey('admin', wsA);
      const rs = await Promise.all(Array.from({ length: 6 }, (_, i) =>
        p.root.request<{ secret: string; generation_number: number }>('POST', `/v1/api-keys/${k.id}/rotate`, { body: {}, idempotencyKey: `rot-${round}-${i}-${Math.random()}` })));
      for (const r of rs) expect([200, 409]).toContain(r.status);
      const won = rs.filter((r) => r.status === 200);
      expect(won.length).toBeGreaterThan(0);
      for (const r of rs.filter((x) => x.status === 409)) expect(errType(r)).toBe('validation.conflict');
      const secrets = [k.secret, ...won.map((r) => r.body.secret)];
      const statuses = await Promise.all(secrets.map(readStatus));
      expect(statuses.filter((s) => s === 200)).toHaveLength(1);
      // The survivor is the secret of the key's current generation.
      const key = await p.root.request<{ generation_number: number }>('GET', `/v1/api-keys/${k.id}`);
      const live = won.find((r) => r.body.generation_number === key.body.generation_number);
      expect(live).toBeDefined();
      expect(await readStatus(live!.body.secret)).toBe(200);

      expect((await p.root.request('PATCH', `/v1/api-keys/${k.id}`, { body: { role: 'viewer' } })).status).toBe(200);
      const writes = await Promise.all(secrets.map((s) => client(s).request('POST', '/v1/vaults', { body: { name: `v-${round}-${Math.random()}` } })));
      for (const w of writes) expect([401, 403]).toContain(w.status);
      expect(writes.filter((w) => w.status === 403)).toHaveLength(1);

      expect((await p.root.request('POST', `/v1/api-keys/${k.id}/revoke`, { body: {} })).status).toBe(200);
      const after = await Promise.all(secrets.map((s) => client(s).request('GET', '/v1/vaults')));
      for (const a of after) {
        expect(a.status).toBe(401);
        expect(errType(a)).toBe('auth.invalid_key');
      }
    }
  });

  it('a patch racing a revocation never brings the revoked secret back', async () => {
    for (let round = 0; round < 15; round++) {
      const k = await newKey('admin', wsA);
      expect(await readStatus(k.secret)).toBe(200); // the read cache now holds its record
      await Promise.all([
        p.root.request('PATCH', `/v1/api-keys/${k.id}`, { body: { display_name: `n${round}a` } }),
        p.root.request('POST', `/v1/api-keys/${k.id}/revoke`, { body: {} }),
        p.root.request('PATCH', `/v1/api-keys/${k.id}`, { body: { role: 'developer' } }),
      ]);
      expect(await readStatus(k.secret)).toBe(401);
    }
  });

  it('a rotation racing a revocation: either made before it, or refused and the key reads as before', async () => {
    let refused = 0;
    for (let round = 0; round < 20; round++) {
      const k = await newKey('admin', wsA);
      const before = (await p.root.request<{ generation_number: number; secret_hint: string }>('GET', `/v1/api-keys/${k.id}`)).body;
      const [rot, rev] = await Promise.all([
        p.root.request<{ secret: string; generation_number: number; secret_hint: string }>('POST', `/v1/api-keys/${k.id}/rotate`, { body: {}, idempotencyKey: `rr-${round}-${Math.random()}` }),
        p.root.request('POST', `/v1/api-keys/${k.id}/revoke`, { body: {} }),
      ]);
      expect(rev.status).toBe(200);
      const after = (await p.root.request<{ status: string; generation_number: number; secret_hint: string }>('GET', `/v1/api-keys/${k.id}`)).body;
      expect(after.status).toBe('revoked');
      if (rot.status === 200) {
        // Made first: the revocation ended the new secret, and the document names it.
        expect(after).toMatchObject({ generation_number: rot.body.generation_number, secret_hint: rot.body.secret_hint });
        expect(await readStatus(rot.body.secret)).toBe(401);
      } else {
        refused++;
        expect(rot.status).toBe(409);
        expect(errType(rot)).toBe('runtime.invalid_transition');
        expect(after).toMatchObject({ generation_number: before.generation_number, secret_hint: before.secret_hint });
      }
      expect(await readStatus(k.secret)).toBe(401);
    }
    expect(refused).toBeGreaterThan(0);
  });

  it('a patch racing rotations reaches the secret that survives', async () => {
    for (let round = 0; round < 5; round++) {
      const k = await newKey('admin', wsA);
      const [, ...rs] = await Promise.all([
        p.root.request('PATCH', `/v1/api-keys/${k.id}`, { body: { role: 'viewer' } }),
        ...Array.from({ length: 3 }, (_, i) =>
          p.root.request<{ secret: string }>('POST', `/v1/api-keys/${k.id}/rotate`, { body: {}, idempotencyKey: `rp-${round}-${i}-${Math.random()}` })),
      ]);
      const secrets = [k.secret, ...rs.filter((r) => r.status === 200).map((r) => r.body.secret)];
      const reads = await Promise.all(secrets.map(readStatus));
      expect(reads.filter((s) => s === 200)).toHaveLength(1);
      const survivor = secrets[reads.indexOf(200)]!;
      const w = await client(survivor).request('POST', '/v1/vaults', { body: { name: `rp-${round}-${Math.random()}` } });
      expect(w.status).toBe(403);
    }
  });
});

describe('the last live root key', () => {
  it('two root keys taking each other away at once: one change is refused, a root key stays live', async () => {
    const q = await startPlatform({ runner: false, scheduler: false });
    try {
      const o = q.bootstrap.organization_id;
      const as = (secret: string) => new HttpClient({ baseUrl: q.baseUrl, token: secret });
      const mint = async (by: HttpClient) => (await by.post<{ id: string; secret: string }>(`/v1/organizations/${o}/api-keys`, {
        display_name: 'root', role: 'root', scope: { type: 'organization' },
      }, { idempotencyKey: `root-${Math.random()}` }));
      const liveRoots = async (by: HttpClient) => (await by.get<{ data: { id: string; role: string; status: string; scope: { type: string } }[] }>(`/v1/organizations/${o}/api-keys`, { limit: 100 }))
        .data.filter((k) => k.status === 'active' && k.role === 'root' && k.scope.type === 'organization').map((k) => k.id);
      let a = await mint(q.root);
      let b = await mint(q.root);
      const bootstrapKey = (await liveRoots(q.root)).find((id) => id !== a.id && id !== b.id) ?? '';
      expect((await as(a.secret).request('POST', `/v1/api-keys/${bootstrapKey}/revoke`, { body: {} })).status).toBe(200);
      for (let round = 0; round < 4; round++) {
        const revoke = round % 2 === 0;
        const [ra, rb] = await Promise.all([
          revoke ? as(a.secret).request('POST', `/v1/api-keys/${b.id}/revoke`, { body: {} }) : as(a.secret).request('PATCH', `/v1/api-keys/${b.id}`, { body: { role: 'admin' } }),
          revoke ? as(b.secret).request('POST', `/v1/api-keys/${a.id}/revoke`, { body: {} }) : as(b.secret).request('PATCH', `/v1/api-keys/${a.id}`, { body: { role: 'admin' } }),
        ]);
        // One change is made. The other is refused: by the guard (409), or, when the first was
        // made before it was authorised, for its own key being revoked (401) or no longer root (403).
        const outcomes = [ra.status, rb.status].sort();
        expect(outcomes[0], JSON.stringify([ra.body, rb.body])).toBe(200);
        expect(revoke ? [401, 409] : [403, 409], JSON.stringify([ra.body, rb.body])).toContain(outcomes[1]);
        const survivor = ra.status === 200 ? a : b;
        expect(await liveRoots(as(survivor.secret))).toEqual([survivor.id]);
        // A new second root key for the next round.
        a = survivor;
        b = await mint(as(survivor.secret));
      }
    } finally {
      await q.stop();
    }
  }, 120_000);
});

describe('disabled default Workspace', () => {
  it('an organization key without a selector is refused in a disabled default Workspace; organization-level calls still answer', async () => {
    const orgAdmin = await newKey('admin', null);
    const admin = client(orgAdmin.secret);
    expect((await admin.request('GET', '/v1/vaults')).status).toBe(200);
    expect((await p.root.request('PATCH', `/v1/organizations/workspaces/${wsA}`, { body: { status: 'disabled' } })).status).toBe(200);
    try {
      const read = await admin.request('GET', '/v1/vaults');
      expect(read.status).toBe(403);
      expect(errType(read)).toBe('auth.disabled_tenancy');
      const write = await admin.request('POST', '/v1/vaults', { body: { name: 'into-disabled' } });
      expect(write.status).toBe(403);
      expect(errType(write)).toBe('auth.disabled_tenancy');
      const named = await admin.request('POST', `/v1/organizations/workspaces/${wsA}/principals`, {
        body: { external_subject_id: 'x-disabled', principal_type: 'person', display_name: 'x' },
      });
      expect(named.status).toBe(403);
      expect(errType(named)).toBe('auth.disabled_tenancy');
      // Naming the disabled Workspace in the path from another selected Workspace is refused too.
      const other = await p.root.request<{ id: string }>('POST', `/v1/organizations/${org}/workspaces`, { body: { name: 'other' } });
      expect(other.status).toBe(201);
      const viaOther = await admin.with({ workspaceId: other.body.id }).request('POST', `/v1/organizations/workspaces/${wsA}/principals`, {
        body: { external_subject_id: 'x-disabled-2', principal_type: 'person', display_name: 'x' },
      });
      expect(viaOther.status).toBe(403);
      expect(errType(viaOther)).toBe('auth.disabled_tenancy');
      // Organization-level operations answer the root key.
      expect((await p.root.request('GET', `/v1/organizations/${org}/workspaces`)).status).toBe(200);
    } finally {
      // The root key (no selector) can re-enable it.
      expect((await p.root.request('PATCH', `/v1/organizations/workspaces/${wsA}`, { body: { status: 'active' } })).status).toBe(200);
    }
    expect((await admin.request('GET', '/v1/vaults')).status).toBe(200);
  });
});

describe('runner pairing redemption', () => {
  it('is audited in the pairing Workspace with the credential as target and nothing of the secret', async () => {
    const pr = await p.root.request<{ id: string }>('POST', `/v1/organizations/workspaces/${wsA}/principals`, {
      body: { external_subject_id: `pairer-${Math.random()}`, principal_type: 'person', display_name: 'pairer' },
    });
    expect(pr.status).toBe(201);
    const pairing = await p.root.request<{ id: string; code: string }>('POST', '/v1/runner-pairings', {
      body: { principal_id: pr.body.id, machine_label: `laptop-${Math.random()}` }, idempotencyKey: `pair-${Math.random()}`,
    });
    expect(pairing.status).toBe(201);
    const red = await p.anon.request<{ runner_credential: { id: string; workspace_id: string }; secret: string }>('POST', '/v1/runner-pairings/redeem', { body: { code: pairing.body.code } });
    expect(red.status).toBe(201);
    const audit = await p.root.request<{ data: Array<Record<string, unknown>> }>('POST', '/v1/audit/export', { body: { limit: 1000 } });
    expect(audit.status).toBe(200);
    const records = audit.body.data.filter((a) => a.action === 'runnerPairings.redeemRunnerPairing');
    expect(records).toHaveLength(1);
    expect(records[0]).toMatchObject({ target: red.body.runner_credential.id, outcome: 'succeeded', status: 201 });
    expect(JSON.stringify(audit.body)).not.toContain(red.body.secret);
  });

  it('limits one source before the platform-wide bucket', async () => {
    // A source's default limit is 60 a minute, the platform's 600: within two fixed windows a
    // source is refused by its 121st code at the latest, while the platform-wide bucket still has room.
    let refusedAt = 0;
    let refusal = '';
    for (let i = 1; i <= 121 && refusedAt === 0; i++) {
      const { status, text } = await redeemFrom('127.0.0.2');
      if (status === 429) {
        refusedAt = i;
        refusal = text;
      } else expect(status).toBe(401);
    }
    expect(refusedAt).toBeGreaterThan(0);
    expect(refusedAt).toBeLessThanOrEqual(121);
    // The refusal says what was counted (the endpoint takes no key).
    expect((JSON.parse(refusal) as Err & { error: { message: string } }).error).toMatchObject({ type: 'budget.exceeded', message: expect.stringContaining('from this client address') });
    // Another source is not refused.
    expect((await redeemFrom('127.0.0.3')).status).toBe(401);
  });
});

describe('Principal external subjects', () => {
  it('a subject held by no live Principal (a create or a deletion that died half-way) is released by the next create', async () => {
    const redis = new Redis(p.redisUrl());
    try {
      const subjects = `ap:{w:${wsA}}:uniq:principal_subjects`;
      const create = (subject: string) => p.root.request<{ id: string; external_subject_id: string }>('POST', `/v1/organizations/workspaces/${wsA}/principals`, {
        body: { external_subject_id: subject, principal_type: 'person', display_name: 'claimed' },
      });

      // Claimed for a Principal that was never written.
      await redis.hset(subjects, 'orphaned-subject', `prin_${'0'.repeat(32)}`);
      const taken = await create('orphaned-subject');
      expect([taken.status, taken.body.external_subject_id]).toEqual([201, 'orphaned-subject']);
      expect(await redis.hget(subjects, 'orphaned-subject')).toBe(taken.body.id);

      // Still claimed by a Principal whose deletion died before it released the subject.
      const gone = await create('deleted-subject');
      expect(gone.status).toBe(201);
      expect((await p.root.request('DELETE', `/v1/principals/${gone.body.id}`)).status).toBe(200);
      await redis.hset(subjects, 'deleted-subject', gone.body.id);
      const again = await create('deleted-subject');
      expect(again.status).toBe(201);
      expect(again.body.id).not.toBe(gone.body.id);
      expect(await redis.hget(subjects, 'deleted-subject')).toBe(again.body.id);

      // Held by a live (or suspended) Principal: 409, and the claim stays its.
      expect((await p.root.request('POST', `/v1/principals/${again.body.id}/suspend`, { body: {} })).status).toBe(200);
      for (const subject of ['orphaned-subject', 'deleted-subject']) {
        const dup = await create(subject);
        expect([dup.status, errType(dup)]).toEqual([409, 'validation.conflict']);
      }
      expect(await redis.hget(subjects, 'deleted-subject')).toBe(again.body.id);
      expect(await redis.hget(subjects, 'orphaned-subject')).toBe(taken.body.id);
    } finally {
      redis.disconnect();
    }
  });
});
