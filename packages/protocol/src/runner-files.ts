/**
 * The runner's config directory, a contract between the runner and what pairs it, supervises it
 * or cleans up after it: `runner.json`, the credential (written by `pair`/`enroll` and by the
 * platform for its local runner; read by the runner, and by another runner's reaper judging
 * whether the sandboxes labelled with this directory still have a runner), and `state.json`, what
 * a running daemon publishes about itself (read by `status` and `drain`).
 */
import { chmodSync, closeSync, existsSync, fsyncSync, mkdirSync, openSync, readFileSync, renameSync, rmSync, statSync, writeFileSync, writeSync } from 'node:fs';
import { join } from 'node:path';
import { ConfigError } from '@agentplane/core';

/** What `pair` stores: enough to connect. Mode 0600 in a 0700 directory. */
export interface RunnerCredentialFile {
  base_url: string;
  secret: string;
  runner_id: string;
  runner_credential_id: string;
  runner_pool_id: string;
  workspace_id: string;
  machine_label: string;
  paired_at: string;
}

/** What a running daemon publishes about itself (read by `status` and `drain`). */
export interface RunnerStateFile {
  pid: number;
  status: 'starting' | 'ready' | 'draining' | 'disconnected' | 'stopped';
  connected: boolean;
  generation: number | null;
  base_url: string;
  runner_id: string;
  last_heartbeat_ack_at: string | null;
  reconnect_attempt: number;
  /**
   * Who asked this daemon to drain: `local` (a signal: `drain`, systemctl stop, Ctrl-C; it then
   * leaves, and one more signal cancels its held work), `control_plane` (the API), or null.
   */
  drain?: 'local' | 'control_plane' | null;
  /** Set when the daemon stopped because the control plane refused its credential for good. */
  credential_refused?: CredentialRefusal | null;
  updated_at: string;
}

/**
 * The control plane refused this runner's credential at the upgrade (HTTP 401: revoked, deleted;
 * 403: its owner Principal or Workspace disabled) twice in a row: the daemon stopped.
 */
export interface CredentialRefusal {
  http_status: 401 | 403;
  /** The control plane's error type and message (its answer's body), when it gave them. */
  error_type: string | null;
  error_message: string | null;
  at: string;
}

export const credentialPath = (dir: string): string => join(dir, 'runner.json');
export const statePath = (dir: string): string => join(dir, 'state.json');

/**
 * Written whole: a temp file (0600) renamed over the target. A write that fails (disk full,
 * read-only) leaves no temp file behind and the target as it was.
 */
function writePrivate(path: string, text: string): void {
  const tmp = `${path}.${process.pid}.tmp`;
  try {
    writeFileSync(tmp, text, { mode: 0o600 });
    chmodSync(tmp, 0o600);
    renameSync(tmp, path);
  } catch (err) {
    rmSync(tmp, { force: true });
    throw err;
  }
}

/** The config dir, made (or narrowed to) 0700: the credential in it is the runner's secret. */
function privateDir(dir: string): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  chmodSync(dir, 0o700);
}

/**
 * Before a credential is asked for: the config dir exists, is 0700, and a file the size of a
 * credential can be written, synced and removed in it. A pairing code is single-use, so a disk
 * that is full or read-only must be found before the code is redeemed, not after. Throws the
 * filesystem's error (ENOSPC, EROFS, EACCES, ENOTDIR, …).
 */
export function checkWritableConfigDir(dir: string): void {
  privateDir(dir);
  const probe = join(dir, `.write-probe.${process.pid}`);
  try {
    const fd = openSync(probe, 'w', 0o600);
    try {
      writeSync(fd, Buffer.alloc(4096, 0x20));
      fsyncSync(fd);
    } finally {
      closeSync(fd);
    }
  } finally {
    rmSync(probe, { force: true });
  }
}

export function saveCredential(dir: string, cred: RunnerCredentialFile): string {
  privateDir(dir);
  const path = credentialPath(dir);
  writePrivate(path, `${JSON.stringify(cred, null, 2)}\n`);
  return path;
}

const CREDENTIAL_FIELDS = ['base_url', 'secret', 'runner_id', 'runner_credential_id', 'runner_pool_id', 'workspace_id'] as const;

/** The stored credential; null when the dir holds none. A damaged file is a ConfigError naming it. */
export function loadCredential(dir: string): RunnerCredentialFile | null {
  // A config dir that is a file is a mistake to name, not a runner that is not paired yet.
  if (existsSync(dir) && !statSync(dir).isDirectory()) throw new ConfigError(`the runner config dir ${dir} is not a directory (--config-dir / AGENTPLANE_RUNNER_HOME)`);
  const path = credentialPath(dir);
  if (!existsSync(path)) return null;
  const fix = 'restore it, or pair again into this config dir with --force (the credential it held stays active until revoked)';
  let body: unknown;
  try {
    body = JSON.parse(readFileSync(path, 'utf8'));
  } catch (err) {
    if (err instanceof SyntaxError) throw new ConfigError(`the runner credential file ${path} is not valid JSON (${err.message}): ${fix}`);
    throw err;
  }
  const missing = body && typeof body === 'object' ? CREDENTIAL_FIELDS.filter((f) => typeof (body as Record<string, unknown>)[f] !== 'string') : ['(not an object)'];
  if (missing.length > 0) throw new ConfigError(`the runner credential file ${path} is damaged (missing ${missing.join(', ')}): ${fix}`);
  return body as RunnerCredentialFile;
}

export function saveState(dir: string, state: RunnerStateFile): void {
  mkdirSync(dir, { recursive: true, mode: 0o700 });
  writePrivate(statePath(dir), `${JSON.stringify(state)}\n`);
}

export function loadState(dir: string): RunnerStateFile | null {
  const path = statePath(dir);
  if (!existsSync(path)) return null;
  try {
    return JSON.parse(readFileSync(path, 'utf8')) as RunnerStateFile;
  } catch {
    return null;
  }
}
