import { request as httpRequest, type IncomingMessage } from 'node:http';
import { request as httpsRequest } from 'node:https';
import type { LookupFunction } from 'node:net';
import type { Job, Queue } from 'bullmq';
import { Webhook } from 'standardwebhooks';
import { BUCKETS, crashPoint, Counter, Histogram, type Logger, type Metrics } from '@agentplane/core';
import { tags, type EventLog, type LogEvent, type Redis } from '@agentplane/store';
import { QueueHost } from '../queue-host.js';
import type { SessionEventTap, TappedAppend } from '../events/tap.js';
import { CachedMemberSet } from '../events/member-set.js';
import { EgressRefused, resolveAllowed, type EgressPolicy } from '@agentplane/core';
import { webhookKeys, type WebhookStore } from './store.js';
import type { EndpointDoc } from './model.js';

export const WEBHOOK_QUEUE_PREFIX = 'ap:{q:webhooks}';
const QUEUE = 'webhooks';

export interface DeliverySettings {
  maxAttempts: number;
  retryBaseMs: number;
  retryMaxMs: number;
  timeoutMs: number;
  sweepIntervalMs: number;
  egress: EgressPolicy;
}

interface LaneData { workspace_id: string; endpoint_id: string; session_id: string; cursor: number }

/** Job id of one lane step: the endpoint, the Session and the cursor it starts from. */
const laneJobId = (endpointId: string, sessionId: string, cursor: number): string => `lane-${endpointId}-${sessionId}-${cursor}`;

/** Exponential backoff with full jitter in [delay/2, delay]: base · 2^(attempt-1), capped. */
export function retryDelay(attemptsMade: number, baseMs: number, maxMs: number, rand = Math.random()): number {
  const d = Math.min(maxMs, baseMs * 2 ** Math.max(0, attemptsMade - 1));
  return Math.round(d / 2 + (d / 2) * rand);
}

/** The longest a receiver's `Retry-After` holds back the next attempt: one hour. */
export const RETRY_AFTER_MAX_MS = 3_600_000;

/** Answers whose `Retry-After` the next attempt honours: 429 Too Many Requests, 503 Service Unavailable. */
const THROTTLED = new Set([429, 503]);

const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const DAY = '(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun)';
const MONTH = `(${MONTHS.join('|')})`;
const TIME = '(\\d{2}):(\\d{2}):(\\d{2})';
/** IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`). */
const IMF_FIXDATE = new RegExp(`^${DAY}, (\\d{2}) ${MONTH} (\\d{4}) ${TIME} GMT$`);
/** The obsolete RFC 850 form (`Sunday, 06-Nov-94 08:49:37 GMT`). */
const RFC850_DATE = new RegExp(`^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), (\\d{2})-${MONTH}-(\\d{2}) ${TIME} GMT$`);
/** The obsolete asctime form (`Sun Nov  6 08:49:37 1994`, GMT). */
const ASCTIME_DATE = new RegExp(`^${DAY} ${MONTH} ([ \\d]\\d) ${TIME} (\\d{4})$`);

/** An HTTP date (RFC 9110 §5.6.7: the three forms a recipient accepts) as epoch milliseconds; null when it is not one. */
export function parseHttpDate(value: string, nowMs = Date.now()): number | null {
  let parts: { day: string; month: string; year: number; h: string; m: string; s: string } | null = null;
  let match = IMF_FIXDATE.exec(value);
  if (match) parts = { day: match[1]!, month: match[2]!, year: Number(match[3]), h: match[4]!, m: match[5]!, s: match[6]! };
  else if ((match = RFC850_DATE.exec(value))) {
    // A two-digit year more than 50 years ahead is the most recent past year ending in those digits.
    const thisYear = new Date(nowMs).getUTCFullYear();
    let year = Math.floor(thisYear / 100) * 100 + Number(match[3]);
    if (year > thisYear + 50) year -= 100;
    parts = { day: match[1]!, month: match[2]!, year, h: match[4]!, m: match[5]!, s: match[6]! };
  } else if ((match = ASCTIME_DATE.exec(value))) {
    parts = { day: match[2]!.trim(), month: match[1]!, year: Number(match[6]), h: match[3]!, m: match[4]!, s: match[5]! };
  }
  if (!parts) return null;
  const [day, month, h, m, s] = [Number(parts.day), MONTHS.indexOf(parts.month), Number(parts.h), Number(parts.m), Number(parts.s)];
  if (h > 23 || m > 59 || s > 60) return null;
  const at = new Date(Date.UTC(parts.year, month, day, h, m, Math.min(s, 59)));
  // No 31 April and no day 0: a date the calendar does not have is not a date.
  return at.getUTCDate() === day && at.getUTCMonth() === month ? at.getTime() : null;
}

/**
 * A `Retry-After` value as the milliseconds to wait from `nowMs`: delay-seconds (digits only) or
 * an HTTP date (one already past is 0). Null when absent or malformed (`1.5`, `-1`, `30 seconds`,
 * a date in another form). Not capped: see `throttleDelay`.
 */
export function parseRetryAfter(value: string | undefined, nowMs = Date.now()): number | null {
  const v = value?.trim();
  if (!v) return null;
  if (/^\d+$/.test(v)) return Number(v) * 1000;
  const at = parseHttpDate(v, nowMs);
  return at === null ? null : Math.max(0, at - nowMs);
}

/**
 * How long a throttled answer asks the next attempt to wait: a valid `Retry-After` of a 429 or a
 * 503, capped at `RETRY_AFTER_MAX_MS`; null for any other status, or without a valid header.
 */
export function throttleDelay(status: number, retryAfter: string | undefined, nowMs = Date.now()): number | null {
  if (!THROTTLED.has(status)) return null;
  const ms = parseRetryAfter(retryAfter, nowMs);
  return ms === null ? null : Math.min(ms, RETRY_AFTER_MAX_MS);
}

/**
 * The wait before the next attempt: the jittered backoff (`retryDelay`), or longer when the
 * failed attempt was throttled with a `Retry-After` (already capped by `throttleDelay`), never shorter.
 */
export function nextAttemptDelay(attemptsMade: number, baseMs: number, maxMs: number, retryAfterMs: number | null, rand = Math.random()): number {
  return Math.max(retryDelay(attemptsMade, baseMs, maxMs, rand), retryAfterMs ?? 0);
}

/** The JSON body of one delivery (docs/AUTOMATIONS.md, "Delivery body"). */
export function deliveryBody(ws: string, e: Pick<LogEvent, 'id' | 'type' | 'created_at' | 'payload'> & { session_id: string | null; session_thread_id: string | null; seq: number }): string {
  return JSON.stringify({
    id: e.id, type: e.type, created_at: e.created_at, workspace_id: ws, session_id: e.session_id, session_thread_id: e.session_thread_id, seq: e.seq, payload: e.payload,
  });
}

/** How much of a receiver's response body a delivery reads before it closes the connection. */
const MAX_RESPONSE_BYTES = 64 * 1024;

export interface SendResult {
  status_code: number;
  latency_ms: number;
  error: string | null;
  /** A throttled answer's `Retry-After` (429 or 503), in ms and capped (`throttleDelay`); else null. */
  retry_after_ms: number | null;
}

/** A failed attempt; `retryAfterMs` (a throttled answer's `Retry-After`) holds back the next one. */
class DeliveryError extends Error {
  constructor(message: string, readonly retryAfterMs: number | null = null) {
    super(message);
    this.name = 'DeliveryError';
  }
}

/**
 * Signed outbound deliveries. Every matching Session event goes to every enabled endpoint of
 * its Workspace, at least once and in order per Session: a lane (endpoint × Session) is a chain
 * of BullMQ jobs, one per cursor position, each delivering the next event and advancing the
 * cursor by compare-and-swap before queueing the next step. A failed delivery is retried by
 * BullMQ with exponential backoff and jitter, held back further by a 429's or 503's
 * `Retry-After`; one that exhausts its attempts disables the endpoint and leaves the cursor on
 * it, so re-enabling resumes there.
 */
export class WebhookDispatcher {
  private readonly host: QueueHost;
  readonly queue: Queue;
  /** Workspaces that have (or had) endpoints. */
  private readonly workspaces: CachedMemberSet;
  private readonly endpointCache = new Map<string, { at: number; list: EndpointDoc[] }>();
  private readonly counter: Counter<'outcome'>;
  private readonly latency: Histogram;

  constructor(private readonly d: { redisUrl: string; redis: Redis; store: WebhookStore; log: EventLog; tap: SessionEventTap; logger: Logger; metrics: Metrics; settings: DeliverySettings; onDisabled?: (e: EndpointDoc, reason: string) => Promise<void> }) {
    this.host = new QueueHost({ name: 'webhooks', label: 'webhooks', queue: QUEUE, prefix: WEBHOOK_QUEUE_PREFIX, redisUrl: d.redisUrl, log: d.logger });
    this.queue = this.host.queue;
    this.workspaces = new CachedMemberSet(d.redis, webhookKeys.workspaces());
    this.counter = new Counter({ name: 'agentplane_webhook_deliveries_total', help: 'Outbound webhook delivery attempts by outcome', labelNames: ['outcome'], registers: [d.metrics] });
    this.latency = new Histogram({ name: 'agentplane_webhook_delivery_duration_seconds', help: 'Outbound webhook delivery latency', buckets: [...BUCKETS.http], registers: [d.metrics] });
  }

  get store(): WebhookStore {
    return this.d.store;
  }

  // ---- sending -------------------------------------------------------------------------------

  /**
   * One signed POST to the endpoint: the egress guard on the resolved address, no redirects
   * followed, and one deadline (`timeoutMs`) for the whole exchange, the host's lookup included:
   * the status must arrive within it, and the response body is read for no longer than that and
   * no further than 64 KiB.
   */
  async send(endpoint: EndpointDoc, messageId: string, body: string): Promise<SendResult> {
    const started = performance.now();
    const secrets = await this.d.store.signingSecrets(endpoint.workspace_id, endpoint.id);
    const at = new Date();
    const signature = secrets.map((s) => new Webhook(s).sign(messageId, at, body)).join(' ');
    const url = new URL(endpoint.url);
    const done = (status_code: number, error: string | null, retry_after_ms: number | null = null): SendResult => {
      const latency_ms = Math.round(performance.now() - started);
      this.counter.inc({ outcome: status_code >= 200 && status_code < 300 ? 'succeeded' : 'failed' });
      this.latency.observe(latency_ms / 1000);
      return { status_code, latency_ms, error, retry_after_ms };
    };
    const timeoutMs = this.d.settings.timeoutMs;
    let target: { address: string; family: 4 | 6 };
    // A name server that never answers ends the attempt at the deadline too (the lookup itself
    // cannot be called off; its late answer is dropped).
    let lookupDeadline: NodeJS.Timeout | undefined;
    try {
      const late = new Promise<null>((resolve) => {
        lookupDeadline = setTimeout(() => resolve(null), timeoutMs);
      });
      const found = await Promise.race([resolveAllowed(url.hostname, this.d.settings.egress), late]);
      if (found === null) return done(0, 'timeout');
      target = found;
    } catch (err) {
      return done(0, err instanceof EgressRefused ? 'egress_refused' : 'dns_failed');
    } finally {
      clearTimeout(lookupDeadline);
    }
    const lookup: LookupFunction = (_host, opts, cb) => {
      if ((opts as { all?: boolean }).all) (cb as unknown as (e: null, a: { address: string; family: number }[]) => void)(null, [target]);
      else cb(null, target.address, target.family);
    };
    const requestFn = url.protocol === 'https:' ? httpsRequest : httpRequest;
    const remainingMs = Math.max(0, timeoutMs - (performance.now() - started));
    return new Promise<SendResult>((resolve) => {
      let status: number | null = null;
      let retryAfterMs: number | null = null;
      let settled = false;
      let deadline: NodeJS.Timeout | undefined;
      // One deadline for the whole exchange, not an idle timeout: a receiver that trickles its
      // status line, or streams a body without end, is cut off at the same time as a silent one.
      // A status that arrived in time is the answer; without one the attempt failed (`error`).
      const finish = (error: string): void => {
        if (settled) return;
        settled = true;
        clearTimeout(deadline);
        req.destroy();
        resolve(done(status ?? 0, status === null ? error : null, retryAfterMs));
      };
      const req = requestFn(url, {
        method: 'POST', lookup,
        headers: {
          'content-type': 'application/json', 'content-length': Buffer.byteLength(body), 'user-agent': 'agentplane-webhooks/1',
          'webhook-id': messageId, 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)), 'webhook-signature': signature,
        },
      }, (res: IncomingMessage) => {
        status = res.statusCode ?? 0;
        retryAfterMs = throttleDelay(status, res.headers['retry-after']);
        // The status is the answer; the body is read only to end the exchange cleanly, and at most
        // MAX_RESPONSE_BYTES of it (past that the connection is closed).
        let read = 0;
        res.on('data', (chunk: Buffer) => {
          read += chunk.length;
          if (read > MAX_RESPONSE_BYTES) finish('connection_failed');
        });
        res.on('end', () => finish('connection_failed'));
        res.on('error', () => finish('connection_failed'));
      });
      deadline = setTimeout(() => finish('timeout'), remainingMs);
      req.on('error', () => finish('connection_failed'));
      req.end(body);
    });
  }

  /** `POST /v1/webhook-endpoints/{id}/test`: one synthetic `webhook.test` delivery, never in any Session log. */
  async test(endpoint: EndpointDoc): Promise<{ delivered: boolean; status_code: number }> {
    const id = `evt_test_${Date.now().toString(16)}${Math.random().toString(16).slice(2, 10)}`;
    const body = deliveryBody(endpoint.workspace_id, { id, type: 'webhook.test', created_at: new Date().toISOString(), session_id: null, session_thread_id: null, seq: 0, payload: {} });
    const r = await this.send(endpoint, id, body);
    const delivered = r.status_code >= 200 && r.status_code < 300;
    await this.d.store.record(endpoint.workspace_id, endpoint.id, {
      message_id: id, event_type: 'webhook.test', session_id: null, seq: 0, attempt: 1, status_code: r.status_code, latency_ms: r.latency_ms,
      outcome: delivered ? 'succeeded' : 'failed', error: failure(r, delivered), retry_after_ms: r.retry_after_ms, test: true,
    });
    return { delivered, status_code: r.status_code };
  }

  // ---- lanes ---------------------------------------------------------------------------------

  async enqueueLane(ws: string, endpointId: string, sessionId: string, cursor: number): Promise<void> {
    const jobId = laneJobId(endpointId, sessionId, cursor);
    const old = await this.queue.getJob(jobId);
    // `queue.remove`, not the job's own: another process may have removed it since (no error then).
    if (old && (await old.isFailed())) await this.queue.remove(jobId);
    await this.queue.add('deliver', { workspace_id: ws, endpoint_id: endpointId, session_id: sessionId, cursor } satisfies LaneData, {
      jobId, attempts: this.d.settings.maxAttempts, backoff: { type: 'jittered' }, removeOnComplete: true, removeOnFail: { age: 7 * 24 * 3600 },
    });
  }

  private async lane(job: Job<LaneData>): Promise<void> {
    const { workspace_id: ws, endpoint_id: id, session_id: sid, cursor } = job.data;
    const endpoint = await this.d.store.docs.get<EndpointDoc>(tags.workspace(ws), id);
    if (!endpoint) return;
    if (endpoint.status !== 'enabled') {
      // The step that disabled the endpoint (its lane's cursor is still on the event), run again:
      // its api may have died, or the announcement failed, after the disable was written and
      // before it was announced. Announcing again fires no subscription twice (one firing per
      // endpoint and disable time).
      if (endpoint.disabled_reason === 'delivery_failed' && (await this.d.store.cursor(ws, id, sid)) === cursor) await this.d.onDisabled?.(endpoint, 'a delivery failed');
      return;
    }
    if ((await this.d.store.cursor(ws, id, sid)) !== cursor) return; // a stale step: the lane moved on
    let at = cursor;
    for (;;) {
      const batch = await this.d.log.range(sid, at, 50);
      if (batch.length === 0) {
        if (at !== cursor) await this.d.store.advance(ws, id, sid, cursor, at);
        return;
      }
      const next = batch.find((e) => endpoint.event_types.length === 0 || endpoint.event_types.includes(e.type));
      if (!next) {
        at = batch[batch.length - 1]!.seq;
        continue;
      }
      // The cursor stays where this job found it until `next` is delivered, and then moves past
      // it and the events the filter skipped before it in one step: a cursor moved ahead of the
      // send would let the tap or the sweep start a second job at the new cursor, which would
      // send `next` again while this one still is.
      const r = await this.send(endpoint, next.id, deliveryBody(ws, next));
      const ok = r.status_code >= 200 && r.status_code < 300;
      await this.d.store.record(ws, id, {
        message_id: next.id, event_type: next.type, session_id: sid, seq: next.seq, attempt: job.attemptsMade + 1, status_code: r.status_code,
        latency_ms: r.latency_ms, outcome: ok ? 'succeeded' : 'failed', error: failure(r, ok),
        retry_after_ms: r.retry_after_ms, test: false,
      });
      if (r.status_code === 410) {
        // 410 Gone: the receiver wants no more deliveries (Standard Webhooks). The endpoint is
        // disabled now, not after the remaining attempts; the cursor stays on the event, so
        // enabling the endpoint again delivers from there. The step ends without a retry.
        await this.disable(job.data, 'status 410 (gone)');
        return;
      }
      if (!ok) {
        const reason = r.error ?? `status ${r.status_code}`;
        // The last attempt disables the endpoint before the job is marked failed, so that the
        // sweep (which resumes the lanes of enabled endpoints) cannot start the lane over first.
        if (job.attemptsMade + 1 >= this.d.settings.maxAttempts) await this.disable(job.data, reason);
        // Retried from the same cursor, skipping the same events again. A throttled answer (429 or
        // 503 with a valid Retry-After) still counts as an attempt; the backoff strategy reads its
        // Retry-After from this error and waits at least that long before the next one.
        throw new DeliveryError(reason, r.retry_after_ms);
      }
      if (!(await this.d.store.advance(ws, id, sid, cursor, next.seq))) return;
      const state = await this.d.log.state(sid);
      if (state.seq > next.seq) await this.enqueueLane(ws, id, sid, next.seq);
      return;
    }
  }

  /**
   * Disables the endpoint (`delivery_failed`) and announces it (`onDisabled`: the
   * `webhook_endpoint.disabled` subscriptions). An endpoint this step finds disabled for a failed
   * delivery already is announced again: the earlier announcement may have failed, and a repeat
   * fires nothing twice. A crash between the write and the announcement is repaired by the step
   * run again (`lane`).
   */
  private async disable(data: LaneData, reason: string): Promise<void> {
    let changed = false;
    const e = await this.d.store.update(data.workspace_id, data.endpoint_id, (cur) => {
      changed = cur.status !== 'disabled';
      return changed ? { ...cur, status: 'disabled', disabled_reason: 'delivery_failed', disabled_at: new Date().toISOString() } : null;
    });
    this.endpointCache.delete(data.workspace_id);
    if (changed) {
      crashPoint('webhook-endpoint-disabled');
      this.d.logger.warn({ endpoint_id: e.id, session_id: data.session_id, reason }, 'webhook endpoint disabled: a delivery exhausted its attempts or was answered 410 Gone');
    }
    if (e.status === 'disabled' && e.disabled_reason === 'delivery_failed') await this.d.onDisabled?.(e, reason);
  }

  /** After an endpoint is enabled again: every lane whose Session has events past its cursor resumes. */
  async resume(ws: string, endpointId: string): Promise<void> {
    const lanes = await this.d.store.lanes(ws, endpointId);
    for (const [sid, cur] of Object.entries(lanes)) {
      const state = await this.d.log.state(sid);
      if (state.erased) await this.d.store.dropLane(ws, endpointId, sid);
      else if (state.seq > Number(cur)) await this.enqueueLane(ws, endpointId, sid, Number(cur));
    }
  }

  // ---- the event tap -------------------------------------------------------------------------

  private async endpointsOf(ws: string): Promise<EndpointDoc[]> {
    const c = this.endpointCache.get(ws);
    if (c && Date.now() - c.at < 1000) return c.list;
    const list = await this.d.store.enabled(ws);
    this.endpointCache.set(ws, { at: Date.now(), list });
    return list;
  }

  forget(ws: string): void {
    this.endpointCache.delete(ws);
    this.workspaces.invalidate();
  }

  private async onAppend(a: TappedAppend): Promise<void> {
    for (const e of await this.endpointsOf(a.workspace_id)) {
      if (e.event_types.length > 0 && (await this.d.store.cursor(a.workspace_id, e.id, a.session_id)) === null) {
        // A lane starts at the first append that holds an event the endpoint wants.
        if (!(await a.events()).some((x) => e.event_types.includes(x.type))) continue;
      }
      const cur = await this.d.store.initCursor(a.workspace_id, e.id, a.session_id, a.from - 1);
      if (cur !== null) await this.enqueueLane(a.workspace_id, e.id, a.session_id, cur);
    }
  }

  /** Lanes whose Session moved past their cursor while no api heard it (a restart): queued again. */
  async sweep(): Promise<void> {
    for (const ws of await this.d.redis.smembers(webhookKeys.workspaces())) {
      for (const e of await this.d.store.enabled(ws)) await this.resume(ws, e.id);
    }
  }

  start(): void {
    const s = this.d.settings;
    const worker = this.host.startWorker(async (job: Job) => this.lane(job as Job<LaneData>), {
      concurrency: 32,
      settings: {
        backoffStrategy: (attemptsMade: number, _type?: string, err?: Error) =>
          nextAttemptDelay(attemptsMade, s.retryBaseMs, s.retryMaxMs, err instanceof DeliveryError ? err.retryAfterMs : null),
      },
    });
    if (!worker) return;
    worker.on('failed', (job, err) => {
      if (!job || job.attemptsMade < s.maxAttempts) return;
      void this.disable(job.data as LaneData, err.message).catch((e: unknown) => this.d.logger.error({ err: e }, 'disabling a failing webhook endpoint failed'));
    });
    this.d.tap.on({ wants: (f) => this.workspaces.has(f.workspace_id) }, (a) => this.onAppend(a));
    this.host.sweepEvery(s.sweepIntervalMs, () => this.sweep(), 'webhook sweep failed')();
  }

  close(): Promise<void> {
    return this.host.close();
  }
}

/** A delivery record's `error`: what the send found (a timeout, no connection), else the receiver's status. */
function failure(r: { status_code: number; error: string | null }, ok: boolean): string | null {
  return r.error ?? (ok ? null : `status_${r.status_code}`);
}
