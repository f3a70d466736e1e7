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

/**
 * RFC 8785 (JSON Canonicalization Scheme). `canonicalJson` is not JCS: it rebuilds objects, and a
 * JavaScript object always enumerates integer-like keys (`"1"`) first, whatever order they were
 * inserted in, while JCS sorts every key by UTF-16 code units (`"\r"` before `"1"`). This
 * serialiser writes the members itself. Numbers use the ECMAScript shortest form and strings the
 * `JSON.stringify` escapes, both exactly what JCS prescribes. What JCS forbids is refused instead
 * of serialised: lone surrogates, non-finite numbers, and values JSON cannot hold.
 */
export function jcsCanonicalize(value: unknown): string {
  return jcs(value, '$');
}

const LONE_SURROGATE = /[\uD800-\uDBFF](?![\uDC00-\uDFFF])|(?<![\uD800-\uDBFF])[\uDC00-\uDFFF]/;

function jcsString(s: string, at: string): string {
  if (LONE_SURROGATE.test(s)) throw new TypeError(`${at}: lone surrogate`);
  return JSON.stringify(s);
}

function jcs(value: unknown, at: string): string {
  if (value === null) return 'null';
  if (typeof value === 'boolean') return value ? 'true' : 'false';
  if (typeof value === 'number') {
    if (!Number.isFinite(value)) throw new TypeError(`${at}: not a finite number`);
    return JSON.stringify(value);
  }
  if (typeof value === 'string') return jcsString(value, at);
  if (Array.isArray(value)) return `[${value.map((v, i) => jcs(v, `${at}[${i}]`)).join(',')}]`;
  if (typeof value === 'object') {
    const keys = Object.keys(value).sort();
    return `{${keys.map((k) => `${jcsString(k, at)}:${jcs((value as Record<string, unknown>)[k], `${at}.${k}`)}`).join(',')}}`;
  }
  throw new TypeError(`${at}: not a JSON value`);
}
