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

  it('answers a tool use its turn ended without (a lost runner, then an interrupt), before the next message; a wait is left to its answers', () => {
    const msg = ev('user.message', { content: 'run it' });
    const next = ev('user.message', { content: 'again' });
    const log = [
      msg, ev('session.status_running', { run_id: 'run_1', input_event_ids: [msg.id] }),
      ev('agent.tool_use', { id: 'toolu_lost', name: 'bash', input: {} }),
      ev('session.status_idle', { stop_reason: { type: 'interrupted' } }),
      next, ev('session.status_running', { run_id: 'run_2', input_event_ids: [next.id] }),
      ev('agent.tool_use', { id: 'toolu_wait', name: 'lookup', input: {} }),
      ev('session.status_idle', { stop_reason: { type: 'requires_action', tool_use_ids: ['toolu_wait'] } }),
    ];
    expect(texts(log)).toEqual(['user: run it', 'assistant: tool_use', 'user: tool_result|again', 'assistant: tool_use']);
    const closed = conversationOf(log, 'th_1', true).history[2]?.content[0];
    expect(closed).toMatchObject({ type: 'tool_result', tool_use_id: 'toolu_lost', is_error: true, content: expect.stringContaining('interrupted') });
  });

  it('keeps a message\'s text blocks apart, and a tool result\'s a line apart', () => {
    const msg = ev('user.message', { content: [{ type: 'text', text: 'Hello' }, { type: 'text', text: 'World' }] });
    const log = [
      msg, ev('session.status_running', { run_id: 'run_1', input_event_ids: [msg.id] }),
      ev('agent.message', { content: [{ type: 'text', text: 'one' }, { type: 'text', text: 'two' }] }),
      ev('agent.tool_use', { id: 'toolu_1', name: 'bash', input: {} }),
      ev('agent.tool_result', { tool_use_id: 'toolu_1', content: [{ type: 'text', text: 'out' }, { type: 'text', text: 'err' }] }),
    ];
    expect(texts(log)).toEqual(['user: Hello|World', 'assistant: one|two|tool_use', 'user: tool_result']);
    const result = conversationOf(log, 'th_1', true).history[2]?.content[0];
    expect(result).toMatchObject({ type: 'tool_result', content: 'out\nerr' });
  });

  it('reads an evaluation as a revision request only when it starts the revision turn', () => {
    const define = ev('user.define_outcome', { description: 'Write it.' });
    const evaluation = (iteration: number, revisions: number) =>
      ev('session.outcome_evaluation_ended', { result: 'needs_revision', iteration, evaluation_count: iteration, revision_count: revisions, explanation: `fix ${iteration}` });
    const first = evaluation(1, 1);
    const last = evaluation(2, 1);
    const hello = ev('user.message', { content: 'hello' });
    const log = [
      define, ev('session.status_running', { run_id: 'run_1', input_event_ids: [define.id] }),
      ev('agent.message', { content: 'draft 1' }), ev('session.status_idle', { stop_reason: { type: 'end_turn' } }),
      first, ev('session.status_running', { run_id: 'run_2', input_event_ids: [first.id] }),
      ev('agent.message', { content: 'draft 2' }), ev('session.status_idle', { stop_reason: { type: 'end_turn' } }),
      // The last evaluation of an outcome that ran out of iterations: no turn takes it.
      last, ev('session.outcome_ended', { result: 'max_iterations_reached' }),
      hello, ev('session.status_running', { run_id: 'run_3', input_event_ids: [hello.id] }),
    ];
    expect(texts(log)).toEqual([
      'user: Write it.', 'assistant: draft 1', 'user: The outcome grader asks for a revision (evaluation 1):\nfix 1', 'assistant: draft 2', 'user: hello',
    ]);
    // A revision still waiting in the thread's queue is not part of the conversation yet.
    expect(texts(log.slice(0, 5), [first.id])).toEqual(['user: Write it.', 'assistant: draft 1']);
  });

  it('keeps a log written before turn starts named their inputs as it is', () => {
    const log = [ev('user.message', { content: 'a' }), ev('session.status_running', { run_id: 'run_1' }), ev('agent.message', { content: 'b' })];
    expect(texts(log)).toEqual(['user: a', 'assistant: b']);
    const revision = [
      ev('user.define_outcome', { description: 'd' }), ev('session.status_running', { run_id: 'run_1' }), ev('agent.message', { content: 'one' }),
      ev('session.outcome_evaluation_ended', { result: 'needs_revision', iteration: 1, explanation: 'more' }), ev('session.status_running', { run_id: 'run_2' }),
    ];
    expect(texts(revision)).toEqual(['user: d', 'assistant: one', 'user: The outcome grader asks for a revision (evaluation 1):\nmore']);
  });
});
