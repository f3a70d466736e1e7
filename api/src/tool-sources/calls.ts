import { randomBytes, timingSafeEqual } from 'node:crypto';
import type { Redis } from 'ioredis';
import { ApiError, nowIso, scrubSecrets, sha256Hex } from '@agentplane/core';
import { keys, tags, type EventLog, type LogEvent } from '@agentplane/store';
import { callPeer, type CallOutcome, type ClientTls, type PollPolicy } from './invoke.js';
import type { EgressPolicy } from '@agentplane/core';
import type { ToolSourceDoc } from './service.js';

/**
 * The durable record of one consumed A2A tool call, in the Session's slot. It is written before
 * the peer is called and fixes what a retry must reuse: the A2A `messageId` (so a re-sent
 * message is the same message to the peer), the peer's task id once known (a retry then only
 * polls), and the immutable hard deadline.
 */
export interface A2aCallRecord {
  call_id: string;
  workspace_id: string;
  session_id: string;
  session_thread_id: string | null;
  tool_source_id: string;
  source_revision: number;
  tool: string;
  skill_id: string;
  message_id: string;
  task_id: string | null;
  deadline_at: number;
  state: 'in_flight' | 'settled';
  /** Push: SHA-256 of the callback's generated Bearer value (the value itself is never stored). */
  push_digest: string | null;
  created_at: string;
}

export interface A2aCallInput {
  workspace_id: string;
  session_id: string;
  session_thread_id: string | null;
  /** The tool use id the harness gave the call (`toolu_…`): the call's identity across retries. */
  call_id: string;
  source: ToolSourceDoc;
  tool: string;
  text: string;
  /** Peer credential headers, resolved in this process; never stored. */
  headers: Record<string, string>;
  /** mTLS: the client certificate and key, resolved in this process; never stored. */
  tls?: ClientTls | undefined;
  /**
   * The peer refused the message's credential (401), so nothing was started there: a credential
   * to send it once more with (an OAuth2 token refreshed in place of the refused one), or null
   * when there is none other to try.
   */
  reauthorize?: () => Promise<{ headers: Record<string, string>; tls?: ClientTls | undefined } | null>;
}

export interface InvocationResult {
  event: LogEvent;
  outcome: CallOutcome;
}

export interface A2aCallSettings {
  policy: PollPolicy;
  /** Hard deadline of a call, from its first attempt. */
  deadlineMs: number;
  /** How often the due sweep runs. */
  sweepMs: number;
  /** The outbound address guard: every request's host is checked and the request connects to the checked address. */
  egress?: EgressPolicy;
  /** Public base URL push callbacks are registered under (null: push is not offered). */
  callbackBaseUrl?: string | null;
}

const recordKey = (sessionId: string, callId: string) => keys.scoped(tags.session(sessionId), `a2acall:${callId}`);
const DUE = keys.global('a2a_calls_due');
const WAKE_CHANNEL = keys.global('a2a_call_wake');
/**
 * The credential values a call sent the peer in its headers, whole and without their scheme
 * (`Bearer …`): what a peer's answer is scrubbed of (values shorter than 8 characters are not).
 */
const sentCredentials = (headers: Readonly<Record<string, string>>): string[] =>
  Object.values(headers).flatMap((v) => [v, v.replace(/^\s*\S+\s+/, '')]).filter((v) => v.length >= 8);
const callbackUrl = (base: string, r: A2aCallRecord) => `${base.replace(/\/+$/, '')}/v1/a2a-tool-callbacks/${r.session_id}/${r.call_id}`;
/** The producer key of the call's one `exec.tool_invocation` event. */
export const invocationProducerKey = (callId: string) => `a2a:${callId}:invocation`;

/**
 * One `exec.tool_invocation` per consumed call, whatever crashes: the event is appended under
 * the call's producer key, so every path that settles the call (the caller, a retry of the
 * caller, the due sweep) appends the same one event, and the first to append decides the result.
 */
export class A2aToolCalls {
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly redis: Redis, private readonly log: EventLog, private readonly settings: A2aCallSettings) {}

  async invoke(input: A2aCallInput): Promise<InvocationResult> {
    const tool = input.source.tools.find((t) => t.name === input.tool);
    if (!tool || !input.source.discovery) throw new ApiError('validation.not_found', `tool source ${input.source.id} has no tool ${input.tool}`);
    const fresh: A2aCallRecord = {
      call_id: input.call_id, workspace_id: input.workspace_id, session_id: input.session_id, session_thread_id: input.session_thread_id,
      tool_source_id: input.source.id, source_revision: input.source.revision, tool: input.tool, skill_id: tool.skill_id,
      message_id: `agentplane-${input.call_id}`, task_id: null, deadline_at: Date.now() + this.settings.deadlineMs, state: 'in_flight', push_digest: null, created_at: nowIso(),
    };
    const pushBase = this.settings.callbackBaseUrl;
    const bearer = pushBase && input.source.discovery?.push_notifications ? randomBytes(32).toString('base64url') : null;
    if (bearer) fresh.push_digest = sha256Hex(bearer);
    const key = recordKey(input.session_id, input.call_id);
    const created = await this.redis.set(key, JSON.stringify(fresh), 'PX', this.settings.deadlineMs + 86_400_000, 'NX');
    const record = created ? fresh : (JSON.parse((await this.redis.get(key)) ?? JSON.stringify(fresh)) as A2aCallRecord);
    if (created) await this.redis.zadd(DUE, record.deadline_at, `${record.session_id}/${record.call_id}`);
    if (record.state === 'settled') {
      const again = await this.settle(record, { status: 'indeterminate', task_id: record.task_id, text: '', polls: 0 });
      return again;
    }
    const push = bearer && created ? { url: callbackUrl(pushBase!, record), bearer, wait: (ms: number, signal: AbortSignal) => this.waitWake(record.call_id, ms, signal) } : undefined;
    if (push) await this.watch(record.call_id);
    const discovery = input.source.discovery;
    const call = (headers: Record<string, string>, tls: ClientTls | undefined) => callPeer({
      discovery, headers, tls, text: input.text, messageId: record.message_id, deadlineAt: record.deadline_at,
      policy: this.settings.policy, taskId: record.task_id,
      // A resumed call polls: only the attempt that registered the callback holds its Bearer.
      push,
      // The outbound address guard, on the very address each request connects to.
      egress: { rpcUrl: discovery.interface.url, policy: this.settings.egress },
      // Only the Bearer custody adapter holds a stream open; other alternatives poll.
      streaming: discovery.streaming && discovery.security.kind === 'bearer',
      onTask: async (taskId) => {
        record.task_id = taskId;
        await this.redis.set(key, JSON.stringify(record), 'KEEPTTL');
      },
    });
    const sent = [input.headers];
    let outcome: CallOutcome;
    try {
      outcome = await call(input.headers, input.tls);
      // The credential was refused before anything started at the peer (a token revoked or
      // rotated before its expiry): sent once more, with the one that replaces it, if any.
      if (outcome.status === 'error' && outcome.unauthorized && record.task_id === null && input.reauthorize) {
        const first = outcome;
        const again = await input.reauthorize().catch((err: unknown) => {
          // No other credential (the refresh refused, none held): the refusal stands, with why.
          outcome = { ...first, text: `${first.text}; the credential could not be renewed: ${err instanceof Error ? err.message : String(err)}` };
          return null;
        });
        if (again) {
          sent.push(again.headers);
          outcome = await call(again.headers, again.tls);
        }
      }
    } finally {
      this.watched.delete(record.call_id);
    }
    // A peer's answer may quote the credential it was sent (an HTTP error body the client quotes
    // in its message, a task's text): it is taken out before the event log keeps the text.
    return this.settle(record, outcome.status === 'indeterminate' ? outcome : { ...outcome, text: scrubSecrets(outcome.text, sent.flatMap(sentCredentials)) });
  }

  /**
   * Appends the call's one event (or reads it back, when another path appended it first) and
   * marks the record settled. Returns the outcome the event carries.
   */
  private async settle(record: A2aCallRecord, outcome: CallOutcome): Promise<InvocationResult> {
    const payload = {
      tool_use_id: record.call_id, tool_source_id: record.tool_source_id, source_revision: record.source_revision, tool: record.tool,
      skill_id: record.skill_id, status: outcome.status, task_id: outcome.task_id ?? record.task_id, result: { type: 'text', text: outcome.text },
      polls: outcome.polls, deadline_at: new Date(record.deadline_at).toISOString(),
    };
    const r = await this.log.append(record.session_id, [{
      type: 'exec.tool_invocation', payload, session_thread_id: record.session_thread_id, producer_key: invocationProducerKey(record.call_id),
    }]);
    if (!r.ok) throw new ApiError('validation.conflict', `session ${record.session_id} was erased`);
    const event = r.events[0]!;
    await this.redis.set(recordKey(record.session_id, record.call_id), JSON.stringify({ ...record, state: 'settled' }), 'KEEPTTL');
    await this.redis.zrem(DUE, `${record.session_id}/${record.call_id}`);
    const p = event.payload as typeof payload;
    return { event, outcome: { status: p.status, task_id: p.task_id, text: p.result.text, polls: p.polls } as CallOutcome };
  }

  /**
   * A push notification for a call (`POST /v1/a2a-tool-callbacks/{session_id}/{tool_use_id}`):
   * the call's Workspace when the Bearer value matches the call's stored digest and the call is
   * in flight (else null); the observer is then woken (in whichever api process it runs) and re-reads the task with GetTask.
   * The notification's body is never trusted for the result.
   */
  async notify(sessionId: string, callId: string, bearer: string): Promise<string | null> {
    const raw = await this.redis.get(recordKey(sessionId, callId));
    if (!raw) return null;
    const record = JSON.parse(raw) as A2aCallRecord;
    if (!record.push_digest || record.state !== 'in_flight') return null;
    const a = Buffer.from(sha256Hex(bearer));
    const b = Buffer.from(record.push_digest);
    if (a.length !== b.length || !timingSafeEqual(a, b)) return null;
    await this.redis.publish(WAKE_CHANNEL, callId);
    return record.workspace_id;
  }

  private subscriber: Promise<Redis> | undefined;
  private readonly waiters = new Map<string, Set<() => void>>();
  /** Calls of this process that take notifications: id → a wake arrived while none was waiting. */
  private readonly watched = new Map<string, boolean>();

  /** Subscribes (once per process) before a call's first send, so no notification is missed. */
  private async watch(callId: string): Promise<void> {
    this.subscriber ??= (async () => {
      const sub = this.redis.duplicate();
      sub.on('message', (_channel: string, id: string) => {
        const waiting = this.waiters.get(id);
        if (waiting && waiting.size > 0) for (const wake of waiting) wake();
        else if (this.watched.has(id)) this.watched.set(id, true);
      });
      await sub.subscribe(WAKE_CHANNEL);
      return sub;
    })();
    this.watched.set(callId, false);
    await this.subscriber;
  }

  /** Sleeps `ms`, or less when a push notification for the call arrives (or arrived since the last wait). */
  private async waitWake(callId: string, ms: number, signal: AbortSignal): Promise<void> {
    if (this.watched.get(callId) === true) {
      this.watched.set(callId, false);
      return;
    }
    await new Promise<void>((resolve) => {
      const set = this.waiters.get(callId) ?? new Set<() => void>();
      this.waiters.set(callId, set);
      const done = () => {
        clearTimeout(timer);
        set.delete(done);
        if (set.size === 0) this.waiters.delete(callId);
        signal.removeEventListener('abort', done);
        resolve();
      };
      const timer = setTimeout(done, ms);
      set.add(done);
      signal.addEventListener('abort', done, { once: true });
    });
  }

  /** The due sweep: calls past their hard deadline and still in flight settle as indeterminate, without calling the peer. */
  async sweep(now = Date.now()): Promise<number> {
    const due = await this.redis.zrangebyscore(DUE, '-inf', now, 'LIMIT', 0, 100);
    let settled = 0;
    for (const member of due) {
      const [sessionId, callId] = member.split('/') as [string, string];
      const raw = await this.redis.get(recordKey(sessionId, callId));
      if (!raw) {
        await this.redis.zrem(DUE, member);
        continue;
      }
      const record = JSON.parse(raw) as A2aCallRecord;
      if (record.state === 'settled') {
        await this.redis.zrem(DUE, member);
        continue;
      }
      await this.settle(record, { status: 'indeterminate', task_id: record.task_id, text: '', polls: 0 });
      settled += 1;
    }
    return settled;
  }

  start(onError: (err: unknown) => void): void {
    this.timer ??= setInterval(() => void this.sweep().catch(onError), this.settings.sweepMs);
    this.timer.unref();
  }

  close(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
    void this.subscriber?.then((sub) => sub.disconnect());
    this.subscriber = undefined;
  }
}
