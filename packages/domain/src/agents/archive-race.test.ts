import { beforeAll, describe, expect, it } from 'vitest';
import type { Redis } from '@agentplane/store';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { VersionedStore } from '../versioned.js';
import { newAgent, type Agent } from './model.js';

let redis: Redis;
const testRedis = useEmbeddedRedis('agent-archive-race');
beforeAll(() => {
  redis = testRedis();
});

/**
 * A client of `redis` whose first GET answers what Redis held, after `between` has run: the
 * interleaving of a write that read the head just before another request changed it.
 */
function readThen(between: () => Promise<unknown>): Redis {
  let first = true;
  return new Proxy(redis, {
    get(target, prop, receiver) {
      if (prop === 'get') {
        return async (key: string) => {
          const value = await target.get(key);
          if (first) {
            first = false;
            await between();
          }
          return value;
        };
      }
      const v = Reflect.get(target, prop, receiver) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
    },
  });
}

describe('an Agent archived while a new version of it is written', () => {
  it('stays archived: the version that read it live is refused (409 runtime.invalid_transition)', async () => {
    const ws = 'wrkspc_archive_race';
    const agents = new VersionedStore<Agent>(redis, 'agents', 'agent');
    const agent = await agents.create(ws, newAgent(ws, { name: 'a', model: 'default' }));
    const racing = new VersionedStore<Agent>(readThen(() => agents.archive(ws, agent.id)), 'agents', 'agent');
    await expect(racing.newVersion(ws, agent.id, 1, (cur) => ({ ...cur, name: 'renamed' }))).rejects.toMatchObject({ type: 'runtime.invalid_transition' });
    const head = await agents.get(ws, agent.id);
    expect(head.archived_at).not.toBeNull();
    expect([head.version, head.name]).toEqual([1, 'a']);
    await expect(agents.getVersion(ws, agent.id, 2)).rejects.toMatchObject({ type: 'validation.not_found' });
  });
});
