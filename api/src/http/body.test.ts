import { describe, expect, it } from 'vitest';
import { illFormedAt } from './body.js';

describe('illFormedAt', () => {
  it('names the first string, key or array item holding a lone surrogate', () => {
    expect(illFormedAt({ a: 'ok', b: ['fine', { c: 'x\ud800' }] }, 'body')).toBe('body.b[1].c');
    expect(illFormedAt({ ['k\udfff']: 1 }, 'body')).toBe('body key');
    expect(illFormedAt(['\udbff'], 'body')).toBe('body[0]');
    expect(illFormedAt('\ud800\udc00', 'body')).toBeNull(); // a pair is one code point
    expect(illFormedAt({ a: 1, b: null, c: true, d: ['😀'] }, 'body')).toBeNull();
  });
});
