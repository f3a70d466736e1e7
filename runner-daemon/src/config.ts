import { chmodSync, closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, writeFileSync, writeSync } from 'node:fs';
import { homedir } from 'node:os';
import { join, resolve } from 'node:path';
import { ConfigError, envEnum, envInt, envOptional, envString, type Env } from '@agentplane/core';
import { SANDBOX_SCOPE_ENV } from './sandbox/types.js';

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
  const flag = (name: string): string | undefined => (typeof flags[name] === 'string' ? (flags[name] as string) : undefined);
  // Errors name what the operator typed: the flag (`--slots`) or the environment variable.
  const int = (name: string, envName: string, fallback: number, min = 0, max = Number.MAX_SAFE_INTEGER): number => {
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
    exitWhenDrained: flags['exit-when-drained'] === true || envEnum(env, 'RUNNER_EXIT_WHEN_DRAINED', ['true', 'false'] as const, 'false') === 'true',
    requireDocker: flags['require-docker'] === true || envEnum(env, 'RUNNER_REQUIRE_DOCKER', ['true', 'false'] as const, 'false') === 'true',
    reconnectBaseMs: int('reconnect-base-ms', 'RUNNER_RECONNECT_BASE_MS', 1_000, 10),
    reconnectCapMs: int('reconnect-cap-ms', 'RUNNER_RECONNECT_CAP_MS', 64_000, 10),
    sandboxIdleSuspendMs: int('sandbox-idle-suspend-seconds', 'SANDBOX_IDLE_SUSPEND_SECONDS', 600, 0) * 1000,
    sandboxIdleExpireMs: int('sandbox-idle-expire-seconds', 'SANDBOX_IDLE_EXPIRE_SECONDS', 86_400, 0) * 1000,
    sandboxReportMs: int('sandbox-report-seconds', 'SANDBOX_REPORT_SECONDS', 30, 1) * 1000,
    repositoryMaxBytes: int('repository-max-mib', 'REPOSITORY_MAX_MIB', 256, 1) * 1024 * 1024,
    sandboxReapIntervalMs: int('sandbox-reap-interval-seconds', 'SANDBOX_REAP_INTERVAL_SECONDS', 300, 0) * 1000,
    sandboxReapGraceMs: int('sandbox-reap-grace-seconds', 'SANDBOX_REAP_GRACE_SECONDS', 900, 0) * 1000,
    sandboxScope: envOptional(env, SANDBOX_SCOPE_ENV),
    metricsAddr: envOptional(env, 'RUNNER_METRICS_ADDR'),
    acpHarnesses: (flag('acp-harness') ?? envOptional(env, 'RUNNER_ACP_HARNESSES') ?? '').split(',').map((x) => x.trim()).filter(Boolean),
    logLevel: flag('log-level') !== undefined ? envEnum({ '--log-level': flag('log-level') }, '--log-level', LOG_LEVELS, 'info') : envEnum(env, 'LOG_LEVEL', LOG_LEVELS, 'info'),
  });
}

/** What `pair` stores: enough to connect. Mode 0600 in a 0700 directory. */
export interface RunnerCredentialFile {
  base_url: string;
  secret: string;
  runner_id: string;
  runner_credential_id: string;
  runner_pool_id: string;
  workspace_id: string;
  machine_label: string;
  paired_at: string;
}

/** What a running daemon publishes about itself (read by `status` and `drain`). */
export interface RunnerStateFile {
  pid: number;
  status: 'starting' | 'ready' | 'draining' | 'disconnected' | 'stopped';
  connected: boolean;
  generation: number | null;
  base_url: string;
  runner_id: string;
  last_heartbeat_ack_at: string | null;
  reconnect_attempt: number;
  /**
   * Who asked this daemon to drain: `local` (a signal: `drain`, systemctl stop, Ctrl-C; it then
   * leaves, and one more signal cancels its held work), `control_plane` (the API), or null.
   */
  drain?: 'local' | 'control_plane' | null;
  /** Set when the daemon stopped because the control plane refused its credential for good. */
  credential_refused?: CredentialRefusal | null;
  updated_at: string;
}

/**
 * The control plane refused this runner's credential at the upgrade (HTTP 401: revoked, deleted;
 * 403: its owner Principal or Workspace disabled) twice in a row: the daemon stopped.
 */
export interface CredentialRefusal {
  http_status: 401 | 403;
  /** The control plane's error type and message (its answer's body), when it gave them. */
  error_type: string | null;
  error_message: string | null;
  at: string;
}

export const credentialPath = (dir: string): string => join(dir, 'runner.json');
export const statePath = (dir: string): string => join(dir, 'state.json');

/**
 * Written whole: a temp file (0600) renamed over the target. A write that fails (disk full,
 * read-only) leaves no temp file behind and the target as it was.
 */
function writePrivate(path: string, text: string): void {
  const tmp = `${path}.${process.pid}.tmp`;
  try {
    writeFileSync(tmp, text, { mode: 0o600 });
    chmodSync(tmp, 0o600);
    renameSync(tmp, path);
  } catch (err) {
    rmSync(tmp, { force: true });
    throw err;
  }
}

/** The config dir, made (or narrowed to) 0700: the credential in it is the runner's secret. */
function privateDir(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
}

/**
 * Before a credential is asked for: the config dir exists, is 0700, and a file the size of a
 * credential can be written, synced and removed in it. A pairing code is single-use, so a disk
 * that is full or read-only must be found before the code is redeemed, not after. Throws the
 * filesystem's error (ENOSPC, EROFS, EACCES, ENOTDIR, …).
 */
export function checkWritableConfigDir(dir: string): void {
  privateDir(dir);
  const probe = join(dir, `.write-probe.${process.pid}`);
  try {
    const fd = openSync(probe, 'w', 0o600);
    try {
      writeSync(fd, Buffer.alloc(4096, 0x20));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  } finally {
    rmSync(probe, { force: true });
  }
}

export function saveCredential(dir: string, cred: RunnerCredentialFile): string {
  privateDir(dir);
  const path = credentialPath(dir);
  writePrivate(path, `${JSON.stringify(cred, null, 2)}\n`);
  return path;
}

const CREDENTIAL_FIELDS = ['base_url', 'secret', 'runner_id', 'runner_credential_id', 'runner_pool_id', 'workspace_id'] as const;

/** The stored credential; null when the dir holds none. A damaged file is a ConfigError naming it. */
export function loadCredential(dir: string): RunnerCredentialFile | null {
  const path = credentialPath(dir);
  if (!existsSync(path)) return null;
  const fix = 'restore it, or pair again into this config dir with --force (the credential it held stays active until revoked)';
  let body: unknown;
  try {
    body = JSON.parse(readFileSync(path, 'utf8'));
  } catch (err) {
    if (err instanceof SyntaxError) throw new ConfigError(`the runner credential file ${path} is not valid JSON (${err.message}): ${fix}`);
    throw err;
  }
  const missing = body && typeof body === 'object' ? CREDENTIAL_FIELDS.filter((f) => typeof (body as Record<string, unknown>)[f] !== 'string') : ['(not an object)'];
  if (missing.length > 0) throw new ConfigError(`the runner credential file ${path} is damaged (missing ${missing.join(', ')}): ${fix}`);
  return body as RunnerCredentialFile;
}

export function saveState(dir: string, state: RunnerStateFile): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  writePrivate(statePath(dir), `${JSON.stringify(state)}\n`);
}

export function loadState(dir: string): RunnerStateFile | null {
  const path = statePath(dir);
  if (!existsSync(path)) return null;
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as RunnerStateFile;
  } catch {
    return null;
  }
}
