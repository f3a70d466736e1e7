import type { Logger } from '@agentplane/core';
import { GATEWAY_CONTROL_CHANNEL, type GatewayControlMessage } from '@agentplane/gateway';
import { CancelMarks, LeaseFence } from '@agentplane/lease';
import { onSubscriberReplaced, type Redis } from '@agentplane/store';

/** The runner lease a model step is served under, and the Run it works for. */
export interface StepLease {
  workspace_id: string;
  session_id: string;
  /** The Run the lease is an attempt of (its cancel mark ends the lease's steps too). */
  run_id?: string | undefined;
  lease_id: string;
}

interface Tracked {
  lease: StepLease;
  abort: () => void;
}

/** How long a step's first check waits for the subscription before it reads the lease anyway. */
const SUBSCRIBE_WAIT_MS = 2_000;
/**
 * How often the leases of tracked steps are read again: a lease that ends by expiry (its runner
 * stopped heartbeating, the scheduler rescheduled its Run) is announced by no one.
 */
export const LEASE_RECHECK_MS = 10_000;

export interface LeaseStreamsOptions {
  /** Re-read every tracked lease this often while steps are tracked (default `LEASE_RECHECK_MS`). */
  recheckMs?: number;
}

/**
 * The model steps this node serves under runner leases, by lease: a lease that ends anywhere ends
 * its steps here, whichever node the revocation or the Run's cancellation was handled on.
 *
 * - Every lease end is announced on the gateway's control channel (`lease_ended`: the Run was
 *   cancelled, or its runner was told the lease is revoked), after that end is in Redis. This
 *   node subscribes (on its own connection, from its first tracked step on), and on an
 *   announcement for a lease it serves it reads the lease (`live`): a step whose lease no longer
 *   holds is aborted, and ends as any aborted step does (`end`, stop reason `canceled`, its
 *   output charged once).
 * - A step is read once more right after it is tracked, once the subscription is confirmed: a
 *   lease that ended between the caller's check and the tracking was announced before this node
 *   could hear it, but its end is in Redis by then. An end announced after that read is heard.
 * - When the subscriber's connection is replaced (announcements may have been lost meanwhile),
 *   every tracked lease is read again.
 * - While steps are tracked, every tracked lease is read again every `recheckMs`: a lease that
 *   ends by expiry (no heartbeat reached it; the scheduler takes the Run back) is announced by no
 *   one, and its steps end at the next read.
 *
 * Reading the lease rather than trusting the announcement means an announcement of a lease that
 * still holds (a runner naming a lease it does not hold) ends nothing. A read that fails ends the
 * step (fail closed, as the caller's own check does).
 */
export class LeaseStreams {
  private readonly byLease = new Map<string, Set<Tracked>>();
  private readonly fence: LeaseFence;
  private readonly marks: CancelMarks;
  private sub: Redis | null = null;
  /** Resolves once the subscription is confirmed, or after `SUBSCRIBE_WAIT_MS` at most. */
  private subscribed: Promise<void> | null = null;
  private closed = false;
  /** The periodic read of every tracked lease; set while any step is tracked. */
  private recheck: NodeJS.Timeout | null = null;
  private readonly recheckMs: number;

  constructor(private readonly redis: Redis, private readonly log: Logger, options: LeaseStreamsOptions = {}) {
    this.fence = new LeaseFence(redis);
    this.marks = new CancelMarks(redis);
    this.recheckMs = options.recheckMs ?? LEASE_RECHECK_MS;
  }

  /** Steps tracked now (tests, metrics). */
  get size(): number {
    let n = 0;
    for (const set of this.byLease.values()) n += set.size;
    return n;
  }

  /**
   * Track one step served under `lease`: `abort` is called (once at most) when the lease is found
   * ended. Returns the untracking, to call when the step ends.
   */
  track(lease: StepLease, abort: () => void): () => void {
    let aborted = false;
    const entry: Tracked = {
      lease,
      abort: () => {
        if (aborted) return;
        aborted = true;
        abort();
      },
    };
    let set = this.byLease.get(lease.lease_id);
    if (!set) this.byLease.set(lease.lease_id, (set = new Set()));
    set.add(entry);
    if (!this.closed) {
      void this.subscription().then(() => this.check(lease.lease_id, [entry]));
      this.recheck ??= setInterval(() => void this.checkAll(), this.recheckMs).unref();
    }
    return () => {
      const current = this.byLease.get(lease.lease_id);
      if (!current?.delete(entry)) return;
      if (current.size === 0) this.byLease.delete(lease.lease_id);
      if (this.byLease.size === 0) this.stopRecheck();
    };
  }

  /** The lease still holds: its Session fence is live and its Run carries no cancel mark. */
  async live(lease: StepLease): Promise<boolean> {
    const [held, marked] = await Promise.all([
      this.fence.holds(lease.session_id, lease.lease_id),
      lease.run_id !== undefined ? this.marks.marked(lease.session_id, lease.run_id) : Promise.resolve(false),
    ]);
    return held && !marked;
  }

  /** Stop listening. Steps still tracked are left to their own ends. */
  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.stopRecheck();
    const sub = this.sub;
    this.sub = null;
    if (sub) await sub.quit().catch(() => sub.disconnect());
  }

  private stopRecheck(): void {
    if (this.recheck) clearInterval(this.recheck);
    this.recheck = null;
  }

  /** The subscriber, made on first use; it goes when the connection it was made from ends. */
  private subscription(): Promise<void> {
    if (this.subscribed) return this.subscribed;
    const sub = this.redis.duplicate({ connectionName: 'agentplane:api:lease-streams', maxRetriesPerRequest: null });
    this.sub = sub;
    sub.on('error', (err: Error) => this.log.warn({ err: err.message }, 'lease streams subscriber error'));
    sub.on('message', (channel: string, message: string) => this.onMessage(channel, message));
    onSubscriberReplaced(sub, () => void this.resync());
    this.redis.once('end', () => void this.close());
    let late = false;
    const confirmed = sub.subscribe(GATEWAY_CONTROL_CHANNEL).then(
      () => {
        // Steps checked before the confirmation could have missed an announcement: again.
        if (late) void this.checkAll();
      },
      (err: unknown) => {
        if (!this.closed) this.log.warn({ err: err instanceof Error ? err.message : String(err) }, 'lease streams could not subscribe; steps are checked again once it does');
      },
    );
    this.subscribed = Promise.race([
      confirmed,
      new Promise<void>((resolve) => {
        setTimeout(() => {
          late = true;
          resolve();
        }, SUBSCRIBE_WAIT_MS).unref();
      }),
    ]);
    return this.subscribed;
  }

  private onMessage(channel: string, message: string): void {
    if (channel !== GATEWAY_CONTROL_CHANNEL || !message.includes('"lease_ended"')) return;
    let m: GatewayControlMessage;
    try {
      m = JSON.parse(message) as GatewayControlMessage;
    } catch {
      return;
    }
    if (m.kind !== 'lease_ended') return;
    const set = this.byLease.get(m.lease_id);
    if (!set) return;
    const entries = [...set].filter((e) => e.lease.workspace_id === m.workspace_id);
    if (entries.length > 0) void this.check(m.lease_id, entries, m.reason);
  }

  /** After a reconnect: subscribe again (its confirmation covers the client's own), then read every lease. */
  private async resync(): Promise<void> {
    if (this.closed || !this.sub) return;
    try {
      await this.sub.subscribe(GATEWAY_CONTROL_CHANNEL);
    } catch (err) {
      this.log.warn({ err: err instanceof Error ? err.message : String(err) }, 'lease streams could not subscribe again');
    }
    await this.checkAll();
  }

  private async checkAll(): Promise<void> {
    await Promise.all([...this.byLease.entries()].map(([leaseId, set]) => this.check(leaseId, [...set])));
  }

  /** Read the lease of `entries` (one read per distinct Session and Run) and abort those whose lease ended. */
  private async check(leaseId: string, entries: readonly Tracked[], reason?: string): Promise<void> {
    const groups = new Map<string, Tracked[]>();
    for (const e of entries) {
      const key = `${e.lease.workspace_id}|${e.lease.session_id}|${e.lease.run_id ?? ''}`;
      const g = groups.get(key);
      if (g) g.push(e);
      else groups.set(key, [e]);
    }
    await Promise.all([...groups.values()].map(async (group) => {
      const lease = (group[0] as Tracked).lease;
      const live = await this.live(lease).catch((err: unknown) => {
        this.log.warn({ err: err instanceof Error ? err.message : String(err), lease: leaseId }, 'cannot read a lease its model steps are served under; ending them');
        return false;
      });
      if (live) return;
      const tracked = this.byLease.get(leaseId);
      const ending = group.filter((e) => tracked?.has(e));
      if (ending.length === 0) return;
      this.log.info({ lease: leaseId, run: lease.run_id, session: lease.session_id, steps: ending.length, reason }, 'the lease ended: its model steps are aborted');
      for (const e of ending) e.abort();
    }));
  }
}
