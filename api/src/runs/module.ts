import type { Logger } from '@agentplane/core';
import { LeaseFence, LeaseKeeper, LeaseRecords, RunQueues } from '@agentplane/lease';
import { connectRedis, type Redis } from '@agentplane/store';
import type { VersionedStore } from '@agentplane/domain';
import type { ApiConfig } from '../config.js';
import type { Environment } from '@agentplane/domain';
import type { RunnerService } from '@agentplane/domain';
import type { SessionStore } from '@agentplane/domain';
import type { ThreadRuntime } from '@agentplane/domain';
import { RunEngine } from '@agentplane/domain';
import { RunLifecycle } from '@agentplane/domain';

export interface RunsModule {
  queues: RunQueues;
  keeper: LeaseKeeper;
  records: LeaseRecords;
  lifecycle: RunLifecycle;
  engine: RunEngine;
  close(): Promise<void>;
}

export function createRunsModule(d: {
  config: ApiConfig;
  redis: Redis;
  log: Logger;
  store: SessionStore;
  runtime: ThreadRuntime;
  environments: VersionedStore<Environment>;
  runners: RunnerService;
}): RunsModule {
  // BullMQ wants a connection that never gives up on a command.
  const bull = connectRedis(d.config.redisUrl, { name: 'api:queues', blocking: true });
  bull.on('error', (err: Error) => d.log.warn({ err: err.message }, 'queue connection error'));
  const queues = new RunQueues(bull, d.config.lease, d.redis);
  const fence = new LeaseFence(d.redis);
  const keeper = new LeaseKeeper(queues, fence, d.config.lease);
  const records = new LeaseRecords(d.redis);
  const lifecycle = new RunLifecycle(d.store, d.runtime, d.log);
  const engine = new RunEngine({
    redis: d.redis, queues, lifecycle, store: d.store, environments: d.environments, runners: d.runners, log: d.log,
    interruptGraceMs: d.config.interruptGraceMs, poolIdleMs: d.config.lease.poolIdleMs,
  });
  return {
    queues, keeper, records, lifecycle, engine,
    async close() {
      await queues.close();
      await bull.quit().catch(() => bull.disconnect());
    },
  };
}
