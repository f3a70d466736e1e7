import type { IncomingMessage } from 'node:http';
import getRawBody from 'raw-body';
import { Webhook } from 'standardwebhooks';
import { ApiError, Type } from '@agentplane/core';
import type { UploadBody } from '../http/operation.js';

/** An Automation webhook delivery body is at most 1 MiB, enforced while it streams in. */
export const MAX_DELIVERY_BYTES = 1024 * 1024;

/** Reads the raw delivery (the signature covers the exact bytes). */
export const deliveryBody: UploadBody = {
  contentType: 'application/json',
  schema: Type.Unsafe<unknown>({ description: 'any JSON document, at most 1 MiB, 64 nesting levels and 100,000 nodes' }),
  async receive(stream: IncomingMessage): Promise<Record<string, unknown>> {
    const declared = stream.headers['content-length'];
    if (declared !== undefined && Number(declared) > MAX_DELIVERY_BYTES) {
      throw new ApiError('validation.payload_too_large', `the delivery body exceeds ${MAX_DELIVERY_BYTES} bytes`);
    }
    try {
      const raw = await getRawBody(stream, { limit: MAX_DELIVERY_BYTES, encoding: 'utf8', ...(declared !== undefined ? { length: declared } : {}) });
      return { raw };
    } catch (err) {
      const e = err as { type?: string };
      if (e.type === 'entity.too.large') throw new ApiError('validation.payload_too_large', `the delivery body exceeds ${MAX_DELIVERY_BYTES} bytes`);
      throw new ApiError('validation.malformed', 'the delivery body could not be read');
    }
  },
  fingerprint: (body) => body,
  discard: async () => undefined,
};


/**
 * Standard Webhooks verification: HMAC-SHA256 over `<webhook-id>.<webhook-timestamp>.<body>`
 * with any of `secrets` (the current one, and the previous one during a rotation's overlap);
 * the timestamp must be within 5 minutes of now. 401 `auth.invalid_key` otherwise. Only the
 * signature is checked here: the caller parses the body (a signed body that is not JSON is a 400).
 */
export function verifyDelivery(raw: string, headers: Readonly<Record<string, string | undefined>>, secrets: readonly string[]): void {
  const id = headers['webhook-id'];
  const ts = headers['webhook-timestamp'];
  const sig = headers['webhook-signature'];
  if (!id || !ts || !sig) throw new ApiError('auth.invalid_key', 'a delivery needs the webhook-id, webhook-timestamp and webhook-signature headers');
  if (id.length > 255) throw new ApiError('validation.malformed', 'webhook-id is longer than 255 characters');
  let last = 'no signing secret';
  for (const secret of secrets) {
    try {
      new Webhook(secret).verify(raw, { 'webhook-id': id, 'webhook-timestamp': ts, 'webhook-signature': sig });
      return;
    } catch (err) {
      // The library parses the body once the signature matches: a body that is not JSON is the
      // caller's signed mistake (400 from the caller's parse), not a signature refused.
      if (err instanceof SyntaxError) return;
      last = err instanceof Error ? err.message : String(err);
      if (/timestamp/i.test(last)) break;
    }
  }
  throw new ApiError('auth.invalid_key', `the delivery's signature was not accepted: ${last}`);
}
