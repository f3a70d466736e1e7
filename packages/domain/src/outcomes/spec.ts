import type { LogEvent } from '@agentplane/store';
import type { RunDoc } from '../sessions/model.js';
import type { SessionStore } from '../sessions/store.js';
import type { FileStore } from '../files/store.js';
import { graderSpec, type GraderSpec } from './grader.js';
import { readOutcome, rubricText, type OutcomeDoc } from './service.js';

type Payload = Record<string, unknown>;

const textOf = (content: unknown): string =>
  typeof content === 'string' ? content
    : Array.isArray(content) ? content.map((b) => (b && typeof b === 'object' && typeof (b as Payload).text === 'string' ? (b as Payload).text as string : '')).join('')
    : '';

/**
 * The agent's final message of the outcome's latest turn: the last `agent.message` of the thread
 * after the outcome's latest input (its define event or the last revision request). Only
 * messages: thinking, tool uses and tool results never reach the grader.
 */
export function finalMessage(events: readonly LogEvent[], o: Pick<OutcomeDoc, 'id' | 'thread_id' | 'define_event_id'>): string {
  let from = -1;
  for (const [i, e] of events.entries()) {
    if (e.id === o.define_event_id) from = i;
    if (e.type === 'session.outcome_evaluation_ended' && (e.payload as Payload).outcome_id === o.id) from = i;
  }
  let last = '';
  for (const e of events.slice(from + 1)) if (e.type === 'agent.message' && e.session_thread_id === o.thread_id) last = textOf((e.payload as Payload).content);
  return last;
}

/** The `grader` part of a grader Run's turn spec: its request text and the files its runner appends. */
export async function graderTurnSpec(src: { store: SessionStore; files?: FileStore }, run: RunDoc, events: readonly LogEvent[]): Promise<GraderSpec & { routing_key: string }> {
  const info = run.grader;
  if (!info) throw new Error(`run ${run.id} is not a grader Run`);
  const o = await readOutcome(src.store, run.session_id, info.outcome_id);
  if (!o) throw new Error(`outcome ${info.outcome_id} not found`);
  return graderSpec({
    description: o.description,
    rubric: await rubricText(src.files, o),
    finalMessage: finalMessage(events, o),
    iteration: info.iteration,
    maxIterations: o.max_iterations,
  }, info.routing_key);
}
