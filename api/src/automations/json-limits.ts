import { ApiError, jsonDepth as depthOf } from '@agentplane/core';

/** Limits on an Automation webhook delivery's JSON, checked after its signature (docs/AUTOMATIONS.md). */
export const MAX_JSON_DEPTH = 64;
export const MAX_JSON_NODES = 100_000;

/** The deepest nesting of `text` (a linear scan; one past `limit` at most). */
export const jsonDepth = (text: string, limit = MAX_JSON_DEPTH): number => depthOf(text, limit);

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
