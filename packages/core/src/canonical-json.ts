/**
 * JSON with object keys sorted, so equal values always serialise to equal strings. Every key is
 * kept, `__proto__` included: sorted copies are null-prototype objects, where `__proto__` is an
 * ordinary own property rather than the prototype setter that would swallow it.
 */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(sortKeys(value));
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value !== null && typeof value === 'object') {
    const out = Object.create(null) as Record<string, unknown>;
    for (const key of Object.keys(value).sort()) out[key] = sortKeys((value as Record<string, unknown>)[key]);
    return out;
  }
  return value;
}
