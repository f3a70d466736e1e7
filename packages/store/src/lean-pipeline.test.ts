import { describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { installLeanPipelines, originalPipeline } from './lean-pipeline.js';

describe('lean ioredis pipelines', () => {
  it('installs, and builds pipelines with the same fields as ioredis, length on the prototype', () => {
    expect(installLeanPipelines()).toBe(true);
    expect(installLeanPipelines()).toBe(true); // idempotent
    const Original = originalPipeline();
    expect(Original).toBeTypeOf('function');
    const redis = new Redis({ lazyConnect: true });
    try {
      redis.defineCommand('bump', { numberOfKeys: 1, lua: "return redis.call('INCR', KEYS[1])" });
      const lean = redis.pipeline() as unknown as Record<string, unknown>;
      const ours = new (Original as new (r: unknown) => Record<string, unknown>)(redis);
      // Same own fields as ioredis's constructor makes, but its per-instance accessor and the
      // client's script methods (on a prototype its pipelines share).
      const fields = (o: object): string[] => Object.getOwnPropertyNames(o).sort();
      expect(fields(lean)).toEqual(fields(ours).filter((k) => k !== 'length' && k !== 'bump' && k !== 'bumpBuffer'));
      expect(Object.getPrototypeOf(lean)).toBe(Object.getPrototypeOf(redis.pipeline()));
      expect(lean._shaToScript).toEqual(ours._shaToScript);
      expect(Object.getOwnPropertyDescriptor(ours, 'length')?.get).toBeTypeOf('function');
      expect(Object.getOwnPropertyDescriptor(lean, 'length')).toBeUndefined();
      expect(lean).toBeInstanceOf(Original);
      expect(lean.bump).toBe((redis as unknown as Record<string, unknown>).bump);
      // A script defined later reaches the client's next pipelines.
      redis.defineCommand('bump2', { numberOfKeys: 1, lua: "return redis.call('INCRBY', KEYS[1], 2)" });
      const later = redis.pipeline() as unknown as Record<string, unknown>;
      expect(later.bump2).toBe((redis as unknown as Record<string, unknown>).bump2);
      expect(Object.keys(later._shaToScript as object)).toHaveLength(2);
      expect(lean.bump2).toBeUndefined();
      expect(lean.isPipeline).toBe(true);
      expect(lean.options).toBe(redis.options);
      const p = redis.pipeline().get('a').set('b', '1');
      expect(p.length).toBe(2);
      const m = redis.multi().get('a');
      expect(m.length).toBe(2); // MULTI and GET until exec adds EXEC
    } finally {
      redis.disconnect();
    }
  });
});
