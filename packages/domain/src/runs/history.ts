import type { ContentBlock, ModelMessage } from '@agentplane/protocol';
import type { EventLog, LogEvent } from '@agentplane/store';

/** Answers to blocking tool uses, collected from drive events. */
export interface Responses {
  custom_tool_results: Record<string, { content: string; is_error?: boolean }>;
  confirmations: Record<string, 'allow' | 'deny'>;
  /** `user.question_answer`: the answers (or the decline) as the model reads them. */
  question_answers: Record<string, { content: string }>;
}

type Payload = Record<string, unknown>;

const blockTexts = (content: unknown[]): string[] =>
  content.flatMap((b) => (b && typeof b === 'object' && typeof (b as Payload).text === 'string' ? [(b as Payload).text as string] : []));

/** Content as one string (a tool result's): text blocks a line apart, never run together. */
const textOf = (content: unknown): string => {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return blockTexts(content).join('\n');
  if (content && typeof content === 'object') return JSON.stringify(content);
  return '';
};

/** A message's content as text blocks: one per block it was written with. */
const textBlocksOf = (content: unknown): ContentBlock[] => {
  const texts = Array.isArray(content) ? blockTexts(content) : [textOf(content)];
  return (texts.length > 0 ? texts : ['']).map((text) => ({ type: 'text', text }));
};

/** A `user.question_answer` as the agent reads it: one line per answer, or the decline. */
export function questionAnswerText(p: Payload): string {
  if (p.declined === true) return `The user declined to answer${typeof p.reason === 'string' && p.reason ? `: ${p.reason}` : '.'}`;
  const answers = Array.isArray(p.answers) ? (p.answers as Payload[]) : [];
  const lines = answers.map((a, i) => {
    const parts: string[] = [];
    if (Array.isArray(a.selected) && a.selected.length > 0) parts.push((a.selected as unknown[]).map(String).join(', '));
    if (typeof a.text === 'string') parts.push(a.selected ? `other: ${a.text}` : a.text);
    return `${i + 1}. ${parts.join('; ')}`;
  });
  return `The user answered:\n${lines.join('\n')}`;
}

/**
 * The model conversation of one thread, rebuilt from its event log: user messages, the agent's
 * messages and tool uses, tool results. Blocking tool uses answered by drive events come back as
 * `responses` for the harness to resolve (execute a confirmed tool, pass a custom result on).
 *
 * A message sent while a turn ran is in the log where it arrived, but it is the input of a later
 * turn: it goes where that turn starts (the `session.status_running` naming it among its
 * `input_event_ids`), after the earlier turn's answer, never inside it. `queued`: messages still
 * waiting in the thread's input queue for a turn not started yet: not in this conversation at
 * all. (A log written before turn starts named their inputs keeps each message where it is.)
 */
export function conversationOf(
  events: readonly LogEvent[], threadId: string, isPrimary: boolean, queued: ReadonlySet<string> = new Set(),
): { history: ModelMessage[]; responses: Responses } {
  const history: ModelMessage[] = [];
  const responses: Responses = { custom_tool_results: {}, confirmations: {}, question_answers: {} };
  const push = (role: 'user' | 'assistant', block: ContentBlock) => {
    const last = history[history.length - 1];
    if (last && last.role === role) last.content.push(block);
    else history.push({ role, content: [block] });
  };
  const mine = (e: LogEvent) => e.session_thread_id === threadId || (isPrimary && e.session_thread_id === null);
  // Messages a turn start names as its inputs wait for it; the others stay where they are.
  const takenByATurn = new Set<string>();
  for (const e of events) {
    if (e.type !== 'session.status_running' || !mine(e)) continue;
    const ids = (e.payload as Payload | null)?.input_event_ids;
    if (Array.isArray(ids)) for (const id of ids) takenByATurn.add(String(id));
  }
  const waiting = new Map<string, ContentBlock[]>();
  // Tool uses of the turn under way without a result yet: a turn that ends otherwise than
  // waiting on them (a log written before ended turns answered them) answers them here, so no
  // provider is sent a tool call without its result.
  const open = new Set<string>();
  for (const e of events) {
    if (!mine(e)) continue;
    const p = (e.payload ?? {}) as Payload;
    switch (e.type) {
      case 'user.message':
        if (queued.has(e.id)) break;
        if (takenByATurn.has(e.id)) waiting.set(e.id, textBlocksOf(p.content));
        else for (const block of textBlocksOf(p.content)) push('user', block);
        break;
      case 'session.status_running':
        if (Array.isArray(p.input_event_ids)) {
          for (const id of p.input_event_ids) {
            const blocks = waiting.get(String(id));
            if (blocks === undefined) continue;
            waiting.delete(String(id));
            for (const block of blocks) push('user', block);
          }
        }
        break;
      // An outcome's first turn answers its description; a revision answers the grader's explanation.
      case 'user.define_outcome':
        push('user', { type: 'text', text: String(p.description ?? '') });
        break;
      // Only an evaluation that starts a revision turn is that turn's input: the last one of an
      // outcome that ran out of iterations (or whose Session was archived) asks for nothing.
      case 'session.outcome_evaluation_ended': {
        if (p.result !== 'needs_revision' || queued.has(e.id)) break;
        const text = `The outcome grader asks for a revision (evaluation ${String(p.iteration)}):\n${String(p.explanation ?? '')}`;
        if (takenByATurn.has(e.id)) waiting.set(e.id, [{ type: 'text', text }]);
        // A log written before turn starts named their inputs: an evaluation that started a
        // revision counts it (its `revision_count` equals its `evaluation_count`).
        else if (p.revision_count === undefined || p.revision_count === p.evaluation_count) push('user', { type: 'text', text });
        break;
      }
      case 'agent.message':
        for (const block of textBlocksOf(p.content)) push('assistant', block);
        break;
      case 'agent.tool_use':
        push('assistant', { type: 'tool_use', id: String(p.id), name: String(p.name), input: p.input ?? {} });
        open.add(String(p.id));
        break;
      case 'agent.tool_result':
        push('user', { type: 'tool_result', tool_use_id: String(p.tool_use_id), content: textOf(p.content), ...(p.is_error ? { is_error: true } : {}) });
        open.delete(String(p.tool_use_id));
        break;
      case 'session.status_idle': {
        const stop = (p.stop_reason ?? {}) as Payload;
        if (stop.type === 'requires_action') break;
        for (const id of open) push('user', { type: 'tool_result', tool_use_id: id, content: `The tool call did not return: the turn ended (${String(stop.type)}) before its result.`, is_error: true });
        open.clear();
        break;
      }
      case 'user.custom_tool_result':
        responses.custom_tool_results[String(p.tool_use_id)] = { content: textOf(p.result), ...(p.is_error ? { is_error: true } : {}) };
        break;
      case 'user.tool_confirmation':
        responses.confirmations[String(p.tool_use_id)] = p.result === 'deny' ? 'deny' : 'allow';
        break;
      case 'user.question_answer':
        responses.question_answers[String(p.tool_use_id)] = { content: questionAnswerText(p) };
        break;
      default:
        break;
    }
  }
  // Answers already folded into the history (a tool_result exists) are not pending any more.
  const answered = new Set(history.flatMap((m) => m.content.filter((b) => b.type === 'tool_result').map((b) => (b as { tool_use_id: string }).tool_use_id)));
  for (const id of answered) {
    delete responses.custom_tool_results[id];
    delete responses.confirmations[id];
    delete responses.question_answers[id];
  }
  return { history, responses };
}

/** Read a whole log in pages. */
export async function readAll(log: EventLog, sessionId: string, pageSize = 1000): Promise<LogEvent[]> {
  const out: LogEvent[] = [];
  let after = 0;
  for (;;) {
    const page = await log.range(sessionId, after, pageSize);
    out.push(...page);
    if (page.length < pageSize) return out;
    after = (page[page.length - 1] as LogEvent).seq;
  }
}
