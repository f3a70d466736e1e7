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

/**
 * Runs the platform's processes and restarts any that die unexpectedly (capped backoff).
 *
 * Each child runs in a process group of its own (a terminal's Ctrl-C reaches the platform alone,
 * which stops the children in order) and ends when the platform dies, whatever way: it gets
 * SIGTERM at once where `setpriv --pdeathsig` exists (Linux), and a watch loaded into it
 * (./parent-watch.ts) sends it SIGTERM within half a second of being re-parented and exits it
 * when its stop has not ended after its grace period.
 *
 * On stop: the children are stopped stage by stage (SIGTERM, a second SIGTERM when the spec asks
 * for one, SIGKILL after the grace period, logged), each stage once the one before has exited.
 */
export class Supervisor {
  private readonly children = new Map<string, { spec: ChildSpec; proc: ChildProcess; restarts: number }>();
  private stopping = false;
  private readonly wrapper = parentDeathWrapper();
  private readonly watch = new URL('./parent-watch.js', import.meta.url);

  constructor(
    private readonly log: Logger,
    private readonly restart: boolean,
    private readonly onChange: () => void = () => undefined,
  ) {}

  start(spec: ChildSpec, restarts = 0): ChildProcess {
    const watch = new URL(this.watch);
    watch.search = new URLSearchParams({ name: spec.name, exit_ms: String(spec.stopGraceMs), ...(spec.runnerDir ? { runner_dir: spec.runnerDir } : {}) }).toString();
    const [cmd = process.execPath, ...pre] = [...this.wrapper, process.execPath];
    const proc = spawn(cmd, [...pre, ...(spec.nodeArgs ?? []), '--import', watch.href, spec.script, ...(spec.args ?? [])], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp', ...spec.env },
      stdio: ['ignore', 'inherit', 'inherit'],
      detached: true,
    });
    this.children.set(spec.name, { spec, proc, restarts });
    this.onChange();
    proc.on('exit', (code, signal) => {
      const current = this.children.get(spec.name);
      if (current?.proc !== proc) return;
      if (this.stopping) return;
      this.log.warn({ child: spec.name, code, signal }, 'platform process exited');
      if (!this.restart) return;
      const delay = Math.min(250 * 2 ** Math.min(restarts, 5), 8000);
      setTimeout(() => {
        if (!this.stopping) this.start(spec, restarts + 1);
      }, delay).unref();
    });
    return proc;
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
