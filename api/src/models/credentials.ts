import { ApiError, crashPoint, newId, nowIso, type Logger, type SecretBox, staleOrAhead } from '@agentplane/core';
import { DOC_SWAP_LUA, docSwapResult, keys, LuaScript, tags, type DocumentStore, type ListPage, type Redis } from '@agentplane/store';
import { KEYLESS_PROVIDERS, ProviderError, type ProviderAdapter, type ProviderKey } from '@agentplane/models';
import { createClaimed, releaseOrphanClaim } from '@agentplane/domain';
import { credentialHead, type ModelCredentialDoc, type ModelCredentialHead } from './model.js';

const COLLECTION = 'model_credentials';

/**
 * Rotates in one step: the document (KEYS[1]) is written with its new generation only if its
 * version is still ARGV[1] (ARGV[2] its JSON), and in the same script the new generation's sealed
 * secret (KEYS[2], ARGV[3]) is stored and the old generation's (KEYS[3]) erased. Answers as `doc_swap`.
 */
const ROTATE = new LuaScript('mcred_rotate', `${DOC_SWAP_LUA}
local r = doc_swap(KEYS[1], ARGV[1], ARGV[2])
if r[1] == 1 then
  redis.call('SET', KEYS[2], ARGV[3])
  redis.call('DEL', KEYS[3])
end
return r`);

/**
 * Revokes in one step: the document (KEYS[1]) is written revoked only if its version is still
 * ARGV[1] (ARGV[2] its JSON), and in the same script the sealed secret of its active generation
 * (KEYS[2]) is erased and its key's claim (KEYS[3], field ARGV[3]) released while this credential
 * (ARGV[4]) holds it, so a revoked credential never keeps its secret or its key. Answers as `doc_swap`.
 */
const REVOKE = new LuaScript('mcred_revoke', `${DOC_SWAP_LUA}
local r = doc_swap(KEYS[1], ARGV[1], ARGV[2])
if r[1] == 1 then
  redis.call('DEL', KEYS[2])
  if redis.call('HGET', KEYS[3], ARGV[3]) == ARGV[4] then redis.call('HDEL', KEYS[3], ARGV[3]) end
end
return r`);

export interface CreateModelCredentialInput {
  key: string;
  display_name?: string | undefined;
  provider_key: ProviderKey;
  base_url?: string | null | undefined;
  secret?: string | undefined;
}

/** A credential ready for one provider call: the secret is decrypted in memory only. */
export interface UnsealedCredential {
  doc: ModelCredentialDoc;
  secret: string | null;
}

/**
 * ModelCredentials in custody `workspace_vault`: the provider secret is sealed with the
 * platform master key (AES-256-GCM, bound to workspace, credential and generation) in its own
 * Redis key, never in the document, never returned, logged or sent to a runner.
 */
export class ModelCredentialService {
  constructor(
    private readonly docs: DocumentStore,
    private readonly redis: Redis,
    private readonly box: SecretBox,
    private readonly adapters: Record<ProviderKey, ProviderAdapter>,
    private readonly log: Logger,
  ) {}

  private secretKey(ws: string, id: string, generation: number): string {
    return keys.scoped(tags.workspace(ws), `mcred_secret:${id}:${generation}`);
  }

  private aad(ws: string, id: string, generation: number): string {
    return `model_credential\0${ws}\0${id}\0${generation}`;
  }

  private checkInput(provider: ProviderKey, baseUrl: string | null, secret: string | undefined): void {
    if (baseUrl !== null) {
      let u: URL;
      try {
        u = new URL(baseUrl);
      } catch {
        throw new ApiError('validation.malformed', 'body.base_url: is not a URL');
      }
      if (u.protocol !== 'http:' && u.protocol !== 'https:') throw new ApiError('validation.malformed', 'body.base_url: must be http or https');
      if (u.username || u.password) throw new ApiError('validation.malformed', 'body.base_url: must not carry credentials; use secret');
      // Request paths are appended to the base URL: a query or fragment would swallow them.
      if (u.search !== '' || u.hash !== '' || /[?#]/.test(baseUrl)) throw new ApiError('validation.malformed', 'body.base_url: must not carry a query or a fragment');
    }
    if (provider === 'scripted' && (secret !== undefined || baseUrl !== null)) {
      throw new ApiError('validation.malformed', 'the scripted provider takes neither a secret nor a base_url');
    }
    if (provider === 'anthropic' && secret === undefined) throw new ApiError('validation.malformed', 'body.secret: the anthropic provider needs an API key');
    if (provider === 'openai' && baseUrl === null && secret === undefined) {
      throw new ApiError('validation.malformed', 'body.secret: the public OpenAI endpoint needs an API key (keyless servers need a base_url)');
    }
  }

  async create(ws: string, input: CreateModelCredentialInput, id = newId('modelCredential')): Promise<ModelCredentialHead> {
    return credentialHead(await this.createDoc(ws, input, id));
  }

  /** `create`, answering the document written (its head is what the API shows). */
  async createDoc(ws: string, input: CreateModelCredentialInput, id: string): Promise<ModelCredentialDoc> {
    const baseUrl = input.base_url ?? null;
    this.checkInput(input.provider_key, baseUrl, input.secret);
    const tag = tags.workspace(ws);
    const now = nowIso();
    const doc: ModelCredentialDoc = {
      id, workspace_id: ws, key: input.key, display_name: input.display_name ?? input.key,
      provider_key: input.provider_key, base_url: baseUrl, custody_policy: 'workspace_vault', status: 'active',
      health_status: KEYLESS_PROVIDERS.has(input.provider_key) ? 'healthy' : 'unknown', active_generation_number: 1,
      has_secret: input.secret !== undefined, revoked_at: null, version: 1, created_at: now, updated_at: now,
    };
    const unique = keys.unique(tag, COLLECTION);
    // A key held by no credential (an older version wrote them apart) is released and claimed here.
    const created = await createClaimed(this.redis, {
      unique, field: doc.key, id: doc.id, docKey: keys.doc(tag, doc.id), json: JSON.stringify(doc), index: keys.index(tag, COLLECTION), score: Date.parse(now),
      ...(input.secret !== undefined ? { extra: { key: this.secretKey(ws, doc.id, 1), value: this.box.seal(input.secret, this.aad(ws, doc.id, 1)) } } : {}),
    }, () => releaseOrphanClaim(this.redis, unique, doc.key, (owner) => keys.doc(tag, owner)));
    if (!created) {
      throw new ApiError('validation.conflict', `a model credential with key '${doc.key}' exists in this workspace`);
    }
    crashPoint('model-credential-created');
    return doc;
  }

  /** The credential stored under `id` in the Workspace, whatever its status; null when there is none. */
  find(ws: string, id: string): Promise<ModelCredentialDoc | null> {
    return this.docs.get<ModelCredentialDoc>(tags.workspace(ws), id);
  }

  async getDoc(ws: string, id: string): Promise<ModelCredentialDoc> {
    const d = await this.find(ws, id);
    if (!d || d.workspace_id !== ws) throw new ApiError('validation.not_found', 'model credential not found');
    return d;
  }

  async get(ws: string, id: string): Promise<ModelCredentialHead> {
    return credentialHead(await this.getDoc(ws, id));
  }

  /** The active credential holding `key`, or null. */
  async byKey(ws: string, key: string): Promise<ModelCredentialDoc | null> {
    const id = await this.redis.hget(keys.unique(tags.workspace(ws), COLLECTION), key);
    if (!id) return null;
    const d = await this.docs.get<ModelCredentialDoc>(tags.workspace(ws), id);
    return d && d.status === 'active' ? d : null;
  }

  async list(ws: string, opts: { limit: number; page?: string | undefined; key?: string | undefined }): Promise<ListPage<ModelCredentialHead>> {
    const want = opts.key;
    const page = await this.docs.list<ModelCredentialDoc>(
      tags.workspace(ws), COLLECTION, { limit: opts.limit, page: opts.page, order: 'asc' },
      want === undefined ? undefined : (d) => d.key === want,
    );
    return { data: page.data.map(credentialHead), next_page: page.next_page };
  }

  /** New generation: the new secret is stored, the generation moves and the old secret is erased, in one script. */
  async rotate(ws: string, id: string, secret: string, expectedGeneration?: number): Promise<ModelCredentialHead> {
    const cur = await this.getDoc(ws, id);
    if (cur.provider_key === 'scripted') throw new ApiError('runtime.invalid_transition', 'a scripted credential has no secret to rotate');
    if (cur.status === 'revoked') throw new ApiError('runtime.invalid_transition', 'a revoked credential cannot be rotated');
    if (expectedGeneration !== undefined && cur.active_generation_number !== expectedGeneration) {
      throw new ApiError('validation.conflict', `generation ${expectedGeneration} ${staleOrAhead(expectedGeneration, cur.active_generation_number)}; the active generation is ${cur.active_generation_number}`);
    }
    const gen = cur.active_generation_number + 1;
    const tag = tags.workspace(ws);
    const sealed = this.box.seal(secret, this.aad(ws, id, gen));
    // The new generation's secret, the document naming it and the old secret's erasure are one
    // script fenced on the document's version: of two concurrent rotations one wins, and no crash
    // leaves a secret that no generation names.
    const next = await this.docs.update<ModelCredentialDoc>(tag, id, (d) => {
      if (d.status === 'revoked') throw new ApiError('runtime.invalid_transition', 'a revoked credential cannot be rotated');
      if (d.active_generation_number !== cur.active_generation_number) throw new ApiError('validation.conflict', 'the credential was rotated concurrently');
      return { ...d, active_generation_number: gen, has_secret: true, health_status: 'unknown' };
    }, {
      notFound: 'model credential',
      write: async (doc, expected) => docSwapResult((await ROTATE.run(this.redis,
        [keys.doc(tag, id), this.secretKey(ws, id, gen), this.secretKey(ws, id, cur.active_generation_number)],
        [String(expected), JSON.stringify(doc), sealed])) as unknown[]).outcome,
    });
    crashPoint('model-credential-rotated');
    return credentialHead(next);
  }

  /**
   * Irreversible: the secret is erased and the key is free for a new credential, with the
   * revocation itself (one script). Retry-safe.
   */
  async revoke(ws: string, id: string, expectedVersion?: number): Promise<ModelCredentialHead> {
    const tag = tags.workspace(ws);
    const next = await this.docs.update<ModelCredentialDoc>(
      tag, id,
      (d) => (d.status === 'revoked' ? null : { ...d, status: 'revoked', revoked_at: nowIso(), has_secret: false }),
      {
        expectedVersion, notFound: 'model credential',
        write: async (doc, expected) => docSwapResult((await REVOKE.run(this.redis,
          [keys.doc(tag, id), this.secretKey(ws, id, doc.active_generation_number), keys.unique(tag, COLLECTION)],
          [String(expected), JSON.stringify(doc), doc.key, id])) as unknown[]).outcome,
      },
    );
    crashPoint('model-credential-revoked');
    // A credential revoked before (a retry): what an older version's revoke may have left goes now.
    await this.redis.del(this.secretKey(ws, id, next.active_generation_number));
    const holder = await this.redis.hget(keys.unique(tag, COLLECTION), next.key);
    if (holder === id) await this.redis.hdel(keys.unique(tag, COLLECTION), next.key);
    return credentialHead(next);
  }

  /** Decrypt for one call. Callers keep the result in a local variable for the call's duration only. */
  async unseal(doc: ModelCredentialDoc): Promise<UnsealedCredential> {
    let d = doc;
    for (let attempt = 0; attempt < 3; attempt++) {
      if (!d.has_secret) {
        // No secret whose erasure would show a revocation: the live document says whether it still holds.
        const live = await this.docs.get<ModelCredentialDoc>(tags.workspace(d.workspace_id), d.id);
        if (!live || live.status !== 'active') throw new ApiError('model.no_eligible_model', 'the model credential was revoked during the call; no eligible model remains for this step');
        if (!live.has_secret) return { doc: live, secret: null };
        // Given a secret since `doc` was read (rotated): the sealed secret of its live generation.
        d = live;
        continue;
      }
      const sealed = await this.redis.get(this.secretKey(d.workspace_id, d.id, d.active_generation_number));
      if (sealed !== null) return { doc: d, secret: this.box.open(sealed, this.aad(d.workspace_id, d.id, d.active_generation_number)) };
      // Rotated (or revoked) since `doc` was read: use the live generation.
      const live = await this.docs.get<ModelCredentialDoc>(tags.workspace(d.workspace_id), d.id);
      if (!live || live.status !== 'active') throw new ApiError('model.no_eligible_model', 'the model credential was revoked during the call; no eligible model remains for this step');
      d = live;
    }
    throw new ApiError('validation.conflict', 'the model credential is being rotated; retry');
  }

  /** Probe the provider with the credential (list models) and record `health_status`. */
  async healthCheck(ws: string, id: string, signal: AbortSignal): Promise<ModelCredentialHead> {
    const doc = await this.getDoc(ws, id);
    if (doc.status === 'revoked') throw new ApiError('runtime.invalid_transition', 'a revoked credential cannot be checked');
    let health: ModelCredentialDoc['health_status'] = 'healthy';
    try {
      const { secret } = await this.unseal(doc);
      await this.adapters[doc.provider_key].probe({ baseUrl: doc.base_url, apiKey: secret }, signal);
    } catch (err) {
      if (!ProviderError.is(err)) throw err;
      health = 'unhealthy';
      this.log.info({ model_credential_id: id, provider: doc.provider_key, failure: err.kind, status: err.status }, 'model credential health check failed');
    }
    const next = await this.docs.update<ModelCredentialDoc>(tags.workspace(ws), id, (d) => (d.health_status === health ? null : { ...d, health_status: health }), { notFound: 'model credential' });
    return credentialHead(next);
  }

  /**
   * Record what a real call showed (auth failures make a credential unhealthy): about the
   * generation `doc` names, so a call made with a secret rotated out since says nothing of the new one.
   */
  async markHealth(doc: ModelCredentialDoc, health: ModelCredentialDoc['health_status']): Promise<void> {
    await this.docs.update<ModelCredentialDoc>(tags.workspace(doc.workspace_id), doc.id,
      (d) => (d.health_status === health || d.status !== 'active' || d.active_generation_number !== doc.active_generation_number ? null : { ...d, health_status: health })).catch(() => undefined);
  }
}
