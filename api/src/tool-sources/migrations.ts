import type { Job } from 'bullmq';
import { crashPoint, type Logger } from '@agentplane/core';
import { keys, type Redis } from '@agentplane/store';
import { QueueHost } from '../queue-host.js';
import type { MigrationQueue, ToolSourceService } from './service.js';

export const TOOL_SOURCE_MIGRATION_QUEUE_PREFIX = 'ap:{q:tool_source_migrations}';
const QUEUE = 'tool_source_migrations';
/** Rotations whose migration may not have finished: `<ws>/<tsrc>/<revision>` → time of the intent. */
const INTENTS = keys.global('tool_source_migration_intents');

interface MigrationData { workspace_id: string; tool_source_id: string; revision: number }

/** One job per (source, revision): a second enqueue of the same rotation is the same job. */
const jobId = (d: MigrationData) => `migrate-${d.tool_source_id}-${d.revision}`;
const member = (d: MigrationData) => `${d.workspace_id}/${d.tool_source_id}/${d.revision}`;

export interface MigrationSettings {
  /** How often the intents are swept (a rotation whose enqueue was lost is enqueued again). */
  sweepMs: number;
  /** A job whose worker died is taken up again after this long (BullMQ lock / stalled check). */
  lockMs: number;
}

/**
 * Durable, resumable migration of a tool source's dependent Connections after a rotation
 * (docs/A2A_TOOLS.md, "Tool source Connections"). The rotation records an intent, publishes,
 * then enqueues one BullMQ job per (source, revision); the job's steps are idempotent
 * compare-and-swaps, so a job taken up again after a crash finishes the remaining Connections
 * and never migrates one twice. A sweep re-enqueues intents whose job was lost and drops those
 * that are done.
 */
export class ToolSourceMigrations implements MigrationQueue {
  private readonly host: QueueHost;

  constructor(private readonly d: { redisUrl: string; redis: Redis; service: ToolSourceService; logger: Logger; settings: MigrationSettings }) {
    this.host = new QueueHost({
      name: 'tool-source-migrations', label: 'tool source migration', queue: QUEUE, prefix: TOOL_SOURCE_MIGRATION_QUEUE_PREFIX, redisUrl: d.redisUrl, log: d.logger,
    });
  }

  async intend(ws: string, sourceId: string, revision: number): Promise<void> {
    await this.d.redis.zadd(INTENTS, Date.now(), member({ workspace_id: ws, tool_source_id: sourceId, revision }));
  }

  async enqueue(ws: string, sourceId: string, revision: number): Promise<void> {
    const data: MigrationData = { workspace_id: ws, tool_source_id: sourceId, revision };
    await this.host.queue.add('migrate', data, { jobId: jobId(data), attempts: 10, backoff: { type: 'exponential', delay: 500 }, removeOnComplete: 1000, removeOnFail: 1000 });
  }

  private async run(data: MigrationData): Promise<void> {
    const outcome = await this.d.service.runMigration(data.workspace_id, data.tool_source_id, data.revision, async () => crashPoint('tool-source-migration-step'));
    this.d.logger.info({ tool_source_id: data.tool_source_id, revision: data.revision, outcome }, 'tool source migration finished');
    await this.d.redis.zrem(INTENTS, member(data));
  }

  /** Intents whose job is missing are enqueued again; an intent older than a minute whose revision was never published is dropped. */
  async sweep(): Promise<void> {
    const intents = await this.d.redis.zrange(INTENTS, 0, 99, 'WITHSCORES');
    for (let i = 0; i < intents.length; i += 2) {
      const [ws, sourceId, rev] = intents[i]!.split('/') as [string, string, string];
      const at = Number(intents[i + 1]);
      const data: MigrationData = { workspace_id: ws, tool_source_id: sourceId, revision: Number(rev) };
      const src = await this.d.service.getSource(ws, sourceId).catch(() => null);
      const unpublished = !src || src.revision < data.revision;
      if ((unpublished && Date.now() - at > 60_000) || (src && src.revision > data.revision) || (src?.revision === data.revision && src.migration?.state === 'completed')) {
        await this.d.redis.zrem(INTENTS, intents[i]!);
        continue;
      }
      if (!unpublished && !(await this.host.queue.getJob(jobId(data)))) await this.enqueue(ws, sourceId, data.revision);
    }
  }

  start(): void {
    const worker = this.host.startWorker(async (job: Job) => this.run(job.data as MigrationData), {
      concurrency: 4, lockDuration: this.d.settings.lockMs, stalledInterval: Math.max(1000, Math.floor(this.d.settings.lockMs / 2)), maxStalledCount: 5,
    });
    if (!worker) return;
    this.host.sweepEvery(this.d.settings.sweepMs, () => this.sweep(), 'tool source migration sweep failed')();
  }

  close(): Promise<void> {
    return this.host.close();
  }
}
