import { createHash } from 'node:crypto';
import type { Payload } from '@agentplane/protocol';
import type { LeaseHandle } from '../agent.js';
import type { Awaiting, HarnessEvent, SessionEventSink } from '../harness/index.js';
import type { PlanEvent } from '../harness/events.js';

const TOOL_USE_ID = /^toolu_[0-9A-Za-z]{1,64}$/;

/**
 * A sink that turns harness events into idempotent event batches on the lease: producer keys
 * are `<lease>:<n>`, so a batch resent after a reconnect is appended once. Tool-use ids that
 * are not already `toolu_…` (OpenAI-style ids) are mapped deterministically, so drive events can
 * answer them. `session.status_idle` is not forwarded: the control plane ends the turn from
 * lease.complete, once.
 */
export class LeaseSink implements SessionEventSink {
  private n = 0;
  readonly awaiting = new Map<string, Awaiting>();
  private readonly ids = new Map<string, string>();
  private chain: Promise<unknown> = Promise.resolve();

  constructor(
    private readonly handle: LeaseHandle,
    private readonly runId: string,
    private readonly sessionId: string,
  ) {}

  toolId(id: string): string {
    if (TOOL_USE_ID.test(id)) return id;
    let mapped = this.ids.get(id);
    if (!mapped) {
      mapped = `toolu_${createHash('sha256').update(`${this.runId}\0${id}`).digest('hex').slice(0, 32)}`;
      this.ids.set(id, mapped);
    }
    return mapped;
  }

  async emit(event: (HarnessEvent | PlanEvent) & { session_thread_id?: string }): Promise<void> {
    if (event.type === 'session.status_idle') return;
    let payload: unknown = event.payload;
    if (event.type === 'agent.tool_use') {
      const id = this.toolId(event.payload.id);
      payload = { ...event.payload, id };
      if (event.payload.blocking && event.payload.awaiting) this.awaiting.set(id, event.payload.awaiting);
    } else if (event.type === 'agent.tool_result') {
      payload = { ...event.payload, tool_use_id: this.toolId(event.payload.tool_use_id) };
    }
    const batch: Payload<'events.batch'>['events'] = [{ producer_key: `${this.handle.lease.lease_id}:${this.n++}`, type: event.type, payload }];
    // Events go out in order, each acknowledged before the next.
    const next = this.chain.then(() => this.handle.deliverEvents(this.sessionId, batch));
    this.chain = next.catch(() => undefined);
    await next;
  }
}
