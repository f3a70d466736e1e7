import { AgentCard, Role, TaskState, type Message, type Part, type Task } from '@a2a-js/sdk';
import type { StreamResponse } from '@a2a-js/sdk';
import { ClientFactory, ClientFactoryOptions, JsonRpcTransportFactory, type Client } from '@a2a-js/sdk/client';
import { sha256Hex } from '@agentplane/core';
import type { Discovery } from './card.js';
import { egressFetch, type EgressFetch } from '../webhooks/egress-fetch.js';
import type { EgressPolicy } from '@agentplane/core';
import { capResponseBody, MAX_UPSTREAM_RESPONSE_BYTES } from '../mcp/egress.js';

/**
 * Polling for an external A2A task (docs/A2A_TOOLS.md, "Invocation"). Delays grow from
 * `initialMs` by `factor` up to `maxMs`, each with a task-specific jitter of at most ±`jitter`
 * of the delay; a valid `Retry-After` on a 429 or 503 replaces the computed delay when it is at
 * most `maxRetryAfterMs`. Nothing ever waits past the hard deadline.
 */
export interface PollPolicy {
  initialMs: number;
  factor: number;
  maxMs: number;
  /** Fraction of the delay, 0 ≤ jitter < 1. */
  jitter: number;
  maxRetryAfterMs: number;
  /** Time limit of one HTTP request (still cut by the hard deadline). */
  requestTimeoutMs: number;
}

export const DEFAULT_POLL_POLICY: PollPolicy = { initialMs: 500, factor: 2, maxMs: 30_000, jitter: 0.2, maxRetryAfterMs: 120_000, requestTimeoutMs: 30_000 };

/** A task's own jitter in [-1, 1): the same task and attempt always draw the same value. */
function jitterUnit(taskId: string, attempt: number): number {
  return (parseInt(sha256Hex(`${taskId}:${attempt}`).slice(0, 8), 16) / 0x1_0000_0000) * 2 - 1;
}

/** The computed delay before poll `attempt` (0-based: attempt 0 is not delayed). */
export function backoffDelay(policy: PollPolicy, taskId: string, attempt: number): number {
  if (attempt <= 0) return 0;
  const base = Math.min(policy.maxMs, policy.initialMs * policy.factor ** (attempt - 1));
  return Math.max(0, Math.min(policy.maxMs, Math.round(base * (1 + policy.jitter * jitterUnit(taskId, attempt)))));
}

/**
 * An HTTP `Retry-After` value in ms, or null when it is not valid: delta-seconds (digits only)
 * or an HTTP-date, not in the past, and not beyond `maxMs`.
 */
export function parseRetryAfter(value: string | null | undefined, now: number, maxMs: number): number | null {
  if (value === null || value === undefined) return null;
  const v = value.trim();
  let ms: number;
  if (/^\d{1,10}$/.test(v)) ms = Number(v) * 1000;
  else if (/^[A-Z][a-z]{2}, \d{2} [A-Z][a-z]{2} \d{4} \d{2}:\d{2}:\d{2} GMT$/.test(v) && Number.isFinite(Date.parse(v))) ms = Date.parse(v) - now;
  else return null;
  if (ms < 0 || ms > maxMs) return null;
  return ms;
}

/** A 429 or 503 from the peer: temporary; its `Retry-After` when valid. */
export class PeerBusy extends Error {
  constructor(readonly status: number, readonly retryAfter: string | null) {
    super(`the peer answered ${status}`);
  }
}

/** A 401 from the peer: the credential the request carried was refused (the body's start quoted). */
export class PeerUnauthorized extends Error {
  constructor(body: string) {
    super(`the peer answered 401${body ? `: ${body}` : ''}`);
  }
}

/** How much of a 401's body its error quotes. */
const UNAUTHORIZED_QUOTE_CHARS = 1024;

export type CallOutcome =
  | { status: 'completed' | 'failed' | 'canceled' | 'rejected' | 'input_required' | 'auth_required'; task_id: string | null; text: string; polls: number }
  /** The hard deadline passed before the peer settled the task: nothing is known of its result. */
  | { status: 'indeterminate'; task_id: string | null; text: ''; polls: number }
  /**
   * The peer could not be reached or refused the request (the send was not accepted).
   * `unauthorized`: it refused the message's credential (401), so nothing was started there.
   */
  | { status: 'error'; task_id: string | null; text: string; polls: number; unauthorized?: true };

export interface CallInput {
  discovery: Pick<Discovery, 'interface' | 'agent_name' | 'agent_version'>;
  /** Headers carrying the peer credential (resolved from a Vault by the caller). */
  headers: Record<string, string>;
  /** mTLS: the client certificate and key presented on the TLS connection to the peer. */
  tls?: ClientTls | undefined;
  text: string;
  /** The A2A messageId: stable per consumed call, so a retried send is the same message. */
  messageId: string;
  /** Epoch ms; immutable for the call. */
  deadlineAt: number;
  policy: PollPolicy;
  /** The provider package's ceiling, enforced on every request. */
  egress?: EgressCeiling;
  /** Test seams. */
  now?: () => number;
  sleep?: (ms: number, signal: AbortSignal) => Promise<void>;
  /** A task already created by an earlier attempt of this call: resume polling it, never send again. */
  taskId?: string | null;
  /** Called once with the peer's task id, before the first poll (the caller records it durably). */
  onTask?: (taskId: string) => Promise<void>;
  /**
   * Stream instead of polling: one `SendStreamingMessage`, and after a dropped stream only
   * `SubscribeToTask` on the same task (never a second send). Only when the card is signed as
   * streaming and the credential's custody adapter can hold a stream open.
   */
  streaming?: boolean;
  /**
   * Push (cards declaring push notifications): the task-scoped callback registered with the
   * send, its generated Bearer value, and `wake`, which resolves early when a notification for
   * this call arrives. A notification only wakes the observer; the task is re-read with GetTask.
   */
  push?: { url: string; bearer: string; wait: (ms: number, signal: AbortSignal) => Promise<void> } | undefined;
  /** Called with each task state seen (observability). */
  onPoll?: (state: string, attempt: number) => void;
}

const TERMINAL: Partial<Record<TaskState, Exclude<CallOutcome['status'], 'indeterminate' | 'error'>>> = {
  [TaskState.TASK_STATE_COMPLETED]: 'completed',
  [TaskState.TASK_STATE_FAILED]: 'failed',
  [TaskState.TASK_STATE_CANCELED]: 'canceled',
  [TaskState.TASK_STATE_REJECTED]: 'rejected',
  [TaskState.TASK_STATE_INPUT_REQUIRED]: 'input_required',
  [TaskState.TASK_STATE_AUTH_REQUIRED]: 'auth_required',
};

const defaultSleep = (ms: number, signal: AbortSignal) => new Promise<void>((resolve) => {
  const t = setTimeout(resolve, ms);
  signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
});

const partsText = (parts: readonly Part[]) => parts.map((p) => (p.content?.$case === 'text' ? p.content.value : '')).filter((s) => s !== '').join('\n');

/** The text result of a settled task: its artifacts, else its status message. */
export function taskText(task: Task): string {
  const fromArtifacts = task.artifacts.map((a) => partsText(a.parts)).filter((s) => s !== '').join('\n');
  if (fromArtifacts !== '') return fromArtifacts;
  return task.status?.message ? partsText(task.status.message.parts) : '';
}

/**
 * The egress ceiling at call time: every request must be a POST to exactly the JSON-RPC URL the
 * provider package admits, and, with a `policy`, passes the outbound address guard: its host is
 * resolved and checked, and the request connects to exactly the address that was checked
 * (`webhooks/egress-fetch.ts`, the same fetch as MCP Connections'), so a DNS answer that changes
 * between the check and the connection cannot reach a private address.
 */
export interface EgressCeiling {
  rpcUrl: string;
  policy?: EgressPolicy | undefined;
}

/** A client certificate (PEM) and its key (PEM). */
export interface ClientTls {
  cert: string;
  key: string;
}

const requestUrl = (input: Parameters<typeof fetch>[0]) => (typeof input === 'string' ? input : input instanceof URL ? input.href : input.url);

/**
 * A fetch inside the egress ceiling that turns 429 and 503 into `PeerBusy` (with the
 * response's Retry-After), and never follows redirects. A peer's JSON answer is read up to
 * MAX_UPSTREAM_RESPONSE_BYTES: one past it fails the request, and its connection is closed (a
 * stream's events are limited one by one by the SDK's SSE parser, a stream itself only by the
 * deadline). With a client certificate (the mTLS
 * custody adapter) the requests go over one TLS agent per call, never pooled with other
 * credentials (plain `fetch` cannot present a client certificate).
 */
function guardedFetch(ceiling: EgressCeiling | undefined, tls?: ClientTls): typeof fetch {
  const send: EgressFetch = tls || ceiling?.policy
    ? egressFetch({ policy: ceiling?.policy, tls })
    : (input, init) => fetch(input, { ...init, redirect: 'error' });
  return async (input, init) => {
    if (ceiling) {
      const url = new URL(requestUrl(input));
      const method = (init?.method ?? (input instanceof Request ? input.method : 'GET')).toUpperCase();
      if (url.href !== new URL(ceiling.rpcUrl).href || method !== 'POST') throw new Error(`egress refused: ${method} ${url.href} is outside the provider package`);
    }
    const res = await send(input, init);
    if (res.status === 401) {
      const text = await res.text().then((t) => t.slice(0, UNAUTHORIZED_QUOTE_CHARS), () => '');
      throw new PeerUnauthorized(text);
    }
    if (res.status === 429 || res.status === 503) {
      await res.body?.cancel().catch(() => undefined);
      throw new PeerBusy(res.status, res.headers.get('retry-after'));
    }
    const stream = /^\s*text\/event-stream\s*(;|$)/i.test(res.headers.get('content-type') ?? '');
    return stream ? res : capResponseBody(res, MAX_UPSTREAM_RESPONSE_BYTES);
  };
}

/** An SDK client bound to the one JSON-RPC interface discovery chose. */
export async function peerClient(discovery: CallInput['discovery'], streaming = false, ceiling?: EgressCeiling, tls?: ClientTls): Promise<Client> {
  const card = AgentCard.fromJSON({
    name: discovery.agent_name, description: '', version: discovery.agent_version,
    supportedInterfaces: [{ url: discovery.interface.url, protocolBinding: 'JSONRPC', protocolVersion: discovery.interface.protocol_version }],
    capabilities: { streaming }, defaultInputModes: ['text/plain'], defaultOutputModes: ['text/plain'], skills: [],
  });
  const factory = new ClientFactory(ClientFactoryOptions.createFrom(ClientFactoryOptions.default, { transports: [new JsonRpcTransportFactory({ fetchImpl: guardedFetch(ceiling, tls) })] }));
  return factory.createFromAgentCard(card);
}

function findBusy(err: unknown): PeerBusy | null {
  for (let e: unknown = err, i = 0; e && i < 5; e = (e as { cause?: unknown }).cause, i++) if (e instanceof PeerBusy) return e;
  return null;
}

function isUnauthorized(err: unknown): boolean {
  for (let e: unknown = err, i = 0; e && i < 5; e = (e as { cause?: unknown }).cause, i++) if (e instanceof PeerUnauthorized) return true;
  return false;
}

/** The send's refusal: `unauthorized` when the peer refused its credential. */
function notAccepted(err: unknown, polls: number): CallOutcome {
  return { status: 'error', task_id: null, text: `the peer did not accept the message: ${(err as Error).message}`, polls, ...(isUnauthorized(err) ? { unauthorized: true as const } : {}) };
}

/**
 * One consumed call: one `SendMessage` (returning immediately), then `GetTask` polling that
 * starts at once, backs off per task, honours a valid Retry-After on 429/503, and always loses
 * to the hard deadline (the outcome is then `indeterminate`, and the peer is not called again).
 */
export async function callPeer(input: CallInput, client?: Client): Promise<CallOutcome> {
  const now = input.now ?? Date.now;
  const sleep = input.sleep ?? defaultSleep;
  const peer = client ?? (await peerClient(input.discovery, input.streaming === true, input.egress, input.tls));
  const deadline = new AbortController();
  const remaining = () => input.deadlineAt - now();
  if (remaining() <= 0) return { status: 'indeterminate', task_id: null, text: '', polls: 0 };
  const timer = setTimeout(() => deadline.abort(), remaining());
  const options = () => ({
    signal: AbortSignal.any([deadline.signal, AbortSignal.timeout(Math.max(1, Math.min(input.policy.requestTimeoutMs, remaining())))]),
    serviceParameters: input.headers,
  });
  let taskId: string | null = null;
  let polls = 0;
  try {
    const message: Message = {
      messageId: input.messageId, contextId: '', taskId: '', role: Role.ROLE_USER, metadata: undefined, extensions: [], referenceTaskIds: [],
      parts: [{ content: { $case: 'text', value: input.text }, metadata: undefined, filename: '', mediaType: 'text/plain' }],
    };
    if (input.streaming) return await streamTask(peer, input, message, deadline.signal, remaining, options, (id) => { taskId = id; });
    let task: Task;
    if (input.taskId) {
      taskId = input.taskId;
      task = { id: taskId, contextId: '', status: { state: TaskState.TASK_STATE_WORKING, message: undefined, timestamp: undefined }, artifacts: [], history: [], metadata: undefined };
    } else try {
      const sent = await peer.sendMessage({
        tenant: '', message, metadata: undefined,
        configuration: {
          acceptedOutputModes: ['text/plain'], returnImmediately: true,
          taskPushNotificationConfig: input.push
            ? { tenant: '', id: '', taskId: '', url: input.push.url, token: '', authentication: { scheme: 'Bearer', credentials: input.push.bearer } }
            : undefined,
        },
      }, options());
      if (!('status' in sent)) return { status: 'completed', task_id: null, text: partsText(sent.parts), polls };
      task = sent;
    } catch (err) {
      if (deadline.signal.aborted || remaining() <= 0) return { status: 'indeterminate', task_id: null, text: '', polls };
      return notAccepted(err, polls);
    }
    if (taskId === null) {
      taskId = task.id;
      await input.onTask?.(taskId);
    }
    for (let attempt = 0; ; attempt++) {
      const state = task.status?.state ?? TaskState.TASK_STATE_UNSPECIFIED;
      input.onPoll?.(TaskState[state], attempt);
      const settled = TERMINAL[state];
      if (settled) return { status: settled, task_id: taskId, text: taskText(task), polls };
      let delay = backoffDelay(input.policy, taskId, attempt === 0 ? 0 : attempt);
      for (;;) {
        if (delay >= remaining()) return { status: 'indeterminate', task_id: taskId, text: '', polls };
        if (delay > 0) await (input.push?.wait ?? sleep)(delay, deadline.signal);
        if (remaining() <= 0) return { status: 'indeterminate', task_id: taskId, text: '', polls };
        try {
          polls += 1;
          task = await peer.getTask({ tenant: '', id: taskId }, options());
          break;
        } catch (err) {
          if (remaining() <= 0) return { status: 'indeterminate', task_id: taskId, text: '', polls };
          const busy = findBusy(err);
          const retryAfter = busy ? parseRetryAfter(busy.retryAfter, now(), input.policy.maxRetryAfterMs) : null;
          // A temporary refusal waits as the peer asks; anything else backs off like a poll.
          delay = retryAfter ?? backoffDelay(input.policy, taskId, attempt + 1);
        }
      }
    }
  } finally {
    clearTimeout(timer);
  }
}

/**
 * The most of a streamed task's result held (characters of its artifacts' text): a peer whose
 * appended chunks grow past it ends the call as an error (a polled task's answer is bounded by the
 * size of one answer).
 */
const MAX_RESULT_CHARS = 4 * 1024 * 1024;

/** Folds stream events into one task view (artifacts by id, appended chunks joined). */
class TaskView {
  state: TaskState = TaskState.TASK_STATE_UNSPECIFIED;
  statusText = '';
  private readonly artifacts = new Map<string, string>();
  /** The characters of the artifacts' text held. */
  size = 0;

  private setArtifact(id: string, text: string): void {
    this.size += text.length - (this.artifacts.get(id)?.length ?? 0);
    this.artifacts.set(id, text);
  }

  apply(ev: StreamResponse): { taskId?: string; message?: string } {
    const p = ev.payload;
    if (!p) return {};
    switch (p.$case) {
      case 'message':
        return { message: partsText(p.value.parts) };
      case 'task': {
        this.state = p.value.status?.state ?? this.state;
        this.artifacts.clear();
        this.size = 0;
        for (const a of p.value.artifacts) this.setArtifact(a.artifactId, partsText(a.parts));
        if (p.value.status?.message) this.statusText = partsText(p.value.status.message.parts);
        return { taskId: p.value.id };
      }
      case 'statusUpdate':
        this.state = p.value.status?.state ?? this.state;
        if (p.value.status?.message) this.statusText = partsText(p.value.status.message.parts);
        return { taskId: p.value.taskId };
      case 'artifactUpdate': {
        const a = p.value.artifact;
        if (a) this.setArtifact(a.artifactId, (p.value.append ? (this.artifacts.get(a.artifactId) ?? '') : '') + partsText(a.parts));
        return { taskId: p.value.taskId };
      }
    }
  }

  text(): string {
    const t = [...this.artifacts.values()].filter((s) => s !== '').join('\n');
    return t !== '' ? t : this.statusText;
  }
}

/** What a stream's next event loses to once the call's deadline passed. */
const DEADLINE = Symbol('deadline');

async function streamTask(
  peer: Client, input: CallInput, message: Message, deadline: AbortSignal, remaining: () => number,
  options: () => { signal: AbortSignal; serviceParameters: Record<string, string> }, known: (taskId: string) => void,
): Promise<CallOutcome> {
  const view = new TaskView();
  let taskId: string | null = input.taskId ?? null;
  let resumes = 0;
  if (taskId) known(taskId);
  // A stream has no per-request time limit; only the deadline ends it.
  const streamOptions = () => ({ ...options(), signal: deadline });
  // The deadline wins even over a transport that does not end its stream when told to (each
  // event is awaited against it): the call is then indeterminate, and its stream closed.
  const lapsed = new Promise<typeof DEADLINE>((resolve) => {
    if (deadline.aborted) resolve(DEADLINE);
    else deadline.addEventListener('abort', () => resolve(DEADLINE), { once: true });
  });
  for (let attempt = 0; ; attempt++) {
    const stream = taskId === null
      ? peer.sendMessageStream({ tenant: '', message, metadata: undefined, configuration: { acceptedOutputModes: ['text/plain'], taskPushNotificationConfig: undefined, returnImmediately: false } }, streamOptions())
      : peer.resubscribeTask({ tenant: '', id: taskId }, streamOptions());
    if (taskId !== null && attempt > 0) resumes += 1;
    const sent = attempt === 0 && taskId === null;
    const events = stream[Symbol.asyncIterator]();
    let ended = false;
    try {
      for (;;) {
        const next = events.next();
        next.catch(() => undefined);
        const step = await Promise.race([next, lapsed]);
        if (step === DEADLINE) return { status: 'indeterminate', task_id: taskId, text: '', polls: resumes };
        if (step.done) {
          ended = true;
          break;
        }
        const seen = view.apply(step.value);
        if (seen.message !== undefined && taskId === null) return { status: 'completed', task_id: null, text: seen.message, polls: resumes };
        if (seen.taskId && taskId === null) {
          taskId = seen.taskId;
          known(taskId);
          await input.onTask?.(taskId);
        }
        if (view.size > MAX_RESULT_CHARS) {
          return { status: 'error', task_id: taskId, text: `the peer's result grew past ${MAX_RESULT_CHARS} characters`, polls: resumes };
        }
        input.onPoll?.(TaskState[view.state], attempt);
        const settled = TERMINAL[view.state];
        if (settled) return { status: settled, task_id: taskId, text: view.text(), polls: resumes };
      }
    } catch (err) {
      ended = true;
      if (deadline.aborted || remaining() <= 0) return { status: 'indeterminate', task_id: taskId, text: '', polls: resumes };
      if (sent && taskId === null) return notAccepted(err, resumes);
    } finally {
      // Left before its end (a result, the deadline): the stream is closed, as `for await` would.
      if (!ended) void events.return?.(undefined).catch(() => undefined);
    }
    if (taskId === null) return { status: 'error', task_id: null, text: 'the peer ended the stream before naming a task', polls: resumes };
    // The stream dropped before a final state: resume the same task after a backoff.
    const delay = backoffDelay(input.policy, taskId, attempt + 1);
    if (delay >= remaining()) return { status: 'indeterminate', task_id: taskId, text: '', polls: resumes };
    await (input.sleep ?? defaultSleep)(delay, deadline);
    if (remaining() <= 0) return { status: 'indeterminate', task_id: taskId, text: '', polls: resumes };
  }
}
