/**
 * The A2A request handler: every method served from a Session and its event log. The SDK's
 * `JsonRpcTransportHandler` parses and frames JSON-RPC around it (docs/A2A.md).
 */
import { randomUUID } from 'node:crypto';
import {
  Role, TaskState, type AgentCard, type CancelTaskRequest, type GetTaskRequest, type ListTasksRequest, type ListTasksResponse,
  type Message, type SendMessageRequest, type StreamResponse, type SubscribeToTaskRequest, type Task, type TaskPushNotificationConfig,
} from '@a2a-js/sdk';
import {
  ContentTypeNotSupportedError, ExtendedAgentCardNotConfiguredError, PushNotificationNotSupportedError, RequestMalformedError,
  TaskNotCancelableError, TaskNotFoundError, UnsupportedOperationError,
} from '@a2a-js/sdk/errors';
import type { A2ARequestHandler, ServerCallContext } from '@a2a-js/sdk/server';
import { ApiError, isId, type Context } from '@agentplane/core';
import { keys, tags, type LogEvent } from '@agentplane/store';
import type { SessionDoc, ThreadDoc } from '@agentplane/domain';
import type { ApiDeps } from '../deps.js';
import type { Caller } from '../http/caller.js';
import type { Placement } from './placement.js';
import { checkDrivePayload, type DriveEventType, type DrivePayload } from '../sessions/schemas.js';
import { questionsOf, settles, TaskTracker, TERMINAL_STATES, type WaitingUse } from './tasks.js';
import { TEXT_PLAIN } from './card.js';
import { boundaryRefusal } from '../governance/policy-eval.js';
import { META, tasksIndexName } from './task-index.js';
import { claimMessage, releaseMessage } from './message-claims.js';

/** What one A2A request carries into the handler (ServerCallContext state). */
export interface A2aCall {
  deps: ApiDeps;
  caller: Caller & { principalId: string; workspaceId: string };
  placement: Placement;
  card: AgentCard;
  /** Fires when the client goes away or the process shuts down: long waits and streams end on it. */
  signal: AbortSignal;
  /** The task the request turned out to act on (for its audit record). */
  target?: string;
  /** The HTTP request's id (its audit record and any incident name it). */
  requestId: string;
  /** The HTTP request's trace context (tracing on): the parent of the spans made for it. */
  trace?: Context | undefined;
  /**
   * A governance refusal met inside the handler (the ActionPolicies of a reply's answer): the
   * edge answers and records it as its own refusals (403, `denied`), not as a JSON-RPC error.
   */
  denied?: ApiError;
}

export const CALL_STATE_KEY = 'agentplane.a2a';
const READ_PAGE = 500;
const MAX_LIST_PAGE = 100;
const MAX_MESSAGE_ID = 255;
/** A concurrent send of the same messageId is waited for this long before giving up. */
const CLAIM_WAIT_MS = 10_000;
/**
 * A messageId's claim (the send that holds it is creating the Session or appending the message)
 * older than this is stale: its holder died before finishing, and the next send of that
 * messageId takes the claim over. Far beyond what a create or an append takes.
 */
const CLAIM_STALE_MS = 30_000;
/** CancelTask waits at most this long for the interrupted turn to end. */
const CANCEL_WAIT_MS = 30_000;

function callOf(ctx: ServerCallContext): A2aCall {
  const call = ctx.state.get(CALL_STATE_KEY) as A2aCall | undefined;
  if (!call) throw new Error('A2A call state missing');
  return call;
}

const scopeKey = (c: A2aCall) => `${c.placement.installation.id}:${c.placement.scope.id}:${c.caller.principalId}`;
const tasksIndex = (c: A2aCall) => tasksIndexName(c.placement.installation.id, c.placement.scope.id, c.caller.principalId);
const messagesKey = (c: A2aCall) => keys.unique(tags.workspace(c.placement.workspaceId), `a2a_messages:${scopeKey(c)}`);

const URI_KEY = /^[a-z][a-z0-9+.-]*:\/\//i;
function rejectExtensionKeys(meta: Record<string, unknown> | undefined, where: string): void {
  for (const k of Object.keys(meta ?? {})) {
    if (URI_KEY.test(k)) throw new UnsupportedOperationError(`${where}: extension URIs are not supported ('${k}')`);
  }
  if (meta && (meta.zdr === true || meta.zero_data_retention === true || meta.retention === 'zdr')) {
    throw new UnsupportedOperationError(`${where}: zero-data-retention Sessions are not served over A2A`);
  }
}

/** Every admission rule of an incoming message (docs/A2A.md, "What is refused"). */
function checkMessage(params: SendMessageRequest, ctx: ServerCallContext): { message: Message; text: string } {
  if (ctx.tenant !== undefined) throw new UnsupportedOperationError('the A2A tenant field is not accepted: the endpoint names its placement');
  const cfg = params.configuration;
  if (cfg?.taskPushNotificationConfig) throw new PushNotificationNotSupportedError('push notifications are not supported');
  if (cfg && cfg.acceptedOutputModes.length > 0 && !cfg.acceptedOutputModes.includes(TEXT_PLAIN)) {
    throw new ContentTypeNotSupportedError(`only ${TEXT_PLAIN} output is produced`);
  }
  const m = params.message;
  if (!m) throw new RequestMalformedError('params.message is required');
  if (m.role !== Role.ROLE_USER) throw new RequestMalformedError('message.role must be ROLE_USER');
  if (!m.messageId || m.messageId.length > MAX_MESSAGE_ID) throw new RequestMalformedError(`message.messageId must be 1 to ${MAX_MESSAGE_ID} characters`);
  if (m.extensions.length > 0) throw new UnsupportedOperationError('protocol extensions are not supported');
  if (m.referenceTaskIds.length > 0) throw new UnsupportedOperationError('referenceTaskIds are not supported');
  rejectExtensionKeys(params.metadata, 'params.metadata');
  rejectExtensionKeys(m.metadata, 'message.metadata');
  if (m.parts.length === 0) throw new RequestMalformedError('message.parts must not be empty');
  const texts: string[] = [];
  for (const part of m.parts) {
    if (part.content?.$case !== 'text' || (part.mediaType !== '' && part.mediaType !== TEXT_PLAIN)) {
      throw new ContentTypeNotSupportedError(`only ${TEXT_PLAIN} text parts are accepted`);
    }
    rejectExtensionKeys(part.metadata, 'part.metadata');
    texts.push(part.content.value);
  }
  const text = texts.join('\n');
  if (text.length === 0) throw new RequestMalformedError('message text must not be empty');
  if (m.taskId && m.contextId && m.taskId !== m.contextId) throw new RequestMalformedError('taskId and contextId name different tasks (a task is its context here)');
  return { message: m, text };
}

function rethrowNotFound(err: unknown, id: string): never {
  if (err instanceof ApiError && err.type === 'validation.not_found') throw new TaskNotFoundError(`task ${id} not found`);
  throw err;
}

export class SessionTaskHandler implements A2ARequestHandler {
  // ---- tasks: loading and following ------------------------------------------------------

  /** A task of this Principal on this placement, or TaskNotFound (another Principal's task looks absent). */
  private async session(c: A2aCall, id: string): Promise<SessionDoc> {
    if (!isId('session', id)) throw new TaskNotFoundError(`task ${id} not found`);
    const s = await c.deps.sessions.store.get(c.placement.workspaceId, id).catch((err: unknown) => rethrowNotFound(err, id));
    if (s.metadata[META.installation] !== c.placement.installation.id || s.metadata[META.scope] !== c.placement.scope.id || s.metadata[META.principal] !== c.caller.principalId) {
      throw new TaskNotFoundError(`task ${id} not found`);
    }
    c.target = id;
    return s;
  }

  /** Reads the log through `toSeq` (or its current end) into a tracker. */
  private async replay(c: A2aCall, s: Readonly<SessionDoc>, messageId?: string): Promise<{ tracker: TaskTracker; seq: number; seen: boolean }> {
    const log = c.deps.sessions.store.log;
    const end = (await log.state(s.id)).seq;
    const tracker = new TaskTracker(s.id, s._primary_thread_id);
    let cursor = 0;
    let seen = false;
    while (cursor < end) {
      const page = await log.range(s.id, cursor, READ_PAGE, end);
      if (page.length === 0) break;
      for (const e of page) {
        tracker.apply(e);
        if (messageId !== undefined && SessionTaskHandler.carries(e, messageId)) seen = true;
      }
      cursor = (page[page.length - 1] as LogEvent).seq;
    }
    return { tracker, seq: end, seen };
  }

  /** The log after `afterSeq`, then live (the process's event hub), until `signal` fires. */
  private async *follow(c: A2aCall, sessionId: string, afterSeq: number): AsyncGenerator<LogEvent> {
    const log = c.deps.sessions.store.log;
    let dirty = true;
    let wake: (() => void) | null = null;
    const poke = () => {
      dirty = true;
      const w = wake;
      wake = null;
      w?.();
    };
    let erased = false;
    const watch = await c.deps.eventHub.watch(sessionId, (m) => {
      if (m.kind === 'erased') erased = true;
      poke();
    });
    c.signal.addEventListener('abort', poke, { once: true });
    let cursor = afterSeq;
    try {
      for (;;) {
        if (c.signal.aborted) return;
        if (!dirty) await new Promise<void>((resolve) => { wake = resolve; });
        // A deleted Session's log is gone: nothing more will come.
        if (c.signal.aborted || erased) return;
        dirty = false;
        const page = await log.range(sessionId, cursor, READ_PAGE);
        if (page.length === READ_PAGE) dirty = true;
        for (const e of page) {
          cursor = e.seq;
          yield e;
        }
      }
    } finally {
      watch.close();
      c.signal.removeEventListener('abort', poke);
    }
  }

  // ---- sending ---------------------------------------------------------------------------

  /**
   * The messageId's task when a send already made it (`{task}`), else this send's claim on the
   * messageId (`{claim}`). A claim another send holds is waited for (it resolves to its task, or
   * frees the messageId), at most CLAIM_WAIT_MS; one held past CLAIM_STALE_MS is taken over.
   */
  private async claim(c: A2aCall, messageId: string): Promise<{ task: string } | { claim: string }> {
    const key = messagesKey(c);
    const token = randomUUID();
    const deadline = Date.now() + CLAIM_WAIT_MS;
    for (;;) {
      const held = await claimMessage(c.deps.redis, key, messageId, token, CLAIM_STALE_MS);
      if (held.won) return { claim: held.claim };
      if (held.value !== 'pending') return { task: held.value };
      if (Date.now() > deadline || c.signal.aborted) throw new UnsupportedOperationError(`message ${messageId} is still being submitted; retry`);
      await new Promise((r) => setTimeout(r, 50));
    }
  }

  /**
   * Starts (or, for a known messageId, finds) the turn a message asks for. Returns its task. The
   * messageId is claimed first, on a new task and a continuation alike: of concurrent sends of
   * one messageId, one creates the Session or appends the message, and the others return its task.
   */
  private async submit(c: A2aCall, params: SendMessageRequest, ctx: ServerCallContext): Promise<{ session: SessionDoc; messageId: string; known: boolean }> {
    const { message, text } = checkMessage(params, ctx);
    const key = messagesKey(c);
    const held = await this.claim(c, message.messageId);
    if ('task' in held) return { session: await this.session(c, held.task), messageId: message.messageId, known: true };
    let id: string;
    try {
      id = await this.start(c, message, text);
    } catch (err) {
      // Not released (Redis failing too): the claim goes stale and is taken over then.
      await releaseMessage(c.deps.redis, key, message.messageId, held.claim).catch(() => undefined);
      throw err;
    }
    await c.deps.redis.hset(key, message.messageId, id);
    return { session: await this.session(c, id), messageId: message.messageId, known: false };
  }

  /** Under a claim on its messageId: appends the message to its task, or creates the task. Returns the task id. */
  private async start(c: A2aCall, message: Message, text: string): Promise<string> {
    const ws = c.placement.workspaceId;
    let payload: DrivePayload;
    try {
      // The same payload rules a REST drive event meets (text size, shapes).
      payload = checkDrivePayload('user.message', { content: text, authored_by: c.caller.principalId, caused_by: { kind: 'a2a', id: message.messageId } }, 'params.message');
    } catch (err) {
      if (err instanceof ApiError) throw new RequestMalformedError(err.message);
      throw err;
    }
    // The same message sent again after its claim was taken over replays the same create or
    // append (same idempotency key and payload: the same Session, no second event).
    const idem = `a2a:${scopeKey(c)}:${message.messageId}`;
    const target = message.taskId || message.contextId;
    if (target) {
      const s = await this.session(c, target);
      if (s.archived_at !== null) throw new UnsupportedOperationError(`task ${s.id} is archived and takes no messages`);
      // The waits of the task's turn, from its thread (one read); the log is replayed only when
      // the task's state decides something: a send by taskId (no terminal task takes one), or a
      // turn that waits on its caller (what it waits on is in the log).
      const thread = await c.deps.sessions.store.thread(s.id, s._primary_thread_id);
      const open = Object.values(thread._waits).some((w) => w.generation === thread._wait_generation && w.answered_event_id === null);
      const tracker = message.taskId || open ? (await this.replay(c, s)).tracker : null;
      if (message.taskId && tracker && TERMINAL_STATES.has(tracker.state)) {
        throw new UnsupportedOperationError(`task ${s.id} is in a terminal state (${TaskState[tracker.state]}); continue the conversation by contextId`);
      }
      // Input required: the reply is the input (A2A's way), the answer to what the turn waits on.
      // Queued as a message instead, it would wait behind a turn that never continues.
      const answer = tracker?.state === TaskState.TASK_STATE_INPUT_REQUIRED ? await this.answerFor(c, s, thread, tracker.waiting, text, message.messageId) : null;
      await c.deps.sessions.drive(s, answer ?? { type: 'user.message', payload }, idem, c.trace);
      return s.id;
    }
    const { installation, scope, agent } = c.placement;
    const view = await c.deps.sessions.create(ws, {
      agent: { id: agent.id, version: agent.version },
      environment_id: installation.environment_id,
      title: `A2A: ${scope.display_name}`,
      metadata: { [META.installation]: installation.id, [META.scope]: scope.id, [META.principal]: c.caller.principalId },
      initial_events: [{ type: 'user.message', payload }],
    }, idem, { trace: c.trace });
    const id = String(view.id);
    // Indexed after the create: a delete of the Session in between leaves its id here, which the
    // next listing that meets it takes out (listTasks).
    await c.deps.redis.zadd(keys.index(tags.workspace(ws), tasksIndex(c)), 'NX', Date.now(), id);
    return id;
  }

  /**
   * The drive event a reply to an `INPUT_REQUIRED` task is: the answer to the one blocking use its
   * turn waits on (a question of `ask_user` asking one thing, a custom tool's result). Another
   * wait (a tool confirmation, an ActionApproval, several uses at once) is not answered by text:
   * refused, saying why, rather than queued behind a turn that does not continue.
   */
  private async answerFor(
    c: A2aCall, s: SessionDoc, thread: Readonly<ThreadDoc>, waiting: readonly WaitingUse[], text: string, messageId: string,
  ): Promise<{ type: DriveEventType; payload: DrivePayload } | null> {
    const open = waiting.filter((w) => {
      const wait = thread._waits[w.id];
      return wait !== undefined && wait.generation === thread._wait_generation && wait.answered_event_id === null;
    });
    if (open.length === 0) return null;
    const refuse = (why: string) => new UnsupportedOperationError(`task ${s.id} waits on ${why}; a reply cannot give it (CancelTask ends the task)`);
    if (open.length > 1) throw refuse(`${open.length} tool uses at once`);
    const w = open[0] as WaitingUse;
    const kind = thread._waits[w.id]?.kind;
    const common = { tool_use_id: w.id, authored_by: c.caller.principalId, caused_by: { kind: 'a2a', id: messageId } };
    const checked = async (type: DriveEventType, payload: Record<string, unknown>) => {
      let event: { type: DriveEventType; payload: DrivePayload };
      try {
        event = { type, payload: checkDrivePayload(type, payload, 'params.message') };
      } catch (err) {
        if (err instanceof ApiError) throw new RequestMalformedError(err.message);
        throw err;
      }
      // The edge checked the send as a user.message; an answer is its own drive call, and meets
      // the ActionPolicies for it as a REST drive of that type does (a refusal is answered as the
      // edge's own: 403 `policy.denied`, recorded `denied`).
      const d = await c.deps.policies.decide(c.placement.workspaceId, { kind: 'drive', name: type, principal_id: c.caller.principalId, input: event.payload }, {
        actor: { id: c.caller.principalId, credential_id: c.caller.credentialId }, target: s.id, request_id: c.requestId, refusesApproval: true,
      });
      const refused = boundaryRefusal(d);
      if (refused) {
        c.denied = refused;
        throw refused;
      }
      return event;
    };
    if (kind === 'question') {
      const asked = questionsOf(w.input)?.length ?? 0;
      if (asked !== 1) throw refuse(`answers to ${asked} questions at once`);
      return checked('user.question_answer', { ...common, answers: [{ text }] });
    }
    if (kind === 'custom_tool') return checked('user.custom_tool_result', { ...common, result: text });
    throw refuse(kind === 'approval' ? `an ActionApproval of ${w.name}` : `a confirmation of ${w.name}`);
  }

  /** Has the tracker seen the user.message (or the answer) that carries this messageId? */
  private static carries(e: LogEvent, messageId: string): boolean {
    if (e.type !== 'user.message' && e.type !== 'user.question_answer' && e.type !== 'user.custom_tool_result') return false;
    const cause = (e.payload as { caused_by?: { kind?: unknown; id?: unknown } }).caused_by;
    return cause?.kind === 'a2a' && cause.id === messageId;
  }

  async sendMessage(params: SendMessageRequest, ctx: ServerCallContext): Promise<Message | Task> {
    const c = callOf(ctx);
    const { session, messageId, known } = await this.submit(c, params, ctx);
    const historyLength = params.configuration?.historyLength;
    const tracker = new TaskTracker(session.id, session._primary_thread_id);
    if (params.configuration?.returnImmediately) {
      return (await this.replay(c, session)).tracker.task(historyLength);
    }
    // Blocking: until the turn this message started (or joined) is terminal or interrupted.
    let seen = false;
    for await (const e of this.follow(c, session.id, 0)) {
      tracker.apply(e);
      if (SessionTaskHandler.carries(e, messageId)) seen = true;
      // A message sent again returns its task as it is now, not as it was when that turn settled.
      if (seen && settles(tracker.state)) return known ? (await this.replay(c, session)).tracker.task(historyLength) : tracker.task(historyLength);
    }
    // The client went away or the process is stopping: what is known so far.
    return tracker.task(historyLength);
  }

  async *sendMessageStream(params: SendMessageRequest, ctx: ServerCallContext): AsyncGenerator<StreamResponse, void, undefined> {
    const c = callOf(ctx);
    const { session, messageId } = await this.submit(c, params, ctx);
    yield* this.stream(c, session, messageId);
  }

  /** The task now, then its status and artifact updates live, until it settles (after `messageId`, when given). */
  private async *stream(c: A2aCall, session: SessionDoc, messageId: string | null): AsyncGenerator<StreamResponse, void, undefined> {
    const replayed = await this.replay(c, session, messageId ?? undefined);
    const { tracker, seq } = replayed;
    let seen = messageId === null || replayed.seen;
    yield { payload: { $case: 'task', value: tracker.task() } };
    if (seen && settles(tracker.state)) return;
    for await (const e of this.follow(c, session.id, seq)) {
      if (!seen && SessionTaskHandler.carries(e, messageId as string)) seen = true;
      for (const u of tracker.apply(e)) {
        yield u.kind === 'status' ? { payload: { $case: 'statusUpdate', value: u.value } } : { payload: { $case: 'artifactUpdate', value: u.value } };
      }
      if (seen && settles(tracker.state)) return;
    }
  }

  async *resubscribe(params: SubscribeToTaskRequest, ctx: ServerCallContext): AsyncGenerator<StreamResponse, void, undefined> {
    const c = callOf(ctx);
    if (ctx.tenant !== undefined) throw new UnsupportedOperationError('the A2A tenant field is not accepted');
    const s = await this.session(c, params.id);
    const { tracker } = await this.replay(c, s);
    if (TERMINAL_STATES.has(tracker.state)) throw new UnsupportedOperationError(`task ${s.id} is in a terminal state (${TaskState[tracker.state]}); there is nothing to subscribe to`);
    yield* this.stream(c, s, null);
  }

  // ---- reading ---------------------------------------------------------------------------

  async getTask(params: GetTaskRequest, ctx: ServerCallContext): Promise<Task> {
    const c = callOf(ctx);
    if (ctx.tenant !== undefined) throw new UnsupportedOperationError('the A2A tenant field is not accepted');
    const s = await this.session(c, params.id);
    return (await this.replay(c, s)).tracker.task(params.historyLength);
  }

  async listTasks(params: ListTasksRequest, ctx: ServerCallContext): Promise<ListTasksResponse> {
    const c = callOf(ctx);
    if (ctx.tenant !== undefined) throw new UnsupportedOperationError('the A2A tenant field is not accepted');
    // The transport's decoding turns what it cannot read into NaN or an unknown enum value:
    // refused here, not taken as "no filter" or a page of nothing.
    if (params.pageSize !== undefined && !Number.isInteger(params.pageSize)) throw new RequestMalformedError('pageSize must be an integer');
    if (params.status !== undefined && (params.status < 0 || TaskState[params.status] === undefined)) throw new RequestMalformedError('status is not a TaskState');
    if (params.statusTimestampAfter && Number.isNaN(Date.parse(params.statusTimestampAfter))) throw new RequestMalformedError('statusTimestampAfter must be an RFC 3339 timestamp');
    const pageSize = Math.min(Math.max(params.pageSize ?? 50, 1), MAX_LIST_PAGE);
    // A page token names the last task of the page before (its index score and id), not an
    // offset: a task sent between two pages neither repeats one nor skips one.
    let from: { score: number; id: string } | null = null;
    if (params.pageToken) {
      const m = /^c2_([0-9a-z]{1,12})_(sess_[0-9a-f]{32})$/.exec(params.pageToken);
      if (!m) throw new RequestMalformedError('pageToken is not a token issued by this list');
      from = { score: parseInt(m[1] as string, 36), id: m[2] as string };
    }
    const token = (t: { score: number; id: string }) => `c2_${t.score.toString(36)}_${t.id}`;
    // Newest first (score desc, then id desc): what comes after `from` in that order.
    const after = (x: { score: number; id: string }) => from === null || x.score < from.score || (x.score === from.score && x.id < from.id);
    // Newest first; a task's identity is scoped to this Principal on this placement. A Session's
    // deletion takes it out of the index (`a2aTaskListings`), so the index is what exists: an
    // unfiltered page reads its own tasks only, and the index counts them.
    const ws = c.placement.workspaceId;
    const index = keys.index(tags.workspace(ws), tasksIndex(c));
    const read = (id: string) => c.deps.sessions.store.getShared(ws, id).catch((err: unknown) => {
      if (err instanceof ApiError && err.type === 'validation.not_found') return null;
      throw err;
    });
    // The repair: an id whose Session is gone (one indexed by a send that raced the Session's
    // deletion) leaves the index where a listing meets it, before that listing counts or pages.
    const existing = async (ids: string[]): Promise<{ sessions: Array<Readonly<SessionDoc>>; pruned: boolean }> => {
      const docs = await Promise.all(ids.map(read));
      const gone = ids.filter((_, i) => docs[i] === null);
      if (gone.length > 0) await c.deps.redis.zrem(index, ...gone);
      return { sessions: docs.filter((s): s is Readonly<SessionDoc> => s !== null), pruned: gone.length > 0 };
    };
    const since = params.statusTimestampAfter ? Date.parse(params.statusTimestampAfter) : null;
    const filtered = params.status !== TaskState.TASK_STATE_UNSPECIFIED || since !== null;
    const load = async (s: Readonly<SessionDoc>): Promise<Task> => (await this.replay(c, s)).tracker.task(params.historyLength);
    const keep = (t: Task) => (params.status === TaskState.TASK_STATE_UNSPECIFIED || t.status?.state === params.status)
      && (since === null || (t.status?.timestamp !== undefined && Date.parse(t.status.timestamp) > since));
    // The index in listing order, each id with its score (ties: id descending).
    const ordered = async (): Promise<Array<{ score: number; id: string }>> => {
      const raw = await c.deps.redis.zrevrange(index, 0, -1, 'WITHSCORES');
      const rows: Array<{ score: number; id: string }> = [];
      for (let i = 0; i + 1 < raw.length; i += 2) rows.push({ id: raw[i] as string, score: Number(raw[i + 1]) });
      return rows.filter((r) => !params.contextId || r.id === params.contextId);
    };
    let tasks: Task[];
    let total: number;
    let last: { score: number; id: string } | null = null;
    let more = false;
    if (filtered) {
      // A task's state is in its log: a filtered listing reads every task of the index.
      const rows = await ordered();
      const sessions = new Map((await existing(rows.map((r) => r.id))).sessions.map((s) => [s.id, s]));
      const all: Array<{ row: { score: number; id: string }; task: Task }> = [];
      for (const row of rows) {
        const s = sessions.get(row.id);
        if (!s) continue;
        const task = await load(s);
        if (keep(task)) all.push({ row, task });
      }
      total = all.length;
      const rest = all.filter((x) => after(x.row));
      tasks = rest.slice(0, pageSize).map((x) => x.task);
      last = rest[Math.min(pageSize, rest.length) - 1]?.row ?? null;
      more = rest.length > pageSize;
    } else {
      // The page's ids and the index's count; read again when the page met a deleted Session
      // (each round takes at least one id out of the index, so the rounds end).
      let page: Array<Readonly<SessionDoc>>;
      for (;;) {
        const [rows, count] = params.contextId ? [await ordered(), null] : await Promise.all([this.pageFrom(c, index, from, after, pageSize + 1), c.deps.redis.zcard(index)]);
        total = count ?? rows.length;
        const rest = rows.filter(after);
        const slice = rest.slice(0, pageSize);
        last = slice[slice.length - 1] ?? null;
        more = rest.length > pageSize;
        const found = await existing(slice.map((r) => r.id));
        if (!found.pruned) {
          page = found.sessions;
          break;
        }
      }
      tasks = await Promise.all(page.map(load));
    }
    if (params.includeArtifacts !== true) tasks = tasks.map((t) => ({ ...t, artifacts: [] }));
    return { tasks, nextPageToken: more && last ? token(last) : '', pageSize, totalSize: total };
  }

  /**
   * Up to `want` ids of the index after `from` (listing order), read from `from`'s score down, a
   * chunk at a time: only the ids of equal score that came before it are read twice.
   */
  private async pageFrom(c: A2aCall, index: string, from: { score: number; id: string } | null, after: (x: { score: number; id: string }) => boolean, want: number): Promise<Array<{ score: number; id: string }>> {
    const redis = c.deps.redis;
    const out: Array<{ score: number; id: string }> = [];
    const chunk = want + 16;
    for (let skip = 0; ; skip += chunk) {
      const raw = await redis.zrevrangebyscore(index, from ? String(from.score) : '+inf', '-inf', 'WITHSCORES', 'LIMIT', skip, chunk);
      for (let i = 0; i + 1 < raw.length; i += 2) {
        const row = { id: raw[i] as string, score: Number(raw[i + 1]) };
        if (after(row)) out.push(row);
        if (out.length === want) return out;
      }
      if (raw.length < chunk * 2) return out;
    }
  }

  // ---- cancel ----------------------------------------------------------------------------

  async cancelTask(params: CancelTaskRequest, ctx: ServerCallContext): Promise<Task> {
    const c = callOf(ctx);
    if (ctx.tenant !== undefined) throw new UnsupportedOperationError('the A2A tenant field is not accepted');
    const s = await this.session(c, params.id);
    const { tracker, seq } = await this.replay(c, s);
    if (TERMINAL_STATES.has(tracker.state)) throw new TaskNotCancelableError(`task ${s.id} is already ${TaskState[tracker.state]}`);
    // The interrupt ends the turn under way; messages queued behind it would start the next one,
    // and the task would not stay canceled: refused, saying so, before anything is interrupted.
    if (tracker.queued > 0) {
      throw new TaskNotCancelableError(`task ${s.id} has ${tracker.queued} message(s) queued behind its running turn, which would start its next turn after a cancel`);
    }
    // CancelTask is the Session's user.interrupt; the task is canceled when the turn ends interrupted.
    await c.deps.sessions.drive(s, {
      type: 'user.interrupt', payload: { authored_by: c.caller.principalId, caused_by: { kind: 'a2a', id: `cancel:${s.id}` } },
    }, undefined, c.trace);
    // Bounded: a turn that does not stop within the wait is returned as it stands.
    const bounded: A2aCall = { ...c, signal: AbortSignal.any([c.signal, AbortSignal.timeout(CANCEL_WAIT_MS)]) };
    for await (const e of this.follow(bounded, s.id, seq)) {
      tracker.apply(e);
      if (TERMINAL_STATES.has(tracker.state)) break;
    }
    return tracker.task();
  }

  // ---- not served ------------------------------------------------------------------------

  async getAgentCard(): Promise<AgentCard> {
    throw new UnsupportedOperationError('the Agent Card is served at agent-card.json');
  }

  async getAuthenticatedExtendedAgentCard(): Promise<AgentCard> {
    throw new ExtendedAgentCardNotConfiguredError('no extended Agent Card');
  }

  async createTaskPushNotificationConfig(): Promise<TaskPushNotificationConfig> {
    throw new PushNotificationNotSupportedError('push notifications are not supported');
  }

  async getTaskPushNotificationConfig(): Promise<TaskPushNotificationConfig> {
    throw new PushNotificationNotSupportedError('push notifications are not supported');
  }

  async listTaskPushNotificationConfigs(): Promise<never> {
    throw new PushNotificationNotSupportedError('push notifications are not supported');
  }

  async deleteTaskPushNotificationConfig(): Promise<void> {
    throw new PushNotificationNotSupportedError('push notifications are not supported');
  }
}
