/**
 * The contract's Errors catalog, type by type with its HTTP status. `ERROR_STATUS` must
 * satisfy it exactly (an extra, missing or re-statused type does not compile).
 */
interface ErrorCatalog {
  'validation.malformed': 400;
  'auth.invalid_key': 401;
  'auth.disabled_tenancy': 403;
  /** The contract's "policy denied". */
  'policy.denied': 403;
  'validation.not_found': 404;
  'validation.conflict': 409;
  /** The contract's "idempotency conflict". */
  'idempotency.conflict': 409;
  'runtime.invalid_transition': 409;
  'runtime.primary_thread': 409;
  'validation.payload_too_large': 413;
  'model.no_eligible_model': 422;
  'budget.exceeded': 429;
  'billing.usage_limit_reached': 402;
  'billing.payment_required': 402;
  'model.platform_capacity_reached': 503;
  'runtime.internal': 500;
}

/**
 * The one error type of the platform. Every failure that reaches a client is an
 * ApiError; its `type` decides the HTTP status and the documentation anchor.
 *
 * Exactly the Errors catalog of the interface contract (the wire contract), plus the
 * project's names for its two unnamed entries: `policy.denied` and `idempotency.conflict`.
 * Nothing else: a client written against the catalog must be able to handle every answer,
 * so a new failure maps onto one of these (see the retry-safety table in docs/API.md).
 */
export const ERROR_STATUS = {
  /** Version header missing or unsupported; a body, parameter or content type the schema rejects. */
  'validation.malformed': 400,
  /** Missing or revoked credential (or one whose owner is no longer active). */
  'auth.invalid_key': 401,
  'billing.usage_limit_reached': 402,
  'billing.payment_required': 402,
  'auth.disabled_tenancy': 403,
  /**
   * A policy denied the request (the contract's "policy denied"): deployment governance,
   * retention, and the access policy of the credential (its role, scope, kind or audience).
   */
  'policy.denied': 403,
  /** Absent in the resolved boundary: never existed, deleted or erased, or no operation at that method and path. */
  'validation.not_found': 404,
  /** Stale `expected_resource_version`, a pairing conflict, or a concurrent writer won (retry safe). */
  'validation.conflict': 409,
  /** Same Idempotency-Key with another body, or while the first is in flight (the contract's "idempotency conflict"). */
  'idempotency.conflict': 409,
  'runtime.invalid_transition': 409,
  'runtime.primary_thread': 409,
  'validation.payload_too_large': 413,
  'model.no_eligible_model': 422,
  'budget.exceeded': 429,
  /** Unexpected failure; the message holds an opaque incident reference. */
  'runtime.internal': 500,
  'model.platform_capacity_reached': 503,
} as const satisfies ErrorCatalog;

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

  /** A refusal of the request itself (a 4xx): running it again unchanged gets the same answer. */
  static isRefusal(value: unknown): value is ApiError {
    return value instanceof ApiError && value.status < 500;
  }
}

/** `{docs_url}/reference/errors#<type with . and _ written as ->`. */
/**
 * How a compare-and-swap's expected version (or generation) that is not the current one is
 * told: `is stale` when it is behind, and as a version never written when it is ahead.
 */
export function staleOrAhead(expected: number | undefined, current: number): string {
  return expected !== undefined && expected > current ? 'is ahead of the current one (never written)' : 'is stale';
}

export function errorDocsUrl(docsUrl: string, type: string): string {
  return `${docsUrl.replace(/\/+$/, '')}/reference/errors#${type.replace(/[._]/g, '-')}`;
}

export const notFound = (what: string): ApiError => new ApiError('validation.not_found', `${what} not found`);
export const malformed = (message: string): ApiError => new ApiError('validation.malformed', message);
export const conflict = (message: string): ApiError => new ApiError('validation.conflict', message);
export const invalidTransition = (message: string): ApiError => new ApiError('runtime.invalid_transition', message);
/** The credential's access policy (role, scope, kind, audience) does not admit the operation. */
export const policyDenied = (message: string): ApiError => new ApiError('policy.denied', message);
