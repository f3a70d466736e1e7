/**
 * Which process a pid names, told apart from a later process that reused the pid: for the
 * single-holder locks of the runner daemon (its config dir) and the platform (its data dir),
 * whose entries survive a `kill -9` and must be told stale from live.
 */
import { spawnSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';

/** A process as the OS knows it: its pid and, where the OS tells, when it started. */
export interface ProcessIdentity {
  pid: number;
  /** Start time as the OS reports it (tells a reused pid apart); null when it cannot be told. */
  start: string | null;
}

const HAS_PROC = existsSync('/proc/self/stat');

/** Linux: state and start time (clock ticks after boot) from /proc/<pid>/stat; null when gone. */
function procStat(pid: number): { state: string; start: string } | null {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // After "pid (comm) ": field 3 (state) is first, field 22 (starttime) the 20th.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return fields[0] && fields[19] ? { state: fields[0], start: fields[19] } : null;
  } catch {
    return null;
  }
}

/** Elsewhere: `ps -o lstart=` (second precision, enough to tell a reused pid apart). */
function psStart(pid: number): string | null {
  const r = spawnSync('ps', ['-o', 'lstart=', '-p', String(pid)], { encoding: 'utf8' });
  const out = r.status === 0 ? r.stdout.trim().replace(/\s+/g, ' ') : '';
  return out || null;
}

/** When `pid` started, as the OS reports it; null when that cannot be told (or it is gone). */
export function processStart(pid: number): string | null {
  return HAS_PROC ? (procStat(pid)?.start ?? null) : psStart(pid);
}

export function selfIdentity(): ProcessIdentity {
  return { pid: process.pid, start: processStart(process.pid) };
}

/** A start time as it appears in a file name (letters and digits, the rest `_`). */
export const startToken = (start: string): string => start.replace(/[^A-Za-z0-9]+/g, '_');

/**
 * True while that very process runs: the pid exists (owned by any user), is not a zombie and,
 * when its start time was recorded and can be read now, started then (otherwise the pid was
 * reused by another process). Start times compare as `startToken`s.
 */
export function processLive(id: ProcessIdentity): boolean {
  if (!Number.isInteger(id.pid) || id.pid <= 0) return false;
  try {
    process.kill(id.pid, 0);
  } catch (err) {
    // EPERM: it exists, as another user (e.g. a service's account).
    if ((err as NodeJS.ErrnoException).code !== 'EPERM') return false;
  }
  if (HAS_PROC) {
    const stat = procStat(id.pid);
    if (!stat) return false;
    if (stat.state === 'Z' || stat.state === 'X') return false;
    return id.start === null || startToken(stat.start) === startToken(id.start);
  }
  if (id.start === null) return true;
  const now = psStart(id.pid);
  return now === null || startToken(now) === startToken(id.start);
}
