/**
 * Commands as child processes of this process, each the leader of its own process group, with
 * the exec contract's bounds: output capped per stream, a timeout and an abort signal that kill
 * the whole group. The process driver runs them on the host; the colocated harness runs them
 * inside the sandbox, next to itself. Only node built-ins: the colocated bundle includes this.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import { constants } from 'node:os';
import { PassThrough } from 'node:stream';
import { CappedBuffer, runawayBytes, runawayNote, withNote } from './output.js';
import { EXEC_DEFAULTS, SandboxError, type ExecOptions, type ExecResult, type SandboxProcess } from './types.js';

export interface ChildOptions {
  /** Absolute working directory. */
  cwd: string;
  /** The whole environment of the child. */
  env: NodeJS.ProcessEnv;
  /** Told each child's pid when it starts and when it has ended (for reapers). */
  onStart?(pid: number): void;
  onEnd?(pid: number): void;
  /**
   * Ends what a killed command left outside its process group (a descendant that called setsid):
   * a timeout or abort must not leave it running, nor holding the command's stdout open.
   */
  killEscaped?(): Promise<void>;
}

/**
 * How long output already written may still arrive once the command has exited or was killed. A
 * descendant that left the process group can hold stdout open long after: waiting for the
 * streams to close would wait for it.
 */
const OUTPUT_GRACE_MS = 250;

/** SIGKILL to a process group; a group that is already gone is not an error. */
export function killGroup(pid: number): void {
  try {
    process.kill(-pid, 'SIGKILL');
  } catch {
    // gone
  }
}

function exitCodeOf(code: number | null, signal: NodeJS.Signals | null): number {
  if (code !== null) return code;
  return 128 + (signal ? (constants.signals[signal] ?? 9) : 9);
}

function start(argv: string[], o: ChildOptions, stdin: 'pipe' | 'ignore'): ChildProcess {
  const [file, ...args] = argv;
  if (!file) throw new SandboxError('exec_failed', 'empty command');
  // detached: the child leads a new session and process group, so kill(-pid) reaches the whole tree.
  return spawn(file, args, { cwd: o.cwd, env: o.env, detached: true, stdio: [stdin, 'pipe', 'pipe'] });
}

interface Ended {
  code: number | null;
  signal: NodeJS.Signals | null;
  spawnError?: Error;
}

/**
 * The end of a command: when its streams close, or at the latest a short grace after it exited
 * or was killed (`afterKill`). Its streams are then destroyed: nothing keeps reading them.
 */
function whenEnded(child: ChildProcess): { ended: Promise<Ended>; afterKill(): void } {
  let afterKill = (): void => {};
  const ended = new Promise<Ended>((resolve) => {
    let exited: Ended = { code: null, signal: null };
    let grace: NodeJS.Timeout | undefined;
    let settled = false;
    const settle = (e: Ended): void => {
      if (settled) return;
      settled = true;
      clearTimeout(grace);
      child.stdout?.destroy();
      child.stderr?.destroy();
      resolve(e);
    };
    afterKill = (): void => {
      // Past the grace, one more poll of the event loop first: output (or the streams' close)
      // already waiting when a busy loop fired the timer late is read before the end.
      grace ??= setTimeout(() => setImmediate(() => settle(exited)), OUTPUT_GRACE_MS);
    };
    child.on('error', (err) => settle({ code: null, signal: null, spawnError: err }));
    child.on('exit', (code, signal) => {
      exited = { code, signal };
      afterKill();
    });
    child.on('close', (code, signal) => settle({ code, signal }));
  });
  // The executor ran already: afterKill is the grace timer's.
  return { ended, afterKill };
}

/** Runs a command to its end under the exec contract (caps, timeout, abort). */
export async function execChild(argv: string[], o: ChildOptions, options: ExecOptions = {}): Promise<ExecResult> {
  const started = Date.now();
  const maxOutput = options.maxOutputBytes ?? EXEC_DEFAULTS.maxOutputBytes;
  const stdout = new CappedBuffer(maxOutput, runawayBytes(maxOutput));
  const stderr = new CappedBuffer(maxOutput, runawayBytes(maxOutput));
  if (options.signal?.aborted) {
    return { exitCode: 137, stdout: '', stderr: '', truncated: false, timedOut: false, killed: true, oomKilled: false, durationMs: 0 };
  }
  const child = start(argv, o, options.stdin === undefined ? 'ignore' : 'pipe');
  const pid = child.pid;
  if (pid) o.onStart?.(pid);
  child.stdout?.on('data', (c: Buffer) => stdout.add(c));
  child.stderr?.on('data', (c: Buffer) => stderr.add(c));
  if (child.stdin) {
    child.stdin.on('error', () => {});
    child.stdin.end(options.stdin);
  }
  const end = whenEnded(child);
  let timedOut = false;
  let killed = false;
  const kill = (): void => {
    if (pid) killGroup(pid);
    void o.killEscaped?.().catch(() => undefined);
    end.afterKill();
  };
  const timer = setTimeout(() => {
    timedOut = true;
    kill();
  }, options.timeoutMs ?? EXEC_DEFAULTS.timeoutMs);
  const onAbort = (): void => {
    killed = true;
    kill();
  };
  options.signal?.addEventListener('abort', onAbort, { once: true });
  // A command writing without bound is ended, as the docker driver ends one (output.ts).
  let capped = false;
  const onRunaway = (): void => {
    capped = true;
    kill();
  };
  stdout.once('runaway', onRunaway);
  stderr.once('runaway', onRunaway);
  const { code, signal, spawnError } = await end.ended;
  clearTimeout(timer);
  options.signal?.removeEventListener('abort', onAbort);
  if (pid) o.onEnd?.(pid);
  if (spawnError) throw new SandboxError('exec_failed', `spawn ${argv[0]}: ${spawnError.message}`, { cause: spawnError });
  // The leader may be gone while members of its group, or what left it, still run: finish them too.
  if (pid && (timedOut || killed || capped)) {
    killGroup(pid);
    await o.killEscaped?.().catch(() => undefined);
  }
  return {
    exitCode: timedOut || killed || capped ? 137 : exitCodeOf(code, signal),
    stdout: stdout.text(),
    stderr: capped ? withNote(stderr.text(), runawayNote(maxOutput)) : stderr.text(),
    truncated: stdout.truncated || stderr.truncated,
    timedOut,
    killed,
    oomKilled: false,
    durationMs: Date.now() - started,
  };
}

/** Starts a command with open stdio in its own process group (the streaming half of the contract). */
export async function spawnChild(argv: string[], o: ChildOptions): Promise<SandboxProcess> {
  const child = start(argv, o, 'pipe');
  const pid = child.pid;
  await new Promise<void>((resolve, reject) => {
    child.once('spawn', resolve);
    child.once('error', (err) => reject(new SandboxError('exec_failed', `spawn ${argv[0]}: ${err.message}`, { cause: err })));
  });
  if (pid) o.onStart?.(pid);
  let killed = false;
  // As for execChild: a descendant that left the group and holds stdout open keeps neither the
  // process's end nor a kill waiting.
  const end = whenEnded(child);
  const ended = end.ended.then(({ code, signal }) => {
    if (pid) o.onEnd?.(pid);
    return { exitCode: killed ? 137 : exitCodeOf(code, signal), killed };
  });
  const stdin = child.stdin ?? new PassThrough();
  stdin.on('error', () => {});
  return {
    stdin,
    stdout: child.stdout ?? new PassThrough(),
    stderr: child.stderr ?? new PassThrough(),
    wait: () => ended,
    async kill() {
      killed = true;
      if (pid) killGroup(pid);
      void o.killEscaped?.().catch(() => undefined);
      end.afterKill();
      await ended;
      if (pid) killGroup(pid);
      await o.killEscaped?.().catch(() => undefined);
    },
  };
}
