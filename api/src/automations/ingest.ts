import { createHmac, timingSafeEqual } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import getRawBody from 'raw-body';
import { ApiError, crashPoint, ID_PREFIXES, sha256Hex, Type } from '@agentplane/core';
import { tags } from '@agentplane/store';
import type { UploadBody } from '../http/operation.js';
import type { FiringDoc } from './model.js';
import type { AutomationStore } from './store.js';

/** An Automation webhook delivery body is at most 1 MiB, enforced while it streams in. */
export const MAX_DELIVERY_BYTES = 1024 * 1024;

/** Standard Webhooks: a delivery's timestamp may be this far from now, either way. */
export const TOLERANCE_SECONDS = 5 * 60;

/** Reads the raw delivery as bytes (`{raw: Buffer}`): the signature covers the exact bytes, so nothing decodes them first. */
export const deliveryBody: UploadBody = {
  contentType: 'application/json',
  schema: Type.Unsafe<unknown>({ description: 'any JSON document, at most 1 MiB, 64 nesting levels and 100,000 nodes' }),
  async receive(stream: IncomingMessage): Promise<Record<string, unknown>> {
    const declared = stream.headers['content-length'];
    if (declared !== undefined && Number(declared) > MAX_DELIVERY_BYTES) {
      throw new ApiError('validation.payload_too_large', `the delivery body exceeds ${MAX_DELIVERY_BYTES} bytes`);
    }
    try {
      const raw = await getRawBody(stream, { limit: MAX_DELIVERY_BYTES, ...(declared !== undefined ? { length: declared } : {}) });
      return { raw };
    } catch (err) {
      const e = err as { type?: string };
      if (e.type === 'entity.too.large') throw new ApiError('validation.payload_too_large', `the delivery body exceeds ${MAX_DELIVERY_BYTES} bytes`);
      throw new ApiError('validation.malformed', 'the delivery body could not be read');
    }
  },
  fingerprint: (body) => ({ sha256: Buffer.isBuffer(body.raw) ? sha256Hex(body.raw) : null }),
  discard: async () => undefined,
};


/**
 * Standard Webhooks verification: HMAC-SHA256 over `<webhook-id>.<webhook-timestamp>.` and the
 * body's exact bytes with any of `secrets` (the current one, and the previous one during a
 * rotation's overlap); the timestamp must be within 5 minutes of now. 401 `auth.invalid_key`
 * otherwise. Only the signature is checked here: the caller decodes and parses the body (a signed
 * body that is not JSON is a 400).
 */
export function verifyDelivery(raw: Buffer, headers: Readonly<Record<string, string | undefined>>, secrets: readonly string[], nowMs = Date.now()): void {
  const id = headers['webhook-id'];
  const ts = headers['webhook-timestamp'];
  const sig = headers['webhook-signature'];
  if (!id || !ts || !sig) throw new ApiError('auth.invalid_key', 'a delivery needs the webhook-id, webhook-timestamp and webhook-signature headers');
  if (id.length > 255) throw new ApiError('validation.malformed', 'webhook-id is longer than 255 characters');
  const seconds = /^\d{1,12}$/.test(ts) ? Number(ts) : NaN;
  if (!Number.isSafeInteger(seconds)) throw new ApiError('auth.invalid_key', 'the delivery\'s signature was not accepted: webhook-timestamp is not Unix seconds');
  const now = Math.floor(nowMs / 1000);
  if (now - seconds > TOLERANCE_SECONDS) throw new ApiError('auth.invalid_key', 'the delivery\'s signature was not accepted: its timestamp is too old');
  if (seconds - now > TOLERANCE_SECONDS) throw new ApiError('auth.invalid_key', 'the delivery\'s signature was not accepted: its timestamp is too new');
  const offered = sig.split(' ').flatMap((s) => {
    const [version, value] = s.split(',');
    return version === 'v1' && value ? [Buffer.from(value, 'base64')] : [];
  });
  for (const secret of secrets) {
    const key = Buffer.from(secret.startsWith('whsec_') ? secret.slice('whsec_'.length) : secret, 'base64');
    const expected = createHmac('sha256', key).update(`${id}.${ts}.`).update(raw).digest();
    if (offered.some((o) => o.length === expected.length && timingSafeEqual(o, expected))) return;
  }
  throw new ApiError('auth.invalid_key', `the delivery's signature was not accepted: ${secrets.length === 0 ? 'no signing secret' : 'no matching signature'}`);
}

/**
 * The verified body as text: UTF-8, a leading byte order mark dropped (RFC 8259 lets a parser
 * ignore one). Bytes that are not UTF-8 are not JSON: 400 `validation.malformed`.
 */
export function deliveryText(raw: Buffer): string {
  try {
    return new TextDecoder('utf-8', { fatal: true, ignoreBOM: false }).decode(raw);
  } catch {
    throw new ApiError('validation.malformed', 'the delivery body is not UTF-8');
  }
}

/**
 * The id of the receipt of a delivery: the same for every request carrying its `webhook-id`, so
 * however many of them fire (a retry, two at once, one after the claim expired) they write one
 * receipt (it is created only where none exists).
 */
export function deliveryFiringId(automationId: string, deliveryId: string): string {
  return `${ID_PREFIXES.automationFiring}_${sha256Hex(`${automationId}\0webhook\0${deliveryId}`).slice(0, 32)}`;
}

/**
 * Deduplicates a verified delivery on its `webhook-id` and fires it: the id is claimed naming the
 * receipt, so a repeat answers the receipt the first delivery made (`duplicate`). A claim without
 * its receipt (its request is still firing, or its api died before the receipt was written) is
 * completed by the repeat: it fires under the id the claim names, and of two requests firing one
 * id only one writes the receipt (the other answers it). When firing fails, the id is released
 * only if no receipt was written: a receipt that exists runs (the outbox sweep queues its work),
 * so the id keeps naming it and a retry answers it instead of firing a second time.
 */
export async function acceptDelivery(
  store: AutomationStore, ws: string, automationId: string, deliveryId: string, fire: (firingId: string) => Promise<FiringDoc>,
): Promise<{ firing: FiringDoc; duplicate: boolean }> {
  const derived = deliveryFiringId(automationId, deliveryId);
  // A claim made before receipt ids were derived from the webhook-id names a random one.
  const firingId = (await store.claimDelivery(ws, automationId, deliveryId, derived)) ?? derived;
  crashPoint('automation-delivery-claimed');
  const earlier = await store.docs.get<FiringDoc>(tags.workspace(ws), firingId);
  if (earlier) return { firing: earlier, duplicate: true };
  try {
    return { firing: await fire(firingId), duplicate: false };
  } catch (err) {
    // When the receipt cannot be looked for, the id stays claimed (it expires with the replay window).
    const written = await store.docs.get<FiringDoc>(tags.workspace(ws), firingId).then((f) => f !== null, () => true);
    if (!written) await store.forgetDelivery(ws, automationId, deliveryId);
    throw err;
  }
}
