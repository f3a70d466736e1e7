import { describe, expect, it, vi } from 'vitest';
import { BoundedCache } from './cache.js';

describe('BoundedCache', () => {
  it('drops the least recently used entry past its size', () => {
    const c = new BoundedCache<string, number>(2);
    c.set('a', 1);
    c.set('b', 2);
    expect(c.get('a')).toBe(1); // a is now the most recent
    c.set('c', 3);
    expect(c.get('b')).toBeUndefined();
    expect([c.get('a'), c.get('c'), c.size]).toEqual([1, 3, 2]);
  });

  it('take removes; stale entries are not returned', () => {
    vi.useFakeTimers();
    try {
      const c = new BoundedCache<string, string>(10, { maxAgeMs: 1000 });
      c.set('a', 'x');
      expect(c.take('a')).toBe('x');
      expect(c.take('a')).toBeUndefined();
      c.set('b', 'y');
      vi.advanceTimersByTime(1001);
      expect(c.get('b')).toBeUndefined();
      expect(c.size).toBe(0);
    } finally {
      vi.useRealTimers();
    }
  });

  it('keeps its total weight bounded and refuses a value heavier than the bound', () => {
    const c = new BoundedCache<string, string>(100, { maxWeight: 10, weigh: (v) => v.length });
    c.set('a', 'xxxx');
    c.set('b', 'yyyy');
    c.set('c', 'zzzz'); // 12 > 10: a goes
    expect([c.get('a'), c.get('b'), c.get('c')]).toEqual([undefined, 'yyyy', 'zzzz']);
    c.set('big', 'x'.repeat(11));
    expect(c.get('big')).toBeUndefined();
    expect(c.size).toBe(2);
    c.delete('b');
    c.set('d', 'dddddd');
    expect([c.get('c'), c.get('d')]).toEqual(['zzzz', 'dddddd']);
  });
});

describe('BoundedCache eviction by second chance', () => {
  it('keeps entries read since they were last moved, and evicts each unread one in age order', () => {
    const c = new BoundedCache<string, number>(3);
    c.set('a', 1);
    c.set('b', 2);
    c.set('c', 3);
    c.get('a');
    c.get('b');
    c.set('d', 4); // a and b were read: c, the oldest unread, goes
    expect([c.get('c'), c.size]).toEqual([undefined, 3]);
    c.get('d');
    c.get('b');
    c.set('e', 5); // d and b were read again: a, the oldest unread, goes
    expect([...['a', 'b', 'd', 'e'].map((k) => c.get(k) !== undefined)]).toEqual([false, true, true, true]);
  });

  it('a value set over the bound is kept even when everything else was read', () => {
    const c = new BoundedCache<string, number>(2);
    c.set('a', 1);
    c.set('b', 2);
    c.get('a');
    c.get('b');
    c.set('c', 3);
    expect(c.get('c')).toBe(3);
    expect(c.size).toBe(2);
  });
});
