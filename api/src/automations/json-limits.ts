import { ApiError } from '@agentplane/core';

/** Limits on an Automation webhook delivery's JSON, checked after its signature (docs/AUTOMATIONS.md). */
export const MAX_JSON_DEPTH = 64;
export const MAX_JSON_NODES = 100_000;

/**
 * The deepest nesting of objects and arrays in `text`, found by a linear scan that skips string
 * contents; stops as soon as `limit` is passed (returns limit + 1), so a hostile body never
 * reaches a recursive parser.
 */
export function jsonDepth(text: string, limit = MAX_JSON_DEPTH): number {
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

/** Every value counts as one node: objects, arrays and scalars (object keys do not). Stops past `limit`. */
export function jsonNodes(value: unknown, limit = MAX_JSON_NODES): number {
  let count = 0;
  const stack: unknown[] = [value];
  while (stack.length > 0) {
    const v = stack.pop();
    count++;
    if (count > limit) return count;
    if (Array.isArray(v)) for (const x of v) stack.push(x);
    else if (typeof v === 'object' && v !== null) for (const x of Object.values(v)) stack.push(x);
  }
  return count;
}

/** Parses a delivery body within the limits: 400 `validation.malformed` otherwise. */
export function parseLimitedJson(text: string): unknown {
  if (jsonDepth(text) > MAX_JSON_DEPTH) throw new ApiError('validation.malformed', `the delivery's JSON nests deeper than ${MAX_JSON_DEPTH} levels`);
  let value: unknown;
  try {
    value = JSON.parse(text) as unknown;
  } catch {
    throw new ApiError('validation.malformed', 'the delivery body is not valid JSON');
  }
  if (jsonNodes(value) > MAX_JSON_NODES) throw new ApiError('validation.malformed', `the delivery's JSON has more than ${MAX_JSON_NODES} nodes`);
  return value;
}
