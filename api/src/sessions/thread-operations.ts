import { ApiError, Cursor, Nullable, Obj, sha256Hex, Type } from '@agentplane/core';
import type { LogEvent } from '@agentplane/store';
import { READERS, WRITERS } from '../http/caller.js';
import { defineOperation, json, type Operation } from '../http/operation.js';
import { workspaceRead } from '../http/workspace-operation.js';
import { requireWorkspace } from '../http/workspace-scope.js';
import type { ApiDeps } from '../deps.js';
import { threadStats, type SessionDoc, type ThreadDoc } from '@agentplane/domain';
import { deltaFilter } from './operations.js';
import { StreamQuery, ThreadEventsQuery, ThreadListQuery, ThreadPath, SessionPath } from './schemas.js';
import { checkedCursor, sseStream } from './stream.js';

const readers = { kind: 'bearer', roles: READERS } as const;
const writers = { kind: 'bearer', roles: WRITERS } as const;
const ThreadSchema = Type.Unsafe<Record<string, unknown>>({ type: 'object', description: 'SessionThread (docs/API.md)' });

/**
 * What a thread shows of the Session log. A child: its complete history. The primary: the
 * condensed Session history — its own events, Session-level events, and the status events
 * (`session.*`) of child threads, without the children's inner work.
 */
export function threadFilter(session: Pick<SessionDoc, '_primary_thread_id'>, threadId: string): (e: LogEvent) => boolean {
  if (threadId !== session._primary_thread_id) return (e) => e.session_thread_id === threadId;
  return (e) => e.session_thread_id === threadId || e.session_thread_id === null || e.type.startsWith('session.');
}

/**
 * Cursors of this module's lists: `c1_` and the hex of `<kind>|<binding>|<position>`, where the
 * binding (16 hex digits of a SHA-256) names the list that issued it: a thread's events, a
 * Session's threads. A cursor of another kind, or of the same kind from another list, is 400:
 * it would otherwise be read as a position in this list and skip or repeat what it holds.
 */
const binding = (...parts: string[]) => sha256Hex(parts.join('\0')).slice(0, 16);
const encodeCursor = (kind: 'e' | 't', bound: string, n: number) => `c1_${Buffer.from(`${kind}|${bound}|${n}`, 'utf8').toString('hex')}`;
function decodeCursor(kind: 'e' | 't', bound: string, cursor: string): number {
  const hex = cursor.slice(3);
  const text = /^[0-9a-f]+$/.test(hex) && hex.length % 2 === 0 ? Buffer.from(hex, 'hex').toString('utf8') : '';
  const m = /^([a-z])\|([0-9a-f]{16})\|(\d{1,15})$/.exec(text);
  if (!m?.[3] || m[1] !== kind) throw new ApiError('validation.malformed', 'query.page: not a cursor issued by this list');
  if (m[2] !== bound) throw new ApiError('validation.malformed', `query.page: a cursor of another ${kind === 'e' ? "thread's events" : "Session's threads"}, not of this list`);
  return Number(m[3]);
}
const eventsBinding = (sessionId: string, threadId: string) => binding('thread-events', sessionId, threadId);
const threadsBinding = (sessionId: string) => binding('threads', sessionId);

async function sessionAndThread(deps: ApiDeps, ws: string, sessionId: string, threadId: string): Promise<{ session: SessionDoc; thread: ThreadDoc }> {
  const session = await deps.sessions.store.get(ws, sessionId);
  const thread = await deps.sessions.store.thread(sessionId, threadId);
  return { session, thread };
}

/**
 * A thread's answer, kept as its id only and replayed as the thread is now (once the Session is
 * erased, its 404, never the erased content).
 */
const threadReplay: NonNullable<Operation['erasureSafe']> = {
  keep: (body) => ({ id: (body as { id: string }).id }),
  rehydrate: async (_kept, { caller, params, deps }) => {
    const p = params as { session_id: string; thread_id: string };
    const { thread } = await sessionAndThread(deps, requireWorkspace(caller), p.session_id, p.thread_id);
    return deps.sessions.threadView(thread);
  },
};

/** What one page of a thread's events may weigh (its events' stored JSON): it ends early past it, `next_page` set. */
const PAGE_BYTES = 4 * 1024 * 1024;

export const threadOperations: Operation[] = [
  workspaceRead({
    operationId: 'threads.listThreads', path: '/v1/sessions/{session_id}/threads',
    summary: 'List the threads of a Session: primary first, then by spawn', auth: readers, params: SessionPath, query: ThreadListQuery,
    response: Obj({ data: Type.Array(ThreadSchema), next_page: Nullable(Cursor()) }), mcp: 'full',
  }, async (ws, { params, query, deps }) => {
    await deps.sessions.store.get(ws, params.session_id);
    const limit = query.limit ?? 1000;
    const after = query.page ? decodeCursor('t', threadsBinding(params.session_id), query.page) : -1;
    const { ids, scores } = await deps.sessions.store.threadIds(params.session_id, after, limit + 1);
    const page = ids.slice(0, limit);
    const [docs, counters] = await Promise.all([deps.sessions.store.threads(params.session_id, page), deps.sessions.store.log.counters(params.session_id)]);
    const data = await Promise.all(docs.map((t) => deps.sessions.threadView(t, counters)));
    const lastScore = scores[page.length - 1];
    return { data, next_page: ids.length > limit && lastScore !== undefined ? encodeCursor('t', threadsBinding(params.session_id), lastScore) : null };
  }),
  workspaceRead({
    operationId: 'threads.getThread', path: '/v1/sessions/{session_id}/threads/{thread_id}', summary: 'Read a SessionThread',
    auth: readers, params: ThreadPath, response: ThreadSchema, mcp: 'full',
  }, async (ws, { params, deps }) => {
    const { thread } = await sessionAndThread(deps, ws, params.session_id, params.thread_id);
    return deps.sessions.threadView(thread);
  }),
  defineOperation({
    operationId: 'threads.archiveThread', method: 'POST', path: '/v1/sessions/{session_id}/threads/{thread_id}/archive',
    audit: { target: 'thread_id' },
    summary: 'Archive an idle child thread (terminates it, freezes its stats)', auth: writers, params: ThreadPath, response: ThreadSchema,
    idempotency: 'optional', mcp: 'full', erasureSafe: threadReplay,
    async handler({ caller, params, deps }) {
      const { session } = await sessionAndThread(deps, requireWorkspace(caller), params.session_id, params.thread_id);
      const now = new Date().toISOString();
      // Terminated only while no message is queued for the thread (one script): a message the
      // append took before the archive starts the thread's next turn, and is never left behind it.
      const t = await deps.sessions.store.terminateThreadIfNoInput(params.session_id, params.thread_id, (cur) => {
        if (cur.parent_thread_id === null || cur.id === session._primary_thread_id) {
          throw new ApiError('runtime.primary_thread', 'the primary thread cannot be archived; archive the Session instead');
        }
        if (cur.status === 'terminated') return cur.archived_at !== null ? null : { ...cur, archived_at: now, _frozen_stats: threadStats(cur) };
        if (cur.status !== 'idle') throw new ApiError('runtime.invalid_transition', `the thread is ${cur.status}; interrupt it with user.interrupt first`);
        const waiting = Object.values(cur._waits).some((w) => w.generation === cur._wait_generation && w.answered_event_id === null);
        if (waiting) throw new ApiError('runtime.invalid_transition', 'the thread waits on an action; answer or interrupt it first');
        // Idle on a Run whose turn ended requires_action, every wait answered: the turn continues
        // with those answers (its next Run is starting), so it is not over yet.
        if (cur._active_run_id !== null) throw new ApiError('runtime.invalid_transition', 'the thread\'s turn continues with the answers it got; archive it once that turn is over, or interrupt it with user.interrupt first');
        return { ...cur, status: 'terminated', archived_at: now, _frozen_stats: threadStats(cur) };
      });
      return json(200, await deps.sessions.threadView(t));
    },
  }),
  defineOperation({
    operationId: 'threads.listThreadEvents', method: 'GET', path: '/v1/sessions/{session_id}/threads/{thread_id}/events',
    summary: "A thread's events, oldest first: the primary's condensed Session history, a child's full history", auth: readers,
    params: ThreadPath, query: ThreadEventsQuery,
    response: Obj({ data: Type.Array(Type.Unsafe<Record<string, unknown>>({ type: 'object' })), next_page: Nullable(Cursor()) }), mcp: 'full',
    async handler({ caller, params, query, deps }) {
      if (query.after !== undefined && query.page !== undefined) throw new ApiError('validation.malformed', 'query: send either after or page, never both');
      const { session } = await sessionAndThread(deps, requireWorkspace(caller), params.session_id, params.thread_id);
      const limit = query.limit ?? 100;
      const filter = threadFilter(session, params.thread_id);
      const bound = eventsBinding(params.session_id, params.thread_id);
      let cursor = query.page !== undefined ? decodeCursor('e', bound, query.page) : (query.after ?? 0);
      const data: LogEvent[] = [];
      const log = deps.sessions.store.log;
      // Read in batches no larger than the page needs; a page also ends once its events weigh
      // PAGE_BYTES (a log of large events is read a few MiB at a time, never whole).
      const batchSize = Math.min(500, limit + 1);
      let bytes = 0;
      for (;;) {
        const batch = await log.rangeSized(params.session_id, cursor, batchSize);
        for (const { event: e, bytes: size } of batch) {
          if (filter(e)) {
            if (data.length === limit || (data.length > 0 && bytes + size > PAGE_BYTES)) return json(200, { data, next_page: encodeCursor('e', bound, cursor) });
            data.push(e);
            bytes += size;
          }
          cursor = e.seq;
        }
        if (batch.length < batchSize) return json(200, { data, next_page: null });
      }
    },
  }),
  defineOperation({
    operationId: 'threads.streamThread', method: 'GET', path: '/v1/sessions/{session_id}/threads/{thread_id}/stream',
    summary: "SSE of a thread's events: replay after Last-Event-ID, then live", auth: readers, params: ThreadPath, query: StreamQuery, mcp: 'never',
    async handler({ caller, params, query, headers, deps, stillAllowed }) {
      const { session } = await sessionAndThread(deps, requireWorkspace(caller), params.session_id, params.thread_id);
      const deltas = deltaFilter(query.event_deltas);
      return sseStream({
        sessionId: params.session_id, cursor: await checkedCursor(deps.sessions.store.log, params.session_id, headers['last-event-id'], query.last_event_id),
        filter: threadFilter(session, params.thread_id),
        deltas: deltas
          ? (d) => deltas(d) && (d.session_thread_id === params.thread_id || (d.session_thread_id === null && params.thread_id === session._primary_thread_id))
          : null,
        erased: false, log: deps.sessions.store.log, hub: deps.eventHub, shutdown: deps.shutdownSignal, keepaliveMs: deps.config.sseKeepaliveMs,
        stillAllowed,
      });
    },
  }),
];
