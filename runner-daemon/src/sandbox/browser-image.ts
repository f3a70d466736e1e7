/**
 * The browser variant of the sandbox image: the default rootfs plus Chromium, assembled offline
 * from this machine's Debian `chromium` package (its files from `dpkg -L`, the shared libraries
 * `ldd` resolves for them, NSS's modules, fontconfig and two font families) and the
 * `playwright-core` package this runner drives it with. Imported FROM scratch like the default
 * image, under `<repository>-browser:<hash>`.
 *
 * The tag hashes the default image's content hash with the name, size and mtime of every
 * browser file (not their bytes; playwright-core's by its version and sizes, since `npm ci` gives
 * them new mtimes), so deciding that the image is up to date reads no large file:
 * a present image costs one stat per file; a build happens only when a package changed. The
 * default image's content hash comes from the labels of the default image when they record the
 * current inputs (see `identifyRootfs`), else from reading and hashing the default rootfs.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, lstatSync, readdirSync, readFileSync, readlinkSync, realpathSync } from 'node:fs';
import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import Docker from 'dockerode';
import { assembleRootfs, DEFAULT_MANIFEST_PATH, identifyRootfs, imageChanges, imageExists, importRootfs, loadManifest, SandboxImageError, type SandboxImage } from './image.js';
import { createTar, type TarEntry } from './tar.js';

const execFileAsync = promisify(execFile);

/** Where Chromium lives in the image (Debian's layout). */
export const BROWSER_BINARY = '/usr/lib/chromium/chromium';
/** Where `playwright-core` lives in the image (`NODE_PATH` points here). */
export const BROWSER_NODE_PATH = '/opt/agentplane/node_modules';

const PACKAGES = ['chromium', 'chromium-common'];
/** Package paths a headless browser never reads. */
const SKIP = [/^\/usr\/share\/(doc|man|bug|lintian|menu|icons|pixmaps|applications|appdata|metainfo)\//, /libVkLayer_khronos_validation/, /^\/usr\/bin\/chromium$/, /^\/etc\/chromium/];
const FONT_DIRS = ['/usr/share/fonts/truetype/dejavu', '/usr/share/fonts/truetype/liberation'];
const CONFIG_DIRS = ['/etc/fonts', '/usr/share/fontconfig'];

interface HostFile {
  /** Path in the image. */
  path: string;
  host: string;
  kind: 'file' | 'symlink';
  target?: string;
  mode: number;
  size: number;
  mtimeMs: number;
}

function walk(dir: string, out: string[] = []): string[] {
  if (!existsSync(dir)) return out;
  for (const name of readdirSync(dir)) {
    const p = join(dir, name);
    const st = lstatSync(p);
    if (st.isDirectory()) walk(p, out);
    else out.push(p);
  }
  return out;
}

function imagePath(hostPath: string): string {
  if (hostPath.startsWith('/lib/') || hostPath.startsWith('/lib64/')) return `/usr${hostPath}`;
  return hostPath;
}

function describe(host: string, path = imagePath(host)): HostFile | undefined {
  let st;
  try {
    st = lstatSync(host);
  } catch {
    return undefined;
  }
  if (st.isSymbolicLink()) {
    return { path, host, kind: 'symlink', target: readlinkSync(host), mode: 0o777, size: 0, mtimeMs: 0 };
  }
  if (!st.isFile()) return undefined;
  return { path, host, kind: 'file', mode: st.mode & 0o777, size: st.size, mtimeMs: Math.floor(st.mtimeMs) };
}

async function packageFiles(): Promise<string[]> {
  let out: string;
  try {
    out = (await execFileAsync('dpkg', ['-L', ...PACKAGES], { maxBuffer: 16 * 1024 * 1024 })).stdout;
  } catch (err) {
    throw new SandboxImageError('command_missing', `the browser image needs the Debian packages ${PACKAGES.join(', ')} on this host (${(err as Error).message.split('\n')[0]})`);
  }
  return out.split('\n').filter((p) => p.startsWith('/') && !SKIP.some((re) => re.test(p)));
}

async function sharedLibraries(objects: string[]): Promise<string[]> {
  const libs = new Set<string>();
  for (let i = 0; i < objects.length; i += 64) {
    const output = await execFileAsync('ldd', objects.slice(i, i + 64), { maxBuffer: 16 * 1024 * 1024 }).then((r) => r.stdout, (e: { stdout?: string }) => e.stdout ?? '');
    for (const line of output.split('\n')) {
      const m = /(?:=>\s*)?(\/[^\s]+)\s+\(0x/.exec(line);
      if (m?.[1]) libs.add(m[1]);
    }
  }
  return [...libs].sort();
}

/** The directory of the `playwright-core` package this runner uses. */
export function playwrightCoreDir(): string {
  const require = createRequire(import.meta.url);
  return dirname(require.resolve('playwright-core/package.json'));
}

/** Every host file the browser layer carries, with the stats the cache key is made of. */
export async function browserFiles(): Promise<HostFile[]> {
  if (!existsSync(BROWSER_BINARY)) {
    throw new SandboxImageError('command_missing', `the browser image needs Chromium at ${BROWSER_BINARY} (Debian package 'chromium')`);
  }
  const files = new Map<string, HostFile>();
  const add = (f: HostFile | undefined): void => {
    if (f && !files.has(f.path)) files.set(f.path, f);
  };
  const pkg = (await packageFiles()).filter((p) => {
    try {
      const st = lstatSync(p);
      return st.isFile() || st.isSymbolicLink();
    } catch {
      return false;
    }
  });
  for (const p of pkg) add(describe(p));
  const nssDir = '/usr/lib/x86_64-linux-gnu/nss';
  const nss = walk(nssDir);
  for (const p of nss) add(describe(p));
  const objects = [...pkg, ...nss].filter((p) => lstatSync(p).isFile() && (/\.so(\.|$)/.test(p) || p === BROWSER_BINARY || p.endsWith('chrome_crashpad_handler')));
  for (const lib of await sharedLibraries(objects)) {
    // Libraries are copied as the files they resolve to, under the name the loader looks for.
    const real = realpathSync(lib);
    const f = describe(real, imagePath(lib));
    if (f) add({ ...f, path: imagePath(lib) });
  }
  for (const dir of [...CONFIG_DIRS, ...FONT_DIRS]) for (const p of walk(dir)) add(describe(p));
  const pw = playwrightCoreDir();
  for (const p of walk(pw)) add(describe(p, `${BROWSER_NODE_PATH}/playwright-core${p.slice(pw.length)}`));
  return [...files.values()].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
}

export interface EnsureBrowserImageOptions {
  docker?: Docker;
  manifestPath?: string | URL;
  onProgress?: (line: string) => void;
  force?: boolean;
}

/** The repository of the browser variant: the default image's, suffixed. */
export function browserRepository(manifestPath: string | URL = DEFAULT_MANIFEST_PATH): string {
  return `${loadManifest(manifestPath).repository}-browser`;
}

/**
 * Builds the browser variant when the image for the current content is missing (or `force`),
 * and points `<repository>-browser:latest` at it. Safe to call on every start.
 */
export async function ensureBrowserImage(options: EnsureBrowserImageOptions = {}): Promise<SandboxImage> {
  const started = Date.now();
  const progress = options.onProgress ?? (() => {});
  const docker = options.docker ?? new Docker();
  const manifest = loadManifest(options.manifestPath ?? DEFAULT_MANIFEST_PATH);
  const base = await identifyRootfs(manifest, docker, { force: options.force ?? false });
  const files = await browserFiles();
  // playwright-core's files get a new mtime with every `npm ci`: its version and sizes name it.
  const pwVersion = (JSON.parse(readFileSync(join(playwrightCoreDir(), 'package.json'), 'utf8')) as { version: string }).version;
  const hashOf = (baseHash: string): string => {
    const hash = createHash('sha256').update(`browser-v1\0${baseHash}\0`);
    hash.update(`playwright-core@${pwVersion}\0`);
    for (const f of files) {
      const mtime = f.path.startsWith(`${BROWSER_NODE_PATH}/`) ? 0 : f.mtimeMs;
      hash.update(`${f.path}\0${f.kind}\0${f.target ?? ''}\0${f.mode}\0${f.size}\0${mtime}\0`);
    }
    return hash.digest('hex').slice(0, 16);
  };
  let contentHash = hashOf(base.contentHash);
  const repository = `${manifest.repository}-browser`;
  let tag = `${repository}:${contentHash}`;
  const latest = `${repository}:latest`;
  const bytes = base.bytes + files.reduce((n, f) => n + f.size, 0);
  const result = (built: boolean): SandboxImage => ({
    tag, latest, contentHash, built, cached: !built && base.cached, files: base.files + files.length, bytes, durationMs: Date.now() - started,
  });
  if (!options.force && (await imageExists(docker, tag))) {
    await docker.getImage(tag).tag({ repo: repository, tag: 'latest' });
    progress(`browser image: ${tag} is up to date${base.cached ? ' by its inputs' : ''}`);
    return result(false);
  }
  // The default rootfs is read now if its labels stood in for it (the tag follows what was read).
  const rootfs = base.rootfs ?? (await assembleRootfs(manifest));
  if (rootfs.contentHash !== base.contentHash) {
    contentHash = hashOf(rootfs.contentHash);
    tag = `${repository}:${contentHash}`;
  }
  progress(`browser image: ${files.length} browser files, ${(bytes / 1048576).toFixed(0)} MiB in all`);
  const entries: TarEntry[] = [...rootfs.entries];
  const dirs = new Set(rootfs.entries.filter((e) => e.type === 'dir').map((e) => e.path));
  const taken = new Set(rootfs.entries.map((e) => e.path));
  const addParents = (path: string): void => {
    const parts = path.split('/').filter(Boolean);
    for (let i = 1; i < parts.length; i++) {
      const d = '/' + parts.slice(0, i).join('/');
      if (dirs.has(d) || d === '/lib' || d === '/lib64' || d === '/bin' || d === '/sbin') continue;
      dirs.add(d);
      entries.push({ type: 'dir', path: d, mode: 0o755 });
    }
  };
  for (const f of files) {
    if (taken.has(f.path)) continue;
    taken.add(f.path);
    addParents(f.path);
    if (f.kind === 'symlink') entries.push({ type: 'symlink', path: f.path, target: f.target as string });
    else entries.push({ type: 'file', path: f.path, data: readFileSync(f.host), mode: f.mode });
  }
  const archive = createTar(entries);
  progress(`browser image: importing ${(archive.length / 1048576).toFixed(0)} MiB as ${tag}`);
  await importRootfs(docker, archive, repository, contentHash, imageChanges(manifest, { ...manifest.env, NODE_PATH: BROWSER_NODE_PATH }));
  const res = result(true);
  progress(`browser image: built ${tag} (and ${latest}) in ${res.durationMs} ms`);
  return res;
}
