/**
 * Session resources materialised into the workspace before the first Run (mount kind
 * `uploaded_project`). A resource is a source that can load its bytes (a File's content, a
 * repository snapshot) and names their identity (a content digest, a url at a ref); this module
 * places them inside the sandbox as the sandbox user. A marker in the workspace records the
 * identity of each resource placed, so a later Run loads nothing for resources already there,
 * and a resource added to a live Session is placed before the next Run. One exec reads the
 * marker, one per repository tree extracts it, one copy writes every loose file and the marker.
 */
import { createHash } from 'node:crypto';
import { normaliseRelative } from './docker-driver.js';
import { SandboxError, type Sandbox, type SandboxDriver } from './types.js';

export type ResourceContent =
  /** One file at the mount path. */
  | { kind: 'bytes'; data: Buffer; mode?: number }
  /** A tree extracted under the mount path. */
  | { kind: 'tar'; data: Buffer }
  | { kind: 'files'; files: Array<{ path: string; content: Buffer; mode?: number }>; readOnly?: boolean };

export interface ResourceSource {
  /** The Session resource id. */
  id: string;
  type: 'file' | 'repository' | 'uploaded_project' | 'skill';
  /** Where it goes in the workspace: relative, or absolute with `/` as the workspace root. */
  mount_path: string;
  /** What the content is (a digest, a url at a ref): a resource is placed again only when this changes. */
  identity: string;
  load(signal?: AbortSignal): Promise<ResourceContent>;
}

/** Resources whose bytes are already in hand (tests, small inline content). */
export type ResolvedResource =
  | { type: 'file'; id: string; mount_path: string; content: Buffer; mode?: number }
  | {
      type: 'repository';
      id: string;
      mount_path: string;
      snapshot: { kind: 'tar'; data: Buffer } | { kind: 'files'; files: Array<{ path: string; content: Buffer; mode?: number }> };
    };

export interface MaterializeResult {
  /** Nothing had to be placed. */
  skipped: boolean;
  /** Resource ids placed by this call. */
  placed: string[];
  files: number;
  bytes: number;
}

/** Marker of what was materialised: a JSON map of resource id → identity. */
export const MATERIALIZED_MARKER = '.agentplane/materialized.json';

function sha(parts: Array<string | Buffer>): string {
  const h = createHash('sha256');
  for (const p of parts) h.update(p).update('\0');
  return `sha256:${h.digest('hex')}`;
}

/** A source over bytes already in memory; its identity is their digest. */
export function resolvedSource(r: ResolvedResource): ResourceSource {
  if (r.type === 'file') {
    return { id: r.id, type: 'file', mount_path: r.mount_path, identity: sha([r.content]), load: async () => ({ kind: 'bytes', data: r.content, ...(r.mode !== undefined ? { mode: r.mode } : {}) }) };
  }
  const snap = r.snapshot;
  const identity = snap.kind === 'tar' ? sha([snap.data]) : sha(snap.files.flatMap((f) => [f.path, f.content]));
  return { id: r.id, type: 'repository', mount_path: r.mount_path, identity, load: async () => snap };
}

/**
 * A workspace-relative path for a mount path. `/` is the workspace root, so `/data/in.csv`
 * and `data/in.csv` are the same place; a path already under the sandbox's workspace
 * (`/workspace/data/in.csv`) is taken as meant. `..` never escapes.
 */
export function workspacePath(sandbox: Pick<Sandbox, 'workspace'>, mountPath: string): string {
  const root = sandbox.workspace.replace(/\/+$/, '');
  const rel = mountPath === root || mountPath.startsWith(`${root}/`) ? mountPath.slice(root.length) : mountPath;
  if (rel.replace(/[/.]/g, '') === '') return '';
  return normaliseRelative(rel);
}

async function readMarker(driver: SandboxDriver, sandbox: Sandbox, signal?: AbortSignal): Promise<Record<string, string>> {
  const res = await driver.exec(sandbox, ['cat', MATERIALIZED_MARKER], { timeoutMs: 10_000, ...(signal ? { signal } : {}) });
  if (res.exitCode !== 0) return {};
  try {
    const parsed = JSON.parse(res.stdout) as unknown;
    return parsed && typeof parsed === 'object' && !Array.isArray(parsed) ? (parsed as Record<string, string>) : {};
  } catch {
    return {};
  }
}

export async function materializeResources(
  driver: SandboxDriver,
  sandbox: Sandbox,
  resources: ReadonlyArray<ResourceSource | ResolvedResource>,
  options: { signal?: AbortSignal; timeoutMs?: number } = {},
): Promise<MaterializeResult> {
  const sources = resources.map((r) => ('load' in r ? r : resolvedSource(r)));
  const marker = await readMarker(driver, sandbox, options.signal);
  const todo = sources.filter((s) => marker[s.id] !== s.identity);
  if (todo.length === 0) return { skipped: true, placed: [], files: 0, bytes: 0 };

  let files = 0;
  let bytes = 0;
  // Trees are extracted one exec each; loose files and the marker then go in one copy.
  const loose: Array<{ path: string; data: Buffer; mode?: number; readOnly?: boolean }> = [];
  for (const source of todo) {
    const base = workspacePath(sandbox, source.mount_path);
    const content = await source.load(options.signal);
    if (content.kind === 'bytes') {
      if (!base) throw new SandboxError('invalid_path', `resource ${source.id}: a file needs a path, not the workspace root`);
      loose.push({ path: base, data: content.data, ...(content.mode !== undefined ? { mode: content.mode } : {}) });
      files += 1;
      bytes += content.data.length;
    } else if (content.kind === 'files') {
      for (const f of content.files) {
        loose.push({
          path: base ? `${base}/${normaliseRelative(f.path)}` : normaliseRelative(f.path), data: f.content,
          ...(f.mode !== undefined ? { mode: f.mode } : {}), ...(content.readOnly ? { readOnly: true } : {}),
        });
        files += 1;
        bytes += f.content.length;
      }
    } else {
      // Extracted by the sandbox user inside the sandbox: ownership and `..` members stay contained.
      const res = await driver.exec(
        sandbox,
        ['bash', '-c', 'mkdir -p -- "$1" && tar -x --no-same-owner --no-same-permissions -f - -C "$1" && find "$1" -type f -not -path "*/.git/*" | wc -l', 'extract', base || '.'],
        { stdin: content.data, timeoutMs: options.timeoutMs ?? 120_000, ...(options.signal ? { signal: options.signal } : {}) },
      );
      if (res.exitCode !== 0) throw new SandboxError('exec_failed', `extracting resource ${source.id} failed: ${res.stderr.trim()}`);
      files += Number(res.stdout.trim()) || 0;
      bytes += content.data.length;
    }
    marker[source.id] = source.identity;
  }
  // The marker is written with the files, after every tree is in place: a failure before this
  // point places everything again on the next Run (placing is idempotent).
  loose.push({ path: MATERIALIZED_MARKER, data: Buffer.from(`${JSON.stringify(marker)}\n`) });
  await driver.writeFiles(sandbox, loose);
  return { skipped: false, placed: todo.map((s) => s.id), files, bytes };
}
