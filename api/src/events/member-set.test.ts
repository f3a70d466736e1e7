import { describe, expect, it } from 'vitest';
import type { Redis } from '@agentplane/store';
import { CachedMemberSet } from './member-set.js';

describe('CachedMemberSet', () => {
  it('answers at once while fresh, reads once for concurrent questions, and again after invalidate', async () => {
    let reads = 0;
    let members = ['wrkspc_a'];
    const redis = { smembers: async () => (reads++, members) } as unknown as Redis;
    const set = new CachedMemberSet(redis, 'k', 60_000);
    const [a, b] = await Promise.all([set.has('wrkspc_a'), set.has('wrkspc_b')]);
    expect([a, b, reads]).toEqual([true, false, 1]);
    expect(set.has('wrkspc_a')).toBe(true);
    members = ['wrkspc_b'];
    expect(set.has('wrkspc_b')).toBe(false);
    set.invalidate();
    expect(await set.has('wrkspc_b')).toBe(true);
    expect(reads).toBe(2);
  });
});
