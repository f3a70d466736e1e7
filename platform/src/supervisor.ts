import { spawn, type ChildProcess } from 'node:child_process';
import type { Logger } from '@agentplane/core';
import { parentDeathWrapper } from '@agentplane/store';

export interface ChildSpec {
  name: string;
  /** Node entry script. */
  script: string;
  /** Options for node itself, ahead of the script (V8 flags). */
  nodeArgs?: string[];
  args?: string[];
  env: Record<string, string>;
  /**
   * How long a stop may take from its SIGTERM: then the child is killed (SIGKILL, logged). Also
   * how long the child may take to stop on its own once the platform is gone.
   */
  stopGraceMs: number;
  /** A second SIGTERM this long after the first, when the child is still stopping (the runner: cancel held work now). */
  secondSignalAfterMs?: number;
  /** The local runner's config dir: its sandbox containers still running when it is made to exit (platform gone) are killed. */
  runnerDir?: string;
  /**
   * When the child counts as up: `listen` once it listens (the api, the scheduler), `signal` once
   * it says so (the runner, after its startup); unset: at once. A child that exits before it was
   * ever up could not start: the supervisor gives up on it instead of restarting it.
   */
  ready?: 'listen' | 'signal';
  /**
   * Exit codes that say restarting the child as it is cannot help, each with what it means and
   * what to do (the runner's 5: the control plane refused its credential). A child that exits
   * with one is reported (an error line) and left stopped: neither restarted nor given up on, so
   * the other children keep running.
   */
  finalExitCodes?: Readonly<Record<number, string>>;
}

/** The supervisor gave up on a child: it could not start, or it keeps crashing. */
export interface FatalExit {
  child: string;
  /** Why it is given up on, in words (`exited before it was ready`, `exited 5 times within 60 s`). */
  reason: string;
  code: number | null;
  signal: NodeJS.Signals | null;
  /** The last line the child wrote on stderr before it exited, else how it exited. */
  error: string;
}

export interface SupervisorOptions {
  /** Called (once) when a child is given up on; the platform then stops. */
  onFatal?: (fatal: FatalExit) => void;
  /** A child that exits this many times within `crashWindowMs` is given up on. Default 5. */
  maxCrashes?: number;
  crashWindowMs?: number;
  /**
   * A child with a `ready` condition that has not met it after this long, still running, counts as
   * up anyway (a Node without the listen tracing channel, a runner whose image build takes long).
   * Default 60 s.
   */
  readyFallbackMs?: number;
}

/** How a child's stop ended. */
export interface StopResult {
  name: string;
  /** It had to be killed (SIGKILL) at the end of its grace period. */
  killed: boolean;
  ms: number;
}

/** How long a stage's stop waits for the lines logged before it to be written. */
const LOG_FLUSH_WAIT_MS = 1000;

/** Of a child's stderr, the tail kept to name its last error. */
const STDERR_TAIL_BYTES = 4096;

/** The last non-empty line of what a child wrote on stderr (bounded), or how it exited. */
export function lastError(stderrTail: string, code: number | null, signal: NodeJS.Signals | null): string {
  const line = stderrTail.split('\n').map((l) => l.trim()).filter(Boolean).at(-1);
  if (line) return line.length > 500 ? `${line.slice(0, 500)}…` : line;
  return signal ? `killed by ${signal}` : `exit code ${String(code)}`;
}

/** Resolves once the child's stderr and ready pipe have ended, or after `boundMs`. */
function drained(proc: ChildProcess, boundMs = 1000): Promise<void> {
  const pipes = [proc.stdio[2], proc.stdio[3]].filter((p): p is NonNullable<typeof p> => p !== null && p !== undefined && !p.destroyed);
  if (pipes.length === 0) return Promise.resolve();
  return new Promise<void>((resolve) => {
    const timer = setTimeout(resolve, boundMs);
    let open = pipes.length;
    for (const p of pipes) {
      p.once('close', () => {
        open -= 1;
        if (open === 0) {
          clearTimeout(timer);
          resolve();
        }
      });
    }
  });
}

interface Child {
  spec: ChildSpec;
  proc: ChildProcess;
  restarts: number;
  /** This life of the child met its ready condition. */
  ready: boolean;
  stderrTail: string;
}

/**
 * Runs the platform's processes and restarts any that die unexpectedly (capped backoff).
 *
 * Each child runs in a process group of its own (a terminal's Ctrl-C reaches the platform alone,
 * which stops the children in order) and ends when the platform dies, whatever way: it gets
 * SIGTERM at once where `setpriv --pdeathsig` exists (Linux), and a watch loaded into it
 * (./parent-watch.ts) sends it SIGTERM within half a second of being re-parented and exits it
 * when its stop has not ended after its grace period.
 *
 * A child is given up on, and the platform told (`onFatal`), when it exits before it was ever up
 * (its first start failed: a port in use, a bad setting) or when it exits `maxCrashes` times within
 * `crashWindowMs`: restarting it would only log the same failure forever. A child that was up and
 * crashes now and then is restarted as before. One that exits with a code of its spec's
 * `finalExitCodes` is reported and left stopped.
 *
 * On stop: the children are stopped stage by stage (SIGTERM, a second SIGTERM when the spec asks
 * for one, SIGKILL after the grace period, logged), each stage once the one before has exited.
 */
export class Supervisor {
  private readonly children = new Map<string, Child>();
  /** Children that were up at least once (any life). */
  private readonly everReady = new Set<string>();
  /** When each child exited, within the crash window. */
  private readonly crashes = new Map<string, number[]>();
  private stopping = false;
  private gaveUp = false;
  private readonly wrapper = parentDeathWrapper();
  private readonly watch = new URL('./parent-watch.js', import.meta.url);

  constructor(
    private readonly log: Logger,
    private readonly restart: boolean,
    private readonly onChange: () => void = () => undefined,
    private readonly options: SupervisorOptions = {},
  ) {}

  start(spec: ChildSpec, restarts = 0): ChildProcess {
    const watch = new URL(this.watch);
    watch.search = new URLSearchParams({
      name: spec.name, exit_ms: String(spec.stopGraceMs), ...(spec.runnerDir ? { runner_dir: spec.runnerDir } : {}), ...(spec.ready ? { ready: spec.ready } : {}),
    }).toString();
    const [cmd = process.execPath, ...pre] = [...this.wrapper, process.execPath];
    // stderr is relayed (its last line names a failed start); fd 3 is where the child says it is up.
    const proc = spawn(cmd, [...pre, ...(spec.nodeArgs ?? []), '--import', watch.href, spec.script, ...(spec.args ?? [])], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp', ...spec.env },
      stdio: ['ignore', 'inherit', 'pipe', ...(spec.ready ? (['pipe'] as const) : [])],
      detached: true,
    });
    const child: Child = { spec, proc, restarts, ready: false, stderrTail: '' };
    this.children.set(spec.name, child);
    this.onChange();
    proc.stderr?.on('data', (chunk: Buffer) => {
      process.stderr.write(chunk);
      child.stderrTail = (child.stderrTail + chunk.toString('utf8')).slice(-STDERR_TAIL_BYTES);
    });
    const up = (): void => {
      if (child.ready || this.children.get(spec.name) !== child) return;
      child.ready = true;
      this.everReady.add(spec.name);
    };
    if (spec.ready) {
      const readyPipe = proc.stdio[3] as NodeJS.ReadableStream | null | undefined;
      readyPipe?.on('data', up);
      readyPipe?.on('error', () => undefined);
      setTimeout(() => {
        if (proc.exitCode === null && proc.signalCode === null) up();
      }, this.options.readyFallbackMs ?? 60_000).unref();
    } else {
      up();
    }
    proc.on('exit', (code, signal) => {
      if (this.children.get(spec.name)?.proc !== proc || this.stopping) return;
      this.log.warn({ child: spec.name, code, signal }, 'platform process exited');
      // What it wrote last (its ready line, its last error) may still be in the pipes: read it
      // first (not longer than a second: a process it started may hold them open).
      void drained(proc).then(() => this.exited(child, code, signal));
    });
    return proc;
  }

  private exited(child: Child, code: number | null, signal: NodeJS.Signals | null): void {
    const { spec, proc, restarts } = child;
    if (this.children.get(spec.name)?.proc !== proc || this.stopping) return;
    const error = lastError(child.stderrTail, code, signal);
    const final = code === null ? undefined : spec.finalExitCodes?.[code];
    if (final !== undefined) {
      this.log.error({ child: spec.name, code, error }, `the ${spec.name} process exited with code ${code}: ${final}; it is not restarted (${error})`);
      return;
    }
    if (!this.everReady.has(spec.name)) return this.giveUp({ child: spec.name, reason: 'exited before it was ready', code, signal, error });
    const window = this.options.crashWindowMs ?? 60_000;
    const max = this.options.maxCrashes ?? 5;
    const now = Date.now();
    const recent = [...(this.crashes.get(spec.name) ?? []).filter((t) => now - t < window), now];
    this.crashes.set(spec.name, recent);
    if (recent.length >= max) return this.giveUp({ child: spec.name, reason: `exited ${recent.length} times within ${Math.round(window / 1000)} s`, code, signal, error });
    if (!this.restart) return;
    const delay = Math.min(250 * 2 ** Math.min(restarts, 5), 8000);
    setTimeout(() => {
      if (!this.stopping && !this.gaveUp) this.start(spec, restarts + 1);
    }, delay).unref();
  }

  /** Whether the child of that name is up now (its current life met its ready condition). */
  isReady(name: string): boolean {
    return this.children.get(name)?.ready ?? false;
  }

  private giveUp(fatal: FatalExit): void {
    if (this.gaveUp) return;
    this.gaveUp = true;
    this.options.onFatal?.(fatal);
  }

  pids(): Record<string, number | undefined> {
    const out: Record<string, number | undefined> = {};
    for (const [name, c] of this.children) out[name] = c.proc.pid;
    return out;
  }

  /** Stop these children together; resolves when every one has exited. */
  async stopStage(names: readonly string[]): Promise<StopResult[]> {
    this.stopping = true;
    const stage = names.flatMap((name) => {
      const child = this.children.get(name);
      return child ? [{ name, ...child }] : [];
    });
    for (const { name, proc } of stage) if (proc.exitCode === null && proc.signalCode === null) this.log.info({ child: name }, 'stopping platform process');
    // What was logged up to here is written before any child of the stage hears of the stop: the
    // children share stdout, so a child's own first line of stopping could otherwise come before
    // the line that says why. The platform's logger writes each line before the call returns
    // (`createLogger`'s `sync`); a logger that buffers is flushed here (not longer than a second:
    // a stdout nobody reads must not keep the children from being stopped).
    await new Promise<void>((resolve) => {
      const timer = setTimeout(resolve, LOG_FLUSH_WAIT_MS);
      this.log.flush(() => {
        clearTimeout(timer);
        resolve();
      });
    });
    return Promise.all(stage.map(({ name, spec, proc }) => this.stopChild(name, spec, proc)));
  }

  /** Every child not stopped yet, together. */
  async stopRest(): Promise<StopResult[]> {
    return this.stopStage([...this.children.keys()]);
  }

  /** A child being stopped gets SIGTERM again (the runner: cancel held work now). */
  hurry(name: string): boolean {
    const child = this.children.get(name);
    if (!this.stopping || !child || child.proc.exitCode !== null || child.proc.signalCode !== null) return false;
    return child.proc.kill('SIGTERM');
  }

  private stopChild(name: string, spec: ChildSpec, proc: ChildProcess): Promise<StopResult> {
    const started = Date.now();
    if (proc.exitCode !== null || proc.signalCode !== null) return Promise.resolve({ name, killed: false, ms: 0 });
    return new Promise<StopResult>((resolve) => {
      let killed = false;
      const timers: NodeJS.Timeout[] = [];
      if (spec.secondSignalAfterMs !== undefined) {
        timers.push(setTimeout(() => {
          this.log.warn({ child: name, after_ms: spec.secondSignalAfterMs }, 'platform process still stopping; sending SIGTERM again');
          proc.kill('SIGTERM');
        }, spec.secondSignalAfterMs));
      }
      timers.push(setTimeout(() => {
        killed = true;
        this.log.warn({ child: name, after_ms: spec.stopGraceMs }, 'platform process did not stop in time; killing it (SIGKILL)');
        proc.kill('SIGKILL');
      }, spec.stopGraceMs));
      proc.once('exit', (code, signal) => {
        for (const t of timers) clearTimeout(t);
        this.log.info({ child: name, code, signal, ms: Date.now() - started }, 'platform process stopped');
        resolve({ name, killed, ms: Date.now() - started });
      });
      proc.kill('SIGTERM');
    });
  }
}
