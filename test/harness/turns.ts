/**
 * What end-to-end turn tests share: a platform started like `npm start` with its scheduler and
 * local runner, a developer key, a Principal to author messages, a sandbox Environment, and
 * helpers to drive a turn and read the Session's stream.
 */
import { HttpClient, streamEvents, type SseFrame } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './platform.js';

export type Json = Record<string, unknown>;

export interface TurnEvent {
  id: string;
  seq: number;
  type: string;
  payload: Json;
  session_thread_id: string | null;
}

/** Short lease and presence timings so crash and reschedule paths play out in seconds. */
export const FAST_LEASES: Record<string, string> = {
  LEASE_MS: '6000', OFFER_TIMEOUT_MS: '2000', STALLED_INTERVAL_MS: '1000', RUN_BACKOFF_MS: '200',
  RUNNER_HEARTBEAT_INTERVAL_MS: '1000', RUNNER_PRESENCE_TTL_MS: '4000',
};

/** A system prompt that drives the built-in `scripted` model (docs/MODELS.md). */
export const SCRIPT = (rules: unknown[]): string => `Be brief.\n\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;

/** An outcome rubric: its criteria as a list, then the scripted grader's rules. */
export const RUBRIC = (rules: unknown[], criteria: readonly string[] = ['ok']): string =>
  `${criteria.map((c) => `- ${c}`).join('\n')}\n\n\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\`\n`;

/**
 * A skill proposal's instructions carrying the scripted author's answer (a string as it is,
 * anything else as JSON; backticks escaped so the fence stays whole).
 */
export function authorInstructions(answer: unknown): string {
  const script = JSON.stringify({ rules: [{ then: [{ reply: typeof answer === 'string' ? answer : JSON.stringify(answer) }] }] }).replace(/`/g, '\\u0060');
  return `Keep it short.\n\`\`\`scripted\n${script}\n\`\`\``;
}

export interface TurnPlatform {
  p: Platform;
  api: HttpClient;
  principal: string;
  envId: string;
  msg(content: string): { type: 'user.message'; payload: Json };
}

/**
 * A developer API key of the bootstrap Workspace (its client), a person Principal to author drive
 * events, and an Environment (`environment` adds to or replaces the default body's fields).
 */
export async function developerWorkspace(p: Platform, name: string, environment: Json = {}): Promise<{ api: HttpClient; principal: string; envId: string }> {
  const ws = p.bootstrap.workspace_id;
  const key = await p.root.post<{ secret: string }>(`/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
    display_name: 'app', role: 'developer', scope: { type: 'workspace', workspace_id: ws },
  }, { idempotencyKey: `${name}-dev-key` });
  const api = new HttpClient({ baseUrl: p.baseUrl, token: key.secret });
  const principal = (await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
    external_subject_id: 'user-1', principal_type: 'person', display_name: 'User One',
  })).id;
  const envId = (await api.post<{ id: string }>('/v1/environments', { name: 'sandbox', image: 'agentplane/sandbox:latest', ...environment })).id;
  return { api, principal, envId };
}

export async function startTurnPlatform(options: { name: string; env?: Record<string, string>; environment?: Json }): Promise<TurnPlatform> {
  const p = await startPlatform({ runner: true, scheduler: true, env: { ...FAST_LEASES, ...options.env } });
  const { api, principal, envId } = await developerWorkspace(p, options.name, {
    resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
    ...options.environment,
  });
  await waitFor('a ready runner', async () => {
    const r = await p.root.get<{ data: { status: string }[] }>('/v1/runner-pools/presences');
    return r.data.some((x) => x.status === 'ready') ? true : undefined;
  }, 90_000);
  const msg = (content: string) => ({ type: 'user.message' as const, payload: { content, authored_by: principal, caused_by: { kind: 'api' } } });
  return { p, api, principal, envId, msg };
}

/**
 * Reads the Session's stream until `stop` says so; returns every event seen. Throws when the time
 * runs out (or the stream ends) first: a test waiting on an event that never comes fails here,
 * never on whatever older events the stream replayed.
 */
export async function untilEvents(
  api: HttpClient,
  sessionId: string,
  stop: (events: TurnEvent[]) => boolean,
  timeoutMs = 60_000,
  lastEventId?: string,
): Promise<TurnEvent[]> {
  const ac = new AbortController();
  const timer = setTimeout(() => ac.abort(), timeoutMs);
  const seen: TurnEvent[] = [];
  let stopped = false;
  try {
    for await (const f of streamEvents(api, `/v1/sessions/${sessionId}/events/stream`, { signal: ac.signal, ...(lastEventId ? { lastEventId } : {}) }) as AsyncGenerator<SseFrame>) {
      if (!f.id) continue;
      seen.push(JSON.parse(f.data) as TurnEvent);
      if (stop(seen)) {
        stopped = true;
        break;
      }
    }
  } catch (err) {
    if (!ac.signal.aborted) throw err;
  } finally {
    clearTimeout(timer);
    ac.abort();
  }
  if (!stopped) {
    throw new Error(`Session ${sessionId}: the awaited events did not come within ${timeoutMs} ms; seen: ${seen.map((e) => e.type).join(', ') || 'nothing'}`);
  }
  return seen;
}

export const idleCount = (events: TurnEvent[]): number => events.filter((e) => e.type === 'session.status_idle').length;

