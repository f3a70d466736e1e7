/**
 * The wire contract's Errors catalog, type → HTTP status, plus the project's names for its two
 * unnamed entries (policy denied, idempotency conflict). Nothing else may reach a client.
 */
export const CATALOG: Record<string, number> = {
  'validation.malformed': 400,
  'auth.invalid_key': 401,
  'auth.disabled_tenancy': 403,
  'policy.denied': 403,
  'validation.not_found': 404,
  'validation.conflict': 409,
  'idempotency.conflict': 409,
  'runtime.invalid_transition': 409,
  'runtime.primary_thread': 409,
  'validation.payload_too_large': 413,
  'model.no_eligible_model': 422,
  'budget.exceeded': 429,
  'billing.usage_limit_reached': 402,
  'billing.payment_required': 402,
  'model.platform_capacity_reached': 503,
  'runtime.internal': 500,
};
