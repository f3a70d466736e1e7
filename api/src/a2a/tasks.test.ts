import { describe, expect, it } from 'vitest';
import { TaskState } from '@a2a-js/sdk';
import type { LogEvent } from '@agentplane/store';
import { TaskTracker } from './tasks.js';

const T = 'sess_00000000000000000000000000000001';
const PRIMARY = 'sthr_00000000000000000000000000000001';
let seq = 0;
const ev = (type: string, payload: unknown = {}, thread: string | null = PRIMARY): LogEvent => ({
  id: `evt_${String(++seq).padStart(32, '0')}`, seq, created_at: new Date(1_700_000_000_000 + seq).toISOString(),
  session_id: T, session_thread_id: thread, type, payload,
});
const user = (text: string, id?: string) => ev('user.message', { content: text, authored_by: 'prin_x', caused_by: id ? { kind: 'a2a', id } : { kind: 'api' } });
const idle = (type: string) => ev('session.status_idle', { stop_reason: { type } });

function run(events: LogEvent[]): TaskTracker {
  const t = new TaskTracker(T, PRIMARY);
  for (const e of events) t.apply(e);
  return t;
}

describe('TaskTracker: a Session log as an A2A task', () => {
  it('submitted → working → completed, with history and one artifact per agent message', () => {
    const t = new TaskTracker(T, PRIMARY);
    expect(t.apply(user('hi', 'm1'))).toEqual([]);
    expect(t.state).toBe(TaskState.TASK_STATE_SUBMITTED);
    expect(t.apply(ev('session.status_running', { run_id: 'run_x' }))[0]?.value).toMatchObject({ status: { state: TaskState.TASK_STATE_WORKING } });
    const art = t.apply(ev('agent.message', { content: [{ type: 'text', text: 'hello' }] }));
    expect(art[0]).toMatchObject({ kind: 'artifact', value: { taskId: T, contextId: T, lastChunk: true, artifact: { parts: [{ content: { $case: 'text', value: 'hello' }, mediaType: 'text/plain' }] } } });
    const done = t.apply(idle('end_turn'));
    expect(done[0]?.value).toMatchObject({ status: { state: TaskState.TASK_STATE_COMPLETED, message: { parts: [{ content: { value: 'hello' } }] } } });
    const task = t.task();
    expect(task.history.map((m) => [m.role, m.messageId])).toEqual([[1, 'm1'], [2, task.artifacts[0]?.artifactId]]);
    expect(t.task(0).history).toEqual([]);
    expect(t.task(1).history).toHaveLength(1);
  });

  it('maps the stop reasons: requires_action → input required, interrupted → canceled, others → failed', () => {
    expect(run([user('a'), ev('session.status_running'), idle('requires_action')]).state).toBe(TaskState.TASK_STATE_INPUT_REQUIRED);
    expect(run([user('a'), ev('session.status_running'), idle('interrupted')]).state).toBe(TaskState.TASK_STATE_CANCELED);
    expect(run([user('a'), ev('session.status_running'), idle('retries_exhausted')]).state).toBe(TaskState.TASK_STATE_FAILED);
    expect(run([user('a'), ev('session.status_running'), ev('session.thread_status_terminated', { reason: 'x' })]).state).toBe(TaskState.TASK_STATE_FAILED);
  });

  it('a message after a settled turn reopens the task; one queued during a turn keeps it from settling', () => {
    const t = run([user('a'), ev('session.status_running'), idle('end_turn')]);
    const reopened = t.apply(user('b'));
    expect(reopened[0]?.value).toMatchObject({ status: { state: TaskState.TASK_STATE_SUBMITTED } });
    const q = run([user('a'), ev('session.status_running'), user('queued'), idle('end_turn')]);
    expect(q.state).toBe(TaskState.TASK_STATE_SUBMITTED);
    q.apply(ev('session.status_running'));
    q.apply(idle('end_turn'));
    expect(q.state).toBe(TaskState.TASK_STATE_COMPLETED);
  });

  it('a retried attempt of a turn (its running status names the attempt) does not take the messages queued behind the turn', () => {
    const t = run([user('a'), ev('session.status_running', { run_id: 'run_x' }), user('queued'), ev('session.thread_status_rescheduled', { run_id: 'run_x', attempt: 1, cause: 'lost' })]);
    expect(t.apply(ev('session.status_running', { run_id: 'run_x', attempt: 2 }))).toEqual([]);
    expect(t.state).toBe(TaskState.TASK_STATE_WORKING);
    t.apply(idle('end_turn'));
    expect(t.state).toBe(TaskState.TASK_STATE_SUBMITTED);
  });

  it('ignores child threads of a coordinator', () => {
    const t = run([user('a'), ev('session.status_running'), ev('agent.message', { content: 'child' }, 'sthr_child'), idle('end_turn')]);
    expect(t.task().artifacts).toEqual([]);
    expect(t.state).toBe(TaskState.TASK_STATE_COMPLETED);
  });
});
