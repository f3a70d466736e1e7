/**
 * The one error type of the platform. Every failure that reaches a client is an
 * ApiError; its `type` decides the HTTP status and the documentation anchor.
 */
export const ERROR_STATUS = {
  'validation.malformed': 400,
  'auth.invalid_key': 401,
  'billing.usage_limit_reached': 402,
  'billing.payment_required': 402,
  'auth.disabled_tenancy': 403,
  /** The caller's role or audience does not admit the operation (designed; docs/API.md). */
  'auth.permission_denied': 403,
  /** Governance or retention policy denied the request (the contract's "policy denied"). */
  'policy.denied': 403,
  'validation.not_found': 404,
  'validation.method_not_allowed': 405,
  'validation.conflict': 409,
  /** Same Idempotency-Key with another body, or while the first is in flight (the contract's "idempotency conflict"). */
  'idempotency.conflict': 409,
  'runtime.invalid_transition': 409,
  'runtime.primary_thread': 409,
  /** A resource that existed and was erased (session deleted). */
  'validation.gone': 410,
  'validation.payload_too_large': 413,
  'validation.unsupported_media_type': 415,
  'model.no_eligible_model': 422,
  'budget.exceeded': 429,
  'runtime.internal': 500,
  'model.platform_capacity_reached': 503,
  'runtime.unavailable': 503,
} as const;

export type ErrorType = keyof typeof ERROR_STATUS;

export interface WireError {
  error: { type: ErrorType; message: string; more: string };
}

export interface ApiErrorOptions {
  /** Extra response headers, e.g. Retry-After for 429. */
  headers?: Record<string, string>;
  /** Where in the request the problem is (JSON pointer-ish), kept in logs and in `message`. */
  cause?: unknown;
}

export class ApiError extends Error {
  readonly type: ErrorType;
  readonly status: number;
  readonly headers: Record<string, string>;

  constructor(type: ErrorType, message: string, options: ApiErrorOptions = {}) {
    super(message, options.cause === undefined ? undefined : { cause: options.cause });
    this.name = 'ApiError';
    this.type = type;
    this.status = ERROR_STATUS[type];
    this.headers = options.headers ?? {};
  }

  toWire(docsUrl: string): WireError {
    return { error: { type: this.type, message: this.message, more: errorDocsUrl(docsUrl, this.type) } };
  }

  static is(value: unknown): value is ApiError {
    return value instanceof ApiError;
  }
}

/** `{docs_url}/reference/errors#<type with . and _ written as ->`. */
export function errorDocsUrl(docsUrl: string, type: string): string {
  return `${docsUrl.replace(/\/+$/, '')}/reference/errors#${type.replace(/[._]/g, '-')}`;
}

export const notFound = (what: string): ApiError => new ApiError('validation.not_found', `${what} not found`);
export const malformed = (message: string): ApiError => new ApiError('validation.malformed', message);
export const conflict = (message: string): ApiError => new ApiError('validation.conflict', message);
export const invalidTransition = (message: string): ApiError => new ApiError('runtime.invalid_transition', message);
export const permissionDenied = (message: string): ApiError => new ApiError('auth.permission_denied', message);
