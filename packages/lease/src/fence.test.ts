import { describe, expect, it } from 'vitest';
import { EventLog } from '@agentplane/store';
import { CancelMarks } from './cancels.js';
import { LeaseFence } from './fence.js';
import { useEmbeddedRedis } from '@agentplane/store/testing';

const redisOf = useEmbeddedRedis('fence');

describe('lease fences of one Session', () => {
  it('holds one fence per Run side by side; a newer attempt of a Run drops the older token; appends check their own token', async () => {
    const redis = redisOf();
    const fence = new LeaseFence(redis);
    const log = new EventLog(redis);
    const s = `sess_${'a'.repeat(32)}`;
    expect(await fence.claim({ sessionId: s, token: 'child-1', runnerId: 'r1', attempt: 1, runId: 'run_1' }, 60_000)).toBe('ok');
    expect(await fence.claim({ sessionId: s, token: 'child-2', runnerId: 'r2', attempt: 1, runId: 'run_2' }, 60_000)).toBe('ok');
    expect(await fence.holds(s, 'child-1')).toBe(true);
    expect(await fence.holds(s, 'child-2')).toBe(true);
    expect((await log.append(s, [{ type: 'a', payload: {} }], { fence: 'child-1' })).ok).toBe(true);
    expect((await log.append(s, [{ type: 'b', payload: {} }], { fence: 'child-2' })).ok).toBe(true);
    expect(await fence.current(s, 'run_2')).toMatchObject({ token: 'child-2', runner_id: 'r2', attempt: '1', run_id: 'run_2' });

    // The same token claimed by another runner is taken; a second attempt of run_1 fences the first.
    expect(await fence.claim({ sessionId: s, token: 'child-1', runnerId: 'r9', attempt: 1, runId: 'run_1' }, 60_000)).toBe('taken');
    expect(await fence.claim({ sessionId: s, token: 'child-1b', runnerId: 'r2', attempt: 2, runId: 'run_1' }, 60_000)).toBe('ok');
    expect(await fence.holds(s, 'child-1')).toBe(false);
    expect(await log.append(s, [{ type: 'c', payload: {} }], { fence: 'child-1' })).toMatchObject({ ok: false, reason: 'fenced' });
    expect(await fence.holds(s, 'child-2')).toBe(true);

    expect(await fence.release(s, 'child-2')).toBe(true);
    expect(await fence.holds(s, 'child-2')).toBe(false);
    expect(await fence.current(s, 'run_2')).toEqual({});
    expect(await fence.extend(s, 'child-1b', 60_000)).toBe('ok');
    expect(await fence.extend(s, 'child-2', 60_000)).toBe('lost');
  });

  it('never claims a lease for a Run with a cancel mark, and writes nothing for it', async () => {
    const redis = redisOf();
    const fence = new LeaseFence(redis);
    const marks = new CancelMarks(redis);
    const s = `sess_${'b'.repeat(32)}`;
    await marks.mark(s, 'run_9');
    expect(await fence.claim({ sessionId: s, token: 'lease-9', runnerId: 'r1', attempt: 1, runId: 'run_9' }, 60_000)).toBe('canceled');
    expect(await fence.holds(s, 'lease-9')).toBe(false);
    expect(await fence.current(s, 'run_9')).toEqual({});
    // Another Run of the same Session is not affected; once the mark is cleared the Run can be leased.
    expect(await fence.claim({ sessionId: s, token: 'lease-8', runnerId: 'r1', attempt: 1, runId: 'run_8' }, 60_000)).toBe('ok');
    await marks.clear(s, 'run_9');
    expect(await fence.claim({ sessionId: s, token: 'lease-9', runnerId: 'r1', attempt: 1, runId: 'run_9' }, 60_000)).toBe('ok');
  });

  it('extends a leased Run\'s fence and answers canceled once the Run carries a cancel mark', async () => {
    const redis = redisOf();
    const fence = new LeaseFence(redis);
    const marks = new CancelMarks(redis);
    const s = `sess_${'d'.repeat(32)}`;
    expect(await fence.claim({ sessionId: s, token: 'lease-1', runnerId: 'r1', attempt: 1, runId: 'run_1' }, 1_000)).toBe('ok');
    expect(await fence.extend(s, 'lease-1', 60_000, 'run_1')).toBe('ok');
    await marks.mark(s, 'run_1');
    // Marked after its lease: still extended (the runner ends the attempt under it), and told.
    expect(await fence.extend(s, 'lease-1', 60_000, 'run_1')).toBe('canceled');
    expect(Number((await fence.current(s, 'run_1')).expires_at_ms)).toBeGreaterThan(Date.now() + 30_000);
    expect(await fence.holds(s, 'lease-1')).toBe(true);
    // Without the Run, the mark is not looked at; a lost fence stays lost, marked or not.
    expect(await fence.extend(s, 'lease-1', 60_000)).toBe('ok');
    expect(await fence.extend(s, 'lease-2', 60_000, 'run_1')).toBe('lost');
  });

  it('releases a live fence in the check that finds it live, and leaves an expired or unknown one as it is', async () => {
    const redis = redisOf();
    const fence = new LeaseFence(redis);
    const log = new EventLog(redis);
    const s = `sess_${'c'.repeat(32)}`;
    expect(await fence.claim({ sessionId: s, token: 'live', runnerId: 'r1', attempt: 1, runId: 'run_1' }, 60_000)).toBe('ok');
    // A fence that expired (a claim whose time is already past) is not released by the check.
    expect(await fence.claim({ sessionId: s, token: 'expired', runnerId: 'r1', attempt: 1, runId: 'run_2' }, -1_000)).toBe('ok');
    expect(await fence.releaseLive(s, 'live')).toBe(true);
    expect(await fence.holds(s, 'live')).toBe(false);
    expect(await fence.current(s, 'run_1')).toEqual({});
    expect(await log.append(s, [{ type: 'a', payload: {} }], { fence: 'live' })).toMatchObject({ ok: false, reason: 'fenced' });
    expect(await fence.releaseLive(s, 'live')).toBe(false);
    expect(await fence.releaseLive(s, 'expired')).toBe(false);
    expect(await fence.current(s, 'run_2')).toMatchObject({ token: 'expired', run_id: 'run_2' });
    expect(await fence.releaseLive(s, 'never-claimed')).toBe(false);
  });
});
