/**
 * Provider failures, classified once so the gateway can decide between "try the next
 * candidate" and "give up". Messages never carry the provider secret or the request body.
 */
export type ProviderErrorKind =
  /** HTTP 429: the provider throttled us. */
  | 'rate_limited'
  /** HTTP 5xx / 529 / 408, or a provider `error` event such as `overloaded_error` mid-stream. */
  | 'server'
  /** No response, or no chunk, within the configured time. */
  | 'timeout'
  /** Connection refused/reset, DNS failure. */
  | 'network'
  /** HTTP 401/403: the credential is wrong or lacks access. */
  | 'auth'
  /** HTTP 400/404/413/422 or a response we cannot parse. */
  | 'bad_request'
  /** The caller aborted the step. */
  | 'canceled';

const RETRYABLE: ReadonlySet<ProviderErrorKind> = new Set(['rate_limited', 'server', 'timeout', 'network']);

export class ProviderError extends Error {
  readonly kind: ProviderErrorKind;
  readonly status: number | null;
  /** From `retry-after` / `retry-after-ms`, when the provider sent one. */
  readonly retryAfterSeconds: number | null;

  constructor(kind: ProviderErrorKind, message: string, options: { status?: number | null; retryAfterSeconds?: number | null } = {}) {
    super(message);
    this.name = 'ProviderError';
    this.kind = kind;
    this.status = options.status ?? null;
    this.retryAfterSeconds = options.retryAfterSeconds ?? null;
  }

  /** Retryable failures make the gateway fall back to the next candidate. */
  get retryable(): boolean {
    return RETRYABLE.has(this.kind);
  }

  static is(value: unknown): value is ProviderError {
    return value instanceof ProviderError;
  }
}

/** `retry-after-ms` (milliseconds), else `retry-after` (seconds or an HTTP date). */
export function parseRetryAfter(headers: Headers, now = Date.now()): number | null {
  const ms = headers.get('retry-after-ms');
  if (ms !== null && /^\d+(\.\d+)?$/.test(ms.trim())) return Math.max(0, Number(ms) / 1000);
  const raw = headers.get('retry-after');
  if (raw === null) return null;
  const v = raw.trim();
  if (/^\d+(\.\d+)?$/.test(v)) return Number(v);
  const at = Date.parse(v);
  return Number.isNaN(at) ? null : Math.max(0, Math.ceil((at - now) / 1000));
}

/** Classify a non-2xx HTTP response. The body excerpt is the provider's own message, trimmed. */
export function httpError(provider: string, status: number, headers: Headers, bodyText: string): ProviderError {
  const detail = providerMessage(bodyText);
  const msg = `${provider} returned HTTP ${status}${detail ? `: ${detail}` : ''}`;
  if (status === 429) return new ProviderError('rate_limited', msg, { status, retryAfterSeconds: parseRetryAfter(headers) });
  if (status === 401 || status === 403) return new ProviderError('auth', msg, { status });
  if (status === 408) return new ProviderError('timeout', msg, { status });
  if (status >= 500) return new ProviderError('server', msg, { status, retryAfterSeconds: parseRetryAfter(headers) });
  return new ProviderError('bad_request', msg, { status });
}

function providerMessage(bodyText: string): string {
  try {
    const parsed = JSON.parse(bodyText) as { error?: { message?: unknown } | string; message?: unknown };
    const m = typeof parsed.error === 'string' ? parsed.error : parsed.error?.message ?? parsed.message;
    if (typeof m === 'string') return m.slice(0, 300);
  } catch {
    // not JSON
  }
  return bodyText.trim().slice(0, 200);
}
