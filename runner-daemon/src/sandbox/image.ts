/**
 * The default sandbox image, built offline: a rootfs assembled from this machine's own binaries
 * (each with the shared libraries `ldd` resolves for it) plus a non-root user, imported as a
 * single-layer image FROM scratch. No registry is contacted. The tag carries a hash of the
 * rootfs content, so a build is skipped when the image for the current content already exists.
 *
 * Telling that the image is up to date reads no file: the image carries labels with the
 * fingerprint of its inputs (the manifest, the loader's configuration, and the real path, size,
 * mode, mtime, ctime, inode and device of every binary and library) and the libraries `ldd`
 * resolved. A start looks the image up by the fingerprint of the binaries, stats the libraries
 * it names and compares the whole fingerprint; only a difference (or no such image) costs
 * resolving, reading and hashing everything.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, readFileSync, realpathSync, statSync, type BigIntStats } from 'node:fs';
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
  /** Rebuild even when the tag for the current content exists (and read every input). */
  force?: boolean;
  /** Directories a command is looked for in, the first match wins (default: /usr/local/bin, /usr/bin, /bin, /usr/sbin, /sbin). */
  searchDirs?: readonly string[];
}

export interface SandboxImage {
  /** `<repository>:<content hash>` */
  tag: string;
  /** `<repository>:latest` */
  latest: string;
  contentHash: string;
  built: boolean;
  /** Found up to date by the fingerprint of its inputs: no file was read or hashed. */
  cached: boolean;
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

/**
 * Version of the rootfs layout and of the fingerprint below: an image recording another version
 * is found by its content, never by its inputs.
 */
const ROOTFS_FORMAT = 'rootfs-v1';

/**
 * Labels of the default image recording what it was built from, so that the next start can tell
 * that it is up to date without reading a file.
 */
export const IMAGE_LABELS = {
  /** Fingerprint of the manifest, the loader's configuration and the located binaries: how the image is found. */
  binaries: 'agentplane.image.binaries',
  /** The shared libraries `ldd` resolved for the binaries (base64url of a JSON array). */
  libraries: 'agentplane.image.libraries',
  /** Fingerprint of every input: the binaries' one with each library's path and stats. */
  inputs: 'agentplane.image.inputs',
  /** The content hash the image is tagged with. */
  content: 'agentplane.image.content',
} as const;

/** A host file of the rootfs: the path it was named by, the file it resolves to, and that file's stats. */
interface HostFile {
  host: string;
  real: string;
  stat: BigIntStats;
}

function hostFile(host: string): HostFile {
  const real = realpathSync(host);
  return { host, real, stat: statSync(real, { bigint: true }) };
}

/** What changes whenever a file's content does (mtime and ctime in ns), or the file is another one. */
function statIdentity(st: BigIntStats): string {
  return `${st.dev}:${st.ino}:${st.size}:${st.mode}:${st.mtimeNs}:${st.ctimeNs}`;
}

function locate(command: string, dirs: readonly string[]): string | undefined {
  for (const dir of dirs) {
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

/**
 * Runs `ldd` over the binaries in up to four concurrent batches: it starts a few short processes
 * per binary and mostly waits on them, so four batches help even on two cores.
 */
async function sharedLibraries(binaries: string[]): Promise<string[]> {
  const lanes = Math.max(1, Math.min(4, binaries.length));
  const size = Math.ceil(binaries.length / lanes);
  const batches: string[][] = [];
  for (let i = 0; i < binaries.length; i += size) batches.push(binaries.slice(i, i + size));
  // ldd exits non-zero when one argument is static; the output is still complete.
  const outputs = await Promise.all(batches.map((batch) => execFileAsync('ldd', batch, { maxBuffer: 16 * 1024 * 1024 }).then(
    (r) => r.stdout,
    (e: { stdout?: string }) => e.stdout ?? '',
  )));
  const libs = new Set<string>();
  for (const line of outputs.join('\n').split('\n')) {
    const match = /(?:=>\s*)?(\/[^\s]+)\s+\(0x/.exec(line);
    if (match?.[1]) libs.add(match[1]);
  }
  return [...libs].sort();
}

interface LocatedBinary {
  command: string;
  file: HostFile;
}

/** Finds the manifest's commands on this host (a missing optional one is left out). */
function locateBinaries(manifest: SandboxImageManifest, searchDirs: readonly string[] = SEARCH_DIRS): LocatedBinary[] {
  if (process.platform !== 'linux') {
    // The rootfs is made of this host's binaries: only a Linux host has Linux binaries to give.
    throw new SandboxImageError('unsupported_host', `the sandbox image is assembled from host binaries and needs a Linux host (this is ${process.platform})`);
  }
  const binaries: LocatedBinary[] = [];
  for (const command of manifest.commands) {
    const host = locate(command, searchDirs);
    if (host) binaries.push({ command, file: hostFile(host) });
  }
  for (const required of ['bash', 'sleep', 'cat', 'setsid']) {
    if (!binaries.some((b) => b.command === required)) {
      throw new SandboxImageError('command_missing', `the sandbox image needs '${required}' on this host`);
    }
  }
  return binaries;
}

/** Besides the binaries, what decides the libraries the loader resolves: its cache, its preload list, the environment. */
function loaderState(): string {
  const files = ['/etc/ld.so.cache', '/etc/ld.so.preload'].map((p) => {
    try {
      return `${p}=${statIdentity(statSync(p, { bigint: true }))}`;
    } catch {
      return `${p}=absent`;
    }
  });
  return [...files, `LD_LIBRARY_PATH=${process.env.LD_LIBRARY_PATH ?? ''}`, `LD_PRELOAD=${process.env.LD_PRELOAD ?? ''}`].join('\0');
}

function binariesKey(manifest: SandboxImageManifest, binaries: LocatedBinary[]): string {
  const hash = createHash('sha256').update(`${ROOTFS_FORMAT}\0${JSON.stringify(manifest)}\0${loaderState()}`);
  for (const b of binaries) hash.update(`\0${b.command}\0${b.file.host}\0${b.file.real}\0${statIdentity(b.file.stat)}`);
  return hash.digest('hex').slice(0, 32);
}

/** A rootfs entry before any host file is read: host files by their path and stats. */
type PlannedEntry = TarEntry | { type: 'host'; path: string; mode: number; file: HostFile };

/** The rootfs of a manifest with the libraries resolved, and the fingerprint of all its inputs. */
interface RootfsPlan {
  entries: PlannedEntry[];
  libraries: string[];
  binariesKey: string;
  fingerprint: string;
  files: number;
  bytes: number;
}

/** Lays the rootfs out (stats every library, reads none). */
function planRootfs(manifest: SandboxImageManifest, binaries: LocatedBinary[], libraries: string[], key: string): RootfsPlan {
  const { uid, gid, name, home } = manifest.user;
  const entries: PlannedEntry[] = [];
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
  for (const { command, file } of binaries) {
    bytes += Number(file.stat.size);
    entries.push({ type: 'host', path: `/usr/bin/${command}`, file, mode: 0o755 });
  }
  const placed = new Set<string>();
  for (const lib of libraries) {
    const target = imagePath(lib);
    if (placed.has(target)) continue;
    placed.add(target);
    addParents(target);
    const file = hostFile(lib);
    bytes += Number(file.stat.size);
    entries.push({ type: 'host', path: target, file, mode: Number(file.stat.mode) & 0o777 });
  }
  for (const [link, target] of Object.entries(manifest.links)) {
    if (binaries.some((b) => b.command === target) && !binaries.some((b) => b.command === link)) {
      entries.push({ type: 'symlink', path: `/usr/bin/${link}`, target });
    }
  }
  const text = (path: string, content: string, mode = 0o644): void => {
    entries.push({ type: 'file', path, data: Buffer.from(content, 'utf8'), mode });
  };
  text('/etc/passwd', `root:x:0:0:root:/root:/usr/bin/bash\n${name}:x:${uid}:${gid}:${name}:${home}:/usr/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/bin/false\n`);
  text('/etc/group', `root:x:0:\n${name}:x:${gid}:\nnogroup:x:65534:\n`);
  text('/etc/nsswitch.conf', 'passwd: files\ngroup: files\nhosts: files\n');
  text('/etc/profile', Object.entries(manifest.env).map(([k, v]) => `export ${k}=${JSON.stringify(v)}\n`).join(''));

  // Every entry as laid out, host files by name and stats: the libraries' stats validate the
  // resolution the binaries' key found (a library whose content changed has other stats).
  const fingerprint = createHash('sha256').update(`${ROOTFS_FORMAT}\0${key}`);
  for (const e of entries) {
    fingerprint.update(`\0${e.type}\0${e.path}\0`);
    if (e.type === 'host') fingerprint.update(`${e.mode}\0${e.file.host}\0${e.file.real}\0${statIdentity(e.file.stat)}`);
    else if (e.type === 'file') fingerprint.update(`${e.mode ?? 0}\0${e.uid ?? 0}\0${e.gid ?? 0}\0`).update(e.data);
    else if (e.type === 'dir') fingerprint.update(`${e.mode ?? 0}\0${e.uid ?? 0}\0${e.gid ?? 0}`);
    else fingerprint.update(e.target);
  }
  return { entries, libraries, binariesKey: key, fingerprint: fingerprint.digest('hex').slice(0, 32), files: entries.length, bytes };
}

export interface AssembledRootfs {
  entries: TarEntry[];
  contentHash: string;
  files: number;
  bytes: number;
}

/** Reads the host files of a plan and hashes the rootfs content (the image's tag). */
function readRootfs(manifest: SandboxImageManifest, plan: RootfsPlan): AssembledRootfs {
  let bytes = 0;
  const entries = plan.entries.map((e): TarEntry => {
    if (e.type !== 'host') return e;
    const data = readFileSync(e.file.real);
    bytes += data.length;
    return { type: 'file', path: e.path, data, mode: e.mode };
  });
  const hash = createHash('sha256');
  const sorted = [...entries].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  for (const e of sorted) {
    hash.update(`${e.type}\0${e.path}\0`);
    if (e.type === 'file') hash.update(`${e.mode ?? 0}\0${e.uid ?? 0}\0`).update(e.data);
    else if (e.type === 'dir') hash.update(`${e.mode ?? 0}\0${e.uid ?? 0}\0`);
    else hash.update(e.target);
  }
  hash.update(JSON.stringify({ env: manifest.env, user: manifest.user, workspace: manifest.workspace }));
  return { entries, contentHash: hash.digest('hex').slice(0, 16), files: entries.length, bytes };
}

/** Collects binaries, their libraries, users and directories into tar entries, and hashes them. */
export async function assembleRootfs(manifest: SandboxImageManifest, searchDirs?: readonly string[]): Promise<AssembledRootfs> {
  const binaries = locateBinaries(manifest, searchDirs);
  const libraries = await sharedLibraries(binaries.map((b) => b.file.host));
  return readRootfs(manifest, planRootfs(manifest, binaries, libraries, binariesKey(manifest, binaries)));
}

/**
 * What the rootfs of a manifest is: found by the fingerprint of its inputs on the image built
 * from them (`cached`, no file read), or else assembled from the host and hashed (`rootfs`).
 */
export type RootfsIdentity = { contentHash: string; files: number; bytes: number; labels: Record<string, string> } & (
  | { cached: true; rootfs?: undefined }
  | { cached: false; rootfs: AssembledRootfs }
);

function rootfsLabels(plan: RootfsPlan, contentHash: string): Record<string, string> {
  return {
    [IMAGE_LABELS.binaries]: plan.binariesKey,
    [IMAGE_LABELS.libraries]: Buffer.from(JSON.stringify(plan.libraries)).toString('base64url'),
    [IMAGE_LABELS.inputs]: plan.fingerprint,
    [IMAGE_LABELS.content]: contentHash,
  };
}

function decodeLibraries(label: string | undefined): string[] | undefined {
  if (!label) return undefined;
  try {
    const parsed: unknown = JSON.parse(Buffer.from(label, 'base64url').toString('utf8'));
    return Array.isArray(parsed) && parsed.every((p) => typeof p === 'string') ? parsed : undefined;
  } catch {
    return undefined;
  }
}

/** The image of `repository` whose labels record exactly these inputs, still tagged with its content hash. */
async function findByInputs(docker: Docker, manifest: SandboxImageManifest, binaries: LocatedBinary[], key: string): Promise<RootfsIdentity | undefined> {
  let images: Docker.ImageInfo[];
  try {
    images = await docker.listImages({ filters: { label: [`${IMAGE_LABELS.binaries}=${key}`], reference: [manifest.repository] } });
  } catch (err) {
    throw new SandboxImageError('docker_unavailable', `cannot list the ${manifest.repository} images: ${(err as Error).message}`);
  }
  for (const image of images) {
    const labels = image.Labels ?? {};
    const content = labels[IMAGE_LABELS.content];
    const libraries = decodeLibraries(labels[IMAGE_LABELS.libraries]);
    if (!content || !libraries || !(image.RepoTags ?? []).includes(`${manifest.repository}:${content}`)) continue;
    let plan: RootfsPlan;
    try {
      plan = planRootfs(manifest, binaries, libraries, key);
    } catch {
      continue; // a library it names is gone
    }
    if (plan.fingerprint !== labels[IMAGE_LABELS.inputs]) continue;
    return { contentHash: content, files: plan.files, bytes: plan.bytes, labels: rootfsLabels(plan, content), cached: true };
  }
  return undefined;
}

/**
 * Identifies the rootfs of a manifest. Looks for an image of `manifest.repository` labelled with
 * the fingerprint of the current inputs first (skipped with `force`): the binaries are located and
 * stat'ed, the libraries the image names are stat'ed, nothing is read or resolved. Otherwise
 * resolves the libraries, reads and hashes everything.
 */
export async function identifyRootfs(manifest: SandboxImageManifest, docker: Docker, options: { force?: boolean; searchDirs?: readonly string[] } = {}): Promise<RootfsIdentity> {
  const binaries = locateBinaries(manifest, options.searchDirs);
  const key = binariesKey(manifest, binaries);
  if (!options.force) {
    const found = await findByInputs(docker, manifest, binaries, key);
    if (found) return found;
  }
  const libraries = await sharedLibraries(binaries.map((b) => b.file.host));
  const plan = planRootfs(manifest, binaries, libraries, key);
  const rootfs = readRootfs(manifest, plan);
  return { contentHash: rootfs.contentHash, files: rootfs.files, bytes: rootfs.bytes, labels: rootfsLabels(plan, rootfs.contentHash), cached: false, rootfs };
}

/** `LABEL` changes for an import (the values are hex and base64url: nothing to quote or expand). */
export function labelChanges(labels: Record<string, string>): string[] {
  return Object.entries(labels).map(([k, v]) => `LABEL ${k}=${v}`);
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

async function inspectImage(docker: Docker, tag: string): Promise<Docker.ImageInspectInfo | undefined> {
  try {
    return await docker.getImage(tag).inspect();
  } catch (err) {
    if ((err as { statusCode?: number }).statusCode === 404) return undefined;
    throw new SandboxImageError('docker_unavailable', `cannot inspect ${tag}: ${(err as Error).message}`);
  }
}

/**
 * Builds the default sandbox image when the image for the current rootfs content is missing
 * (or `force`), and points `<repository>:latest` at it. Safe to call on every start: an image
 * whose labels record the current inputs is taken without reading them.
 */
export async function ensureSandboxImage(options: EnsureSandboxImageOptions = {}): Promise<SandboxImage> {
  const started = Date.now();
  const progress = options.onProgress ?? (() => {});
  const docker = options.docker ?? new Docker();
  const manifest = loadManifest(options.manifestPath ?? DEFAULT_MANIFEST_PATH);
  progress(`sandbox image: collecting ${manifest.commands.length} commands and their libraries`);
  const id = await identifyRootfs(manifest, docker, options);
  const tag = `${manifest.repository}:${id.contentHash}`;
  const latest = `${manifest.repository}:latest`;
  const result = (built: boolean): SandboxImage => ({
    tag, latest, contentHash: id.contentHash, built, cached: id.cached, files: id.files, bytes: id.bytes, durationMs: Date.now() - started,
  });
  if (id.cached) {
    await docker.getImage(tag).tag({ repo: manifest.repository, tag: 'latest' });
    progress(`sandbox image: ${tag} is up to date by its inputs (${id.files} entries, ${(id.bytes / 1048576).toFixed(1)} MiB, none read)`);
    return result(false);
  }
  const { rootfs } = id;
  progress(`sandbox image: rootfs ${rootfs.files} entries, ${(rootfs.bytes / 1048576).toFixed(1)} MiB, content ${rootfs.contentHash}`);
  let replaced: string | undefined;
  if (!options.force) {
    const present = await inspectImage(docker, tag);
    if (present?.Config.Labels?.[IMAGE_LABELS.inputs] === id.labels[IMAGE_LABELS.inputs]) {
      await docker.getImage(tag).tag({ repo: manifest.repository, tag: 'latest' });
      progress(`sandbox image: ${tag} is up to date`);
      return result(false);
    }
    // Same content, other inputs recorded (an image of an earlier version, or a file touched since):
    // imported again with these, so that the next start finds it by them.
    if (present) progress(`sandbox image: ${tag} is present but records other inputs: importing it again to record these`);
    replaced = present?.Id;
  }
  const archive = createTar(rootfs.entries);
  progress(`sandbox image: importing ${(archive.length / 1048576).toFixed(1)} MiB as ${tag}`);
  await importRootfs(docker, archive, manifest.repository, rootfs.contentHash, [...imageChanges(manifest, manifest.env), ...labelChanges(id.labels)]);
  // The image it replaced, now without a tag, goes (Docker refuses while a container or a
  // harness layer still uses it, and that refusal is fine: it goes with them).
  if (replaced) await docker.getImage(replaced).remove().catch(() => undefined);
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
