/**
 * The `process` driver, for hosts without Docker: launch kind `trusted`, tier `process`.
 * UNISOLATED — commands run as the daemon's own user on the host, with host network and
 * filesystem. It gives a workspace directory per Session under the runner data dir, timeouts,
 * output caps and process-group kills, and nothing more. `driverSatisfies` never selects it for
 * an Environment that requires (or defaults to) tier `container`.
 */
import { randomBytes } from 'node:crypto';
import { chmod, mkdir, readdir, readFile, rm, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { createLogger, type Logger } from '@agentplane/core';
import { normaliseRelative } from './docker-driver.js';
import { execChild, killGroup, spawnChild, type ChildOptions } from './child-exec.js';
import {
  SandboxError,
  type Command,
  type ReapOptions,
  type ComputeUsage,
  type DriverCapabilities,
  type ExecOptions,
  type ExecResult,
  type RuntimeAssurance,
  type Sandbox,
  type SandboxDriver,
  type SandboxProcess,
  type SpawnOptions,
  type SandboxEnvironment,
  type SandboxSession,
} from './types.js';

export interface ProcessDriverOptions {
  runnerId: string;
  /** The runner data dir; workspaces live in `<dataDir>/sandboxes/<runner>/<session>/workspace`. */
  dataDir: string;
  logger?: Logger;
}

export class ProcessDriver implements SandboxDriver {
  readonly name = 'process' as const;
  readonly tier = 'process' as const;
  private readonly root: string;
  private readonly log: Logger;
  private readonly live = new Map<string, Sandbox>();
  private readonly children = new Map<string, Set<number>>();

  constructor(private readonly options: ProcessDriverOptions) {
    this.root = join(options.dataDir, 'sandboxes', options.runnerId.replace(/[^a-zA-Z0-9_.-]/g, '-'));
    this.log = options.logger ?? createLogger({ name: 'sandbox', level: 'warn' });
  }

  /** Only what holds without isolation: process-group kills bound a cancel, removal is a directory delete. */
  assurances(): RuntimeAssurance[] {
    return ['bounded_start', 'bounded_cancel', 'teardown'];
  }

  capabilities(): DriverCapabilities {
    return {
      drivers: ['process'],
      launch_kinds: ['trusted'],
      tiers: ['process'],
      network_modes: ['host'],
      retention_modes: ['durable'],
      session_sandbox: true,
      mount_kinds: ['uploaded_project'],
      runtime_assurances: this.assurances(),
      unisolated: true,
    };
  }

  /** Marks every process of a session (inherited by its children), so a reaper finds them after a daemon crash. */
  private marker(sessionId: string, runnerId = this.options.runnerId): string {
    return `${runnerId}/${sessionId}`;
  }

  private dir(sessionId: string): string {
    return join(this.root, sessionId.replace(/[^a-zA-Z0-9_.-]/g, '-'));
  }

  async ensure(session: SandboxSession, _environment: SandboxEnvironment = {}): Promise<Sandbox> {
    const existing = this.live.get(session.id);
    if (existing) return { ...existing, reused: true };
    const workspace = join(this.dir(session.id), 'workspace');
    await mkdir(workspace, { recursive: true, mode: 0o700 });
    const sandbox: Sandbox = { sessionId: session.id, driver: 'process', ref: workspace, workspace, createdAt: Date.now(), reused: false };
    this.live.set(session.id, sandbox);
    this.log.warn({ session: session.id }, 'process sandbox: commands run UNISOLATED on the host');
    return sandbox;
  }

  private childOptions(sandbox: Sandbox, cwd: string | undefined, env: Record<string, string> | undefined): ChildOptions {
    const pids = this.children.get(sandbox.sessionId) ?? new Set<number>();
    this.children.set(sandbox.sessionId, pids);
    // Per command, not per session: a killed command takes along only what it started, never the
    // session's other commands.
    const command = randomBytes(8).toString('hex');
    return {
      cwd: cwd ? (cwd.startsWith('/') ? cwd : join(sandbox.workspace, cwd)) : sandbox.workspace,
      env: {
        PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: sandbox.workspace, LANG: 'C.UTF-8', ...env,
        [SESSION_MARKER]: this.marker(sandbox.sessionId), [COMMAND_MARKER]: command,
      },
      onStart: (pid) => pids.add(pid),
      onEnd: (pid) => pids.delete(pid),
      killEscaped: async () => {
        await killMarked((m) => m === command, COMMAND_MARKER);
      },
    };
  }

  async exec(sandbox: Sandbox, command: Command, options: ExecOptions = {}): Promise<ExecResult> {
    if (!this.live.has(sandbox.sessionId)) throw new SandboxError('not_found', `no live sandbox for ${sandbox.sessionId}`);
    const argv = Array.isArray(command) ? command : ['bash', '-c', command.script];
    return execChild(argv, this.childOptions(sandbox, options.cwd, options.env), options);
  }

  async spawn(sandbox: Sandbox, command: Command, options: SpawnOptions = {}): Promise<SandboxProcess> {
    if (!this.live.has(sandbox.sessionId)) throw new SandboxError('not_found', `no live sandbox for ${sandbox.sessionId}`);
    const argv = Array.isArray(command) ? command : ['bash', '-c', command.script];
    return spawnChild(argv, this.childOptions(sandbox, options.cwd, options.env));
  }

  async writeFiles(sandbox: Sandbox, files: Array<{ path: string; data: Buffer; mode?: number; readOnly?: boolean }>): Promise<void> {
    for (const file of files) {
      const target = join(sandbox.workspace, normaliseRelative(file.path));
      await mkdir(dirname(target), { recursive: true });
      // A read-only file placed again (a later version of a skill) is replaced, not written through.
      if (file.readOnly) await rm(target, { force: true });
      await writeFile(target, file.data);
      // The process tier has no second user: read-only is the file mode only.
      await chmod(target, file.readOnly ? 0o444 : (file.mode ?? 0o644));
    }
  }

  async usage(_sandbox: Sandbox): Promise<ComputeUsage | undefined> {
    return undefined;
  }

  async suspend(sessionId: string): Promise<void> {
    for (const pid of this.children.get(sessionId) ?? []) killGroup(pid);
    this.children.delete(sessionId);
    await killMarked((m) => m === this.marker(sessionId));
  }

  async destroy(sessionId: string): Promise<void> {
    await this.suspend(sessionId);
    this.live.delete(sessionId);
    await rm(this.dir(sessionId), { recursive: true, force: true });
  }

  async sandboxSessions(runnerId: string): Promise<string[]> {
    const root = join(this.options.dataDir, 'sandboxes', runnerId.replace(/[^a-zA-Z0-9_.-]/g, '-'));
    return (await readdir(root, { withFileTypes: true }).catch(() => [])).filter((e) => e.isDirectory()).map((e) => e.name);
  }

  async reapOrphans(runnerId: string, keepSessionIds: Iterable<string>, options: ReapOptions = {}): Promise<string[]> {
    const clean = (id: string): string => id.replace(/[^a-zA-Z0-9_.-]/g, '-');
    const keepIds = new Set(keepSessionIds);
    const keep = new Set([...keepIds].map(clean));
    const keepWorkspaces = new Set([...(options.keepWorkspacesOf ?? [])].map(clean));
    const prefix = `${runnerId}/`;
    const killed = await killMarked((m) => m.startsWith(prefix) && !keepIds.has(m.slice(prefix.length)));
    const root = join(this.options.dataDir, 'sandboxes', clean(runnerId));
    const entries = await readdir(root).catch(() => [] as string[]);
    const reaped = new Set<string>(killed.map((m) => clean(m.slice(prefix.length))));
    for (const entry of entries) {
      if (keep.has(entry)) continue;
      if (!keepWorkspaces.has(entry)) await rm(join(root, entry), { recursive: true, force: true });
      reaped.add(entry);
    }
    if (runnerId === this.options.runnerId) {
      for (const id of [...this.live.keys()]) if (reaped.has(clean(id))) this.live.delete(id);
    }
    return [...reaped];
  }
}

/** Environment variable `<runner>/<session>` on every process a process sandbox starts. */
const SESSION_MARKER = 'AGENTPLANE_SANDBOX';
/** Environment variable naming the command a process belongs to (it finds one that left the command's group). */
const COMMAND_MARKER = 'AGENTPLANE_SANDBOX_COMMAND';

/** Kills every process (and its group) whose marker `variable` matches; returns the markers it killed. */
async function killMarked(match: (marker: string) => boolean, variable = SESSION_MARKER): Promise<string[]> {
  const entries = await readdir('/proc').catch(() => [] as string[]);
  const killed = new Set<string>();
  for (const name of entries) {
    if (!/^\d+$/.test(name) || Number(name) === process.pid) continue;
    const environ = await readFile(`/proc/${name}/environ`, 'latin1').catch(() => '');
    const entry = environ.split('\0').find((kv) => kv.startsWith(`${variable}=`));
    if (!entry) continue;
    const marker = entry.slice(variable.length + 1);
    if (!match(marker)) continue;
    killGroup(Number(name));
    try {
      process.kill(Number(name), 'SIGKILL');
    } catch {
      // gone
    }
    killed.add(marker);
  }
  return [...killed];
}
