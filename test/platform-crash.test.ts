import { afterAll, describe, expect, it } from 'vitest';
import { rmSync } from 'node:fs';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { killWholePlatform, startToolCallTurn, waitThreadEvents } from './harness/whole-crash.js';

/**
 * A whole-platform crash: every process (platform supervisor, embedded Redis, API, scheduler,
 * local runner) killed with SIGKILL mid-Run, then `npm start` again on the same data. The lease
 * lasts 60 s here, so only the restarted runner's report (it holds no lease any more) can get the
 * interrupted Run rescheduled within the test's bound; it then completes exactly once.
 */
const ENV = { LEASE_MS: '60000', RUN_BACKOFF_MS: '100', RUNNER_HEARTBEAT_INTERVAL_MS: '1000' };

let first: Platform | undefined;
let second: Platform | undefined;
afterAll(async () => {
  await second?.stop();
  if (first) rmSync(first.dataDir, { recursive: true, force: true });
});

describe('whole-platform crash', () => {
  it('kill -9 of every process mid-Run, then a restart on the same data: the Run is rescheduled within seconds of the runner reconnecting and completes once', async () => {
    first = await startPlatform({ runner: true, scheduler: true, env: ENV });
    const p = first;
    const sessionId = await startToolCallTurn(p, 3);
    // Everything dies at once, the supervisor first so that it restarts nothing.
    await killWholePlatform(p);

    second = await startPlatform({ runner: true, scheduler: true, env: ENV, dataDir: p.dataDir, port: p.port });
    const api = second.root;
    const runner = await waitFor('the local runner back', async () => {
      const ready = (await api.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data.find((x) => x.status === 'ready');
      return ready ? Date.now() : undefined;
    }, 60_000);
    const resched = await waitThreadEvents(api, sessionId, (e) => e.some((x) => x.type === 'session.thread_status_rescheduled'), 30_000);
    // Far inside the 60 s lease: only the runner's report on reconnect could have ended it.
    expect(Date.now() - runner).toBeLessThan(20_000);
    expect(resched.filter((e) => e.type === 'session.thread_status_rescheduled')).toHaveLength(1);

    const evs = await waitThreadEvents(api, sessionId, (e) => e.some((x) => x.type === 'session.status_idle'), 60_000);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message'))).toContain('finished');
    const seqs = evs.map((e) => e.seq);
    expect(new Set(seqs).size).toBe(seqs.length);
    expect(seqs).toEqual([...seqs].sort((a, b) => a - b));
    const runs = (await api.get<{ data: { id: string; status: string; attempts: { attempt: number; outcome: string }[] }[] }>(`/v1/sessions/${sessionId}/runs`)).data;
    expect(runs).toHaveLength(1);
    expect(runs[0]?.status).toBe('succeeded');
    expect(runs[0]?.attempts.map((a) => a.outcome)).toEqual(['lost', 'succeeded']);
    // The retried attempt's start says the thread runs again, once, naming the Run and the attempt.
    const running = evs.filter((e) => e.type === 'session.status_running');
    expect(running.map((e) => e.payload)).toEqual([expect.objectContaining({ run_id: runs[0]?.id }), { run_id: runs[0]?.id, attempt: runs[0]?.attempts[1]?.attempt }]);
    const rescheduledAt = evs.find((e) => e.type === 'session.thread_status_rescheduled')?.seq ?? 0;
    expect(running[1]?.seq).toBeGreaterThan(rescheduledAt);
  }, 240_000);
});
