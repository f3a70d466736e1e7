import { ApiError, crashPoint, newId, nowIso, staleOrAhead } from '@agentplane/core';
import { keys, LuaScript, tags, type DocumentStore, type Redis, type StoredDoc, type Tag } from '@agentplane/store';
import type { Role } from './roles.js';
import { CredentialIndex, issueSecret } from './credentials.js';
import type { ApiKey, AuthRecord, KeyScope, Organization, Principal, PrincipalAccessCredential, Workspace } from './model.js';
import { createClaimed } from '../versioned.js';

/**
 * Releases the subject claim (KEYS[1] field ARGV[1]) still held by Principal ARGV[2] when that
 * Principal (KEYS[2]) is absent or deleted: a create that died between its claim and its document
 * (an older version wrote them apart), or a deletion that died before it released the subject.
 * 1 released, 0 not (the claim moved, or its Principal lives).
 */
const RELEASE_DEAD_SUBJECT = new LuaScript('principal_release_dead_subject', `
if redis.call('HGET', KEYS[1], ARGV[1]) ~= ARGV[2] then return 0 end
local cur = redis.call('GET', KEYS[2])
if cur then
  local ok, doc = pcall(cjson.decode, cur)
  if not ok or type(doc) ~= 'table' or doc.status ~= 'deleted' then return 0 end
end
redis.call('HDEL', KEYS[1], ARGV[1])
return 1`);

/** How long a root-key change may hold its organization's root guard (a crashed holder's lapses). */
const ROOT_GUARD_MS = 10_000;

/** Deletes the guard (KEYS[1]) only while it holds this holder's token (ARGV[1]). */
const RELEASE_GUARD = new LuaScript('root_guard_release', `
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`);

export interface CreateApiKeyInput {
  display_name: string;
  role: Role;
  scope: KeyScope;
  rate_limit_per_minute?: number | null | undefined;
}

/** Organizations, workspaces, API keys, Principals and their access credentials. */
export class IdentityService {
  constructor(
    private readonly docs: DocumentStore,
    private readonly redis: Redis,
    private readonly credentials: CredentialIndex,
  ) {}

  // ---- tenancy -------------------------------------------------------------------------------

  async createOrganization(name: string, workspaceName: string): Promise<{ org: Organization; workspace: Workspace }> {
    const now = nowIso();
    const orgId = newId('organization');
    const workspace = await this.newWorkspaceDoc(orgId, workspaceName, now);
    const org: Organization = {
      id: orgId, type: 'organization', name, status: 'active', default_workspace_id: workspace.id,
      version: 1, created_at: now, updated_at: now,
    };
    await this.docs.create(tags.org(orgId), org);
    await this.docs.create(tags.workspace(workspace.id), workspace);
    await this.redis.zadd(keys.index(tags.org(orgId), 'workspaces'), Date.parse(now), workspace.id);
    return { org, workspace };
  }

  private async newWorkspaceDoc(orgId: string, name: string, now: string, id = newId('workspace')): Promise<Workspace> {
    return { id, type: 'workspace', organization_id: orgId, name, status: 'active', version: 1, created_at: now, updated_at: now };
  }

  /** The document first, then its place in the Organization's list (`findWorkspace` finishes a create cut off in between). */
  async createWorkspace(orgId: string, name: string, id?: string): Promise<Workspace> {
    const ws = await this.newWorkspaceDoc(orgId, name, nowIso(), id);
    await this.docs.create(tags.workspace(ws.id), ws);
    crashPoint('workspace-created');
    await this.listWorkspace(ws);
    return ws;
  }

  private async listWorkspace(ws: Workspace): Promise<void> {
    await this.redis.zadd(keys.index(tags.org(ws.organization_id), 'workspaces'), Date.parse(ws.created_at), ws.id);
  }

  /**
   * The Workspace of the Organization stored under `id`, null when there is none. One found is
   * listed in the Organization (again: a no-op unless the create that wrote it died before).
   */
  async findWorkspace(orgId: string, id: string): Promise<Workspace | null> {
    const ws = await this.docs.get<Workspace>(tags.workspace(id), id);
    if (!ws || ws.organization_id !== orgId) return null;
    await this.listWorkspace(ws);
    return ws;
  }

  getOrganization(orgId: string): Promise<Organization | null> {
    return this.docs.get<Organization>(tags.org(orgId), orgId);
  }

  // ---- API keys ------------------------------------------------------------------------------

  private apiKeyRecord(k: ApiKey): AuthRecord & { document_version: number } {
    return {
      kind: 'api_key',
      credential_id: k.id,
      organization_id: k.organization_id,
      workspace_id: k.scope.type === 'workspace' ? k.scope.workspace_id : null,
      role: k.role,
      principal_id: null,
      audience: null,
      rate_limit_per_minute: k.rate_limit_per_minute,
      generation_number: k.generation_number,
      document_version: k.version,
    };
  }

  /** The API key of the Organization stored under `id`; null when there is none. */
  findApiKey(orgId: string, id: string): Promise<ApiKey | null> {
    return this.docs.get<ApiKey>(tags.org(orgId), id);
  }

  /**
   * A new first secret for a key whose create died before its answer (`key`, as found unchanged,
   * version 1): that attempt's secret was never shown (whether or not it was live yet), so it is
   * replaced, and shown once by the retry. The key stays generation 1; its hint changes (version
   * 2). A key changed meanwhile, even between the retry's read and this write, is left alone with
   * its secret (409 `idempotency.conflict`).
   */
  async reissueFirstApiKeySecret(orgId: string, key: ApiKey): Promise<{ key: ApiKey; secret: string }> {
    const { doc, secret } = await this.reissueFirstSecret<ApiKey>(tags.org(orgId), key.id, 'api_key', 'API key', (next) => this.apiKeyRecord(next));
    return { key: doc, secret };
  }

  /** `reissueFirstApiKeySecret` for a Principal access credential (`principal-credential-created`). */
  async reissueFirstCredentialSecret(orgId: string, credential: PrincipalAccessCredential): Promise<{ credential: PrincipalAccessCredential; secret: string }> {
    const { doc, secret } = await this.reissueFirstSecret<PrincipalAccessCredential>(tags.workspace(credential.workspace_id), credential.id, 'principal_credential', 'principal access credential', (next) => this.credentialRecord(next, orgId));
    return { credential: doc, secret };
  }

  private async reissueFirstSecret<T extends ApiKey | PrincipalAccessCredential>(
    tag: Tag, id: string, kind: 'api_key' | 'principal_credential', what: string, record: (next: T) => AuthRecord & { document_version: number },
  ): Promise<{ doc: T; secret: string }> {
    const issued = issueSecret(kind);
    // Checked on the stored document inside the compare-and-swap (a lost race re-reads it), so a
    // change made since the retry's read is refused as the reused key it now is.
    const next = await this.docs.update<T>(tag, id, (d) => {
      if (d.version !== 1 || d.generation_number !== 1 || d.status !== 'active') {
        throw new ApiError('idempotency.conflict', `this Idempotency-Key was used for this request before, and the ${what} it made has changed since; use a new key`);
      }
      return { ...d, secret_hint: issued.hint };
    }, { notFound: what });
    // The first attempt may have died after its secret went live (before its answer was kept):
    // that secret, never shown, is replaced in the same generation.
    await this.credentials.swap(id, { digest: issued.digest, record: record(next) }, { sameGeneration: true });
    return { doc: next, secret: issued.secret };
  }

  /** `point`: the crash point between the key's document and its live secret (crash tests; the API's creates name it, the first boot's does not). */
  async createApiKey(orgId: string, input: CreateApiKeyInput, id = newId('apiKey'), point?: string): Promise<{ key: ApiKey; secret: string }> {
    if (input.scope.type === 'workspace') {
      const ws = await this.docs.get<Workspace>(tags.workspace(input.scope.workspace_id), input.scope.workspace_id);
      if (!ws || ws.organization_id !== orgId) throw new ApiError('validation.not_found', 'workspace not found');
    }
    const now = nowIso();
    const issued = issueSecret('api_key');
    const key: ApiKey = {
      id, type: 'api_key', organization_id: orgId, display_name: input.display_name,
      role: input.role, scope: input.scope, rate_limit_per_minute: input.rate_limit_per_minute ?? null,
      status: 'active', generation_number: 1, secret_hint: issued.hint, revoked_at: null,
      version: 1, created_at: now, updated_at: now,
    };
    await this.docs.create(tags.org(orgId), key, ['api_keys']);
    if (point !== undefined) crashPoint(point);
    await this.credentials.swap(key.id, { digest: issued.digest, record: this.apiKeyRecord(key) });
    // Live but not yet shown (crash tests: the API's creates only): the retry replaces it.
    if (point !== undefined) crashPoint('api-key-secret-live');
    return { key, secret: issued.secret };
  }

  async getApiKey(orgId: string, id: string): Promise<ApiKey> {
    const k = await this.docs.get<ApiKey>(tags.org(orgId), id);
    if (!k) throw new ApiError('validation.not_found', 'API key not found');
    return k;
  }

  /**
   * Whether the organization keeps a live organization-scoped root key besides `exceptId`: only
   * such a key manages keys, so the last one re-roled or revoked would leave nobody able to
   * issue another through the API. (Two root keys changed at the same moment could still both
   * pass; a key is never changed without a root caller, so that takes two at once.)
   */
  private async otherLiveRoot(orgId: string, exceptId: string): Promise<boolean> {
    let page: string | undefined;
    for (;;) {
      const r = await this.docs.list<ApiKey>(tags.org(orgId), 'api_keys', { limit: 200, order: 'asc', ...(page ? { page } : {}) },
        (k) => k.id !== exceptId && k.status === 'active' && k.role === 'root' && k.scope.type === 'organization');
      if (r.data.length > 0) return true;
      if (!r.next_page) return false;
      page = r.next_page;
    }
  }

  /**
   * Runs `change` unless it takes the organization's last live root key away (409, see
   * `otherLiveRoot`). A change that takes a root key away holds the organization's root guard
   * while it checks and writes: two such changes at once (each revoking the other of the last two
   * root keys) are one after the other, and the second finds the first's result.
   */
  private async keepOneRoot<T>(orgId: string, id: string, losesRoot: (k: ApiKey) => boolean, change: () => Promise<T>): Promise<T> {
    const k = await this.getApiKey(orgId, id);
    if (k.status !== 'active' || k.role !== 'root' || k.scope.type !== 'organization' || !losesRoot(k)) return change();
    const guard = keys.scoped(tags.org(orgId), 'root_guard');
    const token = newId('apiKey');
    for (let tries = 0; ; tries++) {
      if ((await this.redis.set(guard, token, 'PX', ROOT_GUARD_MS, 'NX')) === 'OK') break;
      if (tries >= 100) throw new ApiError('validation.conflict', 'another change of a root key is in progress; nothing was written, retry');
      await new Promise((r) => setTimeout(r, 10 + Math.floor(Math.random() * 20)));
    }
    try {
      const now = await this.getApiKey(orgId, id);
      if (now.status === 'active' && now.role === 'root' && now.scope.type === 'organization' && losesRoot(now) && !(await this.otherLiveRoot(orgId, id))) {
        throw new ApiError('runtime.invalid_transition', `${id} is the organization's last live root key: create another root key before re-roling or revoking it`);
      }
      return await change();
    } finally {
      await RELEASE_GUARD.run(this.redis, [guard], [token]).catch(() => undefined);
    }
  }

  async patchApiKey(
    orgId: string,
    id: string,
    patch: { display_name?: string | undefined; role?: Role | undefined; rate_limit_per_minute?: number | null | undefined },
    expectedVersion?: number,
  ): Promise<ApiKey> {
    if (patch.role !== undefined) return this.keepOneRoot(orgId, id, () => patch.role !== 'root', () => this.writePatch(orgId, id, patch, expectedVersion));
    return this.writePatch(orgId, id, patch, expectedVersion);
  }

  private async writePatch(
    orgId: string,
    id: string,
    patch: { display_name?: string | undefined; role?: Role | undefined; rate_limit_per_minute?: number | null | undefined },
    expectedVersion?: number,
  ): Promise<ApiKey> {
    const next = await this.docs.update<ApiKey>(
      tags.org(orgId),
      id,
      (k) => {
        if (k.status === 'revoked') throw new ApiError('runtime.invalid_transition', 'a revoked key cannot be changed');
        return {
          ...k,
          ...(patch.display_name !== undefined ? { display_name: patch.display_name } : {}),
          ...(patch.role !== undefined ? { role: patch.role } : {}),
          ...(patch.rate_limit_per_minute !== undefined ? { rate_limit_per_minute: patch.rate_limit_per_minute } : {}),
        };
      },
      { expectedVersion, notFound: 'API key', unchangedKeepsVersion: true },
    );
    // Only the live secret of this generation is rewritten, and only while it lives: a rotation
    // that displaced it rewrites its own record from the document after it wins (rotateApiKey).
    await this.credentials.refresh(this.apiKeyRecord(next));
    return next;
  }

  async rotateApiKey(orgId: string, id: string, expectedVersion?: number): Promise<{ key: ApiKey; secret: string }> {
    const issued = issueSecret('api_key');
    let before: Pick<ApiKey, 'generation_number' | 'secret_hint'> | undefined;
    const next = await this.docs.update<ApiKey>(
      tags.org(orgId),
      id,
      (k) => {
        if (k.status === 'revoked') throw new ApiError('runtime.invalid_transition', 'a revoked key cannot be rotated');
        before = { generation_number: k.generation_number, secret_hint: k.secret_hint };
        return { ...k, generation_number: k.generation_number + 1, secret_hint: issued.hint };
      },
      { expectedVersion, notFound: 'API key' },
    );
    await this.installRotated(tags.org(orgId), id, next, before, 'API key', () => this.credentials.swap(id, { digest: issued.digest, record: this.apiKeyRecord(next) }));
    // A patch whose document write came after this rotation's may have found the old secret still
    // live and rewritten only that one: carry its change over to the new secret.
    const now = await this.docs.get<ApiKey>(tags.org(orgId), id);
    if (now && now.status === 'active' && now.generation_number === next.generation_number && now.version > next.version) {
      await this.credentials.refresh(this.apiKeyRecord(now));
    }
    return { key: next, secret: issued.secret };
  }

  async revokeApiKey(orgId: string, id: string, expectedVersion?: number): Promise<ApiKey> {
    return this.keepOneRoot(orgId, id, () => true, () => this.writeRevoke(orgId, id, expectedVersion));
  }

  private async writeRevoke(orgId: string, id: string, expectedVersion?: number): Promise<ApiKey> {
    const cur = await this.getApiKey(orgId, id);
    if (expectedVersion !== undefined && cur.version !== expectedVersion) {
      throw new ApiError('validation.conflict', `expected version ${expectedVersion} ${staleOrAhead(expectedVersion, cur.version)}; the current version is ${cur.version}`);
    }
    // The secret dies before the document says so: a process killed in between leaves a key whose
    // secret is refused (and a retry records the revocation), never a revoked key that still works.
    await this.credentials.swap(id, null);
    crashPoint('credential-secret-revoked');
    if (cur.status === 'revoked') return cur;
    // The revocation has happened: the document follows whatever changed it meanwhile.
    return this.docs.update<ApiKey>(
      tags.org(orgId),
      id,
      (k) => (k.status === 'revoked' ? null : { ...k, status: 'revoked', revoked_at: nowIso() }),
      { notFound: 'API key', current: cur },
    );
  }

  // ---- Principals ----------------------------------------------------------------------------

  async createPrincipal(
    workspaceId: string,
    input: { external_subject_id: string; principal_type: 'person' | 'service'; display_name: string },
    id = newId('principal'),
  ): Promise<Principal> {
    const tag = tags.workspace(workspaceId);
    const now = nowIso();
    const p: Principal = {
      id, type: 'principal', workspace_id: workspaceId, external_subject_id: input.external_subject_id,
      principal_type: input.principal_type, display_name: input.display_name, status: 'active',
      suspended_at: null, deleted_at: null, version: 1, created_at: now, updated_at: now,
    };
    const subjects = keys.unique(tag, 'principal_subjects');
    // A subject held by no live Principal (a create or a deletion that died half-way) is released and claimed here.
    const created = await createClaimed(this.redis, {
      unique: subjects, field: input.external_subject_id, id: p.id, docKey: keys.doc(tag, p.id), json: JSON.stringify(p), index: keys.index(tag, 'principals'), score: Date.parse(now),
    }, async () => {
      const owner = await this.redis.hget(subjects, input.external_subject_id);
      return owner !== null && owner !== p.id && (await RELEASE_DEAD_SUBJECT.run(this.redis, [subjects, keys.doc(tag, owner)], [input.external_subject_id, owner])) === 1;
    });
    if (!created) throw new ApiError('validation.conflict', `a Principal with external_subject_id '${input.external_subject_id}' already exists`);
    return p;
  }

  /** The Principal stored under `id` in the Workspace, whatever its status; null when there is none. */
  findPrincipal(workspaceId: string, id: string): Promise<Principal | null> {
    return this.docs.get<Principal>(tags.workspace(workspaceId), id);
  }

  /** A Principal to read (shared with other readers: never change it). */
  async getPrincipal(workspaceId: string, id: string): Promise<Readonly<Principal>> {
    const p = await this.docs.getShared<Principal>(tags.workspace(workspaceId), id);
    if (!p || p.status === 'deleted') throw new ApiError('validation.not_found', 'principal not found');
    return p;
  }

  /** An active Principal of this workspace, or 404 (absent, suspended and deleted look alike to callers). */
  /** The Principal, when active; the read cache's shared copy (read it, never change it). */
  async activePrincipal(workspaceId: string, id: string, what = 'principal'): Promise<Readonly<Principal>> {
    const p = await this.docs.getShared<Principal>(tags.workspace(workspaceId), id);
    if (!p || p.status !== 'active') throw new ApiError('validation.not_found', `${what} ${id} is not an active Principal of this workspace`);
    return p;
  }

  async setPrincipalStatus(workspaceId: string, id: string, status: 'active' | 'suspended' | 'deleted', expectedVersion?: number): Promise<Principal> {
    const tag = tags.workspace(workspaceId);
    const next = await this.docs.update<Principal>(
      tag,
      id,
      (p) => {
        if (p.status === 'deleted') {
          if (status === 'deleted') return null;
          throw new ApiError('validation.not_found', 'principal not found');
        }
        if (p.status === status) return null;
        const now = nowIso();
        return {
          ...p,
          status,
          suspended_at: status === 'suspended' ? now : null,
          deleted_at: status === 'deleted' ? now : p.deleted_at,
        };
      },
      { expectedVersion, notFound: 'principal' },
    );
    if (status === 'deleted') {
      // Only while the subject is still this Principal's: a create may already have taken it over.
      await RELEASE_DEAD_SUBJECT.run(this.redis, [keys.unique(tag, 'principal_subjects'), keys.doc(tag, id)], [next.external_subject_id, id]);
      await this.redis.publish(PRINCIPAL_CHANGES_CHANNEL, JSON.stringify({ workspace_id: workspaceId, principal_id: id, status }));
      await this.revokeCredentialsOf(workspaceId, id);
    } else if (status === 'suspended') {
      await this.redis.publish(PRINCIPAL_CHANGES_CHANNEL, JSON.stringify({ workspace_id: workspaceId, principal_id: id, status }));
    }
    return next;
  }

  // ---- Principal access credentials ----------------------------------------------------------

  private credentialRecord(c: PrincipalAccessCredential, orgId: string): AuthRecord & { document_version: number } {
    return {
      kind: 'principal_credential', credential_id: c.id, organization_id: orgId, workspace_id: c.workspace_id,
      role: null, principal_id: c.principal_id, audience: c.audience, rate_limit_per_minute: null,
      generation_number: c.generation_number, document_version: c.version,
    };
  }

  /** The Principal access credential of the Workspace stored under `id`; null when there is none. */
  findPrincipalCredential(workspaceId: string, id: string): Promise<PrincipalAccessCredential | null> {
    return this.docs.get<PrincipalAccessCredential>(tags.workspace(workspaceId), id);
  }

  /** `point`: the crash point between the credential's document and its live secret (crash tests). */
  async createPrincipalCredential(orgId: string, workspaceId: string, principalId: string, audience: 'api_mcp' | 'a2a', id = newId('principalCredential'), point?: string) {
    await this.activePrincipal(workspaceId, principalId);
    const now = nowIso();
    const issued = issueSecret('principal_credential');
    const c: PrincipalAccessCredential = {
      id, type: 'principal_access_credential', workspace_id: workspaceId,
      principal_id: principalId, audience, status: 'active', generation_number: 1, secret_hint: issued.hint,
      rotated_at: null, revoked_at: null, version: 1, created_at: now, updated_at: now,
    };
    const tag = tags.workspace(workspaceId);
    await this.docs.create(tag, c, [`principal_credentials:${principalId}`]);
    if (point !== undefined) crashPoint(point);
    await this.credentials.swap(c.id, { digest: issued.digest, record: this.credentialRecord(c, orgId) });
    if (point !== undefined) crashPoint('principal-credential-secret-live');
    return { credential: c, secret: issued.secret };
  }

  async getPrincipalCredential(workspaceId: string, id: string): Promise<PrincipalAccessCredential> {
    const c = await this.docs.get<PrincipalAccessCredential>(tags.workspace(workspaceId), id);
    if (!c) throw new ApiError('validation.not_found', 'principal access credential not found');
    return c;
  }

  private async updateCredential(
    workspaceId: string,
    id: string,
    expectedGeneration: number,
    change: (c: PrincipalAccessCredential) => PrincipalAccessCredential | null,
  ): Promise<PrincipalAccessCredential> {
    return this.docs.update<PrincipalAccessCredential>(
      tags.workspace(workspaceId),
      id,
      (c) => {
        if (c.generation_number !== expectedGeneration) {
          throw new ApiError('validation.conflict', `expected_generation_number ${expectedGeneration} ${staleOrAhead(expectedGeneration, c.generation_number)}; the current generation is ${c.generation_number}`);
        }
        return change(c);
      },
      { notFound: 'principal access credential' },
    );
  }

  async rotatePrincipalCredential(orgId: string, workspaceId: string, id: string, expectedGeneration: number) {
    // A deleted Principal's credentials are dead for good: no new secret is issued for one (404,
    // as its credential list is). A suspended Principal's may be rotated (it may be resumed).
    await this.getPrincipal(workspaceId, (await this.getPrincipalCredential(workspaceId, id)).principal_id);
    const issued = issueSecret('principal_credential');
    let before: Pick<PrincipalAccessCredential, 'generation_number' | 'secret_hint' | 'rotated_at'> | undefined;
    const next = await this.updateCredential(workspaceId, id, expectedGeneration, (c) => {
      if (c.status === 'revoked') throw new ApiError('runtime.invalid_transition', 'a revoked credential cannot be rotated');
      before = { generation_number: c.generation_number, secret_hint: c.secret_hint, rotated_at: c.rotated_at };
      return { ...c, generation_number: c.generation_number + 1, secret_hint: issued.hint, rotated_at: nowIso() };
    });
    await this.installRotated(tags.workspace(workspaceId), id, next, before, 'principal access credential', () =>
      this.credentials.swap(id, { digest: issued.digest, record: this.credentialRecord(next, orgId) }));
    return { credential: next, secret: issued.secret };
  }

  /**
   * A rotation's new secret installed after its document was written. A revocation that won the
   * race refuses the secret: the document then goes back to the generation and hint (and rotation
   * time) it had, so a revoked credential does not name a secret that never lived.
   */
  private async installRotated<T extends StoredDoc & { generation_number: number; secret_hint: string }>(
    tag: Tag, id: string, rotated: T, before: Partial<T> | undefined, notFound: string, install: () => Promise<void>,
  ): Promise<void> {
    try {
      await install();
    } catch (err) {
      if (before && err instanceof ApiError && err.type === 'runtime.invalid_transition') {
        await this.docs.update<T>(tag, id, (d) => (d.generation_number === rotated.generation_number && d.secret_hint === rotated.secret_hint ? { ...d, ...before } : null), { notFound })
          // The refusal is what the caller gets either way; a document not put back only names a dead secret.
          .catch(() => undefined);
      }
      throw err;
    }
  }

  /**
   * A deleted Principal's access credentials, revoked: they stopped authenticating with the
   * Principal, and now read so too. A delete retried after a crash here revokes the rest.
   */
  private async revokeCredentialsOf(workspaceId: string, principalId: string): Promise<void> {
    let page: string | undefined;
    do {
      const r = await this.docs.list<PrincipalAccessCredential>(tags.workspace(workspaceId), `principal_credentials:${principalId}`, { limit: 100, page, order: 'asc' });
      for (const c of r.data) {
        if (c.status === 'revoked') continue;
        await this.credentials.swap(c.id, null);
        await this.docs.update<PrincipalAccessCredential>(tags.workspace(workspaceId), c.id,
          (cur) => (cur.status === 'revoked' ? null : { ...cur, status: 'revoked', revoked_at: nowIso() }), { notFound: 'principal access credential', current: c });
      }
      page = r.next_page ?? undefined;
    } while (page);
  }

  async revokePrincipalCredential(workspaceId: string, id: string, expectedGeneration: number) {
    const cur = await this.getPrincipalCredential(workspaceId, id);
    if (cur.generation_number !== expectedGeneration) {
      throw new ApiError('validation.conflict', `expected_generation_number ${expectedGeneration} ${staleOrAhead(expectedGeneration, cur.generation_number)}; the current generation is ${cur.generation_number}`);
    }
    // The secret dies first, as an API key's does (revokeApiKey).
    await this.credentials.swap(id, null);
    crashPoint('credential-secret-revoked');
    if (cur.status === 'revoked') return cur;
    return this.docs.update<PrincipalAccessCredential>(
      tags.workspace(workspaceId),
      id,
      (c) => (c.status === 'revoked' ? null : { ...c, status: 'revoked', revoked_at: nowIso() }),
      { notFound: 'principal access credential', current: cur },
    );
  }
}

/** Pub/sub channel on which Principal suspensions and deletions are announced (gateways close sockets). */
export const PRINCIPAL_CHANGES_CHANNEL = 'ap:principal-changes';
