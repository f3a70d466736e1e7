import { Queue, Worker, type Processor, type QueueOptions, type WorkerOptions } from 'bullmq';
import type { Logger } from '@agentplane/core';
import { connectRedis, type Redis } from '@agentplane/store';

export interface QueueHostOptions {
  /** Connection names: `api:<name>` for the queue, `agentplane:api:<name>-worker` for the worker. */
  name: string;
  /** How log lines name the queue, e.g. `skill proposals`. */
  label: string;
  queue: string;
  prefix: string;
  redisUrl: string;
  log: Logger;
  /** The queue's advanced settings (a Job Scheduler's repeat strategy, say). */
  settings?: QueueOptions['settings'];
}

/**
 * The BullMQ plumbing an api-process service runs its jobs on: one queue connection, a worker
 * on its own blocking connection (started once, in every api process), a periodic sweep, and
 * their orderly close. The service keeps its job logic; this holds the connections and timers.
 */
export class QueueHost {
  readonly queue: Queue;
  private readonly bull: Redis;
  private worker: Worker | null = null;
  private workerConn: Redis | null = null;
  private sweepTimer: NodeJS.Timeout | null = null;

  constructor(private readonly o: QueueHostOptions) {
    this.bull = connectRedis(o.redisUrl, { name: `api:${o.name}`, blocking: true });
    this.bull.on('error', (err: Error) => o.log.warn({ err: err.message }, `${o.label} queue connection error`));
    this.queue = new Queue(o.queue, { connection: this.bull, prefix: o.prefix, ...(o.settings ? { settings: o.settings } : {}) });
    // The Queue re-emits its connection's errors, logged just above; unheard, BullMQ prints each raw.
    this.queue.on('error', () => undefined);
  }

  /** Starts the worker; null when it already runs (the caller then has nothing to start). */
  startWorker(processor: Processor, options: Omit<WorkerOptions, 'connection' | 'prefix'>): Worker | null {
    if (this.worker) return null;
    const conn = this.bull.duplicate({ connectionName: `agentplane:api:${this.o.name}-worker` });
    this.workerConn = conn;
    conn.on('error', (err: Error) => this.o.log.warn({ err: err.message }, `${this.o.label} worker connection error`));
    const worker = new Worker(this.o.queue, processor, { ...options, connection: conn, prefix: this.o.prefix });
    worker.on('error', (err) => this.o.log.warn({ err: err.message }, `${this.o.label} worker error`));
    this.worker = worker;
    return worker;
  }

  /** Runs `sweep` every `intervalMs` (the timer does not hold the process open); a failure is logged as `failure`. Returns one run. */
  sweepEvery(intervalMs: number, sweep: () => Promise<void>, failure: string): () => void {
    const run = () => void sweep().catch((err: unknown) => this.o.log.warn({ err }, failure));
    this.sweepTimer = setInterval(run, intervalMs);
    this.sweepTimer.unref();
    return run;
  }

  async close(): Promise<void> {
    if (this.sweepTimer) clearInterval(this.sweepTimer);
    await this.worker?.close().catch(() => undefined);
    await this.workerConn?.quit().catch(() => this.workerConn?.disconnect());
    await this.queue.close().catch(() => undefined);
    await this.bull.quit().catch(() => this.bull.disconnect());
  }
}
