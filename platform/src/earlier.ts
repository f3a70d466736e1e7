/**
 * The processes an earlier platform on this data directory started, still stopping.
 *
 * A platform killed outright (`kill -9`) leaves its children running for a bounded while: each
 * gets SIGTERM at once and stops within its own bound (the api up to 25 s, the local runner up to
 * its drain deadline + 20 s), still holding the API's port and the runner's config dir. A platform
 * started again on the same data directory in that while would see its api fail to listen (the
 * port in use) or its runner refused (the daemon lock), and give up. So the next start first waits
 * for them to end, within their bounds (then kills them), and says so.
 *
 * They are found by `processes.json` and told apart from unrelated processes that reuse a pid by
 * their command line (this supervisor's watch, with their name) and their environment (this
 * DATA_DIR). Without /proc (not Linux) nothing is found: there the watch ends them in time too.
 */
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Logger } from '@agentplane/core';

/** The supervised children `processes.json` names (the platform and its redis-server are not waited for here). */
const CHILDREN = ['api', 'scheduler', 'runner'] as const;

/** After its own bound, a child still running gets this long before it is killed. */
const KILL_AFTER_MS = 5_000;

interface Earlier {
  name: string;
  pid: number;
  /** How long it may take to stop once its platform is gone (its watch's `exit_ms`). */
  exitMs: number;
}

function zombieOrGone(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    const state = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0];
    return state === 'Z' || state === 'X';
  } catch {
    return true;
  }
}

/** The child `name` of a platform on `dataDir` when pid `pid` is one, with its stop bound; else null. */
function earlierChild(name: string, pid: number, dataDir: string): Earlier | null {
  if (!Number.isInteger(pid) || pid <= 1 || pid === process.pid) return null;
  try {
    const argv = readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0');
    const watch = argv.find((a) => /\/parent-watch\.js\?/.test(a));
    if (!watch) return null;
    const params = new URLSearchParams(watch.slice(watch.indexOf('?') + 1));
    if (params.get('name') !== name) return null;
    const environ = readFileSync(`/proc/${pid}/environ`, 'utf8').split('\0');
    if (!environ.includes(`DATA_DIR=${dataDir}`)) return null;
    if (zombieOrGone(pid)) return null;
    return { name, pid, exitMs: Math.max(1000, Number(params.get('exit_ms')) || 30_000) };
  } catch {
    return null;
  }
}

/** The children of an earlier platform on `dataDir` still running (by its `processes.json`). */
export function earlierChildren(dataDir: string): Earlier[] {
  const file = join(dataDir, 'processes.json');
  if (!existsSync('/proc/self/cmdline') || !existsSync(file)) return [];
  let pids: Record<string, unknown>;
  try {
    pids = JSON.parse(readFileSync(file, 'utf8')) as Record<string, unknown>;
  } catch {
    return [];
  }
  return CHILDREN.flatMap((name) => {
    const found = earlierChild(name, Number(pids[name]), dataDir);
    return found ? [found] : [];
  });
}

/**
 * Waits until the children an earlier platform on `dataDir` left running have ended: each within
 * its own stop bound, after which it is killed (SIGKILL, logged). Call it only while holding the
 * data directory's platform lock (the earlier platform is gone).
 */
export async function awaitEarlierChildren(dataDir: string, log: Logger): Promise<void> {
  const running = earlierChildren(dataDir);
  if (running.length === 0) return;
  log.warn({ processes: running.map((c) => ({ name: c.name, pid: c.pid })) },
    'processes of an earlier platform on this data directory are still stopping; waiting for them to end');
  const started = Date.now();
  await Promise.all(running.map(async (c) => {
    let killed = false;
    while (earlierChild(c.name, c.pid, dataDir)) {
      if (!killed && Date.now() - started > c.exitMs + KILL_AFTER_MS) {
        killed = true;
        log.warn({ child: c.name, child_pid: c.pid, after_ms: Date.now() - started }, 'a process of an earlier platform did not stop in time; killing it (SIGKILL)');
        try {
          process.kill(c.pid, 'SIGKILL');
        } catch {
          // Gone meanwhile.
        }
      }
      // A process SIGKILL did not end (another user's, say) is not waited for longer.
      if (killed && Date.now() - started > c.exitMs + 2 * KILL_AFTER_MS) return;
      await new Promise((r) => setTimeout(r, 100));
    }
  }));
  log.info({ ms: Date.now() - started }, 'the processes of the earlier platform have ended');
}
