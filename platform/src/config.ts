import { LEASE_ENV } from '@agentplane/lease';
import { APPEND_DURABILITY_ENV, checkedRedisUrl } from '@agentplane/store';
import { resolve } from 'node:path';
import { envBool, envBoolAliased, envEnum, envInt, envOptional, envString, type Env } from '@agentplane/core';

export interface PlatformConfig {
  dataDir: string;
  port: number;
  host: string;
  /** An external Redis; when absent a private redis-server is started under dataDir/redis. */
  redisUrl: string | undefined;
  redisHz: number;
  /** The processes reach the embedded Redis by its Unix socket (else over loopback TCP). */
  redisSocket: boolean;
  logLevel: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
  docsUrl: string | undefined;
  /** The address clients reach the API at (Agent Cards, ingest paths); default the listen address. */
  publicBaseUrl: string | undefined;
  /** Where the scheduler serves /metrics and /healthz (its own default when unset). */
  schedulerHost: string | undefined;
  startScheduler: boolean;
  /** Where the scheduler serves /healthz and /metrics (0: an ephemeral port). */
  schedulerPort: number;
  startRunner: boolean;
  /**
   * The api's young-generation semi-space limit (MiB; 0: V8's own, 16). A larger one lets more of
   * a request's short-lived objects die before a scavenge copies them (docs/RUNS.md).
   */
  apiSemiSpaceMib: number;
  /** Restart a child process that dies unexpectedly. */
  restartChildren: boolean;
  /** On a stop: how long the local runner finishes held work before it cancels what is left. */
  runnerDrainDeadlineMs: number;
  /** On a stop: how long the api and the scheduler get for a graceful stop (handed to them as SHUTDOWN_GRACE_MS). */
  shutdownGraceMs: number;
  /** Runner gateway settings passed through to the API (RUNNER_HEARTBEAT_INTERVAL_MS, RUNNER_PRESENCE_TTL_MS, RUNNER_MAX_FRAME_BYTES, PAIRING_REDEEM_PER_MINUTE). */
  runnerEnv: Readonly<Record<string, string>>;
  /** Lease timing handed to the api and scheduler unchanged (LEASE_MS, OFFER_TIMEOUT_MS, …). */
  leaseEnv: Readonly<Record<string, string>>;
  /** Model settings handed to the api process unchanged (MODEL_PRICES_FILE, MODEL_PROVIDER_TIMEOUT_MS, MODEL_STEP_DEADLINE_MS). */
  modelEnv: Record<string, string>;
  /** OpenTelemetry settings (OTEL_*, but OTEL_SERVICE_NAME: each process names itself) handed to every child. */
  otelEnv: Readonly<Record<string, string>>;
  /** Session stream and console settings handed to the api process unchanged (SSE_KEEPALIVE_MS, CONSOLE_ENABLED, CONSOLE_DIR). */
  sessionEnv: Record<string, string>;
  /**
   * Handed to the local runner unchanged: its sandbox settings, and what git needs on this machine
   * to fetch repository resources (CA bundle, SSH agent, proxies).
   */
  localRunnerEnv: Readonly<Record<string, string>>;
}

const LOCAL_RUNNER_ENV = [
  'RUNNER_MAX_SLOTS', 'RUNNER_SLOT_MEMORY_MIB', 'DOCKER_SOCKET', 'SANDBOX_IDLE_SUSPEND_SECONDS', 'SANDBOX_IDLE_EXPIRE_SECONDS',
  'SANDBOX_REPORT_SECONDS', 'SANDBOX_REAP_INTERVAL_SECONDS', 'RUNNER_METRICS_ADDR', 'SANDBOX_REAP_GRACE_SECONDS', 'AGENTPLANE_SANDBOX_SCOPE', 'REPOSITORY_MAX_MIB', 'RUNNER_TIERS', 'RUNNER_BROWSER', 'RUNNER_BROWSER_IMAGE', 'RUNNER_EGRESS_ALLOW_PRIVATE_NETWORKS', 'RUNNER_EXIT_WHEN_DRAINED', 'RUNNER_REQUIRE_DOCKER', 'RUNNER_ACP_HARNESSES', 'GIT_SSL_CAINFO', 'GIT_SSH_COMMAND', 'SSH_AUTH_SOCK', 'HTTPS_PROXY', 'HTTP_PROXY', 'NO_PROXY',
] as const;

const RUNNER_ENV = ['RUNNER_HEARTBEAT_INTERVAL_MS', 'RUNNER_PRESENCE_TTL_MS', 'RUNNER_MAX_FRAME_BYTES', 'PAIRING_REDEEM_PER_MINUTE'] as const;

/** The api's own settings of the README's and docs/OPERATIONS.md's tables, passed through unchanged. */
const API_ENV = [
  'ACTION_APPROVAL_EXPIRY_SECONDS', 'AUDIT_RETENTION_DAYS', 'BODY_LIMIT_BYTES', 'IDEMPOTENCY_TTL_SECONDS', 'MEMORY_INDEXED_STORES', 'METRICS_ENABLED',
  'GATEWAY_LINK_URL',
] as const;

/**
 * API settings of automations, outbound webhooks and the outbound address guard, passed through
 * to the api process (docs/AUTOMATIONS.md). `WEBHOOK_ALLOW_PRIVATE_NETWORKS` is the deprecated
 * alias of `EGRESS_ALLOW_PRIVATE_NETWORKS`: both go through, and the api reads them.
 */
const AUTOMATION_ENV = [
  'AGENTPLANE_MODE', 'AUTOMATION_SWEEP_MS', 'AUTOMATION_MISSED_AFTER_MS', 'WEBHOOK_MAX_ATTEMPTS', 'WEBHOOK_RETRY_BASE_MS', 'WEBHOOK_RETRY_MAX_MS', 'WEBHOOK_TIMEOUT_MS',
  'WEBHOOK_SWEEP_MS', 'EGRESS_ALLOW_PRIVATE_NETWORKS', 'WEBHOOK_ALLOW_PRIVATE_NETWORKS', 'SKILL_SOURCES_ALLOW_LOCAL', 'SKILL_ADOPTION_POLL_MS',
];

/**
 * The outbound address guard's setting and its deprecated alias may not disagree: the api would
 * refuse to start, so the platform refuses first, as for a bad setting of its own (exit code 2),
 * before it starts anything.
 */
function checkEgressAlias(env: Env): void {
  envBoolAliased(env, 'EGRESS_ALLOW_PRIVATE_NETWORKS', 'WEBHOOK_ALLOW_PRIVATE_NETWORKS', false);
}

export function loadPlatformConfig(env: Env): PlatformConfig {
  checkEgressAlias(env);
  return Object.freeze({
    dataDir: resolve(envString(env, 'DATA_DIR', './.data')),
    // Not 0 (an ephemeral port): the local runner, the bootstrap file and PUBLIC_BASE_URL are given
    // the API's address before it listens.
    port: envInt(env, 'PORT', 8080, 1, 65535),
    host: envString(env, 'HOST', '127.0.0.1'),
    redisUrl: redisUrlOf(envOptional(env, 'REDIS_URL')),
    redisHz: envInt(env, 'REDIS_HZ', 100, 1, 500),
    redisSocket: envBool(env, 'REDIS_SOCKET', true),
    logLevel: envEnum(env, 'LOG_LEVEL', ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const, 'info'),
    docsUrl: envOptional(env, 'DOCS_URL'),
    publicBaseUrl: envOptional(env, 'PUBLIC_BASE_URL'),
    schedulerHost: envOptional(env, 'SCHEDULER_HOST'),
    startScheduler: envBool(env, 'START_SCHEDULER', true),
    schedulerPort: envInt(env, 'SCHEDULER_PORT', 0, 0, 65535),
    startRunner: envBool(env, 'START_RUNNER', true),
    restartChildren: envBool(env, 'RESTART_CHILDREN', true),
    apiSemiSpaceMib: envInt(env, 'API_SEMI_SPACE_MIB', 64, 0, 1024),
    runnerDrainDeadlineMs: envInt(env, 'RUNNER_DRAIN_DEADLINE_MS', 10_000, 0, 3_600_000),
    shutdownGraceMs: envInt(env, 'SHUTDOWN_GRACE_MS', 10_000, 0, 600_000),
    leaseEnv: Object.freeze(Object.fromEntries([...LEASE_ENV, ...APPEND_DURABILITY_ENV, 'CAPACITY_RETRY_MS', 'INTERRUPT_GRACE_MS', 'POOL_SCAN_MS', 'ENQUEUE_REPAIR_AFTER_MS', 'GATEWAY_LINKS'].flatMap((k) => (envOptional(env, k) ? [[k, envOptional(env, k) as string]] : [])))),
    runnerEnv: Object.freeze(Object.fromEntries(RUNNER_ENV.flatMap((k) => (envOptional(env, k) ? [[k, envOptional(env, k) as string]] : [])))),
    localRunnerEnv: Object.freeze(Object.fromEntries(LOCAL_RUNNER_ENV.flatMap((k) => (envOptional(env, k) ? [[k, envOptional(env, k) as string]] : [])))),
    otelEnv: Object.freeze(Object.fromEntries(Object.entries(env).filter((e): e is [string, string] => e[0].startsWith('OTEL_') && e[0] !== 'OTEL_SERVICE_NAME' && typeof e[1] === 'string'))),
    // NODE_EXTRA_CA_CERTS: a private CA the api trusts for outbound TLS (e.g. A2A tool source peers).
    // A2A_TOOLS_*: the api's A2A tool source settings (docs/A2A_TOOLS.md).
    sessionEnv: Object.fromEntries(['SSE_KEEPALIVE_MS', 'CONSOLE_ENABLED', 'CONSOLE_DIR', 'NODE_EXTRA_CA_CERTS', ...API_ENV, ...AUTOMATION_ENV, ...Object.keys(env).filter((k) => k.startsWith('A2A_TOOLS_'))].flatMap((k) => (envOptional(env, k) ? [[k, envOptional(env, k) as string]] : []))),
    modelEnv: Object.fromEntries(
      ['MODEL_PRICES_FILE', 'MODEL_PROVIDER_TIMEOUT_MS', 'MODEL_STEP_DEADLINE_MS'].flatMap((name) => {
        const v = envOptional(env, name);
        return v === undefined ? [] : [[name, v]];
      }),
    ),
  });
}

function redisUrlOf(url: string | undefined): string | undefined {
  return url === undefined ? undefined : checkedRedisUrl(url);
}
