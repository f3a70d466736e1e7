/**
 * Loaded (`node --import`) into every process the platform supervises, before its own entry
 * script. When the platform is gone without stopping it (killed outright, so this process was
 * re-parented), the process is asked to stop as a supervisor would ask it (SIGTERM) and, should
 * its stop not end in time, exits. On Linux the parent-death signal (`setpriv --pdeathsig`)
 * usually gets there first; this watch is what makes the bound hold everywhere else, and what
 * ends a stop that hangs.
 *
 * Settings come in the module's own URL (`?name=<child>&exit_ms=<ms>[&runner_dir=<dir>]`), so
 * nothing leaks into the environment of the processes the child starts. With `runner_dir` (the
 * local runner), sandbox containers of that runner still running at the exit are killed first: a
 * runner whose control plane is gone cannot finish cancelling its held work, so it would not get
 * to stop them itself.
 */
const params = new URL(import.meta.url).searchParams;
const name = params.get('name') ?? 'child';
const exitMs = Math.max(1000, Number(params.get('exit_ms')) || 30_000);
const runnerDir = params.get('runner_dir');
const parent = process.ppid;

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
