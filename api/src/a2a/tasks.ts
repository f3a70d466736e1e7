/**
 * One A2A task is one Session: its state, history and artifacts are read from the Session's
 * event log (docs/A2A.md, "Tasks are Sessions"). Pure functions over log events.
 */
import { Role, TaskState, type Artifact, type Message, type Part, type Task, type TaskArtifactUpdateEvent, type TaskStatusUpdateEvent } from '@a2a-js/sdk';
import type { LogEvent } from '@agentplane/store';

/** States after which a blocking SendMessage returns: terminal, or interrupted (waiting on the caller). */
export const TERMINAL_STATES: ReadonlySet<TaskState> = new Set([
  TaskState.TASK_STATE_COMPLETED, TaskState.TASK_STATE_FAILED, TaskState.TASK_STATE_CANCELED, TaskState.TASK_STATE_REJECTED,
]);
export const INTERRUPTED_STATES: ReadonlySet<TaskState> = new Set([TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED]);
export const settles = (s: TaskState): boolean => TERMINAL_STATES.has(s) || INTERRUPTED_STATES.has(s);

type Payload = Record<string, unknown>;

/** The text of a `content` field: a string, or text blocks. */
export function textOf(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content.map((b) => (typeof b === 'object' && b !== null && typeof (b as Payload).text === 'string' ? (b as Payload).text as string : '')).join('');
  }
  return '';
}

export const textPart = (text: string): Part => ({ content: { $case: 'text', value: text }, metadata: undefined, filename: '', mediaType: 'text/plain' });

/** The state one status-bearing event moves the task to (null: the event does not move it). */
export function stateAfter(e: LogEvent): TaskState | null {
  const p = (e.payload ?? {}) as Payload;
  switch (e.type) {
    case 'session.status_running':
      return TaskState.TASK_STATE_WORKING;
    case 'session.status_idle': {
      const stop = (p.stop_reason ?? {}) as Payload;
      switch (stop.type) {
        case 'end_turn': return TaskState.TASK_STATE_COMPLETED;
        case 'requires_action': return TaskState.TASK_STATE_INPUT_REQUIRED;
        case 'interrupted': return TaskState.TASK_STATE_CANCELED;
        default: return TaskState.TASK_STATE_FAILED;
      }
    }
    case 'session.status_completed': return TaskState.TASK_STATE_COMPLETED;
    case 'session.status_failed': return TaskState.TASK_STATE_FAILED;
    case 'session.status_canceled': return TaskState.TASK_STATE_CANCELED;
    case 'session.thread_status_terminated': return TaskState.TASK_STATE_FAILED;
    default: return null;
  }
}

/**
 * Follows a Session's log and keeps the task's state. A user.message after a settled turn starts
 * the next one: the task is `submitted` until that turn runs. Messages queued while a turn runs
 * are taken by the next turn, so a turn that ends with messages still queued does not settle it.
 */
/** A blocking tool use of the task's turn: what `INPUT_REQUIRED` waits on. */
export interface WaitingUse {
  id: string;
  name: string;
  input: unknown;
  /** What answers it: `question_answer`, `custom_tool_result` or `tool_confirmation`. */
  awaiting: string;
}

/** The answers a drive event gives a blocking use, as the text the task's history shows. */
const ANSWER_TYPES: ReadonlySet<string> = new Set(['user.question_answer', 'user.custom_tool_result']);

export class TaskTracker {
  state: TaskState = TaskState.TASK_STATE_SUBMITTED;
  timestamp: string | undefined;
  /** Messages sent since the last turn started. */
  private pending = 0;
  /** The blocking uses of the turn under way (cleared when a turn starts or continues). */
  waiting: WaitingUse[] = [];
  readonly history: Message[] = [];
  readonly artifacts: Artifact[] = [];
  lastAgentMessage: Message | undefined;

  constructor(readonly taskId: string, readonly primaryThreadId: string | null) {}

  /** Applies one event; returns what a stream shows for it (nothing for events it does not show). */
  apply(e: LogEvent): Array<{ kind: 'status'; value: TaskStatusUpdateEvent } | { kind: 'artifact'; value: TaskArtifactUpdateEvent }> {
    // Child threads (a coordinator's roster) are the agent's own business; the task is the primary thread.
    if (this.primaryThreadId !== null && e.session_thread_id !== null && e.session_thread_id !== this.primaryThreadId) return [];
    const p = (e.payload ?? {}) as Payload;
    const out: ReturnType<TaskTracker['apply']> = [];
    if (e.type === 'user.message') {
      // An A2A message carries its messageId as `caused_by.id`; other drive events keep their event id.
      const cause = (p.caused_by ?? {}) as Payload;
      const messageId = cause.kind === 'a2a' && typeof cause.id === 'string' ? cause.id : e.id;
      this.history.push(this.message(messageId, Role.ROLE_USER, textOf(p.content)));
      this.pending += 1;
      if (settles(this.state)) {
        this.state = TaskState.TASK_STATE_SUBMITTED;
        this.timestamp = e.created_at;
        out.push({ kind: 'status', value: this.statusEvent() });
      }
      return out;
    }
    if (ANSWER_TYPES.has(e.type)) {
      // An answer to a blocking use, shown as what the user said (an A2A reply carries its messageId).
      const cause = (p.caused_by ?? {}) as Payload;
      const messageId = cause.kind === 'a2a' && typeof cause.id === 'string' ? cause.id : e.id;
      this.history.push(this.message(messageId, Role.ROLE_USER, answerText(e.type, p)));
      // The last input the turn waited on: it continues (submitted until its next Run starts).
      const before = this.waiting.length;
      this.waiting = this.waiting.filter((w) => w.id !== p.tool_use_id);
      if (this.state === TaskState.TASK_STATE_INPUT_REQUIRED && before > 0 && this.waiting.length === 0) {
        this.state = TaskState.TASK_STATE_SUBMITTED;
        this.timestamp = e.created_at;
        out.push({ kind: 'status', value: this.statusEvent() });
      }
      return out;
    }
    if (e.type === 'agent.tool_use') {
      if (p.blocking === true && typeof p.awaiting === 'string' && typeof p.id === 'string') {
        this.waiting.push({ id: p.id, name: typeof p.name === 'string' ? p.name : '', input: p.input, awaiting: p.awaiting });
      }
      return out;
    }
    if (e.type === 'agent.message') {
      const text = textOf(p.content);
      const m = this.message(e.id, Role.ROLE_AGENT, text);
      this.history.push(m);
      this.lastAgentMessage = m;
      const artifact: Artifact = { artifactId: e.id, name: 'response', description: '', parts: [textPart(text)], metadata: undefined, extensions: [] };
      this.artifacts.push(artifact);
      out.push({ kind: 'artifact', value: { taskId: this.taskId, contextId: this.taskId, artifact, append: false, lastChunk: true, metadata: undefined } });
      return out;
    }
    let next = stateAfter(e);
    if (next === null) return out;
    // A turn's start takes the messages sent before it; a later attempt of the same turn
    // (`attempt` set: the one before was lost) takes none.
    if (e.type === 'session.status_running') {
      if (p.attempt === undefined) this.pending = 0;
      this.waiting = [];
    } else if (this.pending > 0 && next !== TaskState.TASK_STATE_FAILED) next = TaskState.TASK_STATE_SUBMITTED;
    if (next === this.state) return out;
    this.state = next;
    this.timestamp = e.created_at;
    out.push({ kind: 'status', value: this.statusEvent() });
    return out;
  }

  /** Messages queued behind the turn under way (they start the next turn when it ends). */
  get queued(): number {
    return this.state === TaskState.TASK_STATE_WORKING ? this.pending : 0;
  }

  private message(messageId: string, role: Role, text: string): Message {
    return { messageId, contextId: this.taskId, taskId: this.taskId, role, parts: [textPart(text)], metadata: undefined, extensions: [], referenceTaskIds: [] };
  }

  private statusMessage(): Message | undefined {
    // Input required: what the agent asks for, and how a reply is taken.
    if (this.state === TaskState.TASK_STATE_INPUT_REQUIRED && this.waiting.length > 0) {
      return this.message(`input-${this.waiting[0]?.id ?? ''}`, Role.ROLE_AGENT, this.waiting.map(describeWait).join('\n'));
    }
    return TERMINAL_STATES.has(this.state) || INTERRUPTED_STATES.has(this.state) ? this.lastAgentMessage : undefined;
  }

  statusEvent(): TaskStatusUpdateEvent {
    return { taskId: this.taskId, contextId: this.taskId, status: { state: this.state, message: this.statusMessage(), timestamp: this.timestamp }, metadata: undefined };
  }

  /** The task as GetTask returns it; `historyLength` as A2A defines it (absent: all, 0: none, n: the last n). */
  task(historyLength?: number): Task {
    const history = historyLength === undefined ? [...this.history] : historyLength <= 0 ? [] : this.history.slice(-historyLength);
    return {
      id: this.taskId, contextId: this.taskId,
      status: { state: this.state, message: this.statusMessage(), timestamp: this.timestamp },
      artifacts: [...this.artifacts], history, metadata: undefined,
    };
  }
}

/** An answer drive event's text (a question's answers, a custom tool's result). */
function answerText(type: string, p: Payload): string {
  if (type === 'user.question_answer') {
    if (p.declined === true) return typeof p.reason === 'string' ? `(declined: ${p.reason})` : '(declined)';
    const answers = Array.isArray(p.answers) ? p.answers as Payload[] : [];
    return answers.map((a) => [...(Array.isArray(a.selected) ? a.selected.map(String) : []), ...(typeof a.text === 'string' ? [a.text] : [])].join(', ')).join('\n');
  }
  return typeof p.result === 'string' ? p.result : textOf(p.result) || JSON.stringify(p.result ?? null);
}

/** The questions of an `ask_user` use (their text), or null when its input has none. */
export function questionsOf(input: unknown): string[] | null {
  const qs = typeof input === 'object' && input !== null ? (input as Payload).questions : undefined;
  if (!Array.isArray(qs)) return null;
  return qs.map((q) => (typeof q === 'object' && q !== null && typeof (q as Payload).question === 'string' ? (q as Payload).question as string : ''));
}

/** What a blocking use asks the task's client, as the status message's text says it. */
function describeWait(w: WaitingUse): string {
  if (w.awaiting === 'question_answer') return (questionsOf(w.input) ?? []).join('\n');
  if (w.awaiting === 'custom_tool_result') return `The agent calls ${w.name} with ${JSON.stringify(w.input ?? null).slice(0, 2000)}: reply with its result.`;
  return `The agent waits for a confirmation of ${w.name}, which is given outside A2A (or CancelTask ends the task).`;
}
