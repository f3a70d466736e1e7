import { describe, expect, it } from 'vitest';
import { scrubSecret, scrubSecrets } from './scrub.js';

describe('scrubSecret', () => {
  const key = 'sk-test-SUPERSECRET-1234567890abcdef';
  it('takes out the key, any run of 8 or more of its characters, and masked echoes of it', () => {
    expect(scrubSecret(`bad key ${key}!`, key)).toBe('bad key [redacted]!');
    expect(scrubSecret('HTTP 401: bad key test-SUPERSECRET-1234', key)).toBe('HTTP 401: bad key [redacted]');
    expect(scrubSecret('Incorrect API key provided: sk-tes*****abcdef', key)).toBe('Incorrect API key provided: [redacted]');
    expect(scrubSecret('Incorrect API key provided: sk-proj-ABCD********************2345', 'sk-proj-ABCDxyzxyzxyzxyzxyz2345')).toBe('Incorrect API key provided: [redacted]');
    expect(scrubSecret('request had Authorization: Bearer UPSTREAM-TOKEN-abcdef0123456789', 'UPSTREAM-TOKEN-abcdef0123456789')).toBe('request had Authorization: Bearer [redacted]');
    // ASCII dots mask as the ellipsis does, a sentence's period after it or not.
    expect(scrubSecret('invalid key (prefix sk-te...cdef)', key)).toBe('invalid key (prefix [redacted])');
    expect(scrubSecret('invalid key sk-tes...abcdef.', key)).toBe('invalid key [redacted]');
  });
  it('leaves what is not the key', () => {
    expect(scrubSecret('nothing here', key)).toBe('nothing here');
    expect(scrubSecret('a password: ******** was masked', key)).toBe('a password: ******** was masked');
    expect(scrubSecret('test-SU is short', key)).toBe('test-SU is short');
    expect(scrubSecret('wait... then sk-other...9999 failed', key)).toBe('wait... then sk-other...9999 failed');
    expect(scrubSecret('x', null)).toBe('x');
    expect(scrubSecrets('a TOKEN-one and TOKEN-two', ['TOKEN-one', 'TOKEN-two'])).toBe('a [redacted] and [redacted]');
  });
  it('takes time linear in the text: a long word without mask characters (an upstream error body) is read once', () => {
    const long = 'x'.repeat(1 << 20);
    const started = performance.now();
    expect(scrubSecret(`${long} sk-tes*****abcdef`, key)).toBe(`${long} [redacted]`);
    expect(performance.now() - started).toBeLessThan(2_000);
  });
});
