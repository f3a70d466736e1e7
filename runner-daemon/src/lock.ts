/**
 * One daemon per config dir, and one drain signal per daemon.
 *
 * Two daemons on one config dir would keep superseding each other's gateway connection, and each
 * start stops the sandboxes an earlier life of the runner left, so a second start could kill a
 * live daemon's sandboxes. `start` therefore takes the daemon lock first and refuses while a live
 * daemon holds it. The lock survives `kill -9` as a stale entry, which the next start removes.
 *
 * A second SIGTERM makes a draining daemon cancel its held work, so `drain` records its request
 * atomically and a later `drain` (or one racing it) does not signal again.
 */
import { mkdirSync, readdirSync, readFileSync, rmSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { processLive, processStart, selfIdentity, startToken as token, type ProcessIdentity } from '@agentplane/core';

export { processLive, processStart, selfIdentity, type ProcessIdentity };

/** The daemon lock of a config dir: a directory with one entry per process that holds or tries for it. */
export const lockDir = (configDir: string): string => join(configDir, 'daemon.lock');

/** `<pid>-<start>.json`: whose entry it is, readable from the name alone (even while being written). */
const entryName = (id: ProcessIdentity): string => `${id.pid}${id.start === null ? '' : `-${token(id.start)}`}.json`;
const ENTRY = /^(\d+)(?:-([A-Za-z0-9_]+))?\.json$/;

/** A holder (or contender) of the daemon lock, from its entry. */
export interface LockHolder extends ProcessIdentity {
  path: string;
  started_at: string | null;
}

function readEntry(path: string, m: RegExpExecArray): LockHolder {
  let startedAt: string | null = null;
  try {
    const body = JSON.parse(readFileSync(path, 'utf8')) as { started_at?: unknown };
    if (typeof body.started_at === 'string') startedAt = body.started_at;
  } catch {
    // Being written, gone or damaged: the name says whose it is.
  }
  return { path, pid: Number(m[1]), start: m[2] ?? null, started_at: startedAt };
}

/** Another daemon runs (or is starting) on this config dir. */
export class DaemonRunningError extends Error {
  constructor(readonly holder: LockHolder, readonly configDir: string) {
    super(
      `another runner daemon (pid ${holder.pid}) is running or starting on ${configDir}; stop it first ` +
      `(agentplane-runner drain --config-dir ${configDir}), or use another --config-dir ` +
      `(if no such daemon runs, remove ${holder.path})`,
    );
    this.name = 'DaemonRunningError';
  }
}

export interface DaemonLock {
  /** This process's entry. */
  path: string;
  /** Gives the lock up (also done on process exit). */
  release(): void;
}

/**
 * Takes the daemon lock of `configDir` for `self` (this process), or throws DaemonRunningError.
 *
 * Each contender first creates its own entry, named after its pid and start time, then looks at
 * the others': a live one means refusal (and the own entry goes), a stale one (its process gone,
 * a zombie, or its pid now another process) is removed. Of two starts racing, the later to create
 * its entry always sees the earlier's, so two never both hold it (at worst both refuse). No entry
 * is ever replaced, so removing a stale one cannot take a lock away from a live process.
 */
export function acquireDaemonLock(configDir: string, self: ProcessIdentity = selfIdentity()): DaemonLock {
  const dir = lockDir(configDir);
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const name = entryName(self);
  const path = join(dir, name);
  // Unique to this process: an entry of that name can only be a dead process's with the same
  // pid (no start time known), or this process's own.
  writeFileSync(path, `${JSON.stringify({ pid: self.pid, start: self.start, started_at: new Date().toISOString() })}\n`, { mode: 0o600 });
  for (const other of readdirSync(dir)) {
    const m = ENTRY.exec(other);
    if (other === name || !m) continue;
    const holder = readEntry(join(dir, other), m);
    if (processLive(holder)) {
      rmSync(path, { force: true });
      throw new DaemonRunningError(holder, configDir);
    }
    rmSync(holder.path, { force: true });
  }
  let held = true;
  const release = (): void => {
    if (!held) return;
    held = false;
    process.off('exit', release);
    rmSync(path, { force: true });
  };
  process.on('exit', release);
  return { path, release };
}

const DRAIN_REQUEST = /^drain-requested\.\d+$/;
export const drainRequestPath = (configDir: string, pid: number): string => join(configDir, `drain-requested.${pid}`);

/**
 * Records that a drain was asked of daemon `pid`: true for the one caller that records it first
 * (and then signals), false when an earlier `drain` already did (exclusive create: of two
 * concurrent `drain` commands exactly one wins).
 */
export function claimDrainRequest(configDir: string, pid: number): boolean {
  try {
    writeFileSync(drainRequestPath(configDir, pid), `${JSON.stringify({ pid, requested_at: new Date().toISOString(), by: process.pid })}\n`, { flag: 'wx', mode: 0o600 });
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw err;
  }
}

/** When the drain of daemon `pid` was asked by a `drain` command; null when it was not. */
export function drainRequestedAt(configDir: string, pid: number): string | null {
  try {
    const body = JSON.parse(readFileSync(drainRequestPath(configDir, pid), 'utf8')) as { requested_at?: unknown };
    return typeof body.requested_at === 'string' ? body.requested_at : 'unknown';
  } catch (err) {
    return (err as NodeJS.ErrnoException).code === 'ENOENT' ? null : 'unknown';
  }
}

/** A starting daemon (holding the lock) drops the drain requests of earlier lives. */
export function clearDrainRequests(configDir: string): void {
  let names: string[];
  try {
    names = readdirSync(configDir);
  } catch {
    return;
  }
  for (const n of names) {
    if (!DRAIN_REQUEST.test(n)) continue;
    try {
      unlinkSync(join(configDir, n));
    } catch {
      // Already gone.
    }
  }
}
