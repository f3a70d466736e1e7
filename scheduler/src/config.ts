import { envInt, envOptional, envString, type Env } from '@agentplane/core';
import { leaseConfigFrom, type LeaseConfig } from '@agentplane/lease';

export interface SchedulerConfig {
  redisUrl: string;
  logLevel: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
  lease: LeaseConfig;
  /** How often the set of pools with work is re-read. */
  poolScanMs: number;
  /** How long a Run that no runner can take right now waits before it is tried again. */
  capacityRetryMs: number;
  /** Port for /healthz and /metrics (0 = an ephemeral port, unset = off). */
  port: number | undefined;
  host: string;
}

export function loadSchedulerConfig(env: Env): SchedulerConfig {
  const port = envOptional(env, 'SCHEDULER_PORT');
  return Object.freeze({
    redisUrl: envString(env, 'REDIS_URL'),
    logLevel: envString(env, 'LOG_LEVEL', 'info') as SchedulerConfig['logLevel'],
    lease: leaseConfigFrom(env),
    poolScanMs: envInt(env, 'POOL_SCAN_MS', 1000, 50),
    capacityRetryMs: envInt(env, 'CAPACITY_RETRY_MS', 1000, 10),
    port: port === undefined ? undefined : envInt(env, 'SCHEDULER_PORT', 0, 0, 65535),
    host: envString(env, 'SCHEDULER_HOST', '127.0.0.1'),
  });
}
