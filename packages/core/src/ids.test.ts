import { describe, expect, it } from 'vitest';
import { isId, newId } from './ids.js';

describe('newId', () => {
  it('is the prefix and 32 lowercase hex digits, and never repeats across refills of its random pool', () => {
    const ids = Array.from({ length: 2000 }, () => newId('session')); // ~8 refills of 256 ids
    for (const id of ids) expect(isId('session', id)).toBe(true);
    expect(new Set(ids).size).toBe(ids.length);
    // Every hex digit shows up in every position: the bytes are not stuck or zero.
    for (let pos = 5; pos < 37; pos += 7) expect(new Set(ids.map((id) => id[pos])).size).toBe(16);
  });
});
