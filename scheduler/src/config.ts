import { readFileSync } from 'node:fs';
import { ConfigError, envBool, envEnum, envInt, envOptional, envString, type Env } from '@agentplane/core';
import { leaseConfigFrom, type LeaseConfig } from '@agentplane/lease';
import { appendDurabilityFrom, checkedRedisUrl, type EventLogDurability } from '@agentplane/store';

export interface SchedulerConfig {
  redisUrl: string;
  /** WAIT after every Session event append (docs/CLUSTER.md). */
  appendDurability: EventLogDurability;
  logLevel: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
  lease: LeaseConfig;
  /** How often the set of pools with work is re-read. */
  poolScanMs: number;
  /** How long a Run that no runner can take right now waits before it is tried again. */
  capacityRetryMs: number;
  /** A Run whose turn started this long ago without reaching its queue is enqueued by the sweep. */
  enqueueRepairAfterMs: number;
  /** How long a Run cancelled on its runner (user.interrupt) gets to stop before it is cancelled outright. */
  interruptGraceMs: number;
  /** Port for /healthz and /metrics (0 = an ephemeral port, unset = off). */
  port: number | undefined;
  host: string;
  /** How long a graceful stop may take (SHUTDOWN_GRACE_MS): then the process exits regardless. */
  shutdownGraceMs: number;
  /**
   * The platform master key (MASTER_KEY or MASTER_KEY_FILE), needed only to mint runtime MCP
   * bearers for agents with MCP servers. Without it such Runs get no MCP tools.
   */
  masterKey: Buffer | undefined;
  /** Send runners' frames over direct links to the gateway nodes that advertise one (GATEWAY_LINKS). */
  gatewayLinks: boolean;
}

function masterKeyFrom(env: Env): Buffer | undefined {
  const file = envOptional(env, 'MASTER_KEY_FILE');
  let text: string | undefined;
  try {
    text = envOptional(env, 'MASTER_KEY') ?? (file ? readFileSync(file, 'utf8').trim() : undefined);
  } catch (err) {
    // Named as the api names it: the one line on stderr says which setting is wrong.
    throw new ConfigError(`MASTER_KEY_FILE cannot be read: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (!text) return undefined;
  const key = /^[0-9a-f]{64}$/i.test(text) ? Buffer.from(text, 'hex') : Buffer.from(text, 'base64');
  if (key.length !== 32) throw new ConfigError('the master key must decode to exactly 32 bytes');
  return key;
}

export function loadSchedulerConfig(env: Env): SchedulerConfig {
  const port = envOptional(env, 'SCHEDULER_PORT');
  return Object.freeze({
    redisUrl: checkedRedisUrl(envString(env, 'REDIS_URL')),
    appendDurability: appendDurabilityFrom(env),
    logLevel: envEnum(env, 'LOG_LEVEL', ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const, 'info'),
    lease: leaseConfigFrom(env),
    poolScanMs: envInt(env, 'POOL_SCAN_MS', 1000, 50),
    capacityRetryMs: envInt(env, 'CAPACITY_RETRY_MS', 1000, 10),
    enqueueRepairAfterMs: envInt(env, 'ENQUEUE_REPAIR_AFTER_MS', 10_000, 100),
    interruptGraceMs: envInt(env, 'INTERRUPT_GRACE_MS', 10_000, 0),
    port: port === undefined ? undefined : envInt(env, 'SCHEDULER_PORT', 0, 0, 65535),
    host: envString(env, 'SCHEDULER_HOST', '127.0.0.1'),
    shutdownGraceMs: envInt(env, 'SHUTDOWN_GRACE_MS', 10_000, 0),
    masterKey: masterKeyFrom(env),
    gatewayLinks: envBool(env, 'GATEWAY_LINKS', true),
  });
}
