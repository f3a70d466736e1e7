/**
 * Values read off a provider's stream as the types our events carry: a provider (or whatever
 * answers at its base URL) may send anything, and what it sends reaches Session logs and usage
 * records. A field of the wrong type is read as absent, never passed on.
 */

/** A token count: a non-negative safe integer, else 0. */
export function tokenCount(v: unknown): number {
  return typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : 0;
}

/** A string field, or undefined when it is anything else. */
export function wireString(v: unknown): string | undefined {
  return typeof v === 'string' ? v : undefined;
}

/** An array field's object elements (a non-array is none; a null or scalar element is skipped). */
export function wireObjects<T extends object>(v: unknown): T[] {
  return Array.isArray(v) ? v.filter((x): x is T => typeof x === 'object' && x !== null) : [];
}
