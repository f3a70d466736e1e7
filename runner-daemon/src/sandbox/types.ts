/**
 * The sandbox driver contract: one sandbox per Session, reused between Runs while the Session
 * lives; commands run inside it with caps and timeouts; teardown is explicit and guaranteed by a
 * label-driven reaper.
 */
import type { Readable, Writable } from 'node:stream';

/** `container` (runc) and `gvisor` (runsc) are Docker tiers, claimed after a canary; `process` is unisolated. */
export type SandboxTier = 'container' | 'gvisor' | 'process';
/** `sandboxed`: isolated container; `trusted`: runs with the daemon's own rights (process driver). */
export type LaunchKind = 'sandboxed' | 'trusted';
/**
 * `none`: no network; `allowlist`: no network but the runner's egress proxy, which connects only
 * to the Environment's `allowed_hosts` (docker driver); `host` is reported by the process driver
 * only: it shares the host network.
 */
export type NetworkMode = 'none' | 'allowlist' | 'host';
export type RetentionMode = 'durable';

export type RuntimeAssurance = 'network_isolation' | 'bounded_start' | 'bounded_cancel' | 'teardown' | 'compute_accounting';

/** The part of an Environment a driver needs. Resource names follow RunnerPresence `maximum_resources`. */
export interface SandboxEnvironment {
  /** Image reference; the default sandbox image when absent. */
  image?: string;
  /** Tier the Environment requires; `container` excludes the process driver. */
  tier?: SandboxTier;
  network_mode?: NetworkMode;
  /** With `allowlist`: `host[:port]` entries (`*.` for subdomains) the egress proxy connects to. */
  allowed_hosts?: readonly string[];
  cpu_millis?: number;
  memory_mib?: number;
  /** The most one file written in the sandbox may hold (RLIMIT_FSIZE). */
  disk_mib?: number;
  /** Limit on processes/threads inside the sandbox. */
  pids_limit?: number;
  /** Size of the tmpfs at /tmp. */
  tmp_mib?: number;
  /** Upper bound of one Run's wall time; exec timeouts are capped to what remains. */
  max_duration_seconds?: number;
  /** Extra environment variables for every command. */
  env?: Record<string, string>;
  /** The Environment's opt-in browser: the sandbox runs the browser variant of the image. */
  browser?: boolean;
}

export interface SandboxSession {
  id: string;
}

export interface Sandbox {
  sessionId: string;
  driver: 'docker' | 'process';
  /** Container id for docker, workspace directory for process. */
  ref: string;
  /** Absolute path of the workspace as commands inside the sandbox see it. */
  workspace: string;
  createdAt: number;
  /** Whether `ensure` created it now (cold) or reused an existing one (warm). */
  reused: boolean;
}

export interface ExecOptions {
  cwd?: string;
  env?: Record<string, string>;
  stdin?: string | Buffer;
  /** Wall-clock limit; the process tree is killed when it passes. Default 120 s. */
  timeoutMs?: number;
  /**
   * Per stream; output past it is discarded and `truncated` is set. A driver may end a command
   * that writes far past it without bound (exit code 137, a note at the end of stderr): a caller
   * that wants the capped output checks `truncated` before the exit code. Default 1 MiB.
   */
  maxOutputBytes?: number;
  signal?: AbortSignal;
}

export interface ExecResult {
  exitCode: number;
  stdout: string;
  stderr: string;
  truncated: boolean;
  timedOut: boolean;
  /** Killed because the caller's signal aborted. */
  killed: boolean;
  /** The kernel killed a process for exceeding the sandbox memory limit. */
  oomKilled: boolean;
  durationMs: number;
}

/** A command: an argv, or a script for `bash -c`. */
export type Command = string[] | { script: string };

export interface SpawnOptions {
  cwd?: string;
  env?: Record<string, string>;
}

/**
 * A long-lived command with open stdio (the colocated harness). Unlike `exec` nothing is
 * buffered or capped here: the caller reads the streams and bounds what it keeps.
 */
/**
 * A command started with its stdio open. Its reader reads both `stdout` and `stderr` (or
 * `resume()`s one it does not want): output nobody takes holds the command back, as a full pipe
 * does, rather than piling up in the runner.
 */
export interface SandboxProcess {
  readonly stdin: Writable;
  readonly stdout: Readable;
  readonly stderr: Readable;
  /** Resolves once the command has ended (never rejects); 137 when it was killed. */
  wait(): Promise<{ exitCode: number; killed: boolean }>;
  /**
   * Kills the command's process group; past the driver's cancel bound the sandbox's processes
   * go too (docker: the container is killed; the workspace stays). Resolves once it has ended.
   */
  kill(): Promise<void>;
}

export interface ComputeUsage {
  cpu_nanos: number;
  memory_peak_bytes: number;
}

export interface DriverCapabilities {
  drivers: string[];
  launch_kinds: LaunchKind[];
  tiers: SandboxTier[];
  network_modes: NetworkMode[];
  retention_modes: RetentionMode[];
  session_sandbox: boolean;
  /** Mount kinds the driver serves: Project revisions placed in the workspace. */
  mount_kinds: Array<'uploaded_project'>;
  runtime_assurances: RuntimeAssurance[];
  /** Set on drivers that give no isolation from the host. */
  unisolated?: boolean;
}

export interface SandboxDriver {
  readonly name: 'docker' | 'process';
  readonly tier: SandboxTier;
  /** Creates the Session's sandbox, or returns the live one. Bounded in time. */
  ensure(session: SandboxSession, environment: SandboxEnvironment): Promise<Sandbox>;
  exec(sandbox: Sandbox, command: Command, options?: ExecOptions): Promise<ExecResult>;
  /** Starts a command with its stdin, stdout and stderr open, in its own process group. */
  spawn(sandbox: Sandbox, command: Command, options?: SpawnOptions): Promise<SandboxProcess>;
  /**
   * Writes files (relative to the workspace) owned by the sandbox user. A `readOnly` file (a
   * skill) is mode 0444; where the driver can, it and the directories only it needs are owned by
   * root, so the sandbox user cannot change them.
   */
  writeFiles(sandbox: Sandbox, files: Array<{ path: string; data: Buffer; mode?: number; readOnly?: boolean }>): Promise<void>;
  /** Removes the Session's sandbox and its workspace. Idempotent. */
  destroy(sessionId: string): Promise<void>;
  /**
   * Removes every sandbox of this runner whose Session is not in `keepSessionIds` (its processes,
   * container and workspace). Sessions in `keepWorkspacesOf` lose their processes and container
   * but keep the workspace, for a Run that will be rescheduled. Returns the reaped Session ids.
   */
  reapOrphans(runnerId: string, keepSessionIds: Iterable<string>, options?: ReapOptions): Promise<string[]>;
  /** Sessions that have a sandbox or a kept workspace of this runner on this machine. */
  sandboxSessions(runnerId: string): Promise<string[]>;
  /** Stops the sandbox's processes to free resources; the workspace stays and `ensure` resumes it. */
  suspend(sessionId: string): Promise<void>;
  /**
   * Whether a sandbox the runner still holds went away from outside it (docker: its container was
   * removed, or the engine no longer answers for it). A Run that failed meanwhile failed for the
   * machine's sake, not its work. A sandbox the runner itself suspended or removed is not lost.
   * Right after a process of it ended, `graceMs` gives a removal under way time to show.
   */
  lost?(sandbox: Sandbox, graceMs?: number): Promise<boolean>;
  usage(sandbox: Sandbox): Promise<ComputeUsage | undefined>;
  assurances(): RuntimeAssurance[];
  /** `tiers` lists only what the driver verified (Docker: a canary sandbox per tier, see `verifyTiers`). */
  capabilities(): DriverCapabilities;
  /** Drivers whose tiers need proving run their canaries (again, if the host changed). */
  verifyTiers?(): Promise<unknown>;
}

/** What the harness tools need of a driver: running commands. */
export type CommandRunner = Pick<SandboxDriver, 'exec'>;

export interface ReapOptions {
  keepWorkspacesOf?: Iterable<string>;
}

export type SandboxErrorReason =
  | 'docker_unavailable'
  | 'image_missing'
  /** The Environment's image lacks what the Environment asks of it (e.g. `node` for an allowlist's relay): the Run's fault, not the machine's. */
  | 'image_unsuitable'
  | 'start_timeout'
  | 'start_failed'
  | 'not_found'
  | 'exec_failed'
  | 'invalid_path'
  | 'tier_unsatisfied';

export class SandboxError extends Error {
  constructor(
    readonly reason: SandboxErrorReason,
    message: string,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.name = 'SandboxError';
  }
}

export const EXEC_DEFAULTS = {
  timeoutMs: 120_000,
  maxOutputBytes: 1024 * 1024,
} as const;

/** The RunnerPresence `runtime_assurances` object: every assurance, true only where it holds. */
export function assuranceFlags(held: readonly RuntimeAssurance[]): Record<RuntimeAssurance, boolean> {
  const all: RuntimeAssurance[] = ['network_isolation', 'bounded_start', 'bounded_cancel', 'teardown', 'compute_accounting'];
  return Object.fromEntries(all.map((a) => [a, held.includes(a)])) as Record<RuntimeAssurance, boolean>;
}

export interface EnvironmentRequirements {
  tier?: SandboxTier;
  network_mode?: NetworkMode;
  required_assurances?: RuntimeAssurance[];
}

/**
 * Whether a driver may run an Environment: only a driver that verified the tier serves it (the
 * process driver never serves `container` or `gvisor`).
 */
export function driverSatisfies(driver: Pick<SandboxDriver, 'tier' | 'assurances' | 'capabilities'>, requirements: EnvironmentRequirements): boolean {
  const tier = requirements.tier ?? 'container';
  if (tier !== 'process' && !driver.capabilities().tiers.includes(tier)) return false;
  if (requirements.network_mode === 'none' && !driver.assurances().includes('network_isolation')) return false;
  if (requirements.network_mode && !driver.capabilities().network_modes.includes(requirements.network_mode)) return false;
  const have = new Set(driver.assurances());
  return (requirements.required_assurances ?? []).every((a) => have.has(a));
}
