import { describe, expect, it } from 'vitest';
import { PooledIdGenerator } from './trace-ids.js';

describe('pooled trace ids', () => {
  it('gives W3C-shaped ids, unique across many pool refills', () => {
    const ids = new PooledIdGenerator();
    const traces = new Set<string>();
    const spans = new Set<string>();
    for (let i = 0; i < 20_000; i++) {
      const t = ids.generateTraceId();
      const s = ids.generateSpanId();
      expect(t).toMatch(/^[0-9a-f]{32}$/);
      expect(s).toMatch(/^[0-9a-f]{16}$/);
      traces.add(t);
      spans.add(s);
    }
    expect(traces.size).toBe(20_000);
    expect(spans.size).toBe(20_000);
  });

  it('replaces an all-zero draw', () => {
    const ids = new PooledIdGenerator();
    // A pool that starts with zeros: the first draw of each kind must be skipped.
    Object.assign(ids, { pool: `${'0'.repeat(32)}${'ab'.repeat(16)}${'0'.repeat(16)}${'cd'.repeat(8)}`, at: 0 });
    expect(ids.generateTraceId()).toBe('ab'.repeat(16));
    expect(ids.generateSpanId()).toBe('cd'.repeat(8));
  });
});
