import { ApiError, newId, nowIso } from '@agentplane/core';
import { releaseOrphanClaim } from '@agentplane/domain';
import { DOC_SWAP_LUA, docSwapResult, keys, LuaScript, tags, type DocumentStore, type Redis, type StoredDoc, type SwapOutcome } from '@agentplane/store';
import type { INHERITANCES, MEMBERSHIPS, ScopeKind, SCOPE_STATES, VISIBILITIES } from './schemas.js';

export interface AmbientPolicy {
  enabled: boolean;
  muted: boolean;
  max_responses_per_window: number | null;
  max_tokens_per_window: number | null;
  self_quiet_threshold: number | null;
}

export interface SurfaceScope extends StoredDoc {
  type: 'surface_scope';
  workspace_id: string;
  external_installation_id: string | null;
  external_id: string | null;
  kind: ScopeKind;
  parent_id: string | null;
  display_name: string;
  visibility: (typeof VISIBILITIES)[number];
  membership: (typeof MEMBERSHIPS)[number];
  inheritance: (typeof INHERITANCES)[number];
  state: (typeof SCOPE_STATES)[number];
  verified_member: { principal_id: string; external_identity_link_id: string | null; paired_at: string } | null;
  membership_assertion: { asserted_at: string; freshness_horizon_seconds: number } | null;
  ambient_policy: AmbientPolicy;
  archived_at: string | null;
}

export interface ExternalInstallation extends StoredDoc {
  type: 'external_installation';
  workspace_id: string;
  provider: string;
  external_id: string;
  display_name: string;
  state: 'active' | 'archived';
  archived_at: string | null;
}

export const DEFAULT_AMBIENT_POLICY: AmbientPolicy = Object.freeze({
  enabled: false, muted: false, max_responses_per_window: null, max_tokens_per_window: null, self_quiet_threshold: null,
});

/** Which parent kinds each kind may sit under (root sits under nothing). */
const PARENT_KINDS: Record<ScopeKind, readonly ScopeKind[]> = {
  root: [],
  team: ['root'],
  channel: ['root', 'team'],
  personal: ['root'],
};

/** How deep an ancestor walk goes at most (root → team → channel is 3; the bound guards bad data). */
const MAX_DEPTH = 8;

export const SCOPES = 'surface_scopes';
const byInstallation = (exti: string | null): string => `surface_scopes:exti:${exti ?? 'native'}`;
const children = (surf: string): string => `surface_scopes:children:${surf}`;
const externalIds = (exti: string | null): string => `surface_scope_external:${exti ?? 'native'}`;
const roots = 'surface_scope_roots';
export const INSTALLATIONS = 'external_installations';
const installationKeys = 'external_installation_keys';

/**
 * Creates an external installation in one step: its `(provider, external_id)` claimed (KEYS[1],
 * field ARGV[1] = ARGV[2]; 0 when taken), the document (KEYS[2]) and its listing entry (KEYS[3],
 * score ARGV[4]), so a key is never claimed by an installation that does not exist. ARGV[3] JSON.
 */
const CREATE_INSTALLATION = new LuaScript('external_installation_create', `
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('SET', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[3], ARGV[4], ARGV[2])
return 1`);

/**
 * Creates a scope in one step, so that what it checks still holds when it is written:
 * KEYS[1] the scope, KEYS[2] its external installation (checked active when ARGV[4] is '1'),
 * KEYS[3] its parent (checked active when ARGV[5] is '1'), KEYS[4] the root claims (field ARGV[6]
 * claimed when not ''), KEYS[5] the external id claims (field ARGV[7] claimed when not ''),
 * KEYS[6..] the listings (score ARGV[2]). ARGV[1] the scope's JSON, ARGV[3] its id.
 * Returns {1} created; {-1} installation archived or gone; {-2} parent archived or gone;
 * {-3, owner} root taken; {-4, owner} external id taken.
 * The parent's children listing is among KEYS[6..]: a parent's archive (ARCHIVE_SCOPE) sees a child
 * written here, and this script sees the parent archived.
 */
const CREATE_SCOPE = new LuaScript('surface_scope_create', `
local function active(key)
  local cur = redis.call('GET', key)
  if not cur then return false end
  local ok, doc = pcall(cjson.decode, cur)
  return ok and type(doc) == 'table' and doc.state == 'active'
end
if ARGV[4] == '1' and not active(KEYS[2]) then return {-1} end
if ARGV[5] == '1' and not active(KEYS[3]) then return {-2} end
if ARGV[6] ~= '' then
  local owner = redis.call('HGET', KEYS[4], ARGV[6])
  if owner then return {-3, owner} end
end
if ARGV[7] ~= '' then
  local owner = redis.call('HGET', KEYS[5], ARGV[7])
  if owner then return {-4, owner} end
end
if ARGV[6] ~= '' then redis.call('HSET', KEYS[4], ARGV[6], ARGV[3]) end
if ARGV[7] ~= '' then redis.call('HSET', KEYS[5], ARGV[7], ARGV[3]) end
redis.call('SET', KEYS[1], ARGV[1])
for i = 6, #KEYS do redis.call('ZADD', KEYS[i], ARGV[2], ARGV[3]) end
return {1}`);

/**
 * A scope's archive: the compare-and-swap of `doc_swap` on KEYS[1] (ARGV[1] expected version,
 * ARGV[2] JSON), written only while its children listing (KEYS[2]) still holds exactly ARGV[3]
 * children, the ones the caller found archived (a child is never taken out of it, and an archived
 * child stays archived). Returns as `doc_swap`, or {-5} when a child was created meanwhile.
 */
const ARCHIVE_SCOPE = new LuaScript('surface_scope_archive', `${DOC_SWAP_LUA}
if redis.call('ZCARD', KEYS[2]) ~= tonumber(ARGV[3]) then return {-5} end
return doc_swap(KEYS[1], ARGV[1], ARGV[2], nil, nil, nil)`);

/** A child created while its parent's archive was checking the children: the check runs again. */
class ChildrenChanged extends Error {}

export interface CreateScopeInput {
  kind: ScopeKind;
  parent_id?: string | null | undefined;
  external_installation_id?: string | null | undefined;
  external_id?: string | null | undefined;
  display_name: string;
  visibility?: SurfaceScope['visibility'] | undefined;
  membership?: SurfaceScope['membership'] | undefined;
  inheritance?: SurfaceScope['inheritance'] | undefined;
  verified_member?: { principal_id: string; external_identity_link_id?: string | null | undefined; paired_at?: string | undefined } | null | undefined;
  membership_assertion?: SurfaceScope['membership_assertion'] | undefined;
  ambient_policy?: Partial<AmbientPolicy> | undefined;
}

export type UpdateScopeInput = Omit<CreateScopeInput, 'kind' | 'parent_id' | 'external_installation_id' | 'external_id' | 'display_name'> & {
  display_name?: string | undefined;
};

/**
 * SurfaceScopes and the external installations they are created under (documents under the
 * Workspace tag). The tree is root → team → channel, plus personal scopes under a root; one root
 * per external installation (or one native root per Workspace).
 */
export class SurfaceScopeStore {
  constructor(private readonly redis: Redis, private readonly docs: DocumentStore) {}

  // ---- external installations ------------------------------------------------------------

  async createInstallation(ws: string, input: { provider: string; external_id: string; display_name: string }, id = newId('externalInstallation')): Promise<ExternalInstallation> {
    const tag = tags.workspace(ws);
    const now = nowIso();
    const doc: ExternalInstallation = {
      id, type: 'external_installation', workspace_id: ws, provider: input.provider,
      external_id: input.external_id, display_name: input.display_name, state: 'active', archived_at: null,
      version: 1, created_at: now, updated_at: now,
    };
    const claims = keys.unique(tag, installationKeys);
    const field = `${input.provider}\u0000${input.external_id}`;
    const create = () => CREATE_INSTALLATION.run(this.redis, [claims, keys.doc(tag, doc.id), keys.index(tag, INSTALLATIONS)],
      [field, doc.id, JSON.stringify(doc), Date.parse(now)]);
    let created = await create();
    // The key held by no installation (an older version claimed it in a step of its own): released, then claimed here.
    if (created !== 1 && (await releaseOrphanClaim(this.redis, claims, field, (owner) => keys.doc(tag, owner)))) created = await create();
    if (created !== 1) throw new ApiError('validation.conflict', `an external installation of ${input.provider} '${input.external_id}' already exists in this Workspace`);
    return doc;
  }

  /** The external installation stored under `id` in the Workspace; null when there is none. */
  findInstallation(ws: string, id: string): Promise<ExternalInstallation | null> {
    return this.docs.get<ExternalInstallation>(tags.workspace(ws), id);
  }

  async getInstallation(ws: string, id: string): Promise<ExternalInstallation> {
    const doc = await this.findInstallation(ws, id);
    if (!doc || doc.type !== 'external_installation' || doc.workspace_id !== ws) throw new ApiError('validation.not_found', `external installation ${id} not found`);
    return doc;
  }

  async archiveInstallation(ws: string, id: string): Promise<ExternalInstallation> {
    await this.getInstallation(ws, id);
    return this.docs.update<ExternalInstallation>(tags.workspace(ws), id, (cur) => cur.state === 'archived' ? null : {
      ...cur, state: 'archived', archived_at: nowIso(), version: cur.version + 1, updated_at: nowIso(),
    }, { notFound: 'external installation' }).then(async (d) => d ?? this.getInstallation(ws, id));
  }

  // ---- scopes ----------------------------------------------------------------------------

  /** The scope stored under `id` in the Workspace; null when there is none. */
  find(ws: string, id: string): Promise<SurfaceScope | null> {
    return this.docs.get<SurfaceScope>(tags.workspace(ws), id);
  }

  async get(ws: string, id: string): Promise<SurfaceScope> {
    const doc = await this.find(ws, id);
    if (!doc || doc.type !== 'surface_scope' || doc.workspace_id !== ws) throw new ApiError('validation.not_found', `surface scope ${id} not found`);
    return doc;
  }

  async create(ws: string, input: CreateScopeInput, principalActive: (id: string) => Promise<void>, id = newId('surfaceScope')): Promise<SurfaceScope> {
    const tag = tags.workspace(ws);
    const exti = input.external_installation_id ?? null;
    if (exti !== null) {
      const inst = await this.getInstallation(ws, exti);
      if (inst.state !== 'active') throw new ApiError('runtime.invalid_transition', `external installation ${exti} is archived`);
    }
    const parentId = input.parent_id ?? null;
    if (input.kind === 'root') {
      if (parentId !== null) throw new ApiError('validation.malformed', 'body.parent_id: a root scope has no parent');
    } else {
      if (parentId === null) throw new ApiError('validation.malformed', `body.parent_id: a ${input.kind} scope needs a parent`);
      const parent = await this.get(ws, parentId);
      if (parent.state !== 'active') throw new ApiError('runtime.invalid_transition', `parent scope ${parentId} is archived`);
      if (!PARENT_KINDS[input.kind].includes(parent.kind)) {
        throw new ApiError('validation.malformed', `body.parent_id: a ${input.kind} scope sits under ${PARENT_KINDS[input.kind].join(' or ')}, not under a ${parent.kind}`);
      }
      if (parent.external_installation_id !== exti) {
        throw new ApiError('validation.malformed', 'body.external_installation_id: a scope belongs to the same external installation as its parent');
      }
    }
    if (input.kind === 'personal') {
      if (!input.verified_member) throw new ApiError('validation.malformed', 'body.verified_member: a personal scope names its verified member');
    } else if (input.verified_member) {
      throw new ApiError('validation.malformed', 'body.verified_member: only a personal scope has a verified member');
    }
    if (input.verified_member) await principalActive(input.verified_member.principal_id);
    const now = nowIso();
    const doc: SurfaceScope = {
      id, type: 'surface_scope', workspace_id: ws, external_installation_id: exti,
      external_id: input.external_id ?? null, kind: input.kind, parent_id: parentId, display_name: input.display_name,
      visibility: input.visibility ?? (input.kind === 'personal' ? 'private' : 'public'),
      membership: input.membership ?? (input.kind === 'personal' ? 'verified' : 'public'),
      inheritance: input.inheritance ?? 'inherit', state: 'active',
      verified_member: input.verified_member ? {
        principal_id: input.verified_member.principal_id,
        external_identity_link_id: input.verified_member.external_identity_link_id ?? null,
        paired_at: input.verified_member.paired_at ?? now,
      } : null,
      membership_assertion: input.membership_assertion ?? null,
      ambient_policy: { ...DEFAULT_AMBIENT_POLICY, ...input.ambient_policy },
      archived_at: null, version: 1, created_at: now, updated_at: now,
    };
    // Claims: one root per installation (or native Workspace), one scope per external id; the
    // installation and the parent are checked active in the script that writes the scope.
    const rootField = doc.kind === 'root' ? exti ?? 'native' : '';
    const externalField = doc.external_id ?? '';
    const keyList = [
      keys.doc(tag, doc.id), keys.doc(tag, exti ?? doc.id), keys.doc(tag, parentId ?? doc.id), keys.unique(tag, roots), keys.unique(tag, externalIds(exti)),
      ...[SCOPES, byInstallation(exti), ...(parentId ? [children(parentId)] : [])].map((c) => keys.index(tag, c)),
    ];
    const args = [JSON.stringify(doc), Date.parse(now), doc.id, exti ? '1' : '0', parentId ? '1' : '0', rootField, externalField];
    for (let attempt = 0; ; attempt++) {
      const [r, owner] = (await CREATE_SCOPE.run(this.redis, keyList, args)) as [number, string | undefined];
      if (r === 1) return doc;
      if (r === -1) throw new ApiError('runtime.invalid_transition', `external installation ${exti ?? ''} is archived`);
      if (r === -2) throw new ApiError('runtime.invalid_transition', `parent scope ${parentId ?? ''} is archived`);
      const claim = r === -3 ? { key: keys.unique(tag, roots), field: rootField } : { key: keys.unique(tag, externalIds(exti)), field: externalField };
      // A claim held by no scope (an older version claimed in steps of their own): released, then claimed here.
      if (attempt < 2 && owner !== undefined && (await releaseOrphanClaim(this.redis, claim.key, claim.field, (o) => keys.doc(tag, o)))) continue;
      throw new ApiError('validation.conflict', r === -3
        ? `this ${exti ? `external installation (${exti})` : 'Workspace'} already has a root scope`
        : `a scope with external_id '${doc.external_id ?? ''}' already exists under ${exti ?? 'the native tree'}`);
    }
  }

  async update(ws: string, id: string, input: UpdateScopeInput & { expected_version?: number | undefined }, principalActive: (id: string) => Promise<void>): Promise<SurfaceScope> {
    const cur = await this.get(ws, id);
    if (cur.state !== 'active') throw new ApiError('runtime.invalid_transition', `surface scope ${id} is archived`);
    if (input.verified_member !== undefined) {
      if (cur.kind !== 'personal' && input.verified_member !== null) throw new ApiError('validation.malformed', 'body.verified_member: only a personal scope has a verified member');
      if (cur.kind === 'personal' && input.verified_member === null) throw new ApiError('validation.malformed', 'body.verified_member: a personal scope keeps its verified member');
      if (input.verified_member) await principalActive(input.verified_member.principal_id);
    }
    return this.docs.update<SurfaceScope>(tags.workspace(ws), id, (s) => {
      if (s.state !== 'active') throw new ApiError('runtime.invalid_transition', `surface scope ${id} is archived`);
      const now = nowIso();
      return {
        ...s,
        ...(input.display_name !== undefined ? { display_name: input.display_name } : {}),
        ...(input.visibility !== undefined ? { visibility: input.visibility } : {}),
        ...(input.membership !== undefined ? { membership: input.membership } : {}),
        ...(input.inheritance !== undefined ? { inheritance: input.inheritance } : {}),
        ...(input.membership_assertion !== undefined ? { membership_assertion: input.membership_assertion } : {}),
        ...(input.verified_member ? {
          verified_member: {
            principal_id: input.verified_member.principal_id,
            external_identity_link_id: input.verified_member.external_identity_link_id ?? null,
            paired_at: input.verified_member.paired_at ?? now,
          },
        } : {}),
        ...(input.ambient_policy !== undefined ? { ambient_policy: { ...s.ambient_policy, ...input.ambient_policy } } : {}),
        version: s.version + 1, updated_at: now,
      };
    }, { expectedVersion: input.expected_version, notFound: 'surface scope', current: cur, unchangedKeepsVersion: true });
  }

  /** Archive (one-way, retry-safe). A scope with active children is archived after them, not before. */
  async archive(ws: string, id: string, expectedVersion: number | undefined): Promise<SurfaceScope> {
    const tag = tags.workspace(ws);
    const childList = keys.index(tag, children(id));
    for (let attempt = 0; attempt < 16; attempt++) {
      const cur = await this.get(ws, id);
      if (cur.state === 'archived') return cur;
      const kidIds = await this.redis.zrange(childList, 0, -1);
      const kids = await this.docs.getMany<SurfaceScope>(tag, kidIds);
      const live = kids.filter((k) => k.state === 'active');
      if (live.length > 0) throw new ApiError('runtime.invalid_transition', `surface scope ${id} has ${live.length} active child scope(s); archive them first`);
      // Written only while the children are still the ones just found archived (ARCHIVE_SCOPE).
      const write = async (next: SurfaceScope, expected: number): Promise<SwapOutcome> => {
        const r = (await ARCHIVE_SCOPE.run(this.redis, [keys.doc(tag, id), childList], [String(expected), JSON.stringify(next), kidIds.length])) as unknown[];
        if (r[0] === -5) throw new ChildrenChanged();
        return docSwapResult(r).outcome;
      };
      try {
        return await this.docs.update<SurfaceScope>(tag, id, (s) => s.state === 'archived' ? null : {
          ...s, state: 'archived', archived_at: nowIso(), version: s.version + 1, updated_at: nowIso(),
        }, { expectedVersion, notFound: 'surface scope', current: cur, write });
      } catch (err) {
        if (!(err instanceof ChildrenChanged)) throw err;
      }
    }
    throw new ApiError('validation.conflict', `too many scopes are being created under surface scope ${id}; nothing was archived, retry`);
  }

  async list(ws: string, q: { limit: number; page?: string | undefined; external_installation_id?: string | undefined; external_id?: string | undefined }) {
    const tag = tags.workspace(ws);
    if (q.external_id !== undefined) {
      // The external id is unique per installation: one lookup, at most one scope per tree.
      const trees = q.external_installation_id !== undefined ? [q.external_installation_id] : [null, ...(await this.redis.zrange(keys.index(tag, INSTALLATIONS), 0, -1))];
      const ids: string[] = [];
      for (const t of trees) {
        const hit = await this.redis.hget(keys.unique(tag, externalIds(t)), q.external_id);
        if (hit) ids.push(hit);
      }
      const docs = (await this.docs.getMany<SurfaceScope>(tag, ids)).sort((a, b) => a.created_at.localeCompare(b.created_at) || a.id.localeCompare(b.id));
      return { data: docs.slice(0, q.limit), next_page: null };
    }
    const collection = q.external_installation_id !== undefined ? byInstallation(q.external_installation_id) : SCOPES;
    return this.docs.list<SurfaceScope>(tag, collection, { limit: q.limit, page: q.page, order: 'asc' });
  }

  /**
   * The scope and every ancestor it inherits from, nearest first: walking up stops after a scope
   * whose `inheritance` is `isolate` (it inherits nothing from above) and at the root.
   */
  async inheritanceChain(ws: string, id: string): Promise<SurfaceScope[]> {
    const chain: SurfaceScope[] = [];
    let cur: SurfaceScope | null = await this.get(ws, id);
    while (cur && chain.length < MAX_DEPTH) {
      chain.push(cur);
      if (cur.inheritance === 'isolate' || cur.parent_id === null) break;
      cur = await this.docs.get<SurfaceScope>(tags.workspace(ws), cur.parent_id);
    }
    return chain;
  }
}

/**
 * The ambient policy in force on a scope: its own, tightened by every ancestor it inherits from.
 * Enabled only if every one enables it; muted if any mutes it; each ceiling is the smallest set.
 */
export function effectiveAmbientPolicy(chain: readonly SurfaceScope[]): AmbientPolicy {
  const min = (a: number | null, b: number | null): number | null => (a === null ? b : b === null ? a : Math.min(a, b));
  let out: AmbientPolicy | null = null;
  for (const s of chain) {
    const p = s.ambient_policy;
    out = out === null ? { ...p } : {
      enabled: out.enabled && p.enabled,
      muted: out.muted || p.muted,
      max_responses_per_window: min(out.max_responses_per_window, p.max_responses_per_window),
      max_tokens_per_window: min(out.max_tokens_per_window, p.max_tokens_per_window),
      self_quiet_threshold: min(out.self_quiet_threshold, p.self_quiet_threshold),
    };
  }
  return out ?? { ...DEFAULT_AMBIENT_POLICY };
}
