/**
 * The deepest nesting of objects and arrays any JSON the platform takes in may have: request
 * bodies, runner frames. Far past what any tool schema or payload needs, and far short of what
 * recursive code meets on the way (canonical JSON for fingerprints, serialisation for storage and
 * streams, Redis's Lua decoder at 1,000), which a deeper document would overflow: a request's 500
 * or a stream that fails for every viewer of a log holding it.
 */
export const MAX_JSON_NESTING = 256;

/**
 * The deepest nesting of objects and arrays in `text`, found by a linear scan that skips string
 * contents; stops as soon as `limit` is passed (returns limit + 1), so a hostile document never
 * reaches a recursive parser.
 */
export function jsonDepth(text: string, limit = MAX_JSON_NESTING): number {
  let depth = 0;
  let max = 0;
  let inString = false;
  for (let i = 0; i < text.length; i++) {
    const c = text.charCodeAt(i);
    if (inString) {
      if (c === 0x5c) i++; // backslash: skip the escaped character
      else if (c === 0x22) inString = false;
      continue;
    }
    if (c === 0x22) inString = true;
    else if (c === 0x7b || c === 0x5b) {
      depth++;
      if (depth > max) {
        max = depth;
        if (max > limit) return max;
      }
    } else if (c === 0x7d || c === 0x5d) depth--;
  }
  return max;
}
