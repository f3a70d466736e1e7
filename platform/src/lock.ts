/**
 * One platform per data directory.
 *
 * Two platforms on one DATA_DIR would each stop the other's embedded redis-server as one "left
 * running" (its pid file), restart their own on the same AOF directory, and so on forever, while
 * both write the same bootstrap, process and runner files. The platform therefore takes this
 * lock before it touches anything under DATA_DIR and refuses to start while a live platform holds
 * it. The lock survives `kill -9` as a stale entry, which the next start removes.
 */
import { mkdirSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { processLive, selfIdentity, startToken } from '@agentplane/core';

/** `<pid>-<start>.json`: whose entry it is, readable from the name alone (even while being written). */
const ENTRY = /^(\d+)(?:-([A-Za-z0-9_]+))?\.json$/;

/** Another platform runs (or is starting) on this data directory. */
export class PlatformRunningError extends Error {
  constructor(readonly pid: number, readonly dataDir: string, readonly path: string) {
    super(
      `another platform (pid ${pid}) is running or starting on ${dataDir}; stop it first, or set another DATA_DIR ` +
      `(if no such platform runs, remove ${path})`,
    );
    this.name = 'PlatformRunningError';
  }
}

/**
 * Takes the platform lock of `dataDir` for this process, or throws PlatformRunningError.
 *
 * Each contender first creates its own entry, named after its pid and start time, then looks at
 * the others': a live one means refusal (and the own entry goes), a stale one (its process gone,
 * a zombie, or its pid now another process) is removed. Of two starts racing, the later to create
 * its entry always sees the earlier's, so two never both hold it (at worst both refuse). No entry
 * is ever replaced, so removing a stale one cannot take the lock away from a live process. The
 * entry is removed when this process exits.
 */
export function acquirePlatformLock(dataDir: string): void {
  const dir = join(dataDir, 'platform.lock');
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  const { start } = selfIdentity();
  const name = `${process.pid}${start === null ? '' : `-${startToken(start)}`}.json`;
  const path = join(dir, name);
  try {
    writeFileSync(path, `${JSON.stringify({ pid: process.pid, start, started_at: new Date().toISOString() })}\n`, { mode: 0o600 });
  } catch (err) {
    // A disk that is full (or read-only) leaves no half-written entry behind.
    rmSync(path, { force: true });
    throw err;
  }
  for (const other of readdirSync(dir)) {
    const m = ENTRY.exec(other);
    if (other === name || !m) continue;
    const holder = { pid: Number(m[1]), start: m[2] ?? null };
    if (processLive(holder)) {
      rmSync(path, { force: true });
      throw new PlatformRunningError(holder.pid, dataDir, join(dir, other));
    }
    rmSync(join(dir, other), { force: true });
  }
  process.once('exit', () => rmSync(path, { force: true }));
}
