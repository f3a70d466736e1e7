/**
 * Health endpoints while Redis does not answer (the embedded redis-server stopped with SIGSTOP):
 * `/metrics` still answers, at once, with `agentplane_redis_up 0` (the alert on it can fire), and
 * `/readyz` answers 503 naming Redis, on the API and the scheduler, while `/healthz` (liveness)
 * stays 200; once Redis answers again `/readyz` is 200.
 */
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { freePort } from '@agentplane/store';
import { startPlatform, type Platform } from './harness/platform.js';

let p: Platform;
let scheduler: string;

beforeAll(async () => {
  const port = await freePort();
  p = await startPlatform({ scheduler: true, env: { SCHEDULER_PORT: String(port) } });
  scheduler = `http://127.0.0.1:${port}`;
}, 120_000);
afterAll(async () => {
  const redis = p?.pids().redis;
  if (redis) try { process.kill(redis, 'SIGCONT'); } catch { /* gone */ }
  await p?.stop();
});

/** Status, body and time of a GET that must answer within `ms`. */
async function probe(url: string, ms = 5000): Promise<{ status: number; text: string; ms: number }> {
  const t0 = Date.now();
  const r = await fetch(url, { signal: AbortSignal.timeout(ms) });
  return { status: r.status, text: await r.text(), ms: Date.now() - t0 };
}

async function until<T>(what: string, fn: () => Promise<T | undefined>, timeoutMs = 30_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn();
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

describe('Redis that does not answer', () => {
  it('/metrics answers promptly with agentplane_redis_up 0 and /readyz is 503 (API and scheduler); both recover', async () => {
    // The scheduler process listens shortly after the API answers.
    await until('the scheduler listening', () => probe(`${scheduler}/healthz`).then((r) => (r.status === 200 ? true : undefined), () => undefined));
    for (const base of [p.baseUrl, scheduler]) {
      const ready = await probe(`${base}/readyz`);
      expect([base, ready.status, JSON.parse(ready.text)]).toEqual([base, 200, { status: 'ready' }]);
    }
    expect((await probe(`${p.baseUrl}/metrics`)).text).toMatch(/^agentplane_redis_up 1$/m);
    // Unauthenticated, like /healthz.
    expect((await fetch(`${p.baseUrl}/readyz`, { headers: { authorization: 'Bearer nonsense' } })).status).toBe(200);

    const redis = p.pids().redis;
    expect(redis).toBeTruthy();
    process.kill(redis as number, 'SIGSTOP');
    try {
      const [metrics, apiReady, apiLive, schedReady, schedLive, schedMetrics] = await Promise.all([
        probe(`${p.baseUrl}/metrics`),
        probe(`${p.baseUrl}/readyz`),
        probe(`${p.baseUrl}/healthz`),
        probe(`${scheduler}/readyz`),
        probe(`${scheduler}/healthz`),
        probe(`${scheduler}/metrics`),
      ]);
      expect(metrics.status).toBe(200);
      expect(metrics.text).toMatch(/^agentplane_redis_up 0$/m);
      expect(metrics.ms).toBeLessThan(4000);
      expect([apiReady.status, JSON.parse(apiReady.text)]).toEqual([503, { status: 'not_ready', not_ready: ['redis'] }]);
      expect(apiLive.status).toBe(200);
      expect(schedReady.status).toBe(503);
      expect(JSON.parse(schedReady.text)).toMatchObject({ status: 'not_ready', not_ready: expect.arrayContaining(['redis']) });
      expect(schedLive.status).toBe(200);
      expect(schedMetrics.status).toBe(200);
      // A second scrape while Redis is still stopped is not held up by the first one's INFO.
      const again = await probe(`${p.baseUrl}/metrics`);
      expect(again.text).toMatch(/^agentplane_redis_up 0$/m);
    } finally {
      process.kill(redis as number, 'SIGCONT');
    }
    for (const base of [p.baseUrl, scheduler]) {
      await until(`${base}/readyz 200`, async () => ((await probe(`${base}/readyz`)).status === 200 ? true : undefined));
    }
    await until('agentplane_redis_up 1', async () => (/^agentplane_redis_up 1$/m.test((await probe(`${p.baseUrl}/metrics`)).text) ? true : undefined));
  }, 120_000);
});
