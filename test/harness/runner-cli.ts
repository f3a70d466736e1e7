import { spawn, type ChildProcess } from 'node:child_process';
import { RUNNER_CLI } from './daemon.js';
import { spawnOwned } from './spawn.js';

export type LogLine = Record<string, unknown> & { msg: string; level: number };

/** A runner daemon started with `agentplane-runner start`, its JSON log lines parsed as they come. */
export interface LoggedDaemon {
  proc: ChildProcess;
  /** Parsed log lines so far. */
  lines: LogLine[];
  /** Resolves with the first log line whose message starts with `msg` (or already did). */
  line(msg: string): Promise<LogLine>;
  stderr(): string;
  stdout(): string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null }>;
}

/**
 * `agentplane-runner start --config-dir dir` at log level info with fast reconnects, under the
 * parent-death wrapper; `home` is its HOME, `env` and `args` added. The caller keeps the child to
 * kill it at the end (`started`).
 */
export function startLoggedDaemon(dir: string, opts: { home: string; env?: Record<string, string>; args?: string[]; started?: (proc: ChildProcess) => void }): LoggedDaemon {
  const proc = spawnOwned(process.execPath, [
    RUNNER_CLI, 'start', '--config-dir', dir, '--log-level', 'info', '--reconnect-base-ms', '200', '--reconnect-cap-ms', '1000', ...(opts.args ?? []),
  ], {
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: opts.home,
      ...(process.env.AGENTPLANE_SANDBOX_SCOPE ? { AGENTPLANE_SANDBOX_SCOPE: process.env.AGENTPLANE_SANDBOX_SCOPE } : {}), ...opts.env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  opts.started?.(proc);
  const lines: LogLine[] = [];
  const waiters: Array<{ msg: string; done: (l: LogLine) => void }> = [];
  let buf = '';
  let out = '';
  let err = '';
  proc.stdout?.setEncoding('utf8').on('data', (d: string) => {
    out += d;
    buf += d;
    for (let i = buf.indexOf('\n'); i >= 0; i = buf.indexOf('\n')) {
      const raw = buf.slice(0, i);
      buf = buf.slice(i + 1);
      let l: LogLine;
      try {
        l = JSON.parse(raw) as LogLine;
      } catch {
        continue;
      }
      if (typeof l.msg !== 'string') continue;
      lines.push(l);
      for (const w of waiters.splice(0)) if (l.msg.startsWith(w.msg)) w.done(l); else waiters.push(w);
    }
  });
  proc.stderr?.setEncoding('utf8').on('data', (d: string) => (err += d));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((r) => proc.once('exit', (code, signal) => r({ code, signal })));
  return {
    proc, lines, stderr: () => err, stdout: () => out, exited,
    line: (msg) => {
      const seen = lines.find((l) => l.msg.startsWith(msg));
      return seen ? Promise.resolve(seen) : new Promise((done) => waiters.push({ msg, done }));
    },
  };
}

export interface CliRun { code: number | null; stdout: string; stderr: string }

/** One `agentplane-runner` command (status, drain, --help, …) run to its end, HOME set to `home`. */
export function runnerCli(args: string[], home: string): Promise<CliRun> {
  return new Promise((done) => {
    const child = spawn(process.execPath, [RUNNER_CLI, ...args], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: home }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('close', (code) => done({ code, stdout, stderr }));
  });
}
