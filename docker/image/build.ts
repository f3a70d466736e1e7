/**
 * `npm run build:image [-- --force] [-- --tag name:tag]`: builds the agentplane process image
 * (`agentplane:local`) offline, FROM scratch, out of this machine's own files, the way the
 * sandbox image is built: the host's `node`, `redis-server`, `redis-cli`, `tini` and a POSIX
 * shell with the few commands the entrypoints use, each with the shared libraries `ldd`
 * resolves for it; the CA bundle; a non-root user (uid 10001); and the repository's built
 * output (`npm run build`: every workspace's `dist/`) with its production node_modules only.
 * The rootfs is imported as a single-layer image; no registry is contacted. The image carries
 * a content hash label, so an unchanged tree is not imported again (unless `--force`).
 *
 * docker/Dockerfile builds an equivalent image for operators with registry access.
 */
import { execFile } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, lstatSync, readdirSync, readFileSync, readlinkSync, realpathSync, statSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { Readable } from 'node:stream';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import Docker from 'dockerode';
import { createTar, type TarEntry } from '../../runner-daemon/src/sandbox/tar.js';

const execFileAsync = promisify(execFile);
const ROOT = fileURLToPath(new URL('../../', import.meta.url));
const APP = '/app';
const USER = { name: 'agentplane', uid: 10001, gid: 10001, home: '/var/lib/agentplane' };
const CONTENT_LABEL = 'org.agentplane.image.content';
/** What the processes and entrypoints run: node, Redis, an init, and sh with what the scripts call. */
const COMMANDS = ['node', 'redis-server', 'redis-cli', 'tini', 'dash', 'sleep', 'grep', 'hostname', 'cat', 'ls', 'env', 'id', 'mkdir', 'rm'];
const REQUIRED = ['node', 'redis-server', 'redis-cli', 'tini', 'dash'];
const LINKS: Record<string, string> = { sh: 'dash' };
/** Files inside packages that nothing runs. */
const SKIP_FILE = /(\.map|\.d\.ts|\.d\.mts|\.d\.cts|\.tsbuildinfo|\.md|\.markdown)$/i;
const EXTRA_FILES = ['docker/runner-entrypoint.sh', 'docker/cluster/lb.mjs', 'docker/sandbox/manifest.json'];
const ENV: Record<string, string> = {
  PATH: '/usr/local/bin:/usr/bin:/bin',
  NODE_ENV: 'production',
  HOST: '0.0.0.0',
  DATA_DIR: USER.home,
  AGENTPLANE_RUNNER_HOME: `${USER.home}/runner`,
  SSL_CERT_FILE: '/etc/ssl/certs/ca-certificates.crt',
  NODE_EXTRA_CA_CERTS: '/etc/ssl/certs/ca-certificates.crt',
  LANG: 'C.UTF-8',
};

const HELP = `Usage: npm run build:image [-- options]

Builds the agentplane process image offline (FROM scratch, from this machine's node, redis-server,
redis-cli, tini and the repository's \`npm run build\` output with production node_modules) and
tags it. No registry is contacted. Run \`npm run build\` first (the npm script does).

Options:
  --tag <name:tag>  the tag to give the image (default agentplane:local)
  --force           import even when the image for the current content exists
  -h, --help        this text
`;

class ImageBuildError extends Error {}
/** A mistake on the command line (exit code 2). */
class UsageError extends ImageBuildError {}

function locate(command: string): string | undefined {
  for (const dir of ['/usr/local/bin', '/usr/bin', '/bin', '/usr/sbin', '/sbin']) {
    if (existsSync(`${dir}/${command}`)) return `${dir}/${command}`;
  }
  return undefined;
}

/** Maps a host library path onto the merged-/usr layout of the image (`/lib` → `/usr/lib`). */
const imagePath = (p: string): string => (p.startsWith('/lib/') || p.startsWith('/lib64/') ? `/usr${p}` : p);

async function sharedLibraries(files: string[]): Promise<string[]> {
  const libs = new Set<string>();
  // ldd exits non-zero when one argument is static; the output is still complete.
  const out = await execFileAsync('ldd', files, { maxBuffer: 16 * 1024 * 1024 }).then((r) => r.stdout, (e: { stdout?: string }) => e.stdout ?? '');
  for (const line of out.split('\n')) {
    const m = /(?:=>\s*)?(\/[^\s]+)\s+\(0x/.exec(line);
    if (m?.[1]) libs.add(m[1]);
  }
  return [...libs].sort();
}

/** The production package directories (relative to the root), from the lockfile's tree. */
async function productionPackages(): Promise<string[]> {
  const out = await execFileAsync('npm', ['ls', '--omit=dev', '--all', '--parseable'], { cwd: ROOT, maxBuffer: 16 * 1024 * 1024 }).then(
    (r) => r.stdout,
    (e: { stdout?: string }) => e.stdout ?? '',
  );
  const dirs = out.split('\n').map((l) => l.trim()).filter(Boolean).map((p) => relative(ROOT, p)).filter((p) => p !== '' && !p.startsWith('..'));
  if (dirs.length === 0) throw new ImageBuildError('`npm ls --omit=dev` listed no packages: run `npm install` first');
  return [...new Set(dirs)].sort();
}

function workspaces(): string[] {
  const pkg = JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { workspaces?: string[] };
  return pkg.workspaces ?? [];
}

interface Rootfs {
  entries: TarEntry[];
  hash: string;
  bytes: number;
  files: number;
}

async function assemble(progress: (line: string) => void): Promise<Rootfs> {
  if (process.platform !== 'linux') throw new ImageBuildError(`the image is assembled from host binaries and needs a Linux host (this is ${process.platform})`);
  const entries: TarEntry[] = [];
  const dirs = new Set<string>();
  const placed = new Set<string>();
  let bytes = 0;
  const addDir = (path: string, mode = 0o755, owner = 0): void => {
    if (dirs.has(path)) return;
    dirs.add(path);
    entries.push({ type: 'dir', path, mode, uid: owner, gid: owner });
  };
  const addParents = (path: string): void => {
    const parts = path.split('/').filter(Boolean);
    for (let i = 1; i < parts.length; i++) addDir('/' + parts.slice(0, i).join('/'));
  };
  const addFile = (path: string, data: Buffer, mode: number): void => {
    if (placed.has(path)) return;
    placed.add(path);
    addParents(path);
    bytes += data.length;
    entries.push({ type: 'file', path, data, mode });
  };
  const copyHost = (host: string, path: string): void => {
    const real = realpathSync(host);
    addFile(path, readFileSync(real), statSync(real).mode & 0o777);
  };

  for (const d of ['/usr', '/usr/bin', '/usr/lib', '/usr/lib64', '/usr/local', '/usr/local/bin', '/etc', '/dev', '/proc', '/sys', '/run', '/var', '/var/lib', '/root']) addDir(d);
  addDir('/tmp', 0o1777);
  addDir('/var/tmp', 0o1777);
  addDir(USER.home, 0o750, USER.uid);
  addDir(`${USER.home}/runner`, 0o700, USER.uid);
  entries.push({ type: 'symlink', path: '/bin', target: 'usr/bin' });
  entries.push({ type: 'symlink', path: '/lib', target: 'usr/lib' });
  entries.push({ type: 'symlink', path: '/lib64', target: 'usr/lib64' });
  entries.push({ type: 'symlink', path: '/sbin', target: 'usr/bin' });

  // Host binaries and their libraries.
  const binaries: Array<{ command: string; host: string }> = [];
  for (const command of COMMANDS) {
    const host = locate(command);
    if (host) binaries.push({ command, host });
    else if (REQUIRED.includes(command)) throw new ImageBuildError(`the image needs '${command}' on this host (apt-get install ${command === 'redis-cli' ? 'redis-tools' : command === 'dash' ? 'dash' : command === 'node' ? 'nodejs' : command})`);
  }
  progress(`image: ${binaries.length} host commands (${binaries.map((b) => b.command).join(', ')})`);
  for (const { command, host } of binaries) copyHost(host, `/usr/bin/${command}`);
  for (const [link, target] of Object.entries(LINKS)) entries.push({ type: 'symlink', path: `/usr/bin/${link}`, target });

  // The repository: every workspace's package.json and dist/, then the production node_modules.
  for (const ws of workspaces()) {
    const pkgJson = join(ROOT, ws, 'package.json');
    if (!existsSync(pkgJson)) continue;
    if (!existsSync(join(ROOT, ws, 'dist'))) throw new ImageBuildError(`${ws}/dist is missing: run \`npm run build\` first`);
    copyHost(pkgJson, `${APP}/${ws}/package.json`);
  }
  const nativeAddons: string[] = [];
  const walk = (hostDir: string, imageDir: string, skipNodeModules: boolean): void => {
    for (const name of readdirSync(hostDir).sort()) {
      if (skipNodeModules && name === 'node_modules') continue;
      const host = join(hostDir, name);
      const image = `${imageDir}/${name}`;
      const st = lstatSync(host);
      if (st.isSymbolicLink()) {
        const target = readlinkSync(host);
        // Links that stay inside the tree keep being links; others are copied as what they point at.
        if (!target.startsWith('/') && realpathSync(host).startsWith(ROOT)) {
          addParents(image);
          entries.push({ type: 'symlink', path: image, target });
        } else if (statSync(host).isFile()) copyHost(host, image);
      } else if (st.isDirectory()) {
        walk(host, image, skipNodeModules);
      } else if (st.isFile() && !SKIP_FILE.test(name)) {
        if (name.endsWith('.node')) nativeAddons.push(host);
        addFile(image, readFileSync(host), st.mode & 0o777);
      }
    }
  };
  for (const ws of workspaces()) {
    if (existsSync(join(ROOT, ws, 'dist'))) walk(join(ROOT, ws, 'dist'), `${APP}/${ws}/dist`, false);
  }
  const packages = await productionPackages();
  const workspaceSet = new Set(workspaces());
  for (const pkg of packages) {
    const host = join(ROOT, pkg);
    if (lstatSync(host).isSymbolicLink()) {
      // A workspace package: node_modules/@agentplane/x -> ../../x
      const target = relative(ROOT, realpathSync(host));
      if (!workspaceSet.has(target)) throw new ImageBuildError(`${pkg} links outside the workspaces (${target})`);
      addParents(`${APP}/${pkg}`);
      entries.push({ type: 'symlink', path: `${APP}/${pkg}`, target: relative(dirname(join(ROOT, pkg)), join(ROOT, target)) });
      continue;
    }
    if (workspaceSet.has(pkg)) continue;
    walk(host, `${APP}/${pkg}`, true);
  }
  progress(`image: ${packages.length} production packages`);
  for (const f of EXTRA_FILES) copyHost(join(ROOT, f), `${APP}/${f}`);

  for (const lib of await sharedLibraries([...binaries.map((b) => b.host), ...nativeAddons])) copyHost(lib, imagePath(lib));

  const ca = '/etc/ssl/certs/ca-certificates.crt';
  if (!existsSync(ca)) throw new ImageBuildError(`the image needs the CA bundle ${ca} (apt-get install ca-certificates)`);
  copyHost(ca, ca);
  const text = (path: string, content: string): void => addFile(path, Buffer.from(content, 'utf8'), 0o644);
  text('/etc/passwd', `root:x:0:0:root:/root:/usr/bin/sh\n${USER.name}:x:${USER.uid}:${USER.gid}:${USER.name}:${USER.home}:/usr/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/bin/false\n`);
  text('/etc/group', `root:x:0:\n${USER.name}:x:${USER.gid}:\nnogroup:x:65534:\n`);
  text('/etc/nsswitch.conf', 'passwd: files\ngroup: files\nhosts: files dns\n');

  const hash = createHash('sha256');
  for (const e of [...entries].sort((a, b) => (a.path < b.path ? -1 : a.path > b.path ? 1 : 0))) {
    hash.update(`${e.type}\0${e.path}\0`);
    if (e.type === 'file') hash.update(`${e.mode ?? 0}\0${e.uid ?? 0}\0`).update(e.data);
    else if (e.type === 'dir') hash.update(`${e.mode ?? 0}\0${e.uid ?? 0}\0`);
    else hash.update(e.target);
  }
  hash.update(JSON.stringify({ ENV, USER }));
  return { entries, hash: hash.digest('hex').slice(0, 16), bytes, files: entries.length };
}

async function currentContent(docker: Docker, tag: string): Promise<string | undefined> {
  try {
    const info = await docker.getImage(tag).inspect();
    return info.Config?.Labels?.[CONTENT_LABEL];
  } catch (err) {
    if ((err as { statusCode?: number }).statusCode === 404) return undefined;
    throw new ImageBuildError(`cannot reach Docker to inspect ${tag}: ${(err as Error).message}`);
  }
}

async function main(): Promise<void> {
  const args = process.argv.slice(2);
  if (args.includes('--help') || args.includes('-h')) {
    process.stdout.write(HELP);
    return;
  }
  for (let i = 0; i < args.length; i++) {
    if (args[i] === '--tag') i++;
    else if (args[i] !== '--force') throw new UsageError(`unknown argument '${args[i]}' (options: --tag <name:tag>, --force, --help)`);
  }
  const tagIndex = args.indexOf('--tag');
  const tag = tagIndex >= 0 ? args[tagIndex + 1] : 'agentplane:local';
  if (!tag || !/^[a-z0-9][a-z0-9._/-]*:[\w.-]+$/.test(tag)) throw new UsageError('--tag needs name:tag');
  const force = args.includes('--force');
  const started = Date.now();
  const progress = (line: string): void => void process.stdout.write(`${line}\n`);
  const docker = new Docker();

  progress('image: collecting host binaries, the built workspaces and production node_modules');
  const rootfs = await assemble(progress);
  progress(`image: rootfs ${rootfs.files} entries, ${(rootfs.bytes / 1048576).toFixed(1)} MiB, content ${rootfs.hash}`);
  if (!force && (await currentContent(docker, tag)) === rootfs.hash) {
    progress(`image: ${tag} is up to date (content ${rootfs.hash})`);
    return;
  }
  const archive = createTar(rootfs.entries);
  progress(`image: importing ${(archive.length / 1048576).toFixed(1)} MiB as ${tag}`);
  const [repo, version] = [tag.slice(0, tag.lastIndexOf(':')), tag.slice(tag.lastIndexOf(':') + 1)];
  const changes = [
    ...Object.entries(ENV).map(([k, v]) => `ENV ${k}=${v}`),
    `LABEL ${CONTENT_LABEL}=${rootfs.hash}`,
    `USER ${USER.uid}:${USER.gid}`,
    `WORKDIR ${APP}`,
    'EXPOSE 8080',
    'ENTRYPOINT ["/usr/bin/tini","--"]',
    'CMD ["node","platform/dist/main.js"]',
  ];
  // POST /images/create?fromSrc=- with the rootfs tar as the body (what `docker import` does).
  const stream = (await docker.importImage(Readable.from([archive]) as unknown as string, { repo, tag: version, changes })) as NodeJS.ReadableStream;
  await new Promise<void>((resolve, reject) => {
    docker.modem.followProgress(stream, (err: Error | null, out: Array<{ error?: string }>) => {
      const failed = err ?? (out.find((o) => o.error) ? new Error(out.find((o) => o.error)?.error) : null);
      if (failed) reject(failed);
      else resolve();
    });
  });
  progress(`image: built ${tag} (content ${rootfs.hash}) in ${((Date.now() - started) / 1000).toFixed(1)} s`);
}

main().catch((err: unknown) => {
  process.stderr.write(`build:image: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(err instanceof UsageError ? 2 : 1);
});
