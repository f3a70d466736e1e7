import { createHmac, randomBytes } from 'node:crypto';
import { ApiError, canonicalJson, ID_PREFIXES, sha256Hex, type IdKind, type SecretBox } from '@agentplane/core';
import { keys, LuaScript, type KeyedWrite, type Redis, type Tag } from '@agentplane/store';
import type { JsonResult } from './operation.js';

/** `Idempotency-Key`: 1 to 255 printable, non-space ASCII characters. */
export const IDEMPOTENCY_KEY_RE = /^[\x21-\x7e]{1,255}$/;

/** A pending record that outlives its owner (a crashed process) frees the key after this long. */
const PENDING_TTL_MS = 60_000;

const BEGIN = new LuaScript(
  'idem_begin',
  `
local cur = redis.call('GET', KEYS[1])
if not cur then
  redis.call('SET', KEYS[1], cjson.encode({state = 'pending', fp = ARGV[1], owner = ARGV[2]}), 'PX', ARGV[3])
  return {'new'}
end
local rec = cjson.decode(cur)
if rec.fp ~= ARGV[1] then return {'mismatch'} end
-- This very begin again (the client re-sent it after a dropped connection, its first answer
-- lost): its own record, not another request in flight.
if rec.state == 'pending' and rec.owner == ARGV[2] then return {'new'} end
if rec.state == 'pending' then return {'in_flight'} end
return {'done', cur}`,
);

const FINISH = new LuaScript(
  'idem_finish',
  `
local cur = redis.call('GET', KEYS[1])
if not cur then return 0 end
local rec = cjson.decode(cur)
if rec.state ~= 'pending' or rec.owner ~= ARGV[1] then return 0 end
if ARGV[2] == '' then redis.call('DEL', KEYS[1]) else redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3]) end
return 1`,
);

interface DoneRecord {
  state: 'done';
  fp: string;
  status: number;
  headers: Record<string, string>;
  /** JSON text of the body, or a sealed envelope for sensitive operations. */
  body: string;
  sealed: boolean;
}

export type IdempotencyBegin =
  | { kind: 'new'; owner: string; recordKey: string; fingerprint: string }
  | { kind: 'replay'; result: JsonResult };

/**
 * What a keyed create makes its resources from, so that a retry whose first attempt died after
 * writing (its key's pending record gone with it) finds what that attempt wrote instead of
 * making it again (docs/API.md, "Idempotency").
 */
export interface KeyedRequest {
  /**
   * The id of kind `kind` that this request's key derives: the same for every attempt under the
   * key (its Workspace, operation and key), unguessable without the server's secret and telling
   * nothing of the key. `name` tells several ids of one kind apart.
   */
  id(kind: IdKind, name?: string): string;
  /** The request's fingerprint: a resource found under a derived id answers only the same request. */
  fingerprint: string;
  /** How long the key's record is kept (ms): a resource under a derived id older than that was made by an earlier use of the key. */
  keptMs: number;
  /**
   * This request as a write recorded once (`KeyedWrites`, for the creates whose retry cannot find
   * its first attempt's result under a derived id: a File, a revision): its token is the derived
   * id of kind `kind` named by the request's fingerprint, so two requests never share one.
   */
  write(kind: IdKind): KeyedWrite;
}

/**
 * A request's fingerprint: its operation and parts (path, query, body, credential). Keyed with
 * `secret` (`IdempotencyStore.fingerprint`) when stored: a body may carry a secret (a vault
 * value), and a bare digest of it kept in Redis would let a reader test guesses against it.
 */
export function fingerprint(operationId: string, parts: unknown, secret?: Buffer): string {
  const text = `${operationId}\0${canonicalJson(parts)}`;
  return secret ? createHmac('sha256', secret).update(text).digest('hex') : sha256Hex(text);
}

/**
 * Stripe-style idempotency: the first response is stored and replayed for the same key and
 * request; another request under that key, or one while the first is in flight, is a 409.
 * Errors raised before the handler (auth, validation) never reach here, so they are not stored.
 */
export class IdempotencyStore {
  /** The secret derived ids are made under (from the master key, for this use only). */
  private readonly idSecret: Buffer;
  /** The secret stored fingerprints are keyed with (from the master key, for this use only). */
  private readonly fpSecret: Buffer;

  constructor(
    private readonly redis: Redis,
    private readonly box: SecretBox,
    private readonly ttlSeconds: number,
    masterKey: Buffer,
  ) {
    this.idSecret = createHmac('sha256', masterKey).update('agentplane.idempotency.derived-ids.v1').digest();
    this.fpSecret = createHmac('sha256', masterKey).update('agentplane.idempotency.fingerprints.v1').digest();
  }

  /** A request's fingerprint as stored: keyed, so that it tells nothing of the body it was made from. */
  fingerprint(operationId: string, parts: unknown): string {
    return fingerprint(operationId, parts, this.fpSecret);
  }

  /** The derived ids and fingerprint of a request begun under `idemKey` in `tag` (see `KeyedRequest`). */
  keyed(tag: Tag, operationId: string, idemKey: string, fp: string): KeyedRequest {
    const keyDigest = sha256Hex(idemKey);
    const id = (kind: IdKind, name = ''): string => {
      const mac = createHmac('sha256', this.idSecret).update(canonicalJson([tag, operationId, keyDigest, kind, name])).digest('hex');
      return `${ID_PREFIXES[kind]}_${mac.slice(0, 32)}`;
    };
    const keptMs = this.ttlSeconds * 1000;
    return { id, fingerprint: fp, keptMs, write: (kind) => ({ token: id(kind, fp), keptMs }) };
  }

  /**
   * `owner`: this begin's own token (new per call). The script sent again with it (ioredis
   * re-sends a command whose answer a dropped connection cut off) finds its own pending record
   * and proceeds, where another request's begin is refused as in flight.
   */
  async begin(tag: Tag, idemKey: string, fp: string, owner = randomBytes(8).toString('hex')): Promise<IdempotencyBegin> {
    const recordKey = keys.idempotency(tag, sha256Hex(idemKey));
    const r = (await BEGIN.run(this.redis, [recordKey], [fp, owner, PENDING_TTL_MS])) as [string, string?];
    switch (r[0]) {
      case 'new':
        return { kind: 'new', owner, recordKey, fingerprint: fp };
      case 'mismatch':
        throw new ApiError('idempotency.conflict', 'this Idempotency-Key was already used with a different request');
      case 'in_flight':
        throw new ApiError('idempotency.conflict', 'a request with this Idempotency-Key is still in progress');
      default: {
        const rec = JSON.parse(r[1] as string) as DoneRecord;
        const text = rec.sealed ? this.box.open(rec.body, recordKey) : rec.body;
        return {
          kind: 'replay',
          result: { status: rec.status, body: JSON.parse(text) as unknown, headers: { ...rec.headers, 'Idempotent-Replayed': 'true' } },
        };
      }
    }
  }

  async complete(begin: Extract<IdempotencyBegin, { kind: 'new' }>, result: JsonResult, sensitive: boolean): Promise<void> {
    const text = JSON.stringify(result.body ?? null);
    const rec: DoneRecord = {
      state: 'done',
      fp: begin.fingerprint,
      status: result.status,
      headers: result.headers ?? {},
      body: sensitive ? this.box.seal(text, begin.recordKey) : text,
      sealed: sensitive,
    };
    await FINISH.run(this.redis, [begin.recordKey], [begin.owner, JSON.stringify(rec), this.ttlSeconds * 1000]);
  }

  /** The handler failed unexpectedly: free the key so the client can retry. */
  async abandon(begin: Extract<IdempotencyBegin, { kind: 'new' }>): Promise<void> {
    await FINISH.run(this.redis, [begin.recordKey], [begin.owner, '', 0]);
  }
}
