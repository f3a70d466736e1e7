import { randomBytes } from 'node:crypto';
import { DOC_SWAP_LUA, docSwapResult, keys, LuaScript, type DocumentStore, type Redis, type StoredDoc, type Tag } from '@agentplane/store';

/** A Standard Webhooks signing secret: `whsec_` + base64 of 32 random bytes. */
export function newSigningSecret(): string {
  return `whsec_${randomBytes(32).toString('base64')}`;
}

/**
 * The signing secrets of one webhook-triggered Automation or outbound endpoint, sealed at rest:
 * the current one, and the previous one until `previous_expires_ms` (a rotation's overlap).
 */
export interface SecretRecord {
  generation: number;
  current: string;
  previous: string | null;
  previous_expires_ms: number;
}

/**
 * A rotation's one write: the document's compare-and-swap and the new secret record together,
 * and only while the stored record is still the generation the rotation was computed from.
 * KEYS: the document, the secret record (same slot). ARGV: expected version, document JSON,
 * expected generation (0: none), record JSON. Answers as `doc_swap` (a record that moved on
 * answers the document as stale).
 */
const ROTATE = new LuaScript('signing_secret_rotate', `${DOC_SWAP_LUA}
local raw = redis.call('GET', KEYS[2])
local gen = 0
if raw then gen = tonumber(cjson.decode(raw)['generation']) or 0 end
if tostring(gen) ~= ARGV[3] then
  local cur = redis.call('GET', KEYS[1])
  if not cur then return {-1} end
  return {0, cur}
end
local r = doc_swap(KEYS[1], ARGV[1], ARGV[2])
if r[1] == 1 then redis.call('SET', KEYS[2], ARGV[4]) end
return r`);

export interface Rotation<T> {
  redis: Redis;
  docs: DocumentStore;
  tag: Tag;
  id: string;
  /** The record's key (in the document's slot). */
  secretKey: string;
  seal: (secret: string) => string;
  expectedVersion: number;
  overlapMs: number;
  notFound: string;
  /** The document with the rotation's generation and overlap end (may throw to refuse). */
  apply: (doc: T, r: { generation: number; previousExpiresMs: number }) => T;
}

/**
 * A new current secret, returned once; the old one keeps verifying for `overlapMs`. The secret
 * record and the document (its generation and overlap end) are written by one script under the
 * document's compare-and-swap at `expectedVersion`: of two rotations at the same version one
 * answers and the other is 409 `validation.conflict` having changed nothing, so the secret a
 * rotation answers is always the one in force.
 */
export async function rotateSigningSecret<T extends StoredDoc>(o: Rotation<T>): Promise<{ doc: T; secret: string }> {
  const raw = await o.redis.get(o.secretKey);
  const old = raw ? (JSON.parse(raw) as SecretRecord) : null;
  const secret = newSigningSecret();
  const previousExpiresMs = old && o.overlapMs > 0 ? Date.now() + o.overlapMs : 0;
  const generation = (old?.generation ?? 0) + 1;
  const record: SecretRecord = { generation, current: o.seal(secret), previous: old && o.overlapMs > 0 ? old.current : null, previous_expires_ms: previousExpiresMs };
  const doc = await o.docs.update<T>(o.tag, o.id, (cur) => o.apply(cur, { generation, previousExpiresMs }), {
    expectedVersion: o.expectedVersion,
    notFound: o.notFound,
    write: async (next, expected) => docSwapResult((await ROTATE.run(o.redis, [keys.doc(o.tag, o.id), o.secretKey], [
      String(expected), JSON.stringify(next), String(old?.generation ?? 0), JSON.stringify(record),
    ])) as unknown[]).outcome,
  });
  return { doc, secret };
}
