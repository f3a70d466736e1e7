import { homedir } from 'node:os';
import { join, resolve } from 'node:path';
import { ConfigError, envEnum, envInt, envOptional, envString, MAX_TIMER_MS, MAX_TIMER_SECONDS, type Env } from '@agentplane/core';
import { SANDBOX_SCOPE_ENV } from '@agentplane/sandbox';

/** Process-level settings of the daemon (flags win over environment, environment over defaults). */
export interface DaemonConfig {
  /** Holds runner.json (credential, 0600) and state.json (status of the running daemon). */
  configDir: string;
  /** Heartbeat interval override; default: what the gateway says in welcome. */
  heartbeatIntervalMs: number | undefined;
  /** Upper bound on slots offered, 1 to 1024 (default: CPU count). */
  maxSlots: number | undefined;
  /** Memory reserved per slot when computing available_slots. */
  slotMemoryMib: number;
  sandboxImage: string;
  dockerSocket: string | undefined;
  /** Drain deadline on SIGTERM: held work is canceled after it. */
  drainDeadlineMs: number;
  /**
   * A drain the control plane asks for (`POST /v1/runners/{id}/drain`, a pool drain) makes the
   * daemon exit once idle, instead of staying connected, idle, until resumed.
   */
  exitWhenDrained: boolean;
  /** Isolation tiers this runner may offer (`container`, `gvisor`); undefined: every verified tier. */
  tiers: ('container' | 'gvisor')[] | undefined;
  /**
   * The browser image this runner offers browser observation with (`--browser`: the default
   * browser variant, built offline from the host's Chromium when missing); undefined: none.
   */
  browserImage: string | undefined;
  /** The egress proxy of allowlist sandboxes may connect to private and reserved addresses. */
  egressAllowPrivate: boolean;
  reconnectBaseMs: number;
  reconnectCapMs: number;
  /** Stop an idle Session sandbox's processes (workspace kept) after this long; 0 never. */
  sandboxIdleSuspendMs: number;
  /** Remove an idle Session sandbox and its workspace after this long; 0 never. */
  sandboxIdleExpireMs: number;
  /** How often the daemon reports its sandboxes so those of archived or deleted Sessions are released. */
  sandboxReportMs: number;
  /** Upper bound on one repository snapshot (bytes). */
  repositoryMaxBytes: number;
  /** How often sandboxes of gone runners of this machine are looked for (0: only at start). */
  sandboxReapIntervalMs: number;
  /** How long a sandbox of a gone runner is seen before it is reaped. */
  sandboxReapGraceMs: number;
  /** Reaping scope (label `agentplane.scope`); undefined: the default scope. */
  sandboxScope: string | undefined;
  logLevel: 'fatal' | 'error' | 'warn' | 'info' | 'debug' | 'trace' | 'silent';
  /** npm package specs of ACP agent harnesses to install into the sandbox image (docs/ACP.md). */
  acpHarnesses: string[];
  /** host:port serving Prometheus /metrics; undefined: not served. */
  metricsAddr: string | undefined;
  /**
   * Refuse to start without Docker (exit code 4) instead of falling back to the unisolated
   * process driver.
   */
  requireDocker: boolean;
}

/** The default browser variant's repository (the default sandbox image's, suffixed). */
const BROWSER_REPOSITORY = 'agentplane/sandbox-browser';
const LOG_LEVELS = ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const;
const TIERS = ['container', 'gvisor'] as const;

function parseTiers(raw: string | undefined): ('container' | 'gvisor')[] | undefined {
  if (raw === undefined) return undefined;
  const list = raw.split(',').map((t) => t.trim()).filter(Boolean);
  for (const t of list) if (!(TIERS as readonly string[]).includes(t)) throw new ConfigError(`--tiers / RUNNER_TIERS: unknown tier '${t}' (known: ${TIERS.join(', ')})`);
  return list as ('container' | 'gvisor')[];
}

export function loadDaemonConfig(env: Env, flags: Record<string, string | boolean>): DaemonConfig {
  // A flag given an empty value names nothing (`--config-dir ""` would be the working directory).
  const flag = (name: string): string | undefined => {
    const v = flags[name];
    if (v === '') throw new ConfigError(`--${name}: must not be empty`);
    return typeof v === 'string' ? v : undefined;
  };
  // Errors name what the operator typed: the flag (`--slots`) or the environment variable.
  const int = (name: string, envName: string, fallback: number, min = 0, max = MAX_TIMER_MS): number => {
    const f = flag(name);
    return f !== undefined ? envInt({ [`--${name}`]: f }, `--${name}`, fallback, min, max) : envInt(env, envName, fallback, min, max);
  };
  const optionalInt = (name: string, envName: string, min: number, max?: number): number | undefined =>
    flag(name) === undefined && envOptional(env, envName) === undefined ? undefined : int(name, envName, min, min, max);
  return Object.freeze({
    configDir: resolve(flag('config-dir') ?? envString(env, 'AGENTPLANE_RUNNER_HOME', join(homedir(), '.agentplane', 'runner'))),
    heartbeatIntervalMs: optionalInt('heartbeat-ms', 'RUNNER_HEARTBEAT_INTERVAL_MS', 100),
    maxSlots: optionalInt('slots', 'RUNNER_MAX_SLOTS', 1, 1024),
    slotMemoryMib: int('slot-memory-mib', 'RUNNER_SLOT_MEMORY_MIB', 512, 64),
    sandboxImage: flag('image') ?? envString(env, 'SANDBOX_IMAGE', 'agentplane/sandbox:latest'),
    dockerSocket: envOptional(env, 'DOCKER_SOCKET'),
    drainDeadlineMs: int('drain-deadline-ms', 'RUNNER_DRAIN_DEADLINE_MS', 3_600_000, 0),
    tiers: parseTiers(flag('tiers') ?? envOptional(env, 'RUNNER_TIERS')),
    browserImage: flag('browser-image') ?? envOptional(env, 'RUNNER_BROWSER_IMAGE')
      ?? (flags.browser === true || envEnum(env, 'RUNNER_BROWSER', ['true', 'false'] as const, 'false') === 'true' ? `${BROWSER_REPOSITORY}:latest` : undefined),
    egressAllowPrivate: flags['egress-allow-private-networks'] === true || envEnum(env, 'RUNNER_EGRESS_ALLOW_PRIVATE_NETWORKS', ['true', 'false'] as const, 'false') === 'true',
    exitWhenDrained: flags['exit-when-drained'] === true || envEnum(env, 'RUNNER_EXIT_WHEN_DRAINED', ['true', 'false'] as const, 'false') === 'true',
    requireDocker: flags['require-docker'] === true || envEnum(env, 'RUNNER_REQUIRE_DOCKER', ['true', 'false'] as const, 'false') === 'true',
    reconnectBaseMs: int('reconnect-base-ms', 'RUNNER_RECONNECT_BASE_MS', 1_000, 10),
    reconnectCapMs: int('reconnect-cap-ms', 'RUNNER_RECONNECT_CAP_MS', 64_000, 10),
    sandboxIdleSuspendMs: int('sandbox-idle-suspend-seconds', 'SANDBOX_IDLE_SUSPEND_SECONDS', 600, 0, MAX_TIMER_SECONDS) * 1000,
    sandboxIdleExpireMs: int('sandbox-idle-expire-seconds', 'SANDBOX_IDLE_EXPIRE_SECONDS', 86_400, 0, MAX_TIMER_SECONDS) * 1000,
    sandboxReportMs: int('sandbox-report-seconds', 'SANDBOX_REPORT_SECONDS', 30, 1, MAX_TIMER_SECONDS) * 1000,
    repositoryMaxBytes: int('repository-max-mib', 'REPOSITORY_MAX_MIB', 256, 1) * 1024 * 1024,
    sandboxReapIntervalMs: int('sandbox-reap-interval-seconds', 'SANDBOX_REAP_INTERVAL_SECONDS', 300, 0, MAX_TIMER_SECONDS) * 1000,
    sandboxReapGraceMs: int('sandbox-reap-grace-seconds', 'SANDBOX_REAP_GRACE_SECONDS', 900, 0, MAX_TIMER_SECONDS) * 1000,
    sandboxScope: envOptional(env, SANDBOX_SCOPE_ENV),
    metricsAddr: envOptional(env, 'RUNNER_METRICS_ADDR'),
    acpHarnesses: (flag('acp-harness') ?? envOptional(env, 'RUNNER_ACP_HARNESSES') ?? '').split(',').map((x) => x.trim()).filter(Boolean),
    logLevel: flag('log-level') !== undefined ? envEnum({ '--log-level': flag('log-level') }, '--log-level', LOG_LEVELS, 'info') : envEnum(env, 'LOG_LEVEL', LOG_LEVELS, 'info'),
  });
}
