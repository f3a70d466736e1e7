import { spawnSync, type ChildProcess } from 'node:child_process';
import { closeSync, mkdtempSync, openSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ROOT_DIR, waitFor, type Platform } from './platform.js';
import { spawnOwned } from './spawn.js';

export const RUNNER_CLI = join(ROOT_DIR, 'runner-daemon/dist/cli.js');

/**
 * How long a test waits for a started daemon to be ready. Before it connects, a daemon checks its
 * sandbox image, reaps sandboxes of an earlier life and runs a canary sandbox under every
 * isolation tier it would claim: about ten seconds on an idle 2-core machine, several times that
 * while other suites load Docker. A daemon that never connects still fails the wait.
 */
export const DAEMON_READY_MS = 90_000;
/** A test timeout with room for a daemon start (`DAEMON_READY_MS`) and the test's own work. */
export const WITH_DAEMON_MS = DAEMON_READY_MS + 90_000;

/** Pair a fresh runner config dir with a single-use code for `principal`, as a person would. */
export async function pairDaemon(p: Platform, principal: string, label: string): Promise<{ dir: string; runnerId: string }> {
  const r = await p.root.request<{ code: string }>('POST', '/v1/runner-pairings', {
    idempotencyKey: `pair-${label}-${Math.random()}`, body: { principal_id: principal, machine_label: label, expires_in_seconds: 300 },
  });
  if (r.status !== 201) throw new Error(`pairing failed: ${r.status} ${JSON.stringify(r.body)}`);
  const dir = mkdtempSync(join(tmpdir(), 'runner-test-'));
  const out = spawnSync(process.execPath, [RUNNER_CLI, 'pair', '--code', r.body.code, '--url', p.baseUrl, '--config-dir', dir, '--label', label, '--json'], { encoding: 'utf8' });
  if (out.status !== 0) throw new Error(`runner pair failed: ${out.stdout}${out.stderr}`);
  return { dir, runnerId: (JSON.parse(out.stdout) as { runner_id: string }).runner_id };
}

/**
 * `runner-daemon start` on a paired dir, reconnecting fast (tests restart things). `logFile`: its
 * log (info and up) is appended there, for a test that keeps its processes' logs; else warnings
 * and errors only, and only those on stderr show.
 */
export function startDaemon(configDir: string, extraArgs: string[] = [], logFile?: string): ChildProcess {
  const out = logFile === undefined ? 'ignore' : openSync(logFile, 'a');
  const child = spawnOwned(process.execPath, [RUNNER_CLI, 'start', '--config-dir', configDir, '--reconnect-base-ms', '200', '--reconnect-cap-ms', '1000', '--log-level', logFile === undefined ? 'warn' : 'info', ...extraArgs], {
    stdio: ['ignore', out, logFile === undefined ? 'inherit' : out],
  });
  if (typeof out === 'number') closeSync(out);
  return child;
}

/** A person Principal in the platform's bootstrap Workspace (a runner's owner); returns its id. */
export async function createPerson(p: Platform, externalSubjectId: string, displayName: string): Promise<string> {
  return (await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: externalSubjectId, principal_type: 'person', display_name: displayName,
  })).id;
}

/**
 * Pairs a runner for `owner`, starts it (its process goes to `daemons`, for the file's teardown)
 * and waits until its presence is ready; returns the presence as the API shows it.
 */
export async function startReadyDaemon<P extends { runner: string; status: string }>(
  p: Platform, owner: string, label: string, daemons: ChildProcess[], args: string[], timeoutMs: number,
): Promise<{ runnerId: string; presence: P }> {
  const { dir, runnerId } = await pairDaemon(p, owner, label);
  daemons.push(startDaemon(dir, args));
  const presence = await waitFor(`${label} ready`, async () => {
    const x = (await p.root.get<{ data: P[] }>('/v1/runner-pools/presences')).data.find((r) => r.runner === runnerId);
    return x?.status === 'ready' ? x : undefined;
  }, timeoutMs);
  return { runnerId, presence };
}
