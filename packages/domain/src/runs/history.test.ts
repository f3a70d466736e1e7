import { describe, expect, it } from 'vitest';
import type { LogEvent } from '@agentplane/store';
import { conversationOf } from './history.js';

let seq = 0;
const ev = (type: string, payload: Record<string, unknown>, id = `evt_${++seq}`): LogEvent => ({
  id, seq, created_at: '2026-01-01T00:00:00.000Z', session_id: 'sess_1', session_thread_id: 'th_1', type, payload,
});
const texts = (events: LogEvent[], queued: string[] = []) =>
  conversationOf(events, 'th_1', true, new Set(queued)).history.map((m) => `${m.role}: ${m.content.map((b) => (b.type === 'text' ? b.text : b.type)).join('|')}`);

describe('conversationOf', () => {
  it('puts a message sent during a turn where the turn that takes it starts, and leaves out one still queued', () => {
    const first = ev('user.message', { content: 'first' });
    const second = ev('user.message', { content: 'second' });
    const third = ev('user.message', { content: 'third' });
    const log = [
      first, ev('session.status_running', { run_id: 'run_1', input_event_ids: [first.id] }),
      second,
      ev('agent.message', { content: [{ type: 'text', text: 'echo first' }] }), ev('session.status_idle', { stop_reason: { type: 'end_turn' } }),
      ev('session.status_running', { run_id: 'run_2', input_event_ids: [second.id] }),
      third,
    ];
    expect(texts(log.slice(0, 5), [second.id])).toEqual(['user: first', 'assistant: echo first']);
    expect(texts(log, [third.id])).toEqual(['user: first', 'assistant: echo first', 'user: second']);
  });

  it('keeps a log written before turn starts named their inputs as it is', () => {
    const log = [ev('user.message', { content: 'a' }), ev('session.status_running', { run_id: 'run_1' }), ev('agent.message', { content: 'b' })];
    expect(texts(log)).toEqual(['user: a', 'assistant: b']);
  });
});
