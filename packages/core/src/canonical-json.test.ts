import { describe, expect, it } from 'vitest';
import { canonicalJson, jcsCanonicalize } from './canonical-json.js';

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

describe('jcsCanonicalize (RFC 8785)', () => {
  it('matches the RFC examples: number forms, key order by UTF-16 code units, string escapes', () => {
    expect(jcsCanonicalize(JSON.parse('[1E30, 4.50, 2e-3, 0.000001, 1e-7, -0, 333333333.33333329]'))).toBe('[1e+30,4.5,0.002,0.000001,1e-7,0,333333333.3333333]');
    const keys = JSON.parse('{"\\u20ac":"Euro","\\r":"CR","\\ufb33":"Dalet","1":"One","\\ud83d\\ude00":"Emoji","\\u0080":"Control","\\u00f6":"o"}');
    const order: [string, string][] = [['\r', 'CR'], ['1', 'One'], ['\u0080', 'Control'], ['\u00f6', 'o'], ['\u20ac', 'Euro'], ['\ud83d\ude00', 'Emoji'], ['\ufb33', 'Dalet']];
    expect(jcsCanonicalize(keys)).toBe(`{${order.map(([k, v]) => `${JSON.stringify(k)}:${JSON.stringify(v)}`).join(',')}}`);
    expect(jcsCanonicalize({ s: '\u000f\n"\\/\u20ac' })).toBe('{"s":"\\u000f\\n\\"\\\\/\u20ac"}');
  });

  it('refuses what JCS cannot represent', () => {
    expect(() => jcsCanonicalize({ a: Number.NaN })).toThrow(/finite/);
    expect(() => jcsCanonicalize(JSON.parse('{"a":"\\ud800"}'))).toThrow(/surrogate/);
    expect(() => jcsCanonicalize({ a: undefined })).toThrow(/JSON value/);
  });
});
