/**
 * ACP agent harnesses on a runner machine (docs/ACP.md). The operator lists npm package specs
 * (`--acp-harness`, `RUNNER_ACP_HARNESSES`); at start the runner installs each with npm on the
 * runner machine (which may reach a registry; the sandbox never does), records its release digest
 * (sha256 over the installed tree), and, for the Docker driver, commits the tree as one image
 * layer on top of the sandbox image (`/opt/agentplane/acp/<id>`), offline. A harness is claimed
 * in the runner's capabilities only after a probe: the agent started in a throwaway sandbox of
 * that image answered ACP `initialize`.
 */
import { execFile } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { lstat, readdir, readFile, readlink } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { Readable } from 'node:stream';
import { promisify } from 'node:util';
import type Docker from 'dockerode';
import type { Logger } from '@agentplane/core';
import { createTar, type TarEntry } from '../sandbox/tar.js';
import type { Sandbox, SandboxDriver } from '../sandbox/types.js';

const execFileAsync = promisify(execFile);

/** Where harness trees live inside sandbox images. */
export const ACP_SANDBOX_ROOT = '/opt/agentplane/acp';
export const ACP_IMAGE_REPOSITORY = 'agentplane/sandbox-acp';

export interface InstalledHarness {
  /** The operator's spec (what npm installed). */
  spec: string;
  /** Short id: the directory under the runner's config and the image path. */
  id: string;
  /** The package's own name and version, as installed. */
  name: string;
  version: string;
  /** `sha256:<hex>` over the installed tree (paths, modes, contents, link targets). */
  digest: string;
  /** The install prefix on the runner machine (holds `node_modules`). */
  hostDir: string;
  /** Its `bin` entries: command → path relative to the package directory. */
  bins: Record<string, string>;
}

/** How one command of an installed harness is started, inside the sandbox of `driver`. */
export function harnessArgv(h: InstalledHarness, command: string, driver: 'docker' | 'process', args: string[] = []): string[] | undefined {
  const bin = h.bins[command];
  if (!bin) return undefined;
  const root = driver === 'process' ? h.hostDir : `${ACP_SANDBOX_ROOT}/${h.id}`;
  const node = driver === 'process' ? process.execPath : 'node';
  return [node, `${root}/node_modules/${h.name}/${bin}`, ...args];
}

const idOf = (spec: string): string => createHash('sha256').update(spec).digest('hex').slice(0, 16);

async function walk(dir: string, base: string, out: Array<{ rel: string; kind: 'file' | 'dir' | 'link'; mode: number; abs: string }>): Promise<void> {
  const names = (await readdir(dir)).sort();
  for (const n of names) {
    const abs = join(dir, n);
    const st = await lstat(abs);
    const rel = relative(base, abs);
    if (st.isSymbolicLink()) out.push({ rel, kind: 'link', mode: 0o777, abs });
    else if (st.isDirectory()) {
      out.push({ rel, kind: 'dir', mode: st.mode & 0o777, abs });
      await walk(abs, base, out);
    } else if (st.isFile()) out.push({ rel, kind: 'file', mode: st.mode & 0o777, abs });
  }
}

/** The installed tree as tar entries under `prefix`, and its digest. */
export async function treeOf(hostDir: string, prefix: string): Promise<{ entries: TarEntry[]; digest: string }> {
  const items: Array<{ rel: string; kind: 'file' | 'dir' | 'link'; mode: number; abs: string }> = [];
  await walk(join(hostDir, 'node_modules'), hostDir, items);
  const hash = createHash('sha256');
  const entries: TarEntry[] = [];
  const parts = prefix.split('/').filter(Boolean);
  for (let i = 1; i <= parts.length; i++) entries.push({ type: 'dir', path: `/${parts.slice(0, i).join('/')}`, mode: 0o755 });
  entries.push({ type: 'dir', path: `${prefix}/node_modules`, mode: 0o755 });
  for (const it of items) {
    const path = `${prefix}/${it.rel}`;
    hash.update(`${it.kind}\0${it.rel}\0${it.mode}\0`);
    if (it.kind === 'dir') entries.push({ type: 'dir', path, mode: it.mode | 0o555 });
    else if (it.kind === 'link') {
      const target = await readlink(it.abs);
      hash.update(target);
      entries.push({ type: 'symlink', path, target });
    } else {
      const data = await readFile(it.abs);
      hash.update(data);
      // Readable by the sandbox user; executables stay executable.
      entries.push({ type: 'file', path, data, mode: it.mode | 0o444 });
    }
    hash.update('\n');
  }
  return { entries, digest: `sha256:${hash.digest('hex')}` };
}

/** Installs one package spec with npm into `<dir>/acp/<id>` (reused while the spec is the same). */
export async function installHarness(spec: string, dir: string, log: Logger): Promise<InstalledHarness> {
  const id = idOf(spec);
  const hostDir = join(dir, id);
  const marker = join(hostDir, '.agentplane-harness.json');
  if (!existsSync(marker)) {
    mkdirSync(hostDir, { recursive: true });
    writeFileSync(join(hostDir, 'package.json'), '{"private":true}\n');
    const local = /\.(tgz|tar\.gz)$/.test(spec) || spec.startsWith('file:') || spec.startsWith('/') || spec.startsWith('.');
    log.info({ spec }, 'installing ACP harness package');
    await execFileAsync('npm', [
      'install', '--prefix', hostDir, '--no-audit', '--no-fund', '--omit=dev', '--omit=peer', '--install-links', '--no-package-lock',
      ...(local ? ['--offline'] : []), spec,
    ], { maxBuffer: 16 * 1024 * 1024, timeout: 600_000 }).catch((err: { stderr?: string; message: string }) => {
      throw new Error(`npm install ${spec} failed: ${(err.stderr ?? err.message).trim().slice(-1500)}`);
    });
    writeFileSync(marker, JSON.stringify({ spec }) + '\n');
  }
  const deps = Object.keys((JSON.parse(readFileSync(join(hostDir, 'package.json'), 'utf8')) as { dependencies?: Record<string, string> }).dependencies ?? {});
  const name = deps[0];
  if (!name) throw new Error(`npm install ${spec} recorded no dependency`);
  const pkg = JSON.parse(readFileSync(join(hostDir, 'node_modules', name, 'package.json'), 'utf8')) as { version?: string; bin?: string | Record<string, string> };
  const bins: Record<string, string> = typeof pkg.bin === 'string' ? { [name.split('/').pop() ?? name]: pkg.bin } : { ...(pkg.bin ?? {}) };
  for (const [k, v] of Object.entries(bins)) bins[k] = v.replace(/^\.\//, '');
  const { digest } = await treeOf(hostDir, `${ACP_SANDBOX_ROOT}/${id}`);
  return { spec, id, name, version: pkg.version ?? '0.0.0', digest, hostDir, bins };
}

/**
 * The sandbox image with the harness's tree as one more layer: made offline from the base image
 * (a created, never started container, the tree put into it, committed). Tagged by the base
 * image id and the harness digest, so it is made once.
 */
export async function ensureHarnessImage(docker: Docker, baseImage: string, h: InstalledHarness, log: Logger): Promise<string> {
  const baseId = ((await docker.getImage(baseImage).inspect()) as { Id: string }).Id;
  const tag = createHash('sha256').update(`${baseId}\0${h.digest}`).digest('hex').slice(0, 16);
  const ref = `${ACP_IMAGE_REPOSITORY}:${tag}`;
  try {
    await docker.getImage(ref).inspect();
    return ref;
  } catch {
    /* make it */
  }
  const started = Date.now();
  const { entries, digest } = await treeOf(h.hostDir, `${ACP_SANDBOX_ROOT}/${h.id}`);
  if (digest !== h.digest) throw new Error(`the installed tree of ${h.spec} changed since it was probed`);
  const container = await docker.createContainer({
    Image: baseImage, Cmd: ['/usr/bin/true'], NetworkDisabled: true,
    Labels: { 'agentplane.acp.build': h.id },
  });
  try {
    await container.putArchive(Readable.from([createTar(entries)]) as unknown as string, { path: '/' });
    await container.commit({
      repo: ACP_IMAGE_REPOSITORY, tag,
      changes: [`LABEL agentplane.acp.package=${h.name}`, `LABEL agentplane.acp.version=${h.version}`, `LABEL agentplane.acp.digest=${h.digest}`],
    });
  } finally {
    await container.remove({ force: true }).catch(() => undefined);
  }
  log.info({ image: ref, harness: `${h.name}@${h.version}`, ms: Date.now() - started }, 'ACP harness image layer built');
  return ref;
}

/** Environment of every ACP agent process: no telemetry, no update checks, no error reporting. */
export const QUIET_AGENT_ENV: Record<string, string> = {
  DISABLE_TELEMETRY: '1',
  DISABLE_AUTOUPDATER: '1',
  DISABLE_ERROR_REPORTING: '1',
  DISABLE_BUG_COMMAND: '1',
  CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1',
  CLAUDE_CODE_DISABLE_TERMINAL_TITLE: '1',
  DO_NOT_TRACK: '1',
  NO_UPDATE_NOTIFIER: '1',
  NPM_CONFIG_UPDATE_NOTIFIER: 'false',
  GEMINI_TELEMETRY_ENABLED: 'false',
  CODEX_DISABLE_UPDATE_CHECK: '1',
  OTEL_SDK_DISABLED: 'true',
};

/** The harnesses this runner has installed, and which of them passed their probe. */
export class AcpHarnesses {
  private readonly images = new Map<string, Promise<string>>();
  readonly probed = new Set<string>();

  constructor(
    readonly installed: InstalledHarness[],
    private readonly docker: Docker | undefined,
    private readonly log: Logger,
  ) {}

  /** The installed harness an Environment's `package` (`name` or `name@version`) names. */
  find(pkg: string): InstalledHarness | undefined {
    const at = pkg.lastIndexOf('@');
    const [name, version] = at > 0 ? [pkg.slice(0, at), pkg.slice(at + 1)] : [pkg, undefined];
    return this.installed.find((h) => h.name === name && (!version || h.version === version) && this.probed.has(h.id));
  }

  /** The image a Session of this harness starts from (the harness layer over `base`). */
  imageFor(base: string, h: InstalledHarness): Promise<string> {
    if (!this.docker) return Promise.resolve(base);
    const key = `${base}\0${h.id}`;
    let p = this.images.get(key);
    if (!p) {
      p = ensureHarnessImage(this.docker, base, h, this.log);
      p.catch(() => this.images.delete(key));
      this.images.set(key, p);
    }
    return p;
  }

  /** What the capabilities report (probed harnesses only). */
  report(): { package: string; version: string; harness_release_digest: string }[] {
    return this.installed.filter((h) => this.probed.has(h.id)).map((h) => ({ package: h.name, version: h.version, harness_release_digest: h.digest }));
  }

  /**
   * Starts each harness's first command in a throwaway sandbox of its image and asks ACP
   * `initialize`; only those that answer are claimed.
   */
  async probe(driver: SandboxDriver, baseImage: string, initialize: (driver: SandboxDriver, sandbox: Sandbox, argv: string[]) => Promise<void>): Promise<void> {
    for (const h of this.installed) {
      const command = Object.keys(h.bins)[0];
      const started = Date.now();
      const id = `acp-probe-${randomBytes(6).toString('hex')}`;
      try {
        if (!command) throw new Error('the package has no bin command');
        const image = driver.name === 'docker' ? await this.imageFor(baseImage, h) : baseImage;
        const sandbox = await driver.ensure({ id }, { image, network_mode: driver.name === 'docker' ? 'none' : 'host', memory_mib: 512, cpu_millis: 1000 });
        await initialize(driver, sandbox, harnessArgv(h, command, driver.name) ?? []);
        this.probed.add(h.id);
        this.log.info({ harness: `${h.name}@${h.version}`, digest: h.digest, ms: Date.now() - started }, 'ACP harness verified');
      } catch (err) {
        this.log.warn({ harness: h.spec, err: err instanceof Error ? err.message : String(err) }, 'ACP harness unavailable');
      } finally {
        await driver.destroy(id).catch(() => undefined);
      }
    }
  }
}
