import { beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import { LeaseFence } from '@agentplane/lease';
import type { Redis } from '@agentplane/store';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { LeaseStreams } from './lease-streams.js';

let redis: Redis;
const testRedis = useEmbeddedRedis('lease-streams');
beforeAll(() => {
  redis = testRedis();
});

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

describe('LeaseStreams', () => {
  it('a step whose lease ends by expiry, which no one announces, is aborted at the next read of its lease; one whose lease holds is not', async () => {
    const fence = new LeaseFence(redis);
    const expiring = `sess_${'e'.repeat(32)}`;
    const held = `sess_${'h'.repeat(32)}`;
    expect(await fence.claim({ sessionId: expiring, token: 'lease-expiring', runnerId: 'runner_1', attempt: 1, runId: 'run_1' }, 600)).toBe('ok');
    expect(await fence.claim({ sessionId: held, token: 'lease-held', runnerId: 'runner_2', attempt: 1, runId: 'run_2' }, 60_000)).toBe('ok');
    const streams = new LeaseStreams(redis, createLogger({ name: 'test', level: 'silent' }), { recheckMs: 200 });
    const aborted: string[] = [];
    const untrack = [
      streams.track({ workspace_id: 'wrkspc_1', session_id: expiring, run_id: 'run_1', lease_id: 'lease-expiring' }, () => aborted.push('expiring')),
      streams.track({ workspace_id: 'wrkspc_1', session_id: held, run_id: 'run_2', lease_id: 'lease-held' }, () => aborted.push('held')),
    ];
    try {
      await sleep(300);
      expect(aborted).toEqual([]);
      // The runner stopped heartbeating: the fence lapses, and no lease_ended is published.
      await sleep(1_000);
      expect(aborted).toEqual(['expiring']);
      for (const u of untrack) u();
      expect(streams.size).toBe(0);
    } finally {
      await streams.close();
    }
  });
});
