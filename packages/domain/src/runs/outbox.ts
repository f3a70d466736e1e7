import type { Redis } from '@agentplane/store';
import { Outbox } from '../outbox.js';

export interface PendingEnqueue {
  session_id: string;
  run_id: string;
  since_ms: number;
}

/**
 * Runs about to start whose BullMQ job may not exist yet: written before the turn start commits
 * the Run, removed once the job exists. A process that dies in between (API, scheduler) leaves
 * the entry, and the scheduler's sweep enqueues the Run (`RunEngine.repairUnqueued`), so an
 * accepted `user.message` is never stuck on a Run that nothing will lease.
 *
 * `ap:{g:enqueue_outbox:<n>}:enqueue_outbox:<n>`: zset, member `<session>/<run>`, score = ms.
 */
export class EnqueueOutbox {
  private readonly box: Outbox;

  constructor(redis: Redis) {
    this.box = new Outbox(redis, 'enqueue_outbox');
  }

  add(sessionId: string, runId: string, now = Date.now()): Promise<void> {
    return this.box.add(`${sessionId}/${runId}`, runId, now);
  }

  remove(sessionId: string, runId: string): Promise<void> {
    return this.box.remove(`${sessionId}/${runId}`, runId);
  }

  /** Entries older than `olderThanMs`, oldest first, at most `limit` per bucket. */
  async due(olderThanMs: number, limit = 100, now = Date.now()): Promise<PendingEnqueue[]> {
    const out: PendingEnqueue[] = [];
    for (const { member, since_ms } of await this.box.due(olderThanMs, limit, now)) {
      const [session_id, run_id] = member.split('/');
      if (session_id && run_id) out.push({ session_id, run_id, since_ms });
    }
    return out;
  }
}
