import { describe, expect, it } from 'vitest';
import { terminalEvent } from './closing.js';
import type { ThreadDoc } from './model.js';

const primary = (over: Partial<ThreadDoc>): ThreadDoc => ({
  id: 'sthr_1', type: 'session_thread', session_id: 'sess_1', workspace_id: 'wrks_1', agent: {} as ThreadDoc['agent'], parent_thread_id: null,
  status: 'idle', archived_at: null, _spawn: 0, _active_run_id: null, _wait_generation: 0, _waits: {}, _running_since_ms: null,
  _running_ms_total: 0, _startup_ms: null, _frozen_stats: null, _stop_reason: null, version: 1, created_at: '', updated_at: '', ...over,
});

describe('terminalEvent', () => {
  it.each([
    [{ _stop_reason: null }, 'session.status_completed'],
    [{ _stop_reason: { type: 'end_turn' } }, 'session.status_completed'],
    [{ _stop_reason: { type: 'interrupted' } }, 'session.status_canceled'],
    [{ _stop_reason: { type: 'requires_action' } }, 'session.status_canceled'],
    [{ _stop_reason: { type: 'retries_exhausted' } }, 'session.status_failed'],
    [{ _stop_reason: { type: 'budget_exceeded' } }, 'session.status_failed'],
    [{ _stop_reason: { type: 'max_duration' } }, 'session.status_failed'],
    [{ status: 'terminated' as const, _stop_reason: { type: 'end_turn' } }, 'session.status_failed'],
  ])('%j ends the Session with %s', (over, type) => {
    const e = terminalEvent(primary(over));
    expect(e.type).toBe(type);
    expect(e.payload).toEqual({ stop_reason: over._stop_reason });
    expect(e.session_thread_id).toBeNull();
  });

  it('a Session without a primary thread found ends completed, with no stop reason', () => {
    expect(terminalEvent(undefined)).toMatchObject({ type: 'session.status_completed', payload: { stop_reason: null } });
  });
});
