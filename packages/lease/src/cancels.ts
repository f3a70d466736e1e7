import { keys, tags, type Redis } from '@agentplane/store';

/** How long an unhonoured mark is kept: longer than any Run waits in a queue in practice. */
const MARK_TTL_MS = 24 * 3600_000;

/** A Run's terminal statuses: such a Run's job is never run. */
const ENDED: ReadonlySet<string> = new Set(['succeeded', 'failed', 'canceled']);

/** In the Session's slot, beside its fence: the fence claim refuses a marked Run (`LeaseFence.claim`). */
export const cancelMarkKey = (sessionId: string, runId: string): string => keys.scoped(tags.session(sessionId), `run_cancel:${runId}`);

/**
 * Interrupts of Runs a scheduler holds while placing them (taken from the queue, offers out):
 * such a job can be neither removed from the queue nor cancelled on a runner. The interrupt
 * leaves a mark in the Session's slot, and the dispatcher honours it right after it takes a job,
 * after it returns one to the queue, and after a lease is granted: whichever happens first
 * after the mark ends the Run (see `RunEngine.interruptRequested` for the ordering argument).
 */
export class CancelMarks {
  constructor(private readonly redis: Redis) {}

  async mark(sessionId: string, runId: string): Promise<void> {
    await this.redis.set(cancelMarkKey(sessionId, runId), '1', 'PX', MARK_TTL_MS);
  }

  async marked(sessionId: string, runId: string): Promise<boolean> {
    return (await this.redis.exists(cancelMarkKey(sessionId, runId))) === 1;
  }

  /**
   * True when the Run must not run: it carries a mark, it was never committed (a job sent
   * behind a turn start that did not commit: `RunQueues.sendBehind`; the add runs after the
   * start, so a job's Run is missing only if it never will be there), or it has ended already
   * (an interrupt records a queued Run's end before it removes the job, so a crash in between
   * leaves a job that must be dropped, not run). One round trip, in the Session's slot.
   */
  async barred(sessionId: string, runId: string): Promise<boolean> {
    const [marked, run] = await Promise.all([
      this.redis.exists(cancelMarkKey(sessionId, runId)),
      this.redis.get(keys.doc(tags.session(sessionId), runId)),
    ]);
    return marked === 1 || run === null || ENDED.has((JSON.parse(run) as { status?: string }).status ?? '');
  }

  async clear(sessionId: string, runId: string): Promise<void> {
    await this.redis.del(cancelMarkKey(sessionId, runId));
  }
}
