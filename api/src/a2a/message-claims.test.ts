import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import type { Redis } from '@agentplane/store';
import { claimMessage, releaseMessage } from './message-claims.js';

let redis: Redis;
const testRedis = useEmbeddedRedis('a2a-claims');
beforeAll(() => {
  redis = testRedis();
});

describe('A2A messageId claims', () => {
  it('a claim sent again by the same send (its answer lost with a connection) is still that send\'s', async () => {
    const first = await claimMessage(redis, 'h:resent', 'm1', 'tok-1', 30_000);
    expect(first.won).toBe(true);
    const again = await claimMessage(redis, 'h:resent', 'm1', 'tok-1', 30_000);
    expect(again).toEqual(first);
    // Another send of the messageId waits for it.
    expect(await claimMessage(redis, 'h:resent', 'm1', 'tok-2', 30_000)).toEqual({ won: false, value: 'pending' });
  });

  it('a claim another send holds is pending until it is stale, then taken over', async () => {
    expect((await claimMessage(redis, 'h:stale', 'm1', 'tok-a', 30_000)).won).toBe(true);
    expect(await claimMessage(redis, 'h:stale', 'm1', 'tok-b', 30_000)).toEqual({ won: false, value: 'pending' });
    const taken = await claimMessage(redis, 'h:stale', 'm1', 'tok-b', 0);
    expect(taken.won).toBe(true);
    // The first holder's claim is gone: it cannot release the new one.
    await releaseMessage(redis, 'h:stale', 'm1', 'pending:0:tok-a');
    expect(await claimMessage(redis, 'h:stale', 'm1', 'tok-c', 30_000)).toEqual({ won: false, value: 'pending' });
  });

  it('an undated claim is dated, and an anonymous dated claim is nobody\'s own', async () => {
    await redis.hset('h:old', 'm1', 'pending');
    expect(await claimMessage(redis, 'h:old', 'm1', '', 30_000)).toEqual({ won: false, value: 'pending' });
    expect(await claimMessage(redis, 'h:old', 'm1', '', 30_000)).toEqual({ won: false, value: 'pending' });
  });

  it('a messageId mapped to its task answers the task; a released claim frees it', async () => {
    await redis.hset('h:done', 'm1', 'sess_x');
    expect(await claimMessage(redis, 'h:done', 'm1', 'tok', 30_000)).toEqual({ won: false, value: 'sess_x' });
    const held = await claimMessage(redis, 'h:done', 'm2', 'tok', 30_000);
    if (!held.won) throw new Error('expected the claim');
    await releaseMessage(redis, 'h:done', 'm2', held.claim);
    expect((await claimMessage(redis, 'h:done', 'm2', 'tok-other', 30_000)).won).toBe(true);
  });
});
