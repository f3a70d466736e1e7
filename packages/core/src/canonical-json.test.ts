import { describe, expect, it } from 'vitest';
import { canonicalJson } from './canonical-json.js';

describe('canonicalJson', () => {
  it('sorts keys at every depth', () => {
    expect(canonicalJson({ b: 1, a: { d: [{ z: 1, y: 2 }], c: null } })).toBe('{"a":{"c":null,"d":[{"y":2,"z":1}]},"b":1}');
  });

  it('keeps a __proto__ key (as JSON.parse gives it) at any depth', () => {
    const top = JSON.parse('{"name":"x","__proto__":{"admin":true}}') as unknown;
    expect(canonicalJson(top)).toBe('{"__proto__":{"admin":true},"name":"x"}');
    const nested = JSON.parse('{"metadata":{"__proto__":"x","team":"a"}}') as unknown;
    expect(canonicalJson(nested)).toBe('{"metadata":{"__proto__":"x","team":"a"}}');
    expect(canonicalJson(nested)).not.toBe(canonicalJson({ metadata: { team: 'a' } }));
    expect(canonicalJson(JSON.parse('[{"__proto__":1}]'))).toBe('[{"__proto__":1}]');
  });

  it('is not fooled into changing a prototype', () => {
    canonicalJson(JSON.parse('{"__proto__":{"polluted":true}}'));
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
  });
});
