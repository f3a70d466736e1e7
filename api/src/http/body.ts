import type { IncomingMessage } from 'node:http';
import getRawBody from 'raw-body';
import { ApiError, jsonDepth, MAX_JSON_NESTING } from '@agentplane/core';

const tooLarge = (limit: number) =>
  new ApiError('validation.payload_too_large', `the request body exceeds the limit of ${limit} bytes`);

/**
 * Read a JSON body while it streams in, never buffering past `limit` bytes.
 * Returns undefined when no body was sent.
 */
export async function readJsonBody(req: IncomingMessage, limit: number): Promise<unknown> {
  const declared = req.headers['content-length'];
  if (declared !== undefined && Number(declared) > limit) {
    req.resume(); // drain without keeping it
    throw tooLarge(limit);
  }
  const chunked = req.headers['transfer-encoding'] !== undefined;
  if (!chunked && (declared === undefined || Number(declared) === 0)) return undefined;
  const type = req.headers['content-type'] ?? '';
  if (!/^application\/([a-z0-9.+-]*\+)?json\b/i.test(type)) {
    req.resume();
    throw new ApiError('validation.malformed', `request bodies must be application/json (got '${type || 'none'}')`);
  }
  // JSON text is UTF-8 (RFC 8259): a body declared as another charset would be read as what it is not.
  const charset = /;\s*charset\s*=\s*"?([^";\s]+)/i.exec(type)?.[1];
  if (charset !== undefined && !/^utf-?8$/i.test(charset)) {
    req.resume();
    throw new ApiError('validation.malformed', `request bodies are UTF-8 JSON (got charset '${charset}')`);
  }
  // A compressed body is not read: taken as it came, it would be refused as bad JSON or, worse, read as another.
  const encoding = req.headers['content-encoding'];
  if (encoding !== undefined && encoding.trim().toLowerCase() !== 'identity' && encoding.trim() !== '') {
    req.resume();
    throw new ApiError('validation.malformed', `Content-Encoding '${encoding}' is not accepted: send the body uncompressed`);
  }
  const whole = bufferedBody(req);
  if (whole !== undefined && whole.length > limit) throw tooLarge(limit);
  const text = utf8Text(whole !== undefined ? whole : await streamedBody(req, limit, declared));
  if (text.length === 0) return undefined;
  if (jsonDepth(text) > MAX_JSON_NESTING) throw new ApiError('validation.malformed', `the request body's JSON nests deeper than ${MAX_JSON_NESTING} levels`);
  let value: unknown;
  try {
    value = JSON.parse(text) as unknown;
  } catch (err) {
    throw new ApiError('validation.malformed', 'the request body is not valid JSON', { cause: err });
  }
  // A lone surrogate can only come in as a `\uD800`-style escape: only such a body is walked.
  if (SURROGATE_ESCAPE.test(text)) {
    const where = illFormedAt(value, 'body');
    if (where !== null) throw new ApiError('validation.malformed', `${where}: not well-formed Unicode (a lone surrogate)`);
  }
  return value;
}

const SURROGATE_ESCAPE = /\\u[dD][89a-fA-F]/;

/** Strict UTF-8: a byte sequence that is not UTF-8 throws instead of becoming U+FFFD; a leading byte order mark is dropped. */
const UTF8 = new TextDecoder('utf-8', { fatal: true });

/**
 * The body's text. JSON text is UTF-8 (RFC 8259): a body that is not is refused, never decoded
 * with replacement characters, which would store something other than what was sent (two
 * different names claiming one key), as a lone surrogate would (see `illFormedAt`).
 */
function utf8Text(bytes: Buffer): string {
  try {
    return UTF8.decode(bytes);
  } catch (err) {
    throw new ApiError('validation.malformed', 'the request body is not JSON text: it is not valid UTF-8', { cause: err });
  }
}
const wellFormed = (s: string): boolean => (s as string & { isWellFormed(): boolean }).isWellFormed();

/**
 * Where `value` holds a string (a value or a key) that is not well-formed UTF-16, or null. Such a
 * string cannot be stored as it is: Redis keeps UTF-8, where a lone surrogate becomes U+FFFD, so
 * two different names would claim one key and what is read back differs from what was sent.
 */
export function illFormedAt(value: unknown, path: string): string | null {
  if (typeof value === 'string') return wellFormed(value) ? null : path;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const at = illFormedAt(value[i], `${path}[${i}]`);
      if (at !== null) return at;
    }
    return null;
  }
  if (value !== null && typeof value === 'object') {
    for (const [k, v] of Object.entries(value)) {
      if (!wellFormed(k)) return `${path} key`;
      const at = illFormedAt(v, `${path}.${k}`);
      if (at !== null) return at;
    }
  }
  return null;
}

/** Whether `readJsonBody` failed because the body it read does not parse as JSON. */
export function isUnparseableJson(err: unknown): boolean {
  return err instanceof ApiError && err.cause instanceof SyntaxError;
}

async function streamedBody(req: IncomingMessage, limit: number, declared: string | undefined): Promise<Buffer> {
  try {
    return await getRawBody(req, { limit, length: declared });
  } catch (err) {
    const e = err as { type?: string };
    if (e.type === 'entity.too.large') throw tooLarge(limit);
    if (e.type === 'request.aborted') throw new ApiError('validation.malformed', 'the request body was cut short');
    throw new ApiError('validation.malformed', 'the request body could not be read');
  }
}

/**
 * The whole body when the request has been received in full and sits in the stream's buffer (a
 * small body comes in the same packets as its headers): taken at once instead of over the
 * stream's events, a few turns of the event loop later. Undefined otherwise (read it as a stream).
 */
function bufferedBody(req: IncomingMessage): Buffer | undefined {
  if (!req.complete || req.readableFlowing === true || req.readableEncoding !== null || req.readableLength === 0) return undefined;
  const chunks: Buffer[] = [];
  for (let c = req.read() as Buffer | null; c !== null; c = req.read() as Buffer | null) chunks.push(c);
  return chunks.length === 1 ? chunks[0] : Buffer.concat(chunks);
}

/** After this much more of a refused body, the connection is cut instead of read further. */
const DRAIN_CAP_BYTES = 16 * 1024 * 1024;

/**
 * Reads off (and drops) what is left of a request body that will not be used, so the client,
 * still sending, gets to read the error response. Past a cap the socket is closed.
 */
export function drainRequest(req: IncomingMessage): void {
  if (req.readableEnded || req.destroyed) return;
  let drained = 0;
  req.on('data', (chunk: Buffer) => {
    drained += chunk.length;
    if (drained > DRAIN_CAP_BYTES) req.destroy();
  });
  req.resume();
}
