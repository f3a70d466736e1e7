import { describe, expect, it } from 'vitest';
import { jsonDepth, jsonNodes, parseLimitedJson } from './json-limits.js';

describe('delivery JSON limits', () => {
  it('counts nesting outside strings only', () => {
    expect(jsonDepth('{"a":[1,{"b":"[[[{{{"}]}')).toBe(3);
    expect(jsonDepth('"\\"[["')).toBe(0);
    expect(jsonDepth('['.repeat(64) + ']'.repeat(64))).toBe(64);
    expect(jsonDepth('['.repeat(100_000))).toBe(65);
  });
  it('counts every value as a node and stops past the limit', () => {
    expect(jsonNodes({ a: [1, 2, { b: null }] })).toBe(6);
    expect(jsonNodes(new Array(200_000).fill(0), 100_000)).toBe(100_001);
  });
  it('refuses 65 levels and 100,001 nodes with validation.malformed, accepts the limits themselves', () => {
    expect(() => parseLimitedJson('['.repeat(65) + ']'.repeat(65))).toThrow(expect.objectContaining({ type: 'validation.malformed' }));
    expect(parseLimitedJson('['.repeat(64) + ']'.repeat(64))).toBeInstanceOf(Array);
    expect(() => parseLimitedJson(JSON.stringify(new Array(100_000).fill(0)))).toThrow(expect.objectContaining({ type: 'validation.malformed' }));
    expect(parseLimitedJson(JSON.stringify(new Array(99_999).fill(0)))).toHaveLength(99_999);
    expect(() => parseLimitedJson('{nope')).toThrow(expect.objectContaining({ type: 'validation.malformed' }));
  });
});
