import { randomInt } from 'node:crypto';
import { ApiError, constantTimeEqual, crashPoint, newId, nowIso, secretDigest, sleep } from '@agentplane/core';
import { keys, LuaScript, tags, type DocumentStore, type Redis, type Tag } from '@agentplane/store';
import { GATEWAY_CONTROL_CHANNEL, type GatewayControlMessage } from '@agentplane/gateway';
import { CredentialIndex, issueSecret } from '../identity/credentials.js';
import type { AuthRecord, Organization, Principal, Workspace } from '../identity/model.js';
import type { IdentityService } from '../identity/service.js';
import { createClaimed, releaseOrphanClaim, type ClaimedCreate } from '../versioned.js';
import type { DrainState, PoolPlacement, RunnerCredential, RunnerOwner, RunnerPairing, RunnerPool } from './model.js';

/** Crockford base32 without I, L, O, U: readable, typable, unambiguous. */
const CODE_ALPHABET = '0123456789ABCDEFGHJKMNPQRSTVWXYZ';
const CODE_CHARS = 16; // 80 bits

/**
 * Writes a runner credential in one step: its owner's machine label claimed (KEYS[1], field
 * ARGV[1] = ARGV[2] when ARGV[1] is not ''; 0 when taken), the credential (KEYS[3]), its runner
 * (KEYS[2], field ARGV[5]) and its listings (KEYS[4..], score ARGV[4]), so a label is never
 * claimed by a credential that does not exist. ARGV[3] the credential's JSON. -1, nothing
 * written, when a credential is stored under its id already (a keyed enrollment's derived id).
 */
const MINT_CREDENTIAL = new LuaScript('runner_credential_mint', `
if redis.call('EXISTS', KEYS[3]) == 1 then return -1 end
if ARGV[1] ~= '' and redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('SET', KEYS[3], ARGV[3])
redis.call('HSET', KEYS[2], ARGV[5], ARGV[2])
for i = 4, #KEYS do redis.call('ZADD', KEYS[i], ARGV[4], ARGV[2]) end
return 1`);

/** Releases a machine label (KEYS[1] field ARGV[1]) only while credential ARGV[2] holds it. 1 when released. */
const RELEASE_LABEL = new LuaScript('runner_owner_label_release', `
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1`);

/** A runner pool's create with its name claimed in `uniq` (`createClaimed`). */
const poolCreate = (uniq: string, tag: Tag, pool: RunnerPool): ClaimedCreate => ({
  unique: uniq, field: pool.name, id: pool.id, docKey: keys.doc(tag, pool.id), json: JSON.stringify(pool), index: keys.index(tag, 'runner_pools'), score: Date.parse(pool.created_at),
});

/** `XXXX-XXXX-XXXX-XXXX`. */
export function newPairingCode(): string {
  let s = '';
  for (let i = 0; i < CODE_CHARS; i++) s += CODE_ALPHABET[randomInt(CODE_ALPHABET.length)];
  return s.match(/.{4}/g)!.join('-');
}

/** Case, separators and look-alikes (O→0, I/L→1) do not matter when a person types the code. */
export function normalizePairingCode(code: string): string | null {
  const s = code.toUpperCase().replace(/[\s-]/g, '').replace(/O/g, '0').replace(/[IL]/g, '1');
  if (s.length !== CODE_CHARS) return null;
  for (const c of s) if (!CODE_ALPHABET.includes(c)) return null;
  return s;
}

const codeDigest = (normalized: string): string => secretDigest(`runner-pairing\0${normalized}`);

const invalidCode = () => new ApiError('auth.invalid_key', 'the pairing code is unknown, expired or already used');

const changedSince = (what: string) => new ApiError('idempotency.conflict', `this Idempotency-Key was used for this request before, and the ${what} it made has changed since; use a new key`);

export interface RedeemInput {
  code: string;
  runner_enrollment?: { placement: string; runner_pool_id?: string; display_name?: string; owner?: unknown };
}

export interface IssuedRunnerCredential {
  runner_credential: RunnerCredential;
  secret: string;
}

/** Runner pools, pairings, runner credentials and drains. */
export class RunnerService {
  constructor(
    private readonly docs: DocumentStore,
    private readonly redis: Redis,
    private readonly credentials: CredentialIndex,
    private readonly identity: IdentityService,
  ) {}

  // ---- pools -----------------------------------------------------------------------------------

  /** Every Workspace has a default BYOC pool, created on first use. */
  async defaultPool(workspaceId: string): Promise<RunnerPool> {
    const tag = tags.workspace(workspaceId);
    const uniq = keys.unique(tag, 'runner_pool_names');
    for (let i = 0; i < 50; i++) {
      const existing = await this.redis.hget(uniq, 'default');
      if (existing) {
        const pool = await this.docs.get<RunnerPool>(tag, existing);
        if (pool) return pool;
        // A name without its pool: only an older version, which wrote them apart, leaves one.
        if (!(await releaseOrphanClaim(this.redis, uniq, 'default', (owner) => keys.doc(tag, owner)))) await sleep(20);
        continue;
      }
      const now = nowIso();
      const pool: RunnerPool = {
        id: newId('runnerPool'), type: 'runner_pool', workspace_id: workspaceId, name: 'default', placement: 'byoc', is_default: true,
        status: 'active', drain: null, version: 1, created_at: now, updated_at: now,
      };
      if (await createClaimed(this.redis, poolCreate(uniq, tag, pool))) return pool;
    }
    throw new ApiError('validation.conflict', 'the default runner pool is being created concurrently; retry');
  }

  async createPool(workspaceId: string, input: { name: string; placement: PoolPlacement }, id = newId('runnerPool')): Promise<RunnerPool> {
    await this.defaultPool(workspaceId);
    const tag = tags.workspace(workspaceId);
    const now = nowIso();
    const pool: RunnerPool = {
      id, type: 'runner_pool', workspace_id: workspaceId, name: input.name, placement: input.placement,
      is_default: false, status: 'active', drain: null, version: 1, created_at: now, updated_at: now,
    };
    const uniq = keys.unique(tag, 'runner_pool_names');
    // A name held by no pool (an older version wrote them apart) is released and claimed here.
    const created = await createClaimed(this.redis, poolCreate(uniq, tag, pool), () => releaseOrphanClaim(this.redis, uniq, pool.name, (owner) => keys.doc(tag, owner)));
    if (!created) throw new ApiError('validation.conflict', `a runner pool named '${input.name}' already exists`);
    crashPoint('runner-pool-created');
    return pool;
  }

  /** The runner pool stored under `id` in the Workspace; null when there is none. */
  findPool(workspaceId: string, id: string): Promise<RunnerPool | null> {
    return this.docs.get<RunnerPool>(tags.workspace(workspaceId), id);
  }

  async getPool(workspaceId: string, id: string): Promise<RunnerPool> {
    const pool = await this.findPool(workspaceId, id);
    if (!pool || pool.workspace_id !== workspaceId) throw new ApiError('validation.not_found', 'runner pool not found');
    return pool;
  }

  async drainPool(workspaceId: string, id: string, deadlineSeconds: number, reason: string): Promise<RunnerPool> {
    const drain = drainState(deadlineSeconds, reason);
    const next = await this.docs.update<RunnerPool>(
      tags.workspace(workspaceId),
      id,
      (p) => (p.workspace_id !== workspaceId ? null : { ...p, status: 'draining', drain }),
      { notFound: 'runner pool' },
    );
    if (next.workspace_id !== workspaceId) throw new ApiError('validation.not_found', 'runner pool not found');
    await this.announcePool(workspaceId, id);
    return next;
  }

  async undrainPool(workspaceId: string, id: string): Promise<RunnerPool> {
    const next = await this.docs.update<RunnerPool>(
      tags.workspace(workspaceId),
      id,
      (p) => (p.workspace_id !== workspaceId || p.status === 'active' ? null : { ...p, status: 'active', drain: null }),
      { notFound: 'runner pool' },
    );
    if (next.workspace_id !== workspaceId) throw new ApiError('validation.not_found', 'runner pool not found');
    await this.announcePool(workspaceId, id);
    return next;
  }

  /**
   * The gateway message stating a pool's drain as stored now: its drain while it drains; else
   * a resume of its connected runners, except those drained on their own (with their drains).
   */
  private async poolMessage(workspaceId: string, id: string): Promise<GatewayControlMessage | null> {
    const pool = await this.docs.get<RunnerPool>(tags.workspace(workspaceId), id);
    if (!pool || pool.workspace_id !== workspaceId) return null;
    if (pool.status === 'draining' && pool.drain) {
      return { kind: 'drain', workspace_id: workspaceId, runner_pool_id: id, deadline: pool.drain.deadline, reason: pool.drain.reason };
    }
    const except: string[] = [];
    let page: string | undefined;
    do {
      const res = await this.docs.list<RunnerCredential>(tags.workspace(workspaceId), `runner_credentials:${id}`, { limit: 200, order: 'asc', ...(page ? { page } : {}) });
      for (const c of res.data) if (c.drain) except.push(c.runner_id);
      page = res.next_page ?? undefined;
    } while (page);
    return { kind: 'resume', workspace_id: workspaceId, runner_pool_id: id, except_runner_ids: except, reason: 'pool resumed' };
  }

  /**
   * Tell the gateways a pool's drain state after a write of it (see `announce`).
   */
  private announcePool(workspaceId: string, id: string): Promise<void> {
    return this.announce(() => this.poolMessage(workspaceId, id));
  }

  /**
   * Publish the message `current` computes from what is stored, then compute it again, and
   * publish again while it changed. Concurrent drains and resumes reach the gateways in the order
   * of their publishes, not of their writes: a drain published after a resume that overtook it
   * would otherwise leave runners drained under an active pool. With every writer publishing
   * until what it read after its last publish is what that publish stated, the last message the
   * gateways receive states what is stored.
   */
  private async announce(current: () => Promise<GatewayControlMessage | null>): Promise<void> {
    let msg = await current();
    for (let i = 0; i < 8 && msg; i++) {
      await this.publish(msg);
      const now = await current();
      if (!now || JSON.stringify(now) === JSON.stringify(msg)) return;
      msg = now;
    }
  }

  // ---- pairing ---------------------------------------------------------------------------------

  private pendingClaimKey(tag: Tag, principalId: string, label: string): string {
    return keys.scoped(tag, `runner_pairing_claim:${secretDigest(`${principalId}\0${label}`)}`);
  }

  private static codeKey(digest: string): string {
    return keys.scoped(tags.global(`rpcode:${digest}`), 'runner_pairing_code');
  }

  /**
   * `id`: the pairing's id (a keyed create's derived one); `point`: the crash point between the
   * pairing's document and its live code (crash tests).
   */
  async createPairing(
    organizationId: string,
    workspaceId: string,
    input: { principal_id: string; machine_label: string; expires_in_seconds: number },
    id = newId('runnerPairing'),
    point?: string,
  ): Promise<{ pairing: RunnerPairing; code: string }> {
    const tag = tags.workspace(workspaceId);
    await this.identity.activePrincipal(workspaceId, input.principal_id);
    const pool = await this.defaultPool(workspaceId);
    const labels = keys.unique(tag, 'runner_owner_labels');
    const labelField = `${input.principal_id}\0${input.machine_label}`;
    let ownerClaim = await this.redis.hget(labels, labelField);
    // A label held by no credential (an older version claimed it in a step of its own) is released.
    if (ownerClaim && (await releaseOrphanClaim(this.redis, labels, labelField, (owner) => keys.doc(tag, owner)))) ownerClaim = await this.redis.hget(labels, labelField);
    if (ownerClaim) {
      throw new ApiError('validation.conflict', `machine '${input.machine_label}' is already paired for this Principal (runner credential ${ownerClaim}); revoke it first`);
    }
    const ttlMs = input.expires_in_seconds * 1000;
    const claimKey = this.pendingClaimKey(tag, input.principal_id, input.machine_label);
    let claimed = (await this.redis.set(claimKey, id, 'PX', ttlMs, 'NX')) === 'OK';
    // A claim under this very id was left by an attempt of the same keyed request that died
    // before writing its pairing: it is this request's, taken over with this attempt's expiry.
    if (!claimed && (await this.redis.get(claimKey)) === id) claimed = (await this.redis.set(claimKey, id, 'PX', ttlMs, 'XX')) === 'OK';
    if (!claimed) {
      throw new ApiError('validation.conflict', `a pairing for machine '${input.machine_label}' of this Principal is already pending`);
    }
    const code = newPairingCode();
    const digest = codeDigest(normalizePairingCode(code)!);
    const now = nowIso();
    const pairing: RunnerPairing = {
      id, type: 'runner_pairing', workspace_id: workspaceId, organization_id: organizationId, runner_pool_id: pool.id,
      principal_id: input.principal_id, machine_label: input.machine_label, code_digest: digest, status: 'pending',
      expires_at: new Date(Date.now() + ttlMs).toISOString(), redeemed_at: null, runner_credential_id: null,
      version: 1, created_at: now, updated_at: now,
    };
    if (!(await this.docs.create(tag, pairing, ['runner_pairings']))) throw new ApiError('validation.conflict', `runner pairing ${id} was made concurrently; retry`);
    if (point !== undefined) crashPoint(point);
    await this.redis.set(RunnerService.codeKey(digest), JSON.stringify({ workspace_id: workspaceId, pairing_id: id }), 'PX', ttlMs);
    return { pairing, code };
  }

  /**
   * A new code for a pairing whose keyed create died before its answer (`pairing`, as found
   * unchanged, version 1): that attempt's code was never shown, so it is replaced, and shown once
   * by the retry. Only while the pairing is still pending and unexpired (as a stored answer's code
   * is replayed only then); else, or if it changed meanwhile, 409 `idempotency.conflict`, nothing
   * written. The pairing keeps its expiry; its code digest changes (version 2), so the dead
   * attempt's code, had it been made live, no longer redeems (its entry is deleted too).
   */
  async reissueFirstPairingCode(pairing: RunnerPairing): Promise<{ pairing: RunnerPairing; code: string }> {
    const code = newPairingCode();
    const digest = codeDigest(normalizePairingCode(code)!);
    const next = await this.docs.update<RunnerPairing>(tags.workspace(pairing.workspace_id), pairing.id, (p) => {
      if (p.version !== 1 || p.status !== 'pending' || Date.parse(p.expires_at) <= Date.now()) throw changedSince('runner pairing');
      return { ...p, code_digest: digest };
    }, { notFound: 'runner pairing' });
    const ttlMs = Math.max(1, Date.parse(next.expires_at) - Date.now());
    await this.redis.set(RunnerService.codeKey(digest), JSON.stringify({ workspace_id: next.workspace_id, pairing_id: next.id }), 'PX', ttlMs);
    await this.redis.del(RunnerService.codeKey(pairing.code_digest));
    return { pairing: next, code };
  }

  /** Is the pairing behind this code still redeemable (pending, unexpired)? */
  async codePending(code: string): Promise<boolean> {
    const normalized = normalizePairingCode(code);
    return normalized !== null && (await this.redis.exists(RunnerService.codeKey(codeDigest(normalized)))) === 1;
  }

  async getPairing(workspaceId: string, id: string): Promise<RunnerPairing | null> {
    return this.docs.get<RunnerPairing>(tags.workspace(workspaceId), id);
  }

  /**
   * Credential-free redemption: the code alone names the Workspace, pool and owner. Single use
   * (GETDEL), expiry checked against the stored `expires_at`, digests compared in constant time.
   */
  async redeem(input: RedeemInput): Promise<IssuedRunnerCredential> {
    const enrollment = input.runner_enrollment;
    if (enrollment) {
      if (enrollment.owner !== undefined) throw new ApiError('validation.malformed', 'runner_enrollment.owner: a redeemer never asserts the owner; it comes from the pairing');
      if (enrollment.placement !== 'byoc') throw new ApiError('validation.malformed', "runner_enrollment.placement: pairing codes enroll BYOC runners only ('byoc')");
    }
    const normalized = normalizePairingCode(input.code);
    if (!normalized) throw invalidCode();
    const digest = codeDigest(normalized);
    const key = RunnerService.codeKey(digest);
    const peek = await this.redis.get(key);
    if (!peek) throw invalidCode();
    const ref = JSON.parse(peek) as { workspace_id: string; pairing_id: string };
    const pairing = await this.getPairing(ref.workspace_id, ref.pairing_id);
    if (!pairing || !constantTimeEqual(pairing.code_digest, digest) || pairing.status !== 'pending') throw invalidCode();
    if (Date.parse(pairing.expires_at) <= Date.now()) {
      await this.redis.del(key);
      throw invalidCode();
    }
    let pool = await this.getPool(pairing.workspace_id, pairing.runner_pool_id);
    if (enrollment?.runner_pool_id !== undefined) {
      pool = await this.getPool(pairing.workspace_id, enrollment.runner_pool_id).catch(() => {
        throw new ApiError('validation.not_found', 'runner_enrollment.runner_pool_id: runner pool not found in the pairing workspace');
      });
      if (pool.placement !== 'byoc') throw new ApiError('validation.malformed', 'runner_enrollment.runner_pool_id: a pairing code can only join a BYOC pool');
    }
    // The code is the redeemer's only credential: the tenancy behind it is checked as a key's
    // would be, and a disabled one mints nothing (the code stays redeemable until it expires).
    const [org, ws] = await Promise.all([
      this.docs.get<Organization>(tags.org(pairing.organization_id), pairing.organization_id),
      this.docs.get<Workspace>(tags.workspace(pairing.workspace_id), pairing.workspace_id),
    ]);
    if (!org || !ws) throw invalidCode();
    if (org.status === 'disabled') throw new ApiError('auth.disabled_tenancy', 'the organization is disabled');
    if (ws.status === 'disabled') throw new ApiError('auth.disabled_tenancy', 'the workspace is disabled');
    const principal = await this.docs.get<Principal>(tags.workspace(pairing.workspace_id), pairing.principal_id);
    if (!principal || principal.status !== 'active') throw new ApiError('policy.denied', 'the Principal that created this pairing is no longer active');
    // Single use: only the caller whose GETDEL returns the value goes on.
    const taken = await this.redis.getdel(key);
    if (taken !== peek) throw invalidCode();

    const owner: RunnerOwner = { principal: pairing.principal_id, machine_label: pairing.machine_label };
    const issued = await this.mint(pairing.organization_id, pairing.workspace_id, pool, {
      owner, display_name: enrollment?.display_name ?? pairing.machine_label, issued_via: 'pairing', pairing_id: pairing.id,
    });
    const tag = tags.workspace(pairing.workspace_id);
    await this.docs.update<RunnerPairing>(tag, pairing.id, (p) => ({ ...p, status: 'redeemed', redeemed_at: nowIso(), runner_credential_id: issued.runner_credential.id }));
    await this.redis.del(this.pendingClaimKey(tag, pairing.principal_id, pairing.machine_label));
    return issued;
  }

  // ---- credentials -------------------------------------------------------------------------------

  /** The auth record of a runner credential's live secret (runner credentials have one generation). */
  private static runnerRecord(organizationId: string, cred: RunnerCredential): AuthRecord {
    return {
      kind: 'runner_credential', credential_id: cred.id, organization_id: organizationId, workspace_id: cred.workspace_id,
      role: null, principal_id: cred.owner?.principal ?? null, audience: null, rate_limit_per_minute: null, generation_number: 1,
    };
  }

  /**
   * `input.id`: the credential's id (a keyed enrollment's derived one); `input.point`: the crash
   * point between the credential's document and its live secret (crash tests).
   */
  private async mint(
    organizationId: string,
    workspaceId: string,
    pool: RunnerPool,
    input: { owner: RunnerOwner | null; display_name: string; issued_via: RunnerCredential['issued_via']; pairing_id: string | null; id?: string; point?: string },
  ): Promise<IssuedRunnerCredential> {
    const tag = tags.workspace(workspaceId);
    const issued = issueSecret('runner_credential');
    const now = nowIso();
    const cred: RunnerCredential = {
      id: input.id ?? newId('runnerCredential'), type: 'runner_credential', workspace_id: workspaceId, runner_pool_id: pool.id,
      runner_id: newId('runner'), placement: pool.placement, owner: input.owner, display_name: input.display_name,
      issued_via: input.issued_via, pairing_id: input.pairing_id, status: 'active', secret_hint: issued.hint,
      revoked_at: null, drain: null, version: 1, created_at: now, updated_at: now,
    };
    const labels = keys.unique(tag, 'runner_owner_labels');
    const labelField = input.owner ? `${input.owner.principal}\0${input.owner.machine_label}` : '';
    const write = () => MINT_CREDENTIAL.run(this.redis,
      [labels, keys.unique(tag, 'runners'), keys.doc(tag, cred.id), ...['runner_credentials', `runner_credentials:${pool.id}`].map((c) => keys.index(tag, c))],
      [labelField, cred.id, JSON.stringify(cred), Date.parse(now), cred.runner_id]);
    let written = Number(await write());
    if (written === 0 && (await releaseOrphanClaim(this.redis, labels, labelField, (owner) => keys.doc(tag, owner)))) written = Number(await write());
    if (written === -1) throw new ApiError('validation.conflict', `runner credential ${cred.id} was made concurrently; retry`);
    if (written !== 1) throw new ApiError('validation.conflict', `machine '${input.owner?.machine_label ?? ''}' is already paired for this Principal`);
    if (input.point !== undefined) crashPoint(input.point);
    await this.credentials.swap(cred.id, { digest: issued.digest, record: RunnerService.runnerRecord(organizationId, cred) });
    return { runner_credential: cred, secret: issued.secret };
  }

  /**
   * Managed pools: an operator's runner-role key enrolls a runner with no owner. `id`: the
   * credential's id (a keyed enrollment's derived one); `point`: the crash point between the
   * credential's document and its live secret (crash tests).
   */
  async enroll(organizationId: string, workspaceId: string, poolId: string, machineLabel: string, id?: string, point?: string): Promise<IssuedRunnerCredential> {
    const pool = await this.getPool(workspaceId, poolId);
    if (pool.placement !== 'managed') throw new ApiError('validation.conflict', 'enrollment by API key is for managed pools; pair BYOC machines with a pairing code');
    return this.mint(organizationId, workspaceId, pool, {
      owner: null, display_name: machineLabel, issued_via: 'enrollment', pairing_id: null, ...(id !== undefined ? { id } : {}), ...(point !== undefined ? { point } : {}),
    });
  }

  /**
   * A new first secret for a runner whose keyed enrollment died before its answer (`cred`, as
   * found unchanged, version 1): that attempt's secret was never shown, so it is replaced, and
   * shown once by the retry. The credential and its runner stay; its hint changes (version 2),
   * and the new secret displaces any the dead attempt made live. A credential changed meanwhile
   * (revoked, drained) is left alone: 409 `idempotency.conflict`.
   */
  async reissueFirstRunnerSecret(organizationId: string, cred: RunnerCredential): Promise<IssuedRunnerCredential> {
    const issued = issueSecret('runner_credential');
    const next = await this.docs.update<RunnerCredential>(tags.workspace(cred.workspace_id), cred.id, (c) => {
      if (c.version !== 1 || c.status !== 'active') throw changedSince('runner credential');
      return { ...c, secret_hint: issued.hint };
    }, { notFound: 'runner credential' });
    // Replaces the dead attempt's secret, had it gone live (same generation: see CredentialIndex.swap).
    await this.credentials.swap(next.id, { digest: issued.digest, record: RunnerService.runnerRecord(organizationId, next) }, { sameGeneration: true });
    return { runner_credential: next, secret: issued.secret };
  }

  /** The runner credential stored under `id` in the Workspace; null when there is none. */
  findCredential(workspaceId: string, id: string): Promise<RunnerCredential | null> {
    return this.docs.get<RunnerCredential>(tags.workspace(workspaceId), id);
  }

  /** The platform launcher's own local runner: Workspace-scoped, default pool, no owner. */
  async mintLocal(workspaceId: string, label: string): Promise<IssuedRunnerCredential> {
    const ws = await this.docs.get<Workspace>(tags.workspace(workspaceId), workspaceId);
    if (!ws) throw new ApiError('validation.not_found', 'workspace not found');
    const pool = await this.defaultPool(workspaceId);
    return this.mint(ws.organization_id, workspaceId, pool, { owner: null, display_name: label, issued_via: 'local', pairing_id: null });
  }

  async getCredential(workspaceId: string, id: string): Promise<RunnerCredential> {
    const c = await this.docs.get<RunnerCredential>(tags.workspace(workspaceId), id);
    if (!c || c.workspace_id !== workspaceId) throw new ApiError('validation.not_found', 'runner credential not found');
    return c;
  }

  async credentialOfRunner(workspaceId: string, runnerId: string): Promise<RunnerCredential> {
    const id = await this.redis.hget(keys.unique(tags.workspace(workspaceId), 'runners'), runnerId);
    if (!id) throw new ApiError('validation.not_found', 'runner not found');
    return this.getCredential(workspaceId, id);
  }

  async revokeCredential(workspaceId: string, id: string): Promise<RunnerCredential> {
    await this.getCredential(workspaceId, id);
    const tag = tags.workspace(workspaceId);
    const next = await this.docs.update<RunnerCredential>(tag, id, (c) => (c.status === 'revoked' ? null : { ...c, status: 'revoked', revoked_at: nowIso() }), {
      notFound: 'runner credential',
    });
    await this.credentials.swap(id, null);
    // The machine's label is released only while this credential holds it: a repeated revocation
    // never frees the label of a credential the machine was paired with since.
    if (next.owner) await RELEASE_LABEL.run(this.redis, [keys.unique(tag, 'runner_owner_labels')], [`${next.owner.principal}\0${next.owner.machine_label}`, id]);
    await this.publish({ kind: 'credential_revoked', workspace_id: workspaceId, credential_id: id });
    return next;
  }

  async drainRunner(workspaceId: string, runnerId: string, deadlineSeconds: number, reason: string): Promise<RunnerCredential> {
    const cred = await this.credentialOfRunner(workspaceId, runnerId);
    const drain = drainState(deadlineSeconds, reason);
    const next = await this.docs.update<RunnerCredential>(tags.workspace(workspaceId), cred.id, (c) => {
      // A revoked runner takes no work and cannot connect: there is nothing for a drain to stop.
      if (c.status === 'revoked') throw new ApiError('runtime.invalid_transition', `runner ${runnerId}'s credential is revoked: it takes no work to drain`);
      return { ...c, drain };
    }, { notFound: 'runner' });
    await this.announceRunner(workspaceId, next);
    return next;
  }

  /**
   * Lift one runner's drain. A runner that stayed connected takes work again at once (unless its
   * pool is draining too); one that left is ready when it next connects.
   */
  async resumeRunner(workspaceId: string, runnerId: string): Promise<RunnerCredential> {
    const cred = await this.credentialOfRunner(workspaceId, runnerId);
    const next = cred.drain
      ? await this.docs.update<RunnerCredential>(tags.workspace(workspaceId), cred.id, (c) => (c.drain ? { ...c, drain: null } : null), { notFound: 'runner' })
      : cred;
    await this.announceRunner(workspaceId, next);
    return next;
  }

  /**
   * Tell the gateways one runner's drain state after a write of it (see `announce`): drained on
   * its own or by its draining pool (its own deadline first), else resumed.
   */
  private announceRunner(workspaceId: string, cred: RunnerCredential): Promise<void> {
    const tag = tags.workspace(workspaceId);
    return this.announce(async () => {
      const [c, pool] = await Promise.all([this.docs.get<RunnerCredential>(tag, cred.id), this.docs.get<RunnerPool>(tag, cred.runner_pool_id)]);
      if (!c) return null;
      const drain = c.drain ?? (pool?.status === 'draining' ? pool.drain : null);
      return drain
        ? { kind: 'drain', workspace_id: workspaceId, runner_id: c.runner_id, deadline: drain.deadline, reason: drain.reason }
        : { kind: 'resume', workspace_id: workspaceId, runner_id: c.runner_id, reason: 'runner resumed' };
    });
  }

  private async publish(msg: GatewayControlMessage): Promise<void> {
    await this.redis.publish(GATEWAY_CONTROL_CHANNEL, JSON.stringify(msg));
  }
}

function drainState(deadlineSeconds: number, reason: string): DrainState {
  const now = Date.now();
  return { requested_at: new Date(now).toISOString(), deadline: new Date(now + deadlineSeconds * 1000).toISOString(), reason };
}
