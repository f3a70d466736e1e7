import { ApiError, crashPoint, newId, nowIso } from '@agentplane/core';
import { DOC_SWAP_LUA, docSwapResult, KEYED_WRITES_LUA, KeyedWrites, keys, LuaScript, tags, type DocumentStore, type KeyedWrite, type ListPage, type Redis } from '@agentplane/store';
import { SCRIPTED_DEFAULT_MODEL } from '@agentplane/models';
import type { ModelCredentialService } from './credentials.js';
import { profileView, type RoutingCandidate, type RoutingProfileDoc, type RoutingProfileView, type RoutingRevision } from './model.js';

const COLLECTION = 'model_routing_profiles';
/** The logical key of the routing profile (and credential) every workspace starts with. */
export const DEFAULT_MODEL_KEY = 'default';

/**
 * Publishes a revision in one step: the head (KEYS[1]) swapped from version ARGV[1] to ARGV[2],
 * then the revision (KEYS[2], ARGV[3]) and, for a keyed request, its record (KEYS[3],
 * `KeyedWrites`: the revision number ARGV[4], kept ARGV[5] ms). A revision number is taken only
 * with the head that names it, so no publish can leave one behind that the head never reached.
 * A keyed request whose record is already there (an attempt of it published meanwhile) answers
 * {2, that revision's number}, nothing written; otherwise as `doc_swap`.
 */
const PUBLISH = new LuaScript('mrp_publish', `${DOC_SWAP_LUA}${KEYED_WRITES_LUA}
if KEYS[3] then
  local had = recorded_keyed(KEYS[3])
  if had then return {2, had} end
end
local r = doc_swap(KEYS[1], ARGV[1], ARGV[2])
if r[1] == 1 then
  redis.call('SET', KEYS[2], ARGV[3])
  if KEYS[3] then record_keyed(KEYS[3], ARGV[4], ARGV[5]) end
end
return r`);

/**
 * Creates a profile in one step: its key claimed (KEYS[1], field ARGV[1] = ARGV[2]; 0 when
 * taken), revision 1 (KEYS[3]), the head (KEYS[2]) and its listing entry (KEYS[4], score ARGV[5]),
 * so a key is never claimed by a profile that does not exist. ARGV[3] head JSON, ARGV[4] revision JSON.
 */
const CREATE = new LuaScript('mrp_create', `
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 0 then return 0 end
redis.call('SET', KEYS[3], ARGV[4])
redis.call('SET', KEYS[2], ARGV[3])
redis.call('ZADD', KEYS[4], ARGV[5], ARGV[2])
return 1`);

type RoutingProfileInput = { key: string; display_name?: string | undefined; candidates: RoutingCandidate[] };

/** A profile as its create answers it, with its head's version and creation time (`createOnce`). */
export interface CreatedProfile { view: RoutingProfileView; version: number; created_at: string }

/**
 * Model routing profiles (`mrp_`), addressed by logical key. Every change is a new immutable
 * revision (an ordered candidate list); the head points at the latest.
 */
export class RoutingProfileService {
  private readonly seeded = new Set<string>();

  /** Keyed revision requests, each with the revision number it published (`addRevision`). */
  private readonly requests: KeyedWrites;

  constructor(
    private readonly docs: DocumentStore,
    private readonly redis: Redis,
    private readonly credentials: ModelCredentialService,
  ) {
    this.requests = new KeyedWrites(redis, 'mrp_req');
  }

  private revKey(ws: string, id: string, n: number): string {
    return keys.scoped(tags.workspace(ws), `mrp_rev:${id}:${n}`);
  }

  async create(ws: string, input: RoutingProfileInput): Promise<RoutingProfileView> {
    return (await this.createAs(ws, input, newId('modelRoutingProfile'))).view;
  }

  /** `create` under `id`, answering the profile as `findCreated` does (a keyed create, `createOnce`). */
  async createAs(ws: string, input: RoutingProfileInput, id: string): Promise<CreatedProfile> {
    const tag = tags.workspace(ws);
    const now = nowIso();
    const doc: RoutingProfileDoc = {
      id, type: 'model_routing_profile', workspace_id: ws, key: input.key,
      display_name: input.display_name ?? input.key, latest_revision_number: 1, version: 1, created_at: now, updated_at: now,
    };
    const rev: RoutingRevision = {
      type: 'model_routing_profile_revision', model_routing_profile_id: doc.id, workspace_id: ws, revision_number: 1,
      candidates: input.candidates, created_at: now,
    };
    const created = await CREATE.run(this.redis, [keys.unique(tag, COLLECTION), keys.doc(tag, doc.id), this.revKey(ws, doc.id, 1), keys.index(tag, COLLECTION)],
      [doc.key, doc.id, JSON.stringify(doc), JSON.stringify(rev), Date.parse(now)]);
    if (created !== 1) throw new ApiError('validation.conflict', `a model routing profile with key '${doc.key}' exists in this workspace`);
    crashPoint('model-routing-profile-created');
    return { view: profileView(doc, rev), version: doc.version, created_at: doc.created_at };
  }

  /**
   * The profile stored under `id` in the Workspace (its latest revision) with its head's version,
   * as a keyed create's retry answers it (`createOnce`); null when there is none.
   */
  async findCreated(ws: string, id: string): Promise<CreatedProfile | null> {
    const d = await this.docs.get<RoutingProfileDoc>(tags.workspace(ws), id);
    if (!d || d.workspace_id !== ws) return null;
    return { view: profileView(d, await this.revision(ws, id, d.latest_revision_number, d)), version: d.version, created_at: d.created_at };
  }

  async getDoc(ws: string, id: string): Promise<RoutingProfileDoc> {
    const d = await this.docs.get<RoutingProfileDoc>(tags.workspace(ws), id);
    if (!d || d.workspace_id !== ws) throw new ApiError('validation.not_found', 'model routing profile not found');
    return d;
  }

  /**
   * Revision `n`, only when the head has reached it (`n` up to its `latest_revision_number`): a
   * revision document above the head's latest (left by an older version's publish that died
   * between its two writes) is not a revision, and its number is 404 until a publish takes it.
   * `head` is the profile as the caller just read it; without it, the head is read with the
   * revision (one round trip).
   */
  async revision(ws: string, id: string, n: number, head?: RoutingProfileDoc): Promise<RoutingRevision> {
    let latest: number;
    let raw: string | null;
    if (head) {
      latest = head.latest_revision_number;
      raw = n <= latest ? await this.redis.get(this.revKey(ws, id, n)) : null;
    } else {
      const [headRaw, revRaw] = await this.redis.mget(keys.doc(tags.workspace(ws), id), this.revKey(ws, id, n));
      latest = headRaw ? (JSON.parse(headRaw) as RoutingProfileDoc).latest_revision_number : 0;
      raw = revRaw ?? null;
    }
    if (raw === null || n > latest) throw new ApiError('validation.not_found', `revision ${n} not found`);
    return JSON.parse(raw) as RoutingRevision;
  }

  async get(ws: string, id: string): Promise<RoutingProfileView> {
    const d = await this.getDoc(ws, id);
    return profileView(d, await this.revision(ws, id, d.latest_revision_number, d));
  }

  /** The latest revision of the profile holding `key`, or null. */
  async resolve(ws: string, key: string): Promise<{ profile: RoutingProfileDoc; revision: RoutingRevision } | null> {
    const id = await this.redis.hget(keys.unique(tags.workspace(ws), COLLECTION), key);
    if (!id) return null;
    const profile = await this.docs.get<RoutingProfileDoc>(tags.workspace(ws), id);
    if (!profile) return null;
    return { profile, revision: await this.revision(ws, id, profile.latest_revision_number, profile) };
  }

  /**
   * Refuse a model key that names no routing profile of the workspace, so that a typo in an
   * Agent's `model` is refused where it is written, never only as a failed turn: 422
   * `model.no_eligible_model`, the type a model step would fail with. The built-in `default`
   * profile is seeded first, so it always resolves.
   */
  async requireKey(ws: string, key: string, field: string): Promise<void> {
    await this.ensureDefaults(ws);
    if ((await this.redis.hexists(keys.unique(tags.workspace(ws), COLLECTION), key)) === 1) return;
    throw new ApiError('model.no_eligible_model',
      `${field}: no model routing profile of this workspace has the key '${key}'; use '${DEFAULT_MODEL_KEY}' or create the profile first (POST /v1/organizations/workspaces/{workspace_id}/model-routing-profiles)`);
  }

  async list(ws: string, opts: { limit: number; page?: string | undefined; key?: string | undefined }): Promise<ListPage<RoutingProfileView>> {
    const want = opts.key;
    const page = await this.docs.list<RoutingProfileDoc>(tags.workspace(ws), COLLECTION, { limit: opts.limit, page: opts.page, order: 'asc' },
      want === undefined ? undefined : (d) => d.key === want);
    const data = await Promise.all(page.data.map(async (d) => profileView(d, await this.revision(ws, d.id, d.latest_revision_number, d))));
    return { data, next_page: page.next_page };
  }

  /**
   * Publish a new revision; `expected_revision_number` fences concurrent editors (409 when stale).
   * The revision and the head that names it are one script, fenced on the head's version: of two
   * racing publishers one wins, the other is 409.
   *
   * `keyed`: published once per keyed request. The revision an earlier attempt of the request
   * published (its process died before the answer was kept) answers it, whatever `expected` now
   * says, while it is still the latest (`published`); an attempt racing another of the same
   * request is answered the other's revision, not refused as stale.
   */
  async addRevision(ws: string, id: string, candidates: RoutingCandidate[], expected?: number, keyed?: KeyedWrite): Promise<RoutingProfileView> {
    const tag = tags.workspace(ws);
    const [cur, earlier] = await Promise.all([this.getDoc(ws, id), keyed ? this.requests.find(tag, keyed) : null]);
    if (earlier !== null) return this.published(ws, cur, Number(earlier));
    if (expected !== undefined && cur.latest_revision_number !== expected) {
      throw new ApiError('validation.conflict', `revision ${expected} is stale; the latest revision is ${cur.latest_revision_number}`);
    }
    const n = cur.latest_revision_number + 1;
    const now = nowIso();
    const rev: RoutingRevision = {
      type: 'model_routing_profile_revision', model_routing_profile_id: id, workspace_id: ws, revision_number: n, candidates, created_at: now,
    };
    const next: RoutingProfileDoc = { ...cur, latest_revision_number: n, version: cur.version + 1, updated_at: now };
    const raw = (await PUBLISH.run(this.redis, [keys.doc(tag, id), this.revKey(ws, id, n), ...(keyed ? [this.requests.key(tag, keyed)] : [])],
      [String(cur.version), JSON.stringify(next), JSON.stringify(rev), ...(keyed ? [String(n), String(keyed.keptMs)] : [])])) as unknown[];
    if (raw[0] === 2) return this.published(ws, await this.getDoc(ws, id), Number(raw[1]));
    const r = docSwapResult(raw).outcome;
    if (r.kind === 'missing') throw new ApiError('validation.not_found', 'model routing profile not found');
    if (r.kind === 'stale') throw new ApiError('validation.conflict', `revision ${n} was published concurrently`);
    crashPoint('model-routing-revision-written');
    return profileView(next, rev);
  }

  /**
   * The answer to a keyed request one of whose attempts published revision `n`: the profile with
   * that revision while it is still the latest; one published over it since is no longer what
   * that attempt answered: 409 `idempotency.conflict`, nothing written.
   */
  private async published(ws: string, cur: RoutingProfileDoc, n: number): Promise<RoutingProfileView> {
    if (cur.latest_revision_number !== n) {
      throw new ApiError('idempotency.conflict', `this Idempotency-Key published revision ${n}, and the profile has had revision ${cur.latest_revision_number} since; use a new key`);
    }
    return profileView(cur, await this.revision(ws, cur.id, n, cur));
  }

  /**
   * Seed the workspace defaults once: credential `default` (provider `scripted`) and profile
   * `default` routing to it, so a new workspace runs Sessions with no external model.
   * Idempotent under races (unique-key claims); a marker skips the work afterwards, so a
   * revoked default is not re-created.
   */
  async ensureDefaults(ws: string): Promise<void> {
    if (this.seeded.has(ws)) return;
    const marker = keys.scoped(tags.workspace(ws), 'model_defaults_seeded');
    if ((await this.redis.exists(marker)) === 1) {
      this.remember(ws);
      return;
    }
    await this.credentials.create(ws, { key: DEFAULT_MODEL_KEY, display_name: 'Built-in scripted model', provider_key: 'scripted' }).catch(ignoreConflict);
    await this.create(ws, {
      key: DEFAULT_MODEL_KEY, display_name: 'Default (built-in scripted model)',
      candidates: [{ credential_key: DEFAULT_MODEL_KEY, provider_model: SCRIPTED_DEFAULT_MODEL }],
    }).catch(ignoreConflict);
    await this.redis.set(marker, '1');
    this.remember(ws);
  }

  /** The marker is never removed, so a process may remember seeded workspaces (bounded). */
  private remember(ws: string): void {
    if (this.seeded.size >= 10_000) this.seeded.clear();
    this.seeded.add(ws);
  }
}

function ignoreConflict(err: unknown): void {
  if (err instanceof ApiError && err.type === 'validation.conflict') return;
  throw err;
}
