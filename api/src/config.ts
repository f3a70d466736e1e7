import { readFileSync } from 'node:fs';
import type { A2aCallSettings } from './tool-sources/calls.js';
import type { MigrationSettings } from './tool-sources/migrations.js';
import type { DeliverySettings } from './webhooks/delivery.js';
import { gatewayLinkUrlFrom } from '@agentplane/gateway';
import { leaseConfigFrom, type LeaseConfig } from '@agentplane/lease';
import { appendDurabilityFrom, checkedRedisUrl, type EventLogDurability } from '@agentplane/store';
import { DEFAULT_APPROVAL_EXPIRY_SECONDS, MAX_APPROVAL_EXPIRY_SECONDS } from './approvals/limits.js';
import { envBool, envBoolAliased, envEnum, envInt, envOptional, envString, type Env, ConfigError } from '@agentplane/core';

export interface ApiConfig {
  port: number;
  host: string;
  redisUrl: string;
  /** WAIT after every Session event append (docs/CLUSTER.md). */
  appendDurability: EventLogDurability;
  /** Base of the public documentation; error bodies link into it. */
  docsUrl: string;
  /** The URL clients use to reach this API (bootstrap file, OpenAPI servers). */
  publicBaseUrl: string;
  /** 32-byte key that seals secrets at rest (idempotent replays, vault material). */
  masterKey: Buffer;
  bodyLimitBytes: number;
  logLevel: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
  /** How long Idempotency-Key records are kept. */
  idempotencyTtlSeconds: number;
  /** How long audit records are kept (AUDIT_RETENTION_DAYS). */
  auditRetentionMs: number;
  /** Grace period for in-flight requests on shutdown. */
  shutdownGraceMs: number;
  /** Host the runner WebSocket gateway in this process. */
  gatewayEmbedded: boolean;
  /**
   * Where schedulers reach this gateway node's link (GATEWAY_LINK_URL; null: `off`, no link, frames
   * come by pub/sub; undefined: derived from the listen address).
   */
  gatewayLinkUrl: string | null | undefined;
  metricsEnabled: boolean;
  /** Period of the SSE keep-alive comment on session streams. */
  sseKeepaliveMs: number;
  /** Lease timing shared with the scheduler (LEASE_MS, OFFER_TIMEOUT_MS, …). */
  lease: LeaseConfig;
  /** How long a running Run gets to stop after user.interrupt. */
  interruptGraceMs: number;
  /** Runner gateway: heartbeat interval told to runners, presence TTL, largest accepted frame. */
  runnerHeartbeatIntervalMs: number;
  runnerPresenceTtlMs: number;
  runnerMaxFrameBytes: number;
  /** Pairing-code redemptions accepted per minute per client address; the platform as a whole takes ten times that (guessing defence). */
  pairingRedeemPerMinute: number;
  /** JSON price table laid over the shipped one (USD per million tokens per provider and model). */
  modelPricesFile: string | undefined;
  /** Per provider request: time allowed to response headers and between stream chunks. */
  modelProviderTimeoutMs: number;
  /** The overall deadline of one model step, every candidate and throttle wait in (MODEL_STEP_DEADLINE_MS). */
  modelStepDeadlineMs: number;
  /** Serve the web console at /console (CONSOLE_ENABLED) from this built directory (CONSOLE_DIR; default the repository's console/dist). */
  /**
   * Outbound webhooks: attempts per delivery, backoff base and cap, request timeout, the lane
   * sweep interval, and the egress guard of every outbound request to an address a Workspace
   * chooses, webhooks or not (`AGENTPLANE_MODE=development` allows loopback hosts;
   * `EGRESS_ALLOW_PRIVATE_NETWORKS=true` allows private ranges).
   */
  webhooks: DeliverySettings;
  /** Deprecated setting names this configuration was given, each with the name that replaces it (logged at start). */
  deprecatedSettings?: readonly { name: string; use: string }[];
  /** How often each api sweeps firing receipts whose work a crash may have lost (ms). */
  automationSweepMs: number;
  /** Skill sources may be local repositories (`file://`, absolute paths): single-machine installs and tests only. */
  skillSourcesAllowLocal: boolean;
  /** External A2A tool sources: the card GET's time limit (docs/A2A_TOOLS.md). */
  a2aTools: { cardTimeoutMs: number; calls: A2aCallSettings; migrations: MigrationSettings };
  /** How often a submitted skill proposal's source is checked for its adoption. */
  skillAdoptionPollMs: number;
  /** A schedule tick later than this is a missed fire (`on_missed`). */
  automationMissedAfterMs: number;
  consoleEnabled: boolean;
  consoleDir: string | undefined;
  /** ActionApprovals: expiry when the rule sets none (ACTION_APPROVAL_EXPIRY_SECONDS) and the ceiling of every expiry. */
  approvals: { defaultExpirySeconds: number; maxExpirySeconds: number };
  /** MemoryStores whose search index this process keeps in memory (MEMORY_INDEXED_STORES; least recently used evicted). */
  memoryIndexedStores: number;
}

/** The setting that lets outbound requests to addresses a Workspace chooses reach private ranges. */
const EGRESS_ALLOW_PRIVATE = 'EGRESS_ALLOW_PRIVATE_NETWORKS';
/** Its former name, from when it governed webhook deliveries only: still read, deprecated. */
const EGRESS_ALLOW_PRIVATE_ALIAS = 'WEBHOOK_ALLOW_PRIVATE_NETWORKS';

function loadMasterKey(env: Env): Buffer {
  const inline = envOptional(env, 'MASTER_KEY');
  const file = envOptional(env, 'MASTER_KEY_FILE');
  let text: string | undefined;
  try {
    text = inline ?? (file ? readFileSync(file, 'utf8').trim() : undefined);
  } catch (err) {
    throw new ConfigError(`MASTER_KEY_FILE cannot be read: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (!text) throw new ConfigError('MASTER_KEY or MASTER_KEY_FILE is required (32 bytes, hex or base64)');
  const key = /^[0-9a-f]{64}$/i.test(text) ? Buffer.from(text, 'hex') : Buffer.from(text, 'base64');
  if (key.length !== 32) throw new ConfigError('the master key must decode to exactly 32 bytes');
  return key;
}

export function loadApiConfig(env: Env): ApiConfig {
  const port = envInt(env, 'PORT', 8080, 0, 65535);
  const host = envString(env, 'HOST', '127.0.0.1');
  const egressPrivate = envBoolAliased(env, EGRESS_ALLOW_PRIVATE, EGRESS_ALLOW_PRIVATE_ALIAS, false);
  return Object.freeze({
    port,
    host,
    redisUrl: checkedRedisUrl(envString(env, 'REDIS_URL')),
    appendDurability: appendDurabilityFrom(env),
    docsUrl: envString(env, 'DOCS_URL', 'https://docs.agentplane.dev'),
    publicBaseUrl: publicBaseUrl(envString(env, 'PUBLIC_BASE_URL', `http://${host === '0.0.0.0' ? '127.0.0.1' : host}:${port}`)),
    masterKey: loadMasterKey(env),
    bodyLimitBytes: envInt(env, 'BODY_LIMIT_BYTES', 4 * 1024 * 1024, 1024),
    logLevel: envEnum(env, 'LOG_LEVEL', ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const, 'info'),
    idempotencyTtlSeconds: envInt(env, 'IDEMPOTENCY_TTL_SECONDS', 24 * 3600, 60),
    auditRetentionMs: envInt(env, 'AUDIT_RETENTION_DAYS', 400, 1, 3650) * 24 * 3600 * 1000,
    shutdownGraceMs: envInt(env, 'SHUTDOWN_GRACE_MS', 10_000, 0),
    gatewayEmbedded: envBool(env, 'GATEWAY_EMBEDDED', true),
    gatewayLinkUrl: gatewayLinkUrlFrom(env),
    metricsEnabled: envBool(env, 'METRICS_ENABLED', true),
    sseKeepaliveMs: envInt(env, 'SSE_KEEPALIVE_MS', 15_000, 100, 300_000),
    lease: leaseConfigFrom(env),
    interruptGraceMs: envInt(env, 'INTERRUPT_GRACE_MS', 10_000, 0),
    runnerHeartbeatIntervalMs: envInt(env, 'RUNNER_HEARTBEAT_INTERVAL_MS', 5_000, 100, 600_000),
    runnerPresenceTtlMs: envInt(env, 'RUNNER_PRESENCE_TTL_MS', 20_000, 300, 3_600_000),
    runnerMaxFrameBytes: envInt(env, 'RUNNER_MAX_FRAME_BYTES', 1024 * 1024, 1024, 64 * 1024 * 1024),
    pairingRedeemPerMinute: envInt(env, 'PAIRING_REDEEM_PER_MINUTE', 60, 1, 100_000),
    approvals: {
      defaultExpirySeconds: envInt(env, 'ACTION_APPROVAL_EXPIRY_SECONDS', DEFAULT_APPROVAL_EXPIRY_SECONDS, 1, MAX_APPROVAL_EXPIRY_SECONDS),
      maxExpirySeconds: MAX_APPROVAL_EXPIRY_SECONDS,
    },
    memoryIndexedStores: envInt(env, 'MEMORY_INDEXED_STORES', 32, 1, 10_000),
    modelPricesFile: envOptional(env, 'MODEL_PRICES_FILE'),
    modelProviderTimeoutMs: envInt(env, 'MODEL_PROVIDER_TIMEOUT_MS', 60_000, 100),
    modelStepDeadlineMs: envInt(env, 'MODEL_STEP_DEADLINE_MS', 600_000, 1000),
    webhooks: {
      maxAttempts: envInt(env, 'WEBHOOK_MAX_ATTEMPTS', 12, 1, 100),
      retryBaseMs: envInt(env, 'WEBHOOK_RETRY_BASE_MS', 1000, 10, 3_600_000),
      retryMaxMs: envInt(env, 'WEBHOOK_RETRY_MAX_MS', 3_600_000, 10, 24 * 3_600_000),
      timeoutMs: envInt(env, 'WEBHOOK_TIMEOUT_MS', 10_000, 100, 120_000),
      sweepIntervalMs: envInt(env, 'WEBHOOK_SWEEP_MS', 30_000, 100, 3_600_000),
      egress: { development: envString(env, 'AGENTPLANE_MODE', 'production') === 'development', allowPrivate: egressPrivate.value },
    },
    deprecatedSettings: egressPrivate.aliased ? [{ name: EGRESS_ALLOW_PRIVATE_ALIAS, use: EGRESS_ALLOW_PRIVATE }] : [],
    automationSweepMs: envInt(env, 'AUTOMATION_SWEEP_MS', 10_000, 100, 600_000),
    skillSourcesAllowLocal: envBool(env, 'SKILL_SOURCES_ALLOW_LOCAL', false),
    a2aTools: {
      cardTimeoutMs: envInt(env, 'A2A_TOOLS_CARD_TIMEOUT_MS', 10_000, 100, 120_000),
      calls: {
        deadlineMs: envInt(env, 'A2A_TOOLS_DEADLINE_MS', 600_000, 100, 24 * 3_600_000),
        sweepMs: envInt(env, 'A2A_TOOLS_SWEEP_MS', 5_000, 50, 600_000),
        policy: {
          initialMs: envInt(env, 'A2A_TOOLS_POLL_INITIAL_MS', 500, 1, 600_000),
          factor: 2,
          maxMs: envInt(env, 'A2A_TOOLS_POLL_MAX_MS', 30_000, 1, 3_600_000),
          jitter: 0.2,
          maxRetryAfterMs: envInt(env, 'A2A_TOOLS_MAX_RETRY_AFTER_MS', 120_000, 0, 3_600_000),
          requestTimeoutMs: envInt(env, 'A2A_TOOLS_REQUEST_TIMEOUT_MS', 30_000, 100, 600_000),
        },
      },
      migrations: {
        sweepMs: envInt(env, 'A2A_TOOLS_MIGRATION_SWEEP_MS', 10_000, 100, 600_000),
        lockMs: envInt(env, 'A2A_TOOLS_MIGRATION_LOCK_MS', 30_000, 1_000, 600_000),
      },
    },
    skillAdoptionPollMs: envInt(env, 'SKILL_ADOPTION_POLL_MS', 60_000, 1_000, 24 * 3600_000),
    automationMissedAfterMs: envInt(env, 'AUTOMATION_MISSED_AFTER_MS', 30_000, 100, 24 * 3_600_000),
    consoleEnabled: envBool(env, 'CONSOLE_ENABLED', true),
    consoleDir: envOptional(env, 'CONSOLE_DIR'),
  });
}

/** The address clients reach the API at (OpenAPI `servers`, A2A cards, MCP URLs): an http(s) URL, a base path allowed. */
function publicBaseUrl(raw: string): string {
  let url: URL | undefined;
  try {
    url = new URL(raw);
  } catch {
    url = undefined;
  }
  if (!url || (url.protocol !== 'http:' && url.protocol !== 'https:') || url.search !== '' || url.hash !== '' || url.username !== '' || url.password !== '') {
    throw new ConfigError(`PUBLIC_BASE_URL must be an http or https URL without query, fragment or credentials (e.g. https://agents.example.com), got '${raw}'`);
  }
  return raw;
}
