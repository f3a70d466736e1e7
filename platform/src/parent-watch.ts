/**
 * Loaded (`node --import`) into every process the platform supervises, before its own entry
 * script. When the platform is gone without stopping it (killed outright, so this process was
 * re-parented), the process is asked to stop as a supervisor would ask it (SIGTERM) and, should
 * its stop not end in time, exits. On Linux the parent-death signal (`setpriv --pdeathsig`)
 * usually gets there first; this watch is what makes the bound hold everywhere else, and what
 * ends a stop that hangs.
 *
 * Settings come in the module's own URL (`?name=<child>&exit_ms=<ms>[&runner_dir=<dir>][&ready=…]`),
 * so nothing leaks into the environment of the processes the child starts. With `runner_dir` (the
 * local runner), sandbox containers of that runner still running at the exit are killed first: a
 * runner whose control plane is gone cannot finish cancelling its held work, so it would not get
 * to stop them itself.
 *
 * With `ready`, the process tells the supervisor when it is up, with one line on file descriptor
 * 3 (a pipe the supervisor reads): `listen` when it first listens (the api, the scheduler), `signal`
 * when it says so itself on the diagnostics channel `agentplane:ready` (the runner, once its
 * startup is done). A child that exits before that never started; the supervisor gives up on it.
 */
import { closeSync, writeSync } from 'node:fs';
import { subscribe, tracingChannel, unsubscribe } from 'node:diagnostics_channel';

const params = new URL(import.meta.url).searchParams;
const name = params.get('name') ?? 'child';
const exitMs = Math.max(1000, Number(params.get('exit_ms')) || 30_000);
const runnerDir = params.get('runner_dir');
const ready = params.get('ready');
const parent = process.ppid;

// The supervisor relays this process's stderr (it keeps the last line, the reason of a failed
// start): once the platform is gone that pipe is closed, and a write to it must not end the process.
process.stderr.on('error', () => undefined);

if (ready === 'listen' || ready === 'signal') {
  const noop = (): void => undefined;
  const listening = { start: noop, end: noop, asyncStart: noop, asyncEnd: (): void => tell(), error: noop };
  let told = false;
  const tell = (): void => {
    if (told) return;
    told = true;
    // Not from inside the channel's own publish.
    queueMicrotask(() => {
      unsubscribe('agentplane:ready', tell);
      if (ready === 'listen') tracingChannel('net.server.listen').unsubscribe(listening);
    });
    try {
      writeSync(3, 'ready\n');
      closeSync(3);
    } catch {
      // The supervisor is gone (or did not ask): nobody to tell.
    }
  };
  subscribe('agentplane:ready', tell);
  if (ready === 'listen') tracingChannel('net.server.listen').subscribe(listening);
}

/** One structured line, shaped like the process's own log lines. */
function note(level: number, msg: string, fields: Record<string, unknown>): void {
  process.stdout.write(`${JSON.stringify({ level, time: new Date().toISOString(), service: name, pid: process.pid, name, ...fields, msg })}\n`);
}

const watch = setInterval(() => {
  if (process.ppid === parent) return;
  clearInterval(watch);
  note(40, 'the platform is gone; stopping', { parent_pid: parent, exit_after_ms: exitMs });
  process.kill(process.pid, 'SIGTERM');
  setTimeout(() => {
    note(50, 'stop did not finish after the platform was gone; exiting', { after_ms: exitMs });
    if (!runnerDir) process.exit(1);
    import('./leftovers.js')
      .then(({ stopRunnerSandboxes }) => stopRunnerSandboxes({ runnerDir, dockerSocket: process.env.DOCKER_SOCKET }))
      .then((killed) => {
        if (killed > 0) note(40, 'killed the sandbox containers this runner left running', { containers: killed });
      }, (err: unknown) => note(40, 'could not stop this runner\'s sandbox containers', { err: err instanceof Error ? err.message : String(err) }))
      .finally(() => process.exit(1));
  }, exitMs).unref();
}, 500);
watch.unref();
