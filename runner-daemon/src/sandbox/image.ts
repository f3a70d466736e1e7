/**
 * The default sandbox image, built offline: a rootfs assembled from this machine's own binaries
 * (each with the shared libraries `ldd` resolves for it) plus a non-root user, imported as a
 * single-layer image FROM scratch. No registry is contacted. The tag carries a hash of the
 * rootfs content, so a build is skipped when the image for the current content already exists.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, realpathSync, statSync } from 'node:fs';
import { Readable } from 'node:stream';
import { promisify } from 'node:util';
import Docker from 'dockerode';
import { createTar, type TarEntry } from './tar.js';

const execFileAsync = promisify(execFile);

export interface SandboxImageManifest {
  repository: string;
  user: { name: string; uid: number; gid: number; home: string };
  workspace: string;
  commands: string[];
  links: Record<string, string>;
  env: Record<string, string>;
}

export interface EnsureSandboxImageOptions {
  docker?: Docker;
  /** Defaults to `docker/sandbox/manifest.json` of this repository. */
  manifestPath?: string;
  /** Progress lines (human readable). */
  onProgress?: (line: string) => void;
  /** Rebuild even when the tag for the current content exists. */
  force?: boolean;
}

export interface SandboxImage {
  /** `<repository>:<content hash>` */
  tag: string;
  /** `<repository>:latest` */
  latest: string;
  contentHash: string;
  built: boolean;
  files: number;
  bytes: number;
  durationMs: number;
}

export class SandboxImageError extends Error {
  constructor(
    readonly reason: 'manifest_invalid' | 'command_missing' | 'docker_unavailable' | 'import_failed' | 'unsupported_host',
    message: string,
  ) {
    super(message);
    this.name = 'SandboxImageError';
  }
}

export const DEFAULT_MANIFEST_PATH = new URL('../../../docker/sandbox/manifest.json', import.meta.url);

/** The image settings of a sandbox rootfs: its environment, the non-root user, the workspace, an idle command. */
export function imageChanges(manifest: SandboxImageManifest, env: Record<string, string>): string[] {
  return [
    ...Object.entries(env).map(([k, v]) => `ENV ${k}=${v}`),
    `USER ${manifest.user.uid}:${manifest.user.gid}`,
    `WORKDIR ${manifest.workspace}`,
    'CMD ["/usr/bin/sleep","infinity"]',
  ];
}

/**
 * Imports a rootfs tar as `repository:tag` (POST /images/create?fromSrc=-, what `docker import`
 * does: no registry is contacted), then tags it `latest`.
 */
export async function importRootfs(docker: Docker, archive: Buffer, repository: string, tag: string, changes: string[]): Promise<void> {
  try {
    const stream = (await docker.importImage(Readable.from([archive]) as unknown as string, { repo: repository, tag, changes })) as NodeJS.ReadableStream;
    await new Promise<void>((resolve, reject) => {
      docker.modem.followProgress(stream, (err: Error | null, out: Array<{ error?: string }>) => {
        const reported = out.find((o) => o.error)?.error;
        const failure = err ?? (reported ? new Error(reported) : null);
        if (failure) reject(failure);
        else resolve();
      });
    });
  } catch (err) {
    throw new SandboxImageError('import_failed', `importing ${repository}:${tag} failed: ${(err as Error).message}`);
  }
  await docker.getImage(`${repository}:${tag}`).tag({ repo: repository, tag: 'latest' });
}

export function loadManifest(path: string | URL = DEFAULT_MANIFEST_PATH): SandboxImageManifest {
  const parsed: unknown = JSON.parse(readFileSync(path, 'utf8'));
  const m = parsed as Partial<SandboxImageManifest>;
  if (!m || typeof m.repository !== 'string' || !Array.isArray(m.commands) || !m.user || typeof m.user.uid !== 'number') {
    throw new SandboxImageError('manifest_invalid', 'sandbox image manifest is missing repository, user or commands');
  }
  return {
    repository: m.repository,
    user: m.user,
    workspace: m.workspace ?? '/workspace',
    commands: [...new Set(m.commands)],
    links: m.links ?? {},
    env: m.env ?? {},
  };
}

const SEARCH_DIRS = ['/usr/local/bin', '/usr/bin', '/bin', '/usr/sbin', '/sbin'];

function locate(command: string): string | undefined {
  for (const dir of SEARCH_DIRS) {
    const candidate = `${dir}/${command}`;
    if (existsSync(candidate)) return candidate;
  }
  return undefined;
}

/** Maps a host library path onto the merged-/usr layout of the image (`/lib` → `/usr/lib`). */
function imagePath(hostPath: string): string {
  if (hostPath.startsWith('/lib/')) return `/usr${hostPath}`;
  if (hostPath.startsWith('/lib64/')) return `/usr${hostPath}`;
  return hostPath;
}

async function sharedLibraries(binaries: string[]): Promise<string[]> {
  const libs = new Set<string>();
  // ldd exits non-zero when one argument is static; the output is still complete.
  const output = await execFileAsync('ldd', binaries, { maxBuffer: 16 * 1024 * 1024 }).then(
    (r) => r.stdout,
    (e: { stdout?: string }) => e.stdout ?? '',
  );
  for (const line of output.split('\n')) {
    const match = /(?:=>\s*)?(\/[^\s]+)\s+\(0x/.exec(line);
    if (match?.[1]) libs.add(match[1]);
  }
  return [...libs].sort();
}

export interface AssembledRootfs {
  entries: TarEntry[];
  contentHash: string;
  files: number;
  bytes: number;
}

/** Collects binaries, their libraries, users and directories into tar entries, and hashes them. */
export async function assembleRootfs(manifest: SandboxImageManifest): Promise<AssembledRootfs> {
  if (process.platform !== 'linux') {
    // The rootfs is made of this host's binaries: only a Linux host has Linux binaries to give.
    throw new SandboxImageError('unsupported_host', `the sandbox image is assembled from host binaries and needs a Linux host (this is ${process.platform})`);
  }
  const { uid, gid, name, home } = manifest.user;
  const binaries: Array<{ command: string; host: string }> = [];
  const missing: string[] = [];
  for (const command of manifest.commands) {
    const host = locate(command);
    if (host) binaries.push({ command, host });
    else missing.push(command);
  }
  for (const required of ['bash', 'sleep', 'cat', 'setsid']) {
    if (!binaries.some((b) => b.command === required)) {
      throw new SandboxImageError('command_missing', `the sandbox image needs '${required}' on this host`);
    }
  }
  const libs = await sharedLibraries(binaries.map((b) => b.host));

  const entries: TarEntry[] = [];
  const dirs = new Set<string>();
  const addDir = (path: string, mode = 0o755, owner = 0): void => {
    if (dirs.has(path)) return;
    dirs.add(path);
    entries.push({ type: 'dir', path, mode, uid: owner, gid: owner });
  };
  const addParents = (path: string): void => {
    const parts = path.split('/').filter(Boolean);
    for (let i = 1; i < parts.length; i++) addDir('/' + parts.slice(0, i).join('/'));
  };
  for (const d of ['/usr', '/usr/bin', '/usr/lib', '/usr/lib64', '/usr/local', '/usr/local/bin', '/etc', '/dev', '/proc', '/sys', '/run', '/var', '/home']) addDir(d);
  addDir('/tmp', 0o1777);
  addDir('/var/tmp', 0o1777);
  addDir(home, 0o750, uid);
  addDir(manifest.workspace, 0o755, uid);
  entries.push({ type: 'symlink', path: '/bin', target: 'usr/bin' });
  entries.push({ type: 'symlink', path: '/lib', target: 'usr/lib' });
  entries.push({ type: 'symlink', path: '/lib64', target: 'usr/lib64' });
  entries.push({ type: 'symlink', path: '/sbin', target: 'usr/bin' });

  let bytes = 0;
  for (const { command, host } of binaries) {
    const data = readFileSync(realpathSync(host));
    bytes += data.length;
    entries.push({ type: 'file', path: `/usr/bin/${command}`, data, mode: 0o755 });
  }
  const placed = new Set<string>();
  for (const lib of libs) {
    const target = imagePath(lib);
    if (placed.has(target)) continue;
    placed.add(target);
    addParents(target);
    const data = readFileSync(realpathSync(lib));
    bytes += data.length;
    entries.push({ type: 'file', path: target, data, mode: statSync(realpathSync(lib)).mode & 0o777 });
  }
  for (const [link, target] of Object.entries(manifest.links)) {
    if (binaries.some((b) => b.command === target) && !binaries.some((b) => b.command === link)) {
      entries.push({ type: 'symlink', path: `/usr/bin/${link}`, target });
    }
  }
  const text = (path: string, content: string, mode = 0o644): void => {
    const data = Buffer.from(content, 'utf8');
    entries.push({ type: 'file', path, data, mode });
  };
  text('/etc/passwd', `root:x:0:0:root:/root:/usr/bin/bash\n${name}:x:${uid}:${gid}:${name}:${home}:/usr/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/bin/false\n`);
  text('/etc/group', `root:x:0:\n${name}:x:${gid}:\nnogroup:x:65534:\n`);
  text('/etc/nsswitch.conf', 'passwd: files\ngroup: files\nhosts: files\n');
  text('/etc/profile', Object.entries(manifest.env).map(([k, v]) => `export ${k}=${JSON.stringify(v)}\n`).join(''));

  const hash = createHash('sha256');
  const sorted = [...entries].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  for (const e of sorted) {
    hash.update(`${e.type}\0${e.path}\0`);
    if (e.type === 'file') hash.update(`${e.mode ?? 0}\0${e.uid ?? 0}\0`).update(e.data);
    else if (e.type === 'dir') hash.update(`${e.mode ?? 0}\0${e.uid ?? 0}\0`);
    else hash.update(e.target);
  }
  hash.update(JSON.stringify({ env: manifest.env, user: manifest.user, workspace: manifest.workspace }));
  void missing;
  return { entries, contentHash: hash.digest('hex').slice(0, 16), files: entries.length, bytes };
}

export async function imageExists(docker: Docker, tag: string): Promise<boolean> {
  try {
    await docker.getImage(tag).inspect();
    return true;
  } catch (err) {
    if ((err as { statusCode?: number }).statusCode === 404) return false;
    throw new SandboxImageError('docker_unavailable', `cannot inspect ${tag}: ${(err as Error).message}`);
  }
}

/**
 * Builds the default sandbox image when the image for the current rootfs content is missing
 * (or `force`), and points `<repository>:latest` at it. Safe to call on every start.
 */
export async function ensureSandboxImage(options: EnsureSandboxImageOptions = {}): Promise<SandboxImage> {
  const started = Date.now();
  const progress = options.onProgress ?? (() => {});
  const docker = options.docker ?? new Docker();
  const manifest = loadManifest(options.manifestPath ?? DEFAULT_MANIFEST_PATH);
  progress(`sandbox image: collecting ${manifest.commands.length} commands and their libraries`);
  const rootfs = await assembleRootfs(manifest);
  const tag = `${manifest.repository}:${rootfs.contentHash}`;
  const latest = `${manifest.repository}:latest`;
  progress(`sandbox image: rootfs ${rootfs.files} entries, ${(rootfs.bytes / 1048576).toFixed(1)} MiB, content ${rootfs.contentHash}`);
  const result = (built: boolean): SandboxImage => ({
    tag, latest, contentHash: rootfs.contentHash, built, files: rootfs.files, bytes: rootfs.bytes, durationMs: Date.now() - started,
  });
  if (!options.force && (await imageExists(docker, tag))) {
    await docker.getImage(tag).tag({ repo: manifest.repository, tag: 'latest' });
    progress(`sandbox image: ${tag} is up to date`);
    return result(false);
  }
  const archive = createTar(rootfs.entries);
  progress(`sandbox image: importing ${(archive.length / 1048576).toFixed(1)} MiB as ${tag}`);
  await importRootfs(docker, archive, manifest.repository, rootfs.contentHash, imageChanges(manifest, manifest.env));
  const res = result(true);
  progress(`sandbox image: built ${tag} (and ${latest}) in ${res.durationMs} ms`);
  return res;
}

/**
 * For the platform start command: builds the default image when dockerd answers and the image for
 * the current content is missing; returns undefined (and does nothing) when Docker is absent.
 */
export async function ensureSandboxImageIfDocker(options: EnsureSandboxImageOptions & { pingTimeoutMs?: number } = {}): Promise<SandboxImage | undefined> {
  const docker = options.docker ?? new Docker();
  const ping = docker.ping();
  const answered = await Promise.race([
    ping.then(() => true, () => false),
    new Promise<boolean>((resolve) => setTimeout(() => resolve(false), options.pingTimeoutMs ?? 2_000).unref()),
  ]);
  if (!answered) return undefined;
  return ensureSandboxImage({ ...options, docker });
}
