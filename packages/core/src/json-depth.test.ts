import { describe, expect, it } from 'vitest';
import { jsonDepth, MAX_JSON_NESTING } from './json-depth.js';

describe('jsonDepth', () => {
  it('counts objects and arrays, not brackets inside strings', () => {
    expect(jsonDepth('{"a":[1,{"b":"[[[{{{"}]}')).toBe(3);
    expect(jsonDepth('"\\"[["')).toBe(0);
    expect(jsonDepth('{"a":"\\\\"}')).toBe(1);
    expect(jsonDepth('[]'.repeat(3))).toBe(1);
  });
  it('stops one past the limit, however deep the text goes', () => {
    expect(jsonDepth('['.repeat(MAX_JSON_NESTING) + ']'.repeat(MAX_JSON_NESTING))).toBe(MAX_JSON_NESTING);
    expect(jsonDepth('['.repeat(2_000_000))).toBe(MAX_JSON_NESTING + 1);
    expect(jsonDepth('['.repeat(100), 64)).toBe(65);
  });
});
