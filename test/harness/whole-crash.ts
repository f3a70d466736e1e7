/**
 * A whole-platform crash mid-Run, shared by the crash test and `bench:recovery`: a Session whose
 * turn runs a tool call in its sandbox, every process of the platform killed with SIGKILL while it
 * runs, and the reads that follow the Session's thread after the restart.
 */
import type { HttpClient } from '@agentplane/client';
import { waitFor, type Platform } from './platform.js';
import { alive } from './processes.js';

type Json = Record<string, unknown>;
export interface ThreadEvent { seq: number; type: string; created_at: string; payload: Json }

const SCRIPT = (rules: unknown[]) => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;
/** The supervisor first, so that it restarts nothing; then every process it started. */
const KILL_ORDER = ['platform', 'api', 'scheduler', 'runner', 'redis'];

/** The events of the Session's (first) thread, oldest first. */
export async function threadEvents(api: HttpClient, sessionId: string): Promise<ThreadEvent[]> {
  const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id ?? '';
  return (await api.get<{ data: ThreadEvent[] }>(`/v1/sessions/${sessionId}/threads/${thread}/events`, { limit: 1000 })).data;
}

/** The thread's events once `pred` holds for them (read again until then, up to `ms`). */
export const waitThreadEvents = (api: HttpClient, sessionId: string, pred: (e: ThreadEvent[]) => boolean, ms: number): Promise<ThreadEvent[]> =>
  waitFor('events', async () => {
    const e = await threadEvents(api, sessionId);
    return pred(e) ? e : undefined;
  }, ms);

/**
 * A Session whose agent answers `go` with one bash call (`sleep <seconds>; echo finished`) and
 * then replies `ok: <its output>`; the message sent. Resolves with the Session's id once the tool
 * call is under way (`agent.tool_use`).
 */
export async function startToolCallTurn(p: Platform, seconds: number): Promise<string> {
  const owner = (await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: 'owner', principal_type: 'person', display_name: 'Owner',
  })).id;
  const envId = (await p.root.post<{ id: string }>('/v1/environments', { name: 'sb', image: 'agentplane/sandbox:latest' })).id;
  const s = await p.root.post<{ id: string }>('/v1/sessions', {
    agent: {
      name: 'a', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
      system: SCRIPT([
        { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: `sleep ${seconds}; echo finished` } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'ok: {{tool_result}}' }] },
      ]),
    },
    environment_id: envId,
  });
  await p.root.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'go', authored_by: owner, caused_by: { kind: 'api' } } });
  await waitThreadEvents(p.root, s.id, (e) => e.some((x) => x.type === 'agent.tool_use'), 120_000);
  return s.id;
}

/** Every process of the platform killed with SIGKILL at once; resolves once all are gone. */
export async function killWholePlatform(p: Platform): Promise<void> {
  const pids = p.pids();
  for (const name of KILL_ORDER) {
    const pid = pids[name];
    if (pid) try { process.kill(pid, 'SIGKILL'); } catch { /* already gone */ }
  }
  await waitFor('every process gone', () => (KILL_ORDER.every((n) => {
    const pid = pids[n];
    return !pid || !alive(pid);
  }) ? true : undefined), 20_000);
}
