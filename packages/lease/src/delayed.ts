import { Queue, Worker, type Job } from 'bullmq';
import type { Redis } from '@agentplane/store';

/**
 * A BullMQ queue of one-shot jobs due at a given time (e.g. an ActionApproval's expiry). Keys
 * share one hash tag (`ap:{q:<name>}`); a job id is given by the caller, so scheduling the same
 * id twice is a no-op. Any process may run a worker: BullMQ hands each due job to one of them,
 * and a job whose worker died is retried after the stalled check. Owns its connection.
 */
export class DelayedJobs<T extends Record<string, unknown>> {
  private readonly queue: Queue;
  private worker: Worker | null = null;

  constructor(
    private readonly name: string,
    private readonly connection: Redis,
  ) {
    this.queue = new Queue(name, { connection, prefix: DelayedJobs.prefix(name) });
    // Its connection's errors, which the worker's listener (or the connection's owner) logs.
    this.queue.on('error', () => undefined);
  }

  static prefix(name: string): string {
    return `ap:{q:${name}}`;
  }

  /** Run `data` at `dueAtMs` (at once if past). `id` dedupes: the first schedule of an id wins. */
  async schedule(id: string, dueAtMs: number, data: T): Promise<void> {
    await this.queue.add(this.name, data, {
      jobId: id, delay: Math.max(0, dueAtMs - Date.now()),
      attempts: 5, backoff: { type: 'exponential', delay: 500 },
      removeOnComplete: true, removeOnFail: 1000,
    });
  }

  /** Start handling due jobs in this process (a throwing handler is retried with backoff). */
  work(handler: (data: T) => Promise<void>, onError: (err: Error) => void): void {
    if (this.worker) return;
    this.worker = new Worker(this.name, async (job: Job) => handler(job.data as T), {
      connection: this.connection, prefix: DelayedJobs.prefix(this.name), concurrency: 4,
    });
    this.worker.on('error', onError);
  }

  /** Stops the worker and the queue, and closes the connection (which this object owns). */
  async close(): Promise<void> {
    await this.worker?.close();
    await this.queue.close();
    await this.connection.quit().catch(() => this.connection.disconnect());
  }
}
