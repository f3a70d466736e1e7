import { ATTR, injectTrace, inSpan, newId, SpanKind, type Context, type Logger, type Metrics } from '@agentplane/core';
import { isCluster } from '@agentplane/store';
import { deliverToRunner, NodeLinks } from '@agentplane/gateway';
import { LeaseFence, leaseRecordTtlMs, offerReplyChannel, type LeaseRecords, type OfferReply } from '@agentplane/lease';
import { frame, type Payload } from '@agentplane/protocol';
import type { Redis } from '@agentplane/store';
import type { LeaseOffer, LeasePlan, OfferBody, OfferChannel, OfferOutcome } from './directory.js';

/**
 * Offers travel as `lease.offer` frames through whichever gateway node holds the runner's
 * socket (its presence route): over the scheduler's link to that node when one is open, else
 * published on the node's channel. The gateway answers on this scheduler's reply channel (over
 * the same link when there is one) once the runner accepted (and the lock was extended to a
 * full lease) or declined. A lost answer is recovered from the Session fence: if the lease id
 * holds it, the offer was accepted. An offer not answered in time, or refused, is withdrawn in
 * one script with the claim it races (`LeaseFence.withdrawOffer`): either the runner's claim came
 * first and the offer was accepted, or the runner can no longer claim the lease.
 */
const FENCE_POLL_MS = 250;
/** Offers out (sent, not answered) at or above which offers are published rather than sent on a link. */
const LINK_MAX_OFFERS_OUT = 4;
/**
 * Offers out at or above which an offer waits for its spec and carries it, even to a runner that
 * takes its spec later (`lease-spec-v1`). Sending the offer ahead takes the spec's reads off the
 * path to the lease, but costs a second frame through every hop (this scheduler, Redis or the
 * link, the gateway node, the runner); with this many offers out the scheduler is busy, and the
 * milliseconds the early offer saves are lost in its queue anyway.
 */
const SPEC_AHEAD_MAX_OFFERS_OUT = LINK_MAX_OFFERS_OUT;

type Route = { nodeId?: string; links?: NodeLinks };

/** An error's message for the log (never its stack). */
const reasonOf = (err: unknown): string => (err instanceof Error ? err.message : String(err));

export class RedisOfferChannel implements OfferChannel {
  readonly channel: string;
  private readonly waiters = new Map<string, (reply: OfferReply) => void>();
  private readonly fence: LeaseFence;
  /** Direct sockets to gateway nodes (none: every frame is published). */
  private readonly links: NodeLinks | undefined;

  constructor(
    private readonly redis: Redis,
    private readonly subscriber: Redis,
    instanceId: string,
    private readonly records: LeaseRecords,
    private readonly buildSpec: (plan: LeasePlan) => Promise<Record<string, unknown>>,
    private readonly log: Logger,
    links?: { metrics?: Metrics },
  ) {
    this.channel = offerReplyChannel(instanceId);
    this.fence = new LeaseFence(redis);
    const answer = (ch: string, message: string) => {
      if (ch !== this.channel) return;
      try {
        const reply = JSON.parse(message) as OfferReply;
        this.waiters.get(reply.lease_id)?.(reply);
      } catch {
        this.log.warn('unreadable offer reply');
      }
    };
    subscriber.on('message', answer);
    this.links = links ? new NodeLinks({ redis, log, replyChannels: [this.channel], onReply: answer, ...(links.metrics ? { metrics: links.metrics } : {}) }) : undefined;
  }

  close(): void {
    this.links?.close();
  }

  /**
   * How an offer's frames go to the node the directory saw its runner on: over the node's link
   * while this scheduler has few offers out, else published. A frame on a link is a write system
   * call of its own, where a publish shares the connection's one write of the turn with the placement's
   * other commands; with many offers out the scheduler is busy, and the hop the link saves is
   * lost in its queue anyway (`bench:dispatch`: +0.1 ms of scheduler CPU per Run at 500 Runs/s
   * with every offer on the link).
   */
  private route(nodeId: string | undefined): Route {
    if (!nodeId) return {};
    return this.links && this.waiters.size < LINK_MAX_OFFERS_OUT ? { nodeId, links: this.links } : { nodeId };
  }

  async start(): Promise<void> {
    await this.subscriber.subscribe(this.channel);
  }

  prepare(plan: LeasePlan): OfferBody {
    const body = this.buildSpec(plan);
    // Awaited by each offer that carries it; a Run that ends before any offer never awaits it.
    body.catch(() => undefined);
    return body;
  }

  async offer(o: LeaseOffer, timeoutMs: number, body: OfferBody, nodeId?: string, specFollows = false, trace?: Context): Promise<OfferOutcome> {
    // The record and the spec are independent writes and reads: both are under way at once. The
    // record lives as long as an accepted lease's (the acceptance does not write it again); an
    // offer not taken removes it.
    // An offer sent ahead of its spec over a link overtakes the turn's held-back writes: its
    // record is written to the connection at once (`LeaseRecords.put`'s `now`). Any other offer's record
    // goes ahead of its publish on the same connection, or is awaited before the offer is sent.
    const route = this.route(nodeId);
    const ahead = specFollows && this.waiters.size < SPEC_AHEAD_MAX_OFFERS_OUT;
    const put = this.records.put({ ...o, reply_to: this.channel }, Math.max(timeoutMs * 3, leaseRecordTtlMs(o.lease_ms)), { now: ahead && route.links !== undefined });
    if (ahead) return this.offerAhead(o, timeoutMs, body, put, route, trace);
    let spec: Record<string, unknown> | null;
    try {
      [spec] = await Promise.all([body, put]);
    } catch (err) {
      await put.catch(() => undefined);
      this.log.warn({ err: reasonOf(err), run: o.run_id }, 'cannot prepare the offer');
      await this.records.remove(o.lease_id, o.runner_id);
      return 'rejected';
    }
    if (spec === null) {
      await this.records.remove(o.lease_id, o.runner_id);
      return 'withdrawn';
    }
    return this.traced(o, false, trace, (ctx) => this.deliverOffer(o, spec, timeoutMs, route, ctx));
  }

  /**
   * The offer's PRODUCER span, child of `trace` (the placement's span): the offer frame carries
   * its context, and the runner's lease span continues the trace.
   */
  private traced(o: LeaseOffer, specFollows: boolean, trace: Context | undefined, send: (ctx: Context) => Promise<OfferOutcome>): Promise<OfferOutcome> {
    return inSpan('send lease.offer', {
      kind: SpanKind.PRODUCER,
      attributes: {
        [ATTR.messagingSystem]: 'agentplane.runner', [ATTR.messagingOperationType]: 'send', [ATTR.messagingOperationName]: 'send',
        [ATTR.messagingDestinationName]: 'lease.offer', [ATTR.messagingMessageId]: o.lease_id, 'agentplane.runner.id': o.runner_id, 'agentplane.run.id': o.run_id,
        ...(specFollows ? { 'agentplane.offer.spec_follows': true } : {}),
      },
      parent: trace,
    }, async (span, ctx) => {
      const outcome = await send(ctx);
      span.setAttribute('agentplane.offer.outcome', outcome);
      return outcome;
    });
  }

  /**
   * An offer sent ahead of its spec (`lease-spec-v1`). The runner can accept only once the lease
   * record is in Redis: on one Redis the record's write and the offer's publish go out on this
   * connection in that order and run in it; on a Cluster they are on different nodes, so the write
   * is awaited first. The spec follows on the same route once it is built and the checks passed;
   * a withdrawn body sends nothing (the Run's cancel mark refuses the lease's claim, and the
   * dispatcher ends the Run), a body that failed sends its error (the runner fails the attempt as
   * an infrastructure failure), and nothing is sent once the runner is known not to hold the offer.
   */
  private async offerAhead(o: LeaseOffer, timeoutMs: number, body: OfferBody, put: Promise<void>, route: Route, trace: Context | undefined): Promise<OfferOutcome> {
    if (isCluster(this.redis)) {
      try {
        await put;
      } catch (err) {
        this.log.warn({ err: reasonOf(err), run: o.run_id }, 'cannot prepare the offer');
        await this.records.remove(o.lease_id, o.runner_id).catch(() => undefined);
        return 'rejected';
      }
    } else {
      put.catch((err: unknown) => this.log.warn({ err: reasonOf(err), run: o.run_id }, 'cannot record the offer'));
    }
    // The spec follows the offer's route.
    return this.traced(o, true, trace, async (ctx) => {
      let refused = false;
      const follow = body.then(
        (spec) => (spec === null || refused ? undefined : this.sendSpec(o, { spec }, route)),
        (err: unknown) => {
          this.log.warn({ err: reasonOf(err), run: o.run_id }, 'cannot prepare the offer');
          return refused ? undefined : this.sendSpec(o, { error: 'the control plane could not prepare the turn spec' }, route);
        },
      );
      follow.catch((err: unknown) => this.log.warn({ err: reasonOf(err), run: o.run_id }, 'cannot send the lease spec'));
      const outcome = await this.deliverOffer(o, undefined, timeoutMs, route, ctx);
      refused = outcome !== 'accepted' && outcome !== 'recorded';
      return outcome;
    });
  }

  /** The spec (or why there is none) of an offer sent ahead of it, along the offer's route. */
  private async sendSpec(o: LeaseOffer, body: Pick<Payload<'lease.spec'>, 'spec' | 'error'>, route: Route): Promise<void> {
    const text = frame('lease.spec', newId('event'), { lease_id: o.lease_id, attempt: o.attempt, ...body });
    await deliverToRunner(this.redis, o.workspace_id, o.runner_id, text, route);
  }

  /** `spec` undefined: it follows (`offerAhead`). */
  private async deliverOffer(o: LeaseOffer, spec: Record<string, unknown> | undefined, timeoutMs: number, route: Route, ctx: Context): Promise<OfferOutcome> {
    const answer = new Promise<OfferOutcome>((resolve) => {
      let settled = false;
      const finish = (outcome: OfferOutcome) => {
        if (settled) return;
        settled = true;
        clearTimeout(timer);
        clearInterval(poll);
        this.waiters.delete(o.lease_id);
        resolve(outcome);
      };
      const timer = setTimeout(() => finish('timeout'), timeoutMs);
      // The answer travels by pub/sub; the fence is the truth. Checking it as well bounds the
      // cost of a late or lost answer to one poll period instead of the whole offer window.
      const poll = setInterval(() => {
        void this.fence.holds(o.session_id, o.lease_id).then((held) => held && finish('accepted'), () => undefined);
      }, FENCE_POLL_MS);
      // An answer about another runner is about an earlier offer of this lease (refused since).
      this.waiters.set(o.lease_id, (reply) => {
        if (reply.runner_id !== undefined && reply.runner_id !== o.runner_id) return;
        finish(reply.outcome === 'accepted' && reply.recorded ? 'recorded' : reply.outcome);
      });
    });
    const text = frame('lease.offer', newId('event'), {
      lease_id: o.lease_id, attempt: o.attempt, run_id: o.run_id, session_id: o.session_id, thread_id: o.thread_id,
      accept_within_ms: timeoutMs, lease_ttl_ms: o.lease_ms, ...(spec ? { spec } : {}),
    }, undefined, injectTrace(ctx));
    const notConnected: OfferReply = { lease_id: o.lease_id, runner_id: o.runner_id, outcome: 'rejected', reason: 'runner not connected' };
    // A gateway node that finds the runner gone (it closed since the directory listed it) answers
    // for it at once: the next runner is offered without waiting out this offer's window.
    const undelivered = { channel: this.channel, message: JSON.stringify(notConnected) };
    if (!(await deliverToRunner(this.redis, o.workspace_id, o.runner_id, text, { ...route, undelivered }))) {
      this.waiters.get(o.lease_id)?.(notConnected);
    }
    const outcome = await answer;
    // An offer not taken is withdrawn before the lease id moves on: a refusal may have been made
    // for the runner while its acceptance was on its way (the gateway refuses the offers a
    // reconnecting runner does not name), or the runner may accept after declining.
    if ((outcome === 'timeout' || outcome === 'rejected') && (await this.withdraw(o)) === 'claimed') return 'accepted';
    if (outcome !== 'accepted' && outcome !== 'recorded') await this.records.remove(o.lease_id, o.runner_id);
    return outcome;
  }

  /**
   * An offer not answered in time, or refused, is withdrawn, in one script with the runner's
   * claim, which may be on its way (its acceptance claims with the lock token this scheduler still
   * holds and is about to offer to the next runner or give back): `claimed` when the claim came
   * first (the offer was accepted, its answer late or lost, or overtaken by a refusal made for
   * the runner). Else that runner's claim of this lease is refused from now on (the gateway
   * revokes it), while the next runner's claim of the same lease id is not. Only offers not
   * taken pay this round trip. The claim may have gone alone, or its Run's
   * move may have gone stale: the Run may not record the lease yet (`accepted`, not `recorded`).
   */
  private withdraw(o: LeaseOffer): Promise<'claimed' | 'withdrawn'> {
    return this.fence.withdrawOffer(o.session_id, o.lease_id, o.runner_id, leaseRecordTtlMs(o.lease_ms));
  }
}
