import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { keys, tags, type Redis } from '@agentplane/store';
import { newThreadDoc, SessionStore } from './store.js';
import { idleSession } from './fixtures.test-support.js';

let redis: Redis;
const testRedis = useEmbeddedRedis('session-store');
beforeAll(() => {
  redis = testRedis();
});

describe('SessionStore.create', () => {
  it('writes nothing for an id that exists (a retry of the same create): it returns what is stored', async () => {
    const store = new SessionStore(redis);
    const { session, threadId } = await idleSession(store);
    const again = { ...session, title: 'second attempt' };
    const otherPrimary = newThreadDoc(again, session.agent, null);
    const found = await store.create({ ...again, _primary_thread_id: otherPrimary.id }, otherPrimary);
    // One primary thread, the first one: the second attempt's is neither written nor listed.
    expect(await redis.zrange(keys.index(tags.session(session.id), 'threads'), 0, -1)).toEqual([threadId]);
    expect(await redis.exists(keys.doc(tags.session(session.id), otherPrimary.id))).toBe(0);
    expect(await store.get(session.workspace_id, session.id)).toMatchObject({ title: null, _primary_thread_id: threadId });
    expect(await redis.zrange(keys.index(tags.workspace(session.workspace_id), 'sessions:live'), 0, -1)).toEqual([session.id]);
    expect(found).toMatchObject({ id: session.id, title: null, _primary_thread_id: threadId });
  });
});
