import { ApiError, BUCKETS, Counter, crashPoint, Histogram, type Logger, type Metrics } from '@agentplane/core';
import type { Gateway, RunnerConnection } from '@agentplane/gateway';
import { leaseRecordTtlMs, type Lease, type LeaseConfig, type LeaseKeeper, type LeaseRecord, type LeaseRecords, type OfferReply } from '@agentplane/lease';
import type { LeaseRef } from '@agentplane/protocol';
import { BoundedCache, type EventLog } from '@agentplane/store';
import type { ModelsModule } from '../models/module.js';
import { ModelStreams } from '../models/model-streams.js';
import type { RunLifecycle, SessionStore, TurnResult } from '@agentplane/domain';
import type { ApprovalService } from '../approvals/service.js';
import { boundedGraderResult } from '@agentplane/domain';

export interface RunHandlerDeps {
  keeper: LeaseKeeper;
  records: LeaseRecords;
  lifecycle: RunLifecycle;
  log: EventLog;
  store: SessionStore;
  models: ModelsModule;
  lease: LeaseConfig;
  logger: Logger;
  /** ActionPolicies and ActionApprovals: the tool-call boundary asks them through `tool.check`. */
  approvals: ApprovalService;
  metrics: Metrics;
  /** The grace a cancelled Run's tools get before they are killed (`lease.cancel`'s `grace_ms`). */
  interruptGraceMs: number;
}

/**
 * Leases whose first event batch was appended here. An entry goes when the lease ends here (or is
 * revoked); ends seen elsewhere (the runner moved to another node, or died) are bounded by count
 * and age: a lease forgotten early only takes the first batch's path again, which then appends
 * alone (the Run already records its first event).
 */
const FIRST_EVENTS_KEPT = 10_000;
const FIRST_EVENT_KEPT_MS = 10 * 60_000;

/** The kinds of wait a runner reports in a turn's end (`lease.complete` `result.waits`). */
const RUNNER_WAIT_KINDS: ReadonlySet<string> = new Set(['custom_tool', 'confirmation', 'question']);
/** The largest stop reason a runner may report, serialized (it is written into the Session log). */
const STOP_REASON_MAX_BYTES = 8 * 1024;

const isRecord = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const isId = (v: unknown): v is string => typeof v === 'string' && v.length >= 1 && v.length <= 128;

/**
 * What is wrong with the parts of a turn's end the control plane records as the runner sent
 * them (the stop reason goes into `session.status_idle`, the waits onto the thread), or null.
 * The frame's schema leaves the result open (executors add fields of their own), so these parts
 * are checked here, before anything of the end is written.
 */
function resultProblem(result: Record<string, unknown>): string | null {
  const stop = result.stop_reason;
  if (stop !== undefined) {
    if (!isRecord(stop) || typeof stop.type !== 'string' || stop.type.length < 1 || stop.type.length > 64) {
      return 'result.stop_reason must be an object with a type (1 to 64 characters)';
    }
    if (Buffer.byteLength(JSON.stringify(stop)) > STOP_REASON_MAX_BYTES) return `result.stop_reason is larger than ${STOP_REASON_MAX_BYTES} bytes`;
    if (stop.tool_use_ids !== undefined && (!Array.isArray(stop.tool_use_ids) || stop.tool_use_ids.length > 1024 || !stop.tool_use_ids.every(isId))) {
      return 'result.stop_reason.tool_use_ids must list the waiting tool use ids';
    }
  }
  const waits = result.waits;
  if (waits !== undefined) {
    if (!Array.isArray(waits) || waits.length > 1024) return 'result.waits must be an array of at most 1024 waits';
    for (const w of waits as unknown[]) {
      if (!isRecord(w) || !isId(w.tool_use_id) || typeof w.kind !== 'string' || !RUNNER_WAIT_KINDS.has(w.kind) || Object.keys(w).length !== 2) {
        return `result.waits: each wait is {tool_use_id, kind} with kind one of ${[...RUNNER_WAIT_KINDS].join(', ')}`;
      }
    }
  }
  return null;
}

const leaseOf = (rec: LeaseRecord): Lease => ({
  lease_id: rec.lease_id, run_id: rec.run_id, session_id: rec.session_id, pool_id: rec.pool_id, attempt: rec.attempt, runner_id: rec.runner_id,
});

/**
 * The control plane's answers to lease, event and model frames. Every lease-bound frame is
 * checked against the lease record (this runner, this attempt) and then fenced by the lock token.
 */
export function registerRunHandlers(gw: Gateway, d: RunHandlerDeps): void {
  const recordTtl = leaseRecordTtlMs(d.lease.leaseMs);
  const firstEventSeen = new BoundedCache<string, true>(FIRST_EVENTS_KEPT, { maxAgeMs: FIRST_EVENT_KEPT_MS });
  /** When each lease accepted here was accepted (time to first event), until its first event. */
  const acceptedAt = new Map<string, number>();
  const appendSeconds = new Histogram({
    name: 'agentplane_session_event_append_seconds', help: 'One runner event batch appended to its Session log, by outcome (ok, fenced)',
    labelNames: ['outcome'] as const, buckets: [...BUCKETS.append], registers: [d.metrics],
  });
  const appended = new Counter({ name: 'agentplane_session_events_appended_total', help: 'Session events appended from runner event batches', registers: [d.metrics] });
  const firstEventSeconds = new Histogram({
    name: 'agentplane_run_time_to_first_event_seconds', help: 'Lease accepted → the turn\'s first session event appended',
    buckets: [...BUCKETS.firstEvent], registers: [d.metrics],
  });
  const modelStreams = new Map<string, ModelStreams>();

  /** The lease's model streams on this connection stop: their provider requests are aborted. */
  const endModelStreams = (conn: RunnerConnection, leaseId: string): void => {
    modelStreams.get(conn.id)?.cancelGroup(leaseId);
  };

  const revoke = (conn: RunnerConnection, ref: LeaseRef, reason: string) => {
    known.delete(ref.lease_id);
    firstEventSeen.delete(ref.lease_id);
    acceptedAt.delete(ref.lease_id);
    endModelStreams(conn, ref.lease_id);
    return conn.send('lease.revoked', { lease_id: ref.lease_id, attempt: ref.attempt, reason });
  };

  /**
   * Frames of one socket are handled concurrently (a model stream must not block heartbeats),
   * but a lease's frames must not overtake its acceptance: an event batch sent right after
   * lease.accept would otherwise meet a fence that is not claimed yet.
   */
  const accepting = new Map<string, Promise<void>>();

  /**
   * Lease records of leases accepted through this node, until the lease ends here: a record
   * never changes once written, so a lease's later frames (events, heartbeats, completion) skip
   * the read. Only a shortcut to the record: every write is still fenced by the lock token.
   */
  const known = new Map<string, LeaseRecord>();
  
  /**
   * An offer's answer to the scheduler that made it: over its node link when it has one here, else
   * published. It names the runner it is about: the scheduler may have offered the same lease to
   * the next runner since (an answer to an offer it withdrew must not settle that one).
   */
  const reply = (rec: LeaseRecord, answer: Omit<OfferReply, 'runner_id'>): Promise<void> =>
    gw.sendToChannel(rec.reply_to, JSON.stringify({ ...answer, runner_id: rec.runner_id } satisfies OfferReply));

  async function recordFor(conn: RunnerConnection, ref: LeaseRef): Promise<LeaseRecord | null> {
    await accepting.get(ref.lease_id);
    const rec = known.get(ref.lease_id) ?? await d.records.get(ref.lease_id);
    if (!rec || rec.attempt !== ref.attempt || rec.runner_id !== conn.identity.runnerId || rec.workspace_id !== conn.identity.workspaceId) return null;
    return rec;
  }

  gw.on('lease.accept', async (conn, msg) => {
    let done!: () => void;
    const gate = new Promise<void>((r) => (done = r));
    accepting.set(msg.payload.lease_id, gate);
    try {
      await acceptLease(conn, msg.payload);
    } finally {
      done();
      if (accepting.get(msg.payload.lease_id) === gate) accepting.delete(msg.payload.lease_id);
    }
  });

  async function acceptLease(conn: RunnerConnection, ref: LeaseRef): Promise<void> {
    // An offer sent over a node link can overtake, by a hair, the write of its record that the
    // scheduler flushed to Redis just before it: a record not found is read once more.
    const rec = (await d.records.get(ref.lease_id)) ?? (await d.records.get(ref.lease_id));
    const msg = { payload: ref };
    if (!rec || rec.attempt !== ref.attempt || rec.runner_id !== conn.identity.runnerId || rec.workspace_id !== conn.identity.workspaceId) {
      return void revoke(conn, msg.payload, 'unknown or expired offer');
    }
    // The fence is claimed by the Run's move to running (leased and started in one move), in one
    // script: the Run records the lease before the scheduler hears of it, so the answer tells it
    // there is nothing left to record. (The lease record was written to live as long as a
    // lease's: heartbeats renew it from here.)
    const lease = { lease_id: rec.lease_id, runner_id: rec.runner_id, attempt: rec.attempt };
    const outcome = await d.keeper.accept(leaseOf(rec), (fence, claim, ttlMs) => d.lifecycle.accepted(rec.session_id, rec.run_id, lease, { fence, claim, ttlMs }));
    if (outcome !== 'ok') {
      // The record goes first: a frame the runner sends for this lease afterwards (a failure, as
      // it stops) finds no lease and cannot end the attempt the scheduler still holds. Only this
      // runner's: an acceptance that came after its offer was withdrawn (`taken`) may find the
      // lease offered to the next runner already, under the same lease id.
      await d.records.removeOffer(rec.lease_id, rec.runner_id);
      await reply(rec, { lease_id: rec.lease_id, outcome: 'rejected', reason: outcome });
      const why = outcome === 'taken' ? 'the offer was withdrawn or the lease belongs to another runner' : outcome === 'canceled' ? 'the Run was interrupted' : 'the offer expired';
      return void revoke(conn, msg.payload, why);
    }
    await reply(rec, { lease_id: rec.lease_id, outcome: 'accepted', recorded: true });
    known.set(rec.lease_id, rec);
    // Leases lost without a last frame leave an entry: keep the map bounded.
    if (known.size > 10_000) known.delete(known.keys().next().value as string);
    acceptedAt.set(rec.lease_id, performance.now());
    // Leases lost without a last frame leave an entry: keep the map bounded.
    if (acceptedAt.size > 10_000) acceptedAt.delete(acceptedAt.keys().next().value as string);
  }

  // A runner that connects again names the leases it still holds. Those it was given but no
  // longer names died with its previous process: they are rescheduled now, not after the lease
  // expires; an offer it never answered is refused so the scheduler offers it elsewhere.
  gw.onConnected(async (conn, held) => {
    const orphans = await d.records.orphansOf(conn.identity.runnerId, new Set(held.map((l) => l.lease_id)));
    for (const rec of orphans) {
      if (rec.workspace_id !== conn.identity.workspaceId) continue;
      await accepting.get(rec.lease_id);
      const reason = 'the runner reconnected without this lease';
      const verdict = await d.keeper.abandon(leaseOf(rec), reason);
      if (verdict === 'not_accepted') {
        await reply(rec, { lease_id: rec.lease_id, outcome: 'rejected', reason });
        continue;
      }
      firstEventSeen.delete(rec.lease_id);
      known.delete(rec.lease_id);
      d.logger.info({ run: rec.run_id, lease: rec.lease_id, runner: rec.runner_id, verdict }, 'lease abandoned by a restarted runner');
      if (verdict === 'retry') await d.lifecycle.abandoned(rec.session_id, rec.run_id, rec.lease_id, reason);
      else if (verdict === 'final') {
        await d.lifecycle.failed(rec.session_id, rec.run_id, rec.lease_id, { class: 'infrastructure', code: 'retries_exhausted', message: reason });
      }
      await d.records.remove(rec.lease_id, rec.runner_id);
    }
  });

  // The leases a reconnecting runner names are resumed only while they are still its own: the
  // record names this runner, attempt and Workspace, and the lease was not lost meanwhile. One
  // that cannot be judged now (a read failed) is resumed: its next frame is fenced anyway.
  gw.onResume(async (identity, held) => {
    const judged = await Promise.all(held.map(async (ref) => {
      try {
        await accepting.get(ref.lease_id);
        const rec = known.get(ref.lease_id) ?? await d.records.get(ref.lease_id);
        if (!rec || rec.attempt !== ref.attempt || rec.runner_id !== identity.runnerId || rec.workspace_id !== identity.workspaceId) return null;
        return (await d.keeper.resumable(leaseOf(rec))) ? ref : null;
      } catch (err) {
        d.logger.warn({ err: err instanceof Error ? err.message : String(err), lease: ref.lease_id }, 'cannot tell whether a held lease is still the runner\'s; resumed');
        return ref;
      }
    }));
    return judged.filter((ref): ref is LeaseRef => ref !== null);
  });

  gw.on('lease.reject', async (conn, msg) => {
    const rec = await recordFor(conn, msg.payload);
    if (rec) await reply(rec, { lease_id: rec.lease_id, outcome: 'rejected', reason: msg.payload.reason });
  });

  gw.on('lease.heartbeat', async (conn, msg) => {
    const rec = await recordFor(conn, msg.payload);
    if (!rec) return void revoke(conn, msg.payload, 'unknown lease');
    const beat = await d.keeper.heartbeat(leaseOf(rec));
    if (beat === 'lost') return void revoke(conn, msg.payload, 'the lease was lost (it expired and the Run was rescheduled)');
    // An interrupt whose lease.cancel never reached this runner (sent to the node it had left, or
    // lost on the way): its mark is found here, and the cancellation repeats in every
    // heartbeat.ack until the runner drops the lease.
    if (beat === 'canceled') conn.cancelLease(msg.payload, 'user.interrupt', d.interruptGraceMs);
    await d.records.touch(rec.lease_id, recordTtl);
  });

  /**
   * The turn's end as the Run records it: a use under an ActionApproval waits for the approval,
   * not for a drive event, and a grader's report is bounded.
   */
  async function turnEnd(rec: LeaseRecord, result: Partial<TurnResult>): Promise<TurnResult> {
    const waits = result.waits ? await d.approvals.waitKinds(rec.workspace_id, rec.session_id, rec.run_id, result.waits) : undefined;
    const grader = result.grader ? boundedGraderResult(result.grader) : undefined;
    return {
      stop_reason: (result.stop_reason ?? { type: 'end_turn' }) as TurnResult['stop_reason'],
      ...(waits ? { waits } : {}),
      ...(grader ? { grader } : {}),
    };
  }

  /**
   * The runner keeps the lease until this frame is answered (`ack`, or `lease.revoked`) and sends
   * it again after a reconnect or an error: every step here may be repeated (the keeper answers a
   * complete of a job this lease completed already `ok`, and the turn end applies once).
   */
  gw.on('lease.complete', async (conn, msg, trace) => {
    const rec = await recordFor(conn, msg.payload);
    if (!rec) return void revoke(conn, msg.payload, 'unknown lease');
    // A result the turn's end cannot record as sent is refused before anything is written (sent
    // again, it would be refused again): the lease stays as it is, and is lost if the runner
    // gives it up.
    const result = msg.payload.result ?? {};
    const problem = resultProblem(result);
    if (problem) return void conn.send('error', { code: 'invalid_result', message: problem, retryable: false }, msg.id);
    // The job carries the end as recorded here, so the scheduler's replay of a completed job
    // (after a crash below) ends the turn the same way.
    const end = await turnEnd(rec, result as Partial<TurnResult>);
    if ((await d.keeper.complete(leaseOf(rec), end)) === 'lost') return void revoke(conn, msg.payload, 'the lease was lost before completion');
    // The job is completed, and neither the Run nor the thread records it yet: the scheduler's
    // reconciliation of completed jobs ends the turn if this process dies here.
    crashPoint('run-completed');
    firstEventSeen.delete(rec.lease_id);
    known.delete(rec.lease_id);
    acceptedAt.delete(rec.lease_id);
    endModelStreams(conn, rec.lease_id);
    await d.lifecycle.succeeded(rec.session_id, rec.run_id, rec.lease_id, end, trace);
    // Approvals resolved while the Run was still ending answer their waits now.
    if (end.waits) await d.approvals.settleWaits(rec.workspace_id, rec.session_id, end.waits).catch((err: unknown) => d.logger.error({ err, run: rec.run_id }, 'settling approval waits failed'));
    // The end is on the Run: the job and the lease record go (a crash before this leaves them
    // to the scheduler's sweep and to their expiry).
    await Promise.all([d.keeper.finished(leaseOf(rec)).catch(() => undefined), d.records.remove(rec.lease_id, rec.runner_id)]);
    conn.send('ack', {}, msg.id);
  });

  gw.on('lease.fail', async (conn, msg, trace) => {
    const rec = await recordFor(conn, msg.payload);
    if (!rec) return void revoke(conn, msg.payload, 'unknown lease');
    // Only the attempt that holds the lease ends it: an offer never accepted (its job's lock is
    // still the offering scheduler's, under the same token) or a lease lost since is not failed
    // here (an offer is declined with lease.reject).
    if (!(await d.keeper.holds(leaseOf(rec)))) return void revoke(conn, msg.payload, 'the lease is not held: never accepted, or lost');
    const cls = msg.payload.failure_class === 'work' ? 'agent' : 'infrastructure';
    const verdict = await d.keeper.fail(leaseOf(rec), { class: cls, code: cls === 'agent' ? 'work_failed' : 'runner_failure', message: msg.payload.reason });
    firstEventSeen.delete(rec.lease_id);
    known.delete(rec.lease_id);
    acceptedAt.delete(rec.lease_id);
    endModelStreams(conn, rec.lease_id);
    if (verdict === 'retry') await d.lifecycle.rescheduled(rec.session_id, rec.run_id, rec.lease_id, msg.payload.reason, trace);
    else if (verdict === 'final') {
      await d.lifecycle.failed(rec.session_id, rec.run_id, rec.lease_id, {
        class: msg.payload.failure_class, code: cls === 'agent' ? 'work_failed' : 'retries_exhausted', message: msg.payload.reason,
      }, trace);
    }
    await d.records.remove(rec.lease_id, rec.runner_id);
  });

  gw.on('events.batch', async (conn, msg, trace) => {
    const p = msg.payload;
    const rec = await recordFor(conn, p);
    if (!rec || rec.session_id !== p.session_id) return void revoke(conn, p, 'unknown lease');
    const endAppend = appendSeconds.startTimer();
    const events = p.events.map((e) => ({ type: e.type, payload: e.payload, session_thread_id: rec.thread_id, producer_key: e.producer_key }));
    const first = firstEventSeen.get(rec.lease_id) === undefined;
    // A lease's first batch records the Run's first event in the same script.
    const res = first
      ? await d.lifecycle.appendFirstEvents(rec.session_id, rec.run_id, events, { fence: rec.lease_id, trace })
      : await d.log.append(rec.session_id, events, { fence: rec.lease_id, trace });
    endAppend({ outcome: res.ok ? 'ok' : 'fenced' });
    if (res.ok) appended.inc(res.events.length);
    if (!res.ok) return void revoke(conn, p, res.reason === 'erased' ? 'the session was deleted' : 'the lease was lost: writes are fenced');
    conn.send('events.ack', { lease_id: p.lease_id, attempt: p.attempt, seqs: res.events.map((e) => e.seq) }, msg.id);
    if (first) {
      firstEventSeen.set(rec.lease_id, true);
      const at = acceptedAt.get(rec.lease_id);
      acceptedAt.delete(rec.lease_id);
      if (at !== undefined) firstEventSeconds.observe((performance.now() - at) / 1000);
    }
  });

  /**
   * Connections this node has forgotten: a model request whose checks were still under way when
   * its socket went starts no provider request (nothing would abort it before its first event,
   * and its streams' table would outlive the connection).
   */
  const gone = new WeakSet<RunnerConnection>();

  // A connection gone (closed, lost, replaced): its provider requests are aborted now, not at
  // their next event, and its streams' table goes with it.
  gw.onDisconnected((conn) => {
    gone.add(conn);
    modelStreams.get(conn.id)?.closeAll();
    modelStreams.delete(conn.id);
  });

  /** One ModelStreams per connection (validation, per-connection cap, cancel, socket loss). */
  const streamsOf = (conn: RunnerConnection): ModelStreams => {
    let s = modelStreams.get(conn.id);
    if (!s) {
      s = new ModelStreams(d.models.gateway, (f) => conn.send(f.type, { stream_id: f.stream_id, event: f.event }), d.logger);
      modelStreams.set(conn.id, s);
    }
    return s;
  };
  /** Uncursored previews for `event_deltas` SSE viewers of the stream's own Session and thread. */
  const previews = (sessionId: string, threadId: string) => {
    let index = 0;
    return (f: { stream_id: string; event: { type: string; text?: string } }) => {
      const ev = f.event;
      if ((ev.type === 'text_delta' || ev.type === 'thinking_delta') && ev.text !== undefined) {
        void d.log.publishDelta(sessionId, { session_thread_id: threadId, type: ev.type === 'text_delta' ? 'agent.message' : 'agent.thinking', message_id: f.stream_id, index: index++, text: ev.text });
      }
    };
  };

  /**
   * A model step is served only under a lease this attempt still holds: the lease record names
   * this runner and attempt, and its Session fence is live (one read, beside the Session's). A
   * lease revoked here meanwhile, or later, ends the step (`endModelStreams`).
   */
  gw.on('model.request', async (conn, msg, trace) => {
    const p = msg.payload;
    const deny = () => conn.send('model.end', { stream_id: p.stream_id, event: { type: 'error', error: { type: 'policy.denied', message: 'model steps need a live lease held by this runner', retryable: false } } });
    const rec = await recordFor(conn, p).catch(() => null);
    if (!rec) return void deny();
    const wasKnown = known.has(rec.lease_id);
    const [live, session] = await Promise.all([
      d.keeper.holds(leaseOf(rec)).catch(() => false),
      // No such Session: no Session budget (the Workspace's still holds). Unread (Redis failing):
      // undefined, and the step is not served without the budget it may have (retried).
      d.store.get(rec.workspace_id, rec.session_id).catch((err: unknown) => (err instanceof ApiError && err.type === 'validation.not_found' ? null : undefined)),
    ]);
    if (!live || (wasKnown && !known.has(rec.lease_id))) return void deny();
    if (session === undefined) {
      return void conn.send('model.end', { stream_id: p.stream_id, event: { type: 'error', error: { type: 'runtime.internal', message: 'the Session could not be read to check its budget; retry the step', retryable: true } } });
    }
    // The socket went while the lease was read: no one is left to stream to.
    if (gone.has(conn)) return;
    const streams = streamsOf(conn);
    await streams.open(rec.workspace_id, p.stream_id, p.request, {
      session_id: rec.session_id, thread_id: rec.thread_id, run_id: rec.run_id, session_budget: session?.budget ?? null,
      routing_pin: session?.agent_deployment ?? null, trace,
    }, previews(rec.session_id, rec.thread_id), rec.lease_id);
    if (streams.size === 0 && modelStreams.get(conn.id) === streams) modelStreams.delete(conn.id);
  });

  /**
   * The tool-call boundary: the runner asks before running each tool use. Only a live lease of
   * this runner gets an answer other than deny; an evaluation failure denies (fail closed). The
   * ActionPolicies are those of the lease's Workspace, for the Run's author Principals; a
   * `require_approval` opens (or reads) the use's ActionApproval.
   */
  gw.on('tool.check', async (conn, msg, trace) => {
    const p = msg.payload;
    const answer = (decision: 'allow' | 'deny' | 'require_approval', rule_id: string | null, message: string) =>
      conn.send('tool.decision', { lease_id: p.lease_id, attempt: p.attempt, tool_use_id: p.tool_use_id, decision, rule_id, message: message.slice(0, 2048) }, msg.id);
    const rec = await recordFor(conn, p).catch(() => null);
    const live = rec !== null && await d.keeper.holds(leaseOf(rec)).catch(() => false);
    if (!rec || !live) return void answer('deny', null, 'tool calls need a live lease held by this runner');
    try {
      const decided = await d.approvals.checkToolUse(
        { workspace_id: rec.workspace_id, session_id: rec.session_id, thread_id: rec.thread_id, run_id: rec.run_id, runner_id: rec.runner_id, trace },
        { tool_use_id: p.tool_use_id, tool: p.tool, input: p.input },
      );
      answer(decided.decision, decided.rule_id, decided.message);
    } catch (err) {
      d.logger.error({ err, run: rec.run_id }, 'tool check failed; denying');
      answer('deny', null, 'the policy check failed; denied (fail closed)');
    }
  });

  gw.on('model.cancel', (conn, msg) => {
    modelStreams.get(conn.id)?.cancel(msg.payload.stream_id);
  });
}
