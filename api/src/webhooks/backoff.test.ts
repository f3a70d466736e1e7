import { describe, expect, it } from 'vitest';
import { nextAttemptDelay, parseHttpDate, parseRetryAfter, retryDelay, RETRY_AFTER_MAX_MS, throttleDelay } from './delivery.js';
import { turnEnd } from '../automations/service.js';

describe('delivery retry backoff', () => {
  it('doubles from the base, stays within [d/2, d] and is capped', () => {
    expect([1, 2, 3, 4].map((n) => retryDelay(n, 1000, 60_000, 1))).toEqual([1000, 2000, 4000, 8000]);
    expect([1, 2, 3, 4].map((n) => retryDelay(n, 1000, 60_000, 0))).toEqual([500, 1000, 2000, 4000]);
    expect(retryDelay(30, 1000, 60_000, 1)).toBe(60_000);
    for (let i = 0; i < 100; i++) {
      const d = retryDelay(3, 1000, 60_000);
      expect(d).toBeGreaterThanOrEqual(2000);
      expect(d).toBeLessThanOrEqual(4000);
    }
  });
});

describe('Retry-After of a throttled answer', () => {
  const now = Date.UTC(1994, 10, 6, 8, 49, 30);
  it('reads delay-seconds and the three HTTP date forms; a date already past is 0', () => {
    expect(parseRetryAfter('2', now)).toBe(2000);
    expect(parseRetryAfter(' 0 ', now)).toBe(0);
    expect(parseRetryAfter('Sun, 06 Nov 1994 08:49:37 GMT', now)).toBe(7000);
    expect(parseRetryAfter('Sunday, 06-Nov-94 08:49:37 GMT', now)).toBe(7000);
    expect(parseRetryAfter('Sun Nov  6 08:49:37 1994', now)).toBe(7000);
    expect(parseRetryAfter('Sun, 06 Nov 1994 08:49:00 GMT', now)).toBe(0);
    expect(parseHttpDate('Thu, 01 Jan 2037 00:00:00 GMT')).toBe(Date.UTC(2037, 0, 1));
  });

  it('is null when absent or malformed', () => {
    for (const v of [undefined, '', ' ', '1.5', '-1', '+3', '1e2', '0x20', '30 seconds', 'soon', 'Sun, 31 Apr 1994 08:49:37 GMT', 'Sun, 06 Nov 1994 25:00:00 GMT',
      'Sun, 06 Nov 1994 08:49:37 UTC', '1994-11-06T08:49:37Z', 'Sun, 6 Nov 1994 08:49:37 GMT']) {
      expect([v, parseRetryAfter(v, now)]).toEqual([v, null]);
    }
  });

  it('counts only on 429 and 503, capped at the maximum; the next attempt waits the longer of it and the backoff', () => {
    expect(throttleDelay(429, '2', now)).toBe(2000);
    expect(throttleDelay(503, '2', now)).toBe(2000);
    for (const status of [200, 410, 500, 502, 504]) expect(throttleDelay(status, '2', now)).toBeNull();
    expect(throttleDelay(429, '999999999999999999999', now)).toBe(RETRY_AFTER_MAX_MS);
    expect(throttleDelay(429, 'Fri, 31 Dec 9999 23:59:59 GMT', now)).toBe(RETRY_AFTER_MAX_MS);
    expect(throttleDelay(429, 'later', now)).toBeNull();
    expect(nextAttemptDelay(1, 1000, 60_000, 5000, 1)).toBe(5000);
    expect(nextAttemptDelay(4, 1000, 60_000, 5000, 1)).toBe(8000);
    expect(nextAttemptDelay(1, 1000, 60_000, null, 1)).toBe(1000);
    expect(nextAttemptDelay(1, 1000, 60_000, 0, 1)).toBe(1000);
  });
});

describe('what ends a firing\'s turn', () => {
  it('maps stop reasons to outcomes; requires_action is not an end', () => {
    expect(turnEnd('session.status_idle', { stop_reason: { type: 'end_turn' } })).toEqual({ outcome: 'succeeded', stop: 'end_turn' });
    expect(turnEnd('session.status_idle', { stop_reason: { type: 'requires_action', tool_use_ids: [] } })).toBeNull();
    expect(turnEnd('session.status_idle', { stop_reason: { type: 'retries_exhausted' } })).toEqual({ outcome: 'failed', stop: 'retries_exhausted' });
    expect(turnEnd('session.status_idle', { stop_reason: { type: 'interrupted' } })).toEqual({ outcome: 'canceled', stop: 'interrupted' });
    expect(turnEnd('session.status_failed', {})).toEqual({ outcome: 'failed', stop: 'failed' });
    expect(turnEnd('agent.message', {})).toBeNull();
  });
});
