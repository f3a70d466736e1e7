import { describe, expect, it } from 'vitest';
import { Joiner } from './joiner.js';

describe('Joiner', () => {
  it('joins the calls of a tick by key, caps a batch by weight, answers each call with its own result', async () => {
    const sent: string[][] = [];
    const j = new Joiner<string, string>({
      schedule: (flush) => process.nextTick(flush),
      send: async (items) => {
        sent.push(items);
        return items.map((x) => x.toUpperCase());
      },
      maxWeight: 3,
      weigh: (x) => x.length,
    });
    const out = await Promise.all([j.add('a', 'x'), j.add('b', 'y'), j.add('a', 'zz'), j.add('a', 'w'), j.add('b', 'v')]);
    expect(out).toEqual(['X', 'Y', 'ZZ', 'W', 'V']);
    // 'a' reached its weight (x + zz), so 'w' opened a new batch; the full one went first.
    expect(sent).toEqual([['x', 'zz'], ['y', 'v'], ['w']]);
    // The next tick opens new batches.
    expect(await j.add('a', 'q')).toBe('Q');
    expect(sent.at(-1)).toEqual(['q']);
  });

  it('a batch that fails, throws while sending or answers short fails each of its calls, never leaves one waiting', async () => {
    const failing = (send: (items: number[]) => Promise<number[]>) => new Joiner<number, number>({ schedule: (f) => setImmediate(f), send, maxWeight: 10 });
    const cases = [
      failing(async () => Promise.reject(new Error('down'))),
      failing(() => {
        throw new Error('cannot encode');
      }),
      failing(async (items) => items.slice(1)),
    ];
    for (const j of cases) {
      const r = await Promise.allSettled([j.add('k', 1), j.add('k', 2)]);
      expect(r.map((x) => x.status)).toEqual(['rejected', 'rejected']);
    }
  });
});
