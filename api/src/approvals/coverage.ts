import { canonicalJson } from '@agentplane/core';
import { tags, type DocumentStore } from '@agentplane/store';
import type { SessionStore, ThreadDoc } from '@agentplane/domain';
import type { ActionApproval } from './service.js';

/**
 * What an approved ActionApproval covers, one rule for every boundary that honours approvals (the
 * runner's `tool.check` and the control plane's runtime tool gate): the very call it was asked
 * for (same tool and input), made by the Run that obtained it or by the Run that continues after
 * that tool use's wait. Never another call under the same tool use id, nor a later Run of the
 * Session (one a message started, or one past an interrupt or a later wait).
 */
export interface CoverageDeps {
  docs: DocumentStore;
  sessions: Pick<SessionStore, 'run'>;
}

export type ThreadWait = ThreadDoc['_waits'][string];

/** A tool as an approval names it. */
export interface ApprovedTool {
  kind: ActionApproval['tool']['kind'];
  name: string;
  connection_id?: string | null | undefined;
}

/** Whether `a` was asked for this very call: the same tool (kind, name, Connection) and input. */
export function sameCall(a: ActionApproval, tool: ApprovedTool, input: unknown): boolean {
  return a.tool.kind === tool.kind && a.tool.name === tool.name && a.tool.connection_id === (tool.connection_id ?? null)
    && canonicalJson(a.input ?? {}) === canonicalJson(input ?? {});
}

/**
 * The wait of `toolUseId` on the thread if it is answered and of the thread's current wait
 * generation (an interrupt or a later wait moves the generation on), else null and why.
 */
export async function answeredWait(docs: DocumentStore, sessionId: string, threadId: string, toolUseId: string): Promise<{ wait: ThreadWait | null; stale: boolean }> {
  const thread = await docs.get<ThreadDoc>(tags.session(sessionId), threadId);
  const wait = thread?.type === 'session_thread' ? thread._waits[toolUseId] : undefined;
  if (!thread || !wait || wait.answered_event_id === null) return { wait: null, stale: false };
  return wait.generation === thread._wait_generation ? { wait, stale: false } : { wait: null, stale: true };
}

/**
 * Whether Run `runId` is the one that continues after the wait of `toolUseId`: it continues after
 * answered waits, on `threadId`, and the use is an answered wait of that thread's current wait
 * generation.
 */
export async function continuesAfterWait(deps: CoverageDeps, sessionId: string, runId: string, toolUseId: string, threadId: string): Promise<boolean> {
  const run = await deps.sessions.run(sessionId, runId);
  if (!run?.continues_run_id || run.session_thread_id !== threadId) return false;
  return (await answeredWait(deps.docs, sessionId, threadId, toolUseId)).wait !== null;
}

/** Why approval `a` does not cover this call by Run `runId`, or null when it does. */
export async function notCovered(deps: CoverageDeps, a: ActionApproval, runId: string, tool: ApprovedTool, input: unknown): Promise<string | null> {
  if (!sameCall(a, tool, input)) return `it was asked for ${a.tool.kind} tool '${a.tool.name}' with other input, not for this call`;
  if (a.run_id === runId || (await continuesAfterWait(deps, a.session_id, runId, a.tool_use_id, a.session_thread_id))) return null;
  return `it was asked in run ${a.run_id}, and run ${runId} does not continue after its wait`;
}
