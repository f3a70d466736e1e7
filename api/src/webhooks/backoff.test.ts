import { describe, expect, it } from 'vitest';
import { retryDelay } from './delivery.js';
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
