/**
 * Session resources materialised into the workspace before the first Run (mount kind
 * `uploaded_project`). The caller resolves resources to bytes (File contents, repository
 * snapshots); this module places them inside the sandbox as the sandbox user, once per Session.
 */
import { createHash } from 'node:crypto';
import { normaliseRelative } from './docker-driver.js';
import { SandboxError, type Sandbox, type SandboxDriver } from './types.js';

export type ResolvedResource =
  | {
      type: 'file';
      id: string;
      /** Workspace-relative destination, e.g. `data/input.csv`. */
      mount_path: string;
      content: Buffer;
      mode?: number;
    }
  | {
      type: 'repository';
      id: string;
      /** Workspace-relative directory; `.` for the workspace root. */
      mount_path: string;
      snapshot: { kind: 'tar'; data: Buffer } | { kind: 'files'; files: Array<{ path: string; content: Buffer; mode?: number }> };
    };

export interface MaterializeResult {
  skipped: boolean;
  files: number;
  bytes: number;
}

/** Marker of what was materialised; its presence makes the call a no-op for the same resources. */
export const MATERIALIZED_MARKER = '.agentplane/materialized';

function digest(resources: readonly ResolvedResource[]): string {
  const h = createHash('sha256');
  for (const r of resources) {
    h.update(`${r.type}\0${r.id}\0${r.mount_path}\0`);
    if (r.type === 'file') h.update(r.content);
    else if (r.snapshot.kind === 'tar') h.update(r.snapshot.data);
    else for (const f of r.snapshot.files) h.update(`${f.path}\0`).update(f.content);
  }
  return h.digest('hex');
}

export async function materializeResources(
  driver: SandboxDriver,
  sandbox: Sandbox,
  resources: readonly ResolvedResource[],
  options: { signal?: AbortSignal; timeoutMs?: number } = {},
): Promise<MaterializeResult> {
  const want = digest(resources);
  const marker = await driver.exec(sandbox, ['cat', MATERIALIZED_MARKER], { timeoutMs: 10_000, signal: options.signal });
  if (marker.exitCode === 0 && marker.stdout.trim() === want) return { skipped: true, files: 0, bytes: 0 };

  let files = 0;
  let bytes = 0;
  const loose: Array<{ path: string; data: Buffer; mode?: number }> = [];
  for (const resource of resources) {
    if (resource.type === 'file') {
      loose.push({ path: normaliseRelative(resource.mount_path), data: resource.content, mode: resource.mode });
      files += 1;
      bytes += resource.content.length;
      continue;
    }
    const base = resource.mount_path === '.' || resource.mount_path === '' ? '' : normaliseRelative(resource.mount_path);
    if (resource.snapshot.kind === 'files') {
      for (const f of resource.snapshot.files) {
        loose.push({ path: base ? `${base}/${normaliseRelative(f.path)}` : normaliseRelative(f.path), data: f.content, mode: f.mode });
        files += 1;
        bytes += f.content.length;
      }
      continue;
    }
    // Extracted by the sandbox user inside the sandbox: ownership and `..` members stay contained.
    const res = await driver.exec(
      sandbox,
      ['bash', '-c', 'mkdir -p -- "$1" && tar -x --no-same-owner --no-same-permissions -f - -C "$1" && find "$1" -type f | wc -l', 'extract', base || '.'],
      { stdin: resource.snapshot.data, timeoutMs: options.timeoutMs ?? 120_000, signal: options.signal },
    );
    if (res.exitCode !== 0) {
      throw new SandboxError('exec_failed', `extracting repository ${resource.id} failed: ${res.stderr.trim()}`);
    }
    files += Number(res.stdout.trim()) || 0;
    bytes += resource.snapshot.data.length;
  }
  if (loose.length > 0) await driver.writeFiles(sandbox, loose);
  await driver.writeFiles(sandbox, [{ path: MATERIALIZED_MARKER, data: Buffer.from(`${want}\n`) }]);
  return { skipped: false, files, bytes };
}
