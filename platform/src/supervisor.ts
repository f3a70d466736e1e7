import { spawn, type ChildProcess } from 'node:child_process';
import type { Logger } from '@agentplane/core';
import { parentDeathWrapper } from '@agentplane/store';

export interface ChildSpec {
  name: string;
  /** Node entry script. */
  script: string;
  args?: string[];
  env: Record<string, string>;
}

/**
 * Runs the platform's processes and restarts any that die unexpectedly (capped backoff).
 * On stop: SIGTERM to every child, SIGKILL after the grace period. A child gets SIGTERM too when
 * the platform dies outright (where `setpriv --pdeathsig` exists), so none is left orphaned.
 */
export class Supervisor {
  private readonly children = new Map<string, { spec: ChildSpec; proc: ChildProcess; restarts: number }>();
  private stopping = false;
  private readonly wrapper = parentDeathWrapper();

  constructor(
    private readonly log: Logger,
    private readonly restart: boolean,
    private readonly onChange: () => void = () => undefined,
  ) {}

  start(spec: ChildSpec, restarts = 0): ChildProcess {
    const [cmd = process.execPath, ...pre] = [...this.wrapper, process.execPath];
    const proc = spawn(cmd, [...pre, spec.script, ...(spec.args ?? [])], {
      env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp', ...spec.env },
      stdio: ['ignore', 'inherit', 'inherit'],
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

  async stop(graceMs = 15_000): Promise<void> {
    this.stopping = true;
    const waits = [...this.children.values()].map(
      ({ proc }) =>
        new Promise<void>((resolve) => {
          if (proc.exitCode !== null || proc.signalCode !== null) return resolve();
          const timer = setTimeout(() => proc.kill('SIGKILL'), graceMs);
          proc.once('exit', () => {
            clearTimeout(timer);
            resolve();
          });
          proc.kill('SIGTERM');
        }),
    );
    await Promise.all(waits);
  }
}
