/**
 * The `docker` sandbox driver: one container per Session (retention `durable`), secure by
 * default — no network, non-root, every capability dropped, no-new-privileges, read-only root,
 * memory/cpu/pids limits — with the workspace on a labelled named volume so that it outlives a
 * container restart. Commands run through `docker exec` under a wrapper that puts them in their
 * own process group and records its id, so an interrupt or timeout kills the whole tree.
 */
import { randomBytes } from 'node:crypto';
import { PassThrough } from 'node:stream';
import Docker from 'dockerode';
import { createLogger, type Logger } from '@agentplane/core';
import { SANDBOX_LABELS, SANDBOX_SCOPE_ENV, attributionLabels, canaryLabels, type SandboxAttribution } from '@agentplane/sandbox';
import { ensureSandboxImage, loadManifest } from './image.js';
import { browserRepository, ensureBrowserImage } from './browser-image.js';
import { BrowserProbe, type BrowserVerdict } from './browser-probe.js';
import { TierProbe, type IsolationTier, type TierVerdict } from './tiers.js';
import { CappedBuffer, runawayBytes, runawayNote, sleep, withNote, withTimeout } from './output.js';
import { DISK_CHECK_MS, DiskGuard, diskLowNote, type DiskLow } from './disk-guard.js';
import { createTar, type TarEntry } from './tar.js';
import { demuxHeld } from './demux.js';
import { EGRESS_PROXY_ENV, EGRESS_PROXY_PORT, EgressTunnel, RELAY_SCRIPT, RelayEnded, relayReady, type EgressDecision } from './egress.js';
import {
  EXEC_DEFAULTS,
  SandboxError,
  type Command,
  type ComputeUsage,
  type DriverCapabilities,
  type ExecOptions,
  type ExecResult,
  type ReapOptions,
  type RuntimeAssurance,
  type Sandbox,
  type SandboxDriver,
  type SandboxEnvironment,
  type SandboxProcess,
  type SandboxSession,
  type SpawnOptions,
} from './types.js';

export interface DockerDriverOptions {
  runnerId: string;
  docker?: Docker;
  /** Image used when the Environment names none. */
  defaultImage?: string;
  /** Build the default image when it is missing. Default true. */
  buildDefaultImage?: boolean;
  /** Bound on creating and starting a sandbox. Default 30 s. */
  startTimeoutMs?: number;
  /** Bound on killing a command's process tree before the container itself is killed. Default 3 s. */
  cancelTimeoutMs?: number;
  logger?: Logger;
  /**
   * Who these sandboxes belong to (labels). The scope defaults to $AGENTPLANE_SANDBOX_SCOPE so that
   * every sandbox of a scoped process tree carries it.
   */
  attribution?: SandboxAttribution;
  /** Isolation tiers this runner may offer (default: every tier whose canary passes). */
  tiers?: readonly IsolationTier[];
  /**
   * Offer browser observation: sandboxes of browser Environments run this image (default
   * `<repository>-browser:latest`, built offline from the host's Chromium when missing).
   * Undefined: no browser; `browser_observation` is never claimed.
   */
  browserImage?: string;
  /**
   * MiB kept free on the file system of the engine's data root: a running command is ended once
   * the free space is under it (docs/SANDBOX.md, "Disk"). 0 turns this off. Default: a twentieth
   * of the file system, at least 256 MiB and at most 2 GiB.
   */
  diskReserveMib?: number;
  /** Egress of `allowlist` sandboxes (docs/SANDBOX.md, "Egress allowlist"). */
  egress?: {
    /** Connections may reach private and reserved ranges, loopback included. Default false. */
    allowPrivate?: boolean;
    /** Each connection's decision (metrics). */
    onDecision?: (decision: EgressDecision) => void;
  };
}

/** RLIMIT_FSIZE of a sandbox's processes: the Environment's `disk_mib`, in bytes. */
function fileBytes(environment: SandboxEnvironment): number {
  return (environment.disk_mib ?? SANDBOX_DEFAULTS.disk_mib) * 1024 * 1024;
}

export const SANDBOX_DEFAULTS = {
  cpu_millis: 1000,
  memory_mib: 1024,
  pids_limit: 256,
  /** The most one file may hold (RLIMIT_FSIZE), when the Environment names no `disk_mib`. */
  disk_mib: 4096,
  tmp_mib: 256,
  home_mib: 64,
  shm_mib: 64,
  uid: 10001,
  gid: 10001,
  workspace: '/workspace',
  home: '/home/agent',
} as const;

/**
 * What the tier canary runs: commands every Run relies on, each of which has failed under some
 * runtime while `exit 0` passed (old runsc releases refuse the statx flags coreutils' `ls` and
 * `stat` pass), and a write to and walk of the workspace volume.
 */
export const CANARY_STEPS: readonly string[] = [
  'ls /',
  'stat /',
  `touch ${SANDBOX_DEFAULTS.workspace}/.agentplane-canary`,
  `find ${SANDBOX_DEFAULTS.workspace}`,
];

/** The canary's script: runs each step; the first that fails writes its command, then its stderr, and exits 3. */
export function canaryScript(steps: readonly string[] = CANARY_STEPS): string {
  return steps.map((step) => `if ! err=$(${step} 2>&1 >/dev/null); then printf '%s\\n%s\\n' '${step}' "$err" >&2; exit 3; fi`).join('\n');
}

/**
 * The tmpfs sizes of `/tmp`, the home directory and `/dev/shm` for a memory limit. Their pages count against
 * the sandbox's memory and cannot be reclaimed: were they as large as the limit, a command that
 * fills `/tmp` would leave no memory to start any other (not even `rm`), until the container is
 * stopped. At most a quarter, a sixteenth and a sixteenth of the limit, a full `/tmp` is a write
 * that fails with "No space left on device" and the sandbox goes on.
 */
export function scratchSizes(memoryMib: number, tmpMib: number = SANDBOX_DEFAULTS.tmp_mib): { tmpMib: number; homeMib: number; shmMib: number } {
  return {
    tmpMib: Math.max(1, Math.min(tmpMib, Math.floor(memoryMib / 4))),
    homeMib: Math.max(1, Math.min(SANDBOX_DEFAULTS.home_mib, Math.floor(memoryMib / 16))),
    // /dev/shm is a tmpfs too (Docker's default 64 MiB, as large as the smallest memory limit).
    shmMib: Math.max(1, Math.min(SANDBOX_DEFAULTS.shm_mib, Math.floor(memoryMib / 16))),
  };
}

/** Runs `"$@"` as the leader of a new process group whose id is recorded in a pid file. */
const WRAPPER = 'f=/tmp/.agentplane-exec-$1; shift; echo $$ > "$f"; "$@"; rc=$?; rm -f "$f"; exit $rc';
const KILLER =
  'f=/tmp/.agentplane-exec-$1; for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do [ -s "$f" ] && break; sleep 0.05; done; ' +
  'pg=$(cat "$f" 2>/dev/null); [ -n "$pg" ] && kill -KILL -- "-$pg" 2>/dev/null; rm -f "$f"; exit 0';

/** How long `lost` waits, by default, for a container that still reads `running` to show its removal. */
const LOST_GRACE_MS = 2_000;

interface Tracked {
  sandbox: Sandbox;
  container: Docker.Container;
  oomKills: number;
  /** An `allowlist` sandbox's egress: its hosts and the relay's tunnel (started again when it ended). */
  egress?: { hosts: readonly string[]; tunnel: EgressTunnel | undefined; starting: Promise<void> | undefined };
}

/** How long a relay has to answer `ready`, and a ping before each command. */
const RELAY_START_MS = 10_000;
const RELAY_PING_MS = 2_000;

function statusCode(err: unknown): number | undefined {
  return (err as { statusCode?: number } | null)?.statusCode;
}

/**
 * The processes the engine needs free in a container to start an exec (runc's init, its threads,
 * the command): a sandbox with fewer left than this below its pids limit cannot start a command
 * (seen: 253 of 256 held, every exec refused).
 */
const EXEC_PROCESS_HEADROOM = 8;

export class DockerDriver implements SandboxDriver {
  readonly name = 'docker' as const;
  readonly tier = 'container' as const;
  readonly docker: Docker;
  private readonly runnerId: string;
  private readonly defaultImage: string;
  private readonly buildDefaultImage: boolean;
  private readonly startTimeoutMs: number;
  private readonly cancelTimeoutMs: number;
  private readonly log: Logger;
  private readonly extraLabels: Record<string, string>;
  private readonly live = new Map<string, Tracked>();
  private readonly starting = new Map<string, Promise<Sandbox>>();
  private readonly tierProbe: TierProbe;
  /** The browser variant's image, when this runner offers a browser. */
  readonly browserImage: string | undefined;
  private readonly browserProbe: BrowserProbe | undefined;
  private readonly egressOptions: NonNullable<DockerDriverOptions['egress']>;
  private readonly disk: DiskGuard;

  constructor(options: DockerDriverOptions) {
    this.egressOptions = options.egress ?? {};
    this.runnerId = options.runnerId;
    this.docker = options.docker ?? new Docker();
    this.defaultImage = options.defaultImage ?? `${loadManifest().repository}:latest`;
    this.buildDefaultImage = options.buildDefaultImage ?? true;
    this.startTimeoutMs = options.startTimeoutMs ?? 30_000;
    this.cancelTimeoutMs = options.cancelTimeoutMs ?? 3_000;
    this.log = options.logger ?? createLogger({ name: 'sandbox', level: 'warn' });
    this.disk = new DiskGuard(async () => (await this.docker.info() as { DockerRootDir?: string }).DockerRootDir, this.log, options.diskReserveMib);
    const scope = options.attribution?.scope ?? (process.env[SANDBOX_SCOPE_ENV] || undefined);
    this.extraLabels = attributionLabels({ ...options.attribution, ...(scope ? { scope } : {}) });
    this.tierProbe = new TierProbe(
      this.docker,
      () => this.resolveImage({}).catch(() => undefined),
      (runtime) => this.canary(runtime),
      options.tiers,
    );
    this.browserImage = options.browserImage;
    this.browserProbe = options.browserImage
      // Browser Environments run under `container` only (docs/SANDBOX.md): that tier's canary decides.
      ? new BrowserProbe(this.docker, () => this.resolveImage({ browser: true }).catch(() => undefined), this, async () => {
        const verdicts = this.tierProbe.last().length > 0 ? this.tierProbe.last() : await this.verifyTiers();
        return verdicts.filter((v) => v.ok && v.tier === 'container').map((v) => v.tier);
      })
      : undefined;
  }

  /**
   * Runs the browser canary again if the browser image changed: a sandbox of that image, with
   * every isolation flag, opens a page, reads its accessibility tree and takes a screenshot.
   */
  async verifyBrowser(): Promise<BrowserVerdict> {
    if (!this.browserProbe) return { accessibility_tree: false, screenshot: false, detail: 'browser observation is not enabled on this runner', ms: 0 };
    return this.browserProbe.verified();
  }

  /** What the last browser canary proved. */
  verifiedBrowser(): { accessibility_tree: boolean; screenshot: boolean } {
    const v = this.browserProbe?.last();
    return { accessibility_tree: v?.accessibility_tree ?? false, screenshot: v?.screenshot ?? false };
  }

  /**
   * Runs the canaries again if the engine's runtimes or the sandbox image changed, and returns
   * every verdict. Only tiers whose canary passed are claimed and served.
   */
  async verifyTiers(): Promise<TierVerdict[]> {
    return this.tierProbe.verified();
  }

  /** Tiers verified by the last probe. */
  verifiedTiers(): IsolationTier[] {
    return this.tierProbe.last().filter((v) => v.ok).map((v) => v.tier);
  }

  /**
   * A throwaway sandbox with every isolation flag and a workspace volume, under `runtime`, in which
   * `CANARY_STEPS` must each succeed through `docker exec`, as a Run's commands do; removed with its
   * volume. Throws naming the first step that failed and what it wrote on stderr.
   */
  private async canary(runtime: string | undefined): Promise<void> {
    const image = await this.resolveImage({});
    const opts = this.containerOptions(`agentplane-canary-${randomBytes(6).toString('hex')}`, image, {}, undefined, runtime);
    const labels = canaryLabels(this.runnerId, this.extraLabels);
    const container = await this.docker.createContainer({
      ...opts, Labels: labels,
      // An anonymous volume, like a Session's workspace volume (seeded from the image, owned by the
      // sandbox user), that goes with the container; labelled as the container is, so one left by
      // a runner killed mid-canary is found (and reaped) as its own.
      HostConfig: { ...opts.HostConfig, AutoRemove: false, Mounts: [{ Type: 'volume', Source: '', Target: SANDBOX_DEFAULTS.workspace, VolumeOptions: { Labels: labels } as Docker.MountSettings['VolumeOptions'] }] }, // (the engine's defaults for the other volume options)
    });
    try {
      await withTimeout(container.start(), this.startTimeoutMs, () => new Error('canary start timed out'));
      const exec = await container.exec({ Cmd: ['/bin/sh', '-c', canaryScript()], AttachStdout: true, AttachStderr: true, User: `${SANDBOX_DEFAULTS.uid}:${SANDBOX_DEFAULTS.gid}` });
      const stream = (await exec.start({ hijack: true, stdin: false })) as NodeJS.ReadableStream;
      const out = new CappedBuffer(4096);
      const err = new CappedBuffer(4096);
      this.docker.modem.demuxStream(stream, out, err);
      const ended = new Promise<void>((resolve) => {
        stream.on('end', resolve);
        stream.on('close', resolve);
        stream.on('error', () => resolve());
      });
      await withTimeout(ended, this.startTimeoutMs, () => new Error('canary commands did not finish'));
      const info = await exec.inspect();
      if (info.ExitCode === 0) return;
      const [step, ...stderr] = err.text().trim().split('\n');
      const known = CANARY_STEPS.includes(step ?? '');
      throw new Error(known
        ? `\`${step}\` failed in the canary: ${stderr.join(' ').trim() || '(no output)'}${runtime ? ` (${runtime} too old?)` : ''}`
        : `the canary commands exited with ${info.ExitCode}: ${err.text().trim().slice(0, 500)}`);
    } finally {
      await container.remove({ force: true, v: true }).catch(() => undefined);
    }
  }

  assurances(): RuntimeAssurance[] {
    return ['network_isolation', 'bounded_start', 'bounded_cancel', 'teardown', 'compute_accounting'];
  }

  capabilities(): DriverCapabilities {
    return {
      drivers: ['docker'],
      launch_kinds: ['sandboxed'],
      tiers: this.verifiedTiers(),
      network_modes: ['none', 'allowlist'],
      retention_modes: ['durable'],
      session_sandbox: true,
      mount_kinds: ['uploaded_project'],
      runtime_assurances: this.assurances(),
    };
  }

  containerName(sessionId: string): string {
    return `agentplane-${this.runnerId}-${sessionId}`.replace(/[^a-zA-Z0-9_.-]/g, '-');
  }

  volumeName(sessionId: string): string {
    return `${this.containerName(sessionId)}-workspace`;
  }

  private labels(sessionId: string): Record<string, string> {
    return { ...this.extraLabels, [SANDBOX_LABELS.managed]: 'true', [SANDBOX_LABELS.runner]: this.runnerId, [SANDBOX_LABELS.session]: sessionId };
  }

  async ensure(session: SandboxSession, environment: SandboxEnvironment = {}): Promise<Sandbox> {
    const sandbox = await this.ensureContainer(session, environment);
    await this.configureEgress(sandbox, environment);
    return sandbox;
  }

  /**
   * An `allowlist` sandbox gets its relay (started, or given the Environment's hosts as they now
   * are); one no longer `allowlist` loses it. A relay that cannot start fails the start: the
   * Run would otherwise go without the network its Environment names.
   */
  private async configureEgress(sandbox: Sandbox, environment: SandboxEnvironment): Promise<void> {
    const tracked = this.container(sandbox);
    if (environment.network_mode !== 'allowlist') {
      const tunnel = tracked.egress?.tunnel;
      tracked.egress = undefined;
      await tunnel?.close();
      return;
    }
    const hosts = [...(environment.allowed_hosts ?? [])];
    if (hosts.length === 0) throw new SandboxError('start_failed', 'an allowlist sandbox needs at least one allowed host');
    tracked.egress ??= { hosts, tunnel: undefined, starting: undefined };
    tracked.egress.hosts = hosts;
    tracked.egress.tunnel?.setAllowed(hosts);
    try {
      await this.egressUp(tracked);
    } catch (err) {
      // An image without `node` would fail the same way on every runner: the Run's fault, not a retry's.
      if (err instanceof RelayEnded && err.nodeMissing) {
        throw new SandboxError('image_unsuitable', `the Environment's image has no \`node\` on its PATH, which network mode 'allowlist' needs to run its egress relay: ${err.output.slice(-500)}`, { cause: err });
      }
      throw new SandboxError('start_failed', `the sandbox's egress proxy did not start: ${(err as Error).message}`, { cause: err });
    }
  }

  /** Starts the sandbox's relay unless it runs (it ends with the container, or when the agent kills it). */
  private async egressUp(tracked: Tracked): Promise<void> {
    const egress = tracked.egress;
    if (!egress) return;
    if (!egress.starting && egress.tunnel?.alive) {
      if (await egress.tunnel.ping(RELAY_PING_MS)) return;
      // Killed a moment ago (its end not seen yet) or stuck: a new one takes its place.
      await egress.tunnel.close();
    }
    egress.starting ??= (async () => {
      // An upstream slower than the sandbox's sends holds the relay, not this process's memory.
      const relay = await this.spawnWrapped(tracked, ['node', '-e', RELAY_SCRIPT, String(EGRESS_PROXY_PORT)], {});
      const tunnel = new EgressTunnel(relay, egress.hosts, {
        allowPrivate: this.egressOptions.allowPrivate ?? false,
        log: this.log.child({ session: tracked.sandbox.sessionId }),
        ...(this.egressOptions.onDecision ? { onDecision: this.egressOptions.onDecision } : {}),
      });
      try {
        await relayReady(relay, RELAY_START_MS);
      } catch (err) {
        await tunnel.close();
        throw err;
      }
      egress.tunnel = tunnel;
    })().finally(() => {
      egress.starting = undefined;
    });
    await egress.starting;
  }

  /** A command's environment in an `allowlist` sandbox: the proxy first (the relay started again if it ended), the caller's after. */
  private async commandEnv(tracked: Tracked, env: Record<string, string> | undefined): Promise<Record<string, string> | undefined> {
    if (!tracked.egress) return env;
    await this.egressUp(tracked).catch((err: unknown) => {
      this.log.warn({ session: tracked.sandbox.sessionId, err: (err as Error).message }, 'the sandbox\'s egress relay did not start again: the command runs without network');
    });
    return { ...EGRESS_PROXY_ENV, ...(env ?? {}) };
  }

  private async ensureContainer(session: SandboxSession, environment: SandboxEnvironment): Promise<Sandbox> {
    const tracked = this.live.get(session.id);
    if (tracked) {
      const running = await tracked.container.inspect().then((i) => i.State.Running, () => false);
      if (running) return { ...tracked.sandbox, reused: true };
      this.live.delete(session.id);
    }
    const pending = this.starting.get(session.id);
    if (pending) return pending;
    const inner = this.start(session, environment);
    const start = withTimeout(inner, this.startTimeoutMs, () =>
      new SandboxError('start_timeout', `sandbox for ${session.id} did not start within ${this.startTimeoutMs} ms`),
    ).catch(async (err: unknown) => {
      if (err instanceof SandboxError && err.reason === 'start_timeout') {
        // The late creation is removed once it settles; the workspace volume stays for a retry.
        const cleanup = (): Promise<void> => {
          this.live.delete(session.id);
          return this.removeContainer(this.containerName(session.id)).catch(() => {});
        };
        void inner.then(cleanup, cleanup);
      }
      throw err;
    });
    this.starting.set(session.id, start);
    try {
      return await start;
    } finally {
      this.starting.delete(session.id);
    }
  }

  private async resolveImage(environment: SandboxEnvironment): Promise<string> {
    if (environment.browser) return this.resolveBrowserImage(environment);
    const image = environment.image ?? this.defaultImage;
    try {
      await this.docker.getImage(image).inspect();
      return image;
    } catch (err) {
      if (statusCode(err) !== 404) throw new SandboxError('docker_unavailable', `docker: ${(err as Error).message}`, { cause: err });
    }
    if (image === this.defaultImage && this.buildDefaultImage) {
      const built = await ensureSandboxImage({ docker: this.docker, onProgress: (line) => this.log.info(line) });
      return built.tag;
    }
    throw new SandboxError('image_missing', `image ${image} is not present on this runner`);
  }

  /**
   * The browser variant replaces the default image only: an Environment naming an image of its
   * own cannot have the browser (its image carries no Chromium this runner verified).
   */
  private async resolveBrowserImage(environment: SandboxEnvironment): Promise<string> {
    const image = this.browserImage;
    if (!image) throw new SandboxError('tier_unsatisfied', 'this runner does not offer browser observation');
    if ((environment.tier ?? 'container') !== 'container') throw new SandboxError('tier_unsatisfied', 'browser Environments run under the container tier only');
    if (environment.image && environment.image !== this.defaultImage && environment.image !== this.defaultImage.replace(/:latest$/, '')) {
      throw new SandboxError('image_missing', `a browser Environment runs the runner's sandbox image (${this.defaultImage}); ${environment.image} has no verified browser`);
    }
    try {
      await this.docker.getImage(image).inspect();
      return image;
    } catch (err) {
      if (statusCode(err) !== 404) throw new SandboxError('docker_unavailable', `docker: ${(err as Error).message}`, { cause: err });
    }
    if (image === `${browserRepository()}:latest`) {
      const built = await ensureBrowserImage({ docker: this.docker, onProgress: (line) => this.log.info(line) });
      return built.tag;
    }
    throw new SandboxError('image_missing', `browser image ${image} is not present on this runner`);
  }

  /** The sandbox container: no network, non-root, read-only root, no capabilities, limits. */
  private containerOptions(name: string, image: string, environment: SandboxEnvironment, volume: string | undefined, runtime: string | undefined): Docker.ContainerCreateOptions & { HostConfig: Docker.HostConfig } {
    const memoryMib = environment.memory_mib ?? SANDBOX_DEFAULTS.memory_mib;
    const memory = memoryMib * 1024 * 1024;
    const { tmpMib, homeMib, shmMib } = scratchSizes(memoryMib, environment.tmp_mib);
    const { uid, gid } = SANDBOX_DEFAULTS;
    const env = Object.entries(environment.env ?? {}).map(([k, v]) => `${k}=${v}`);
    return {
      name,
      Image: image,
      Cmd: ['/usr/bin/sleep', 'infinity'],
      User: `${uid}:${gid}`,
      WorkingDir: SANDBOX_DEFAULTS.workspace,
      Env: [`HOME=${SANDBOX_DEFAULTS.home}`, ...env],
      Hostname: 'sandbox',
      NetworkDisabled: true,
      HostConfig: {
        ...(runtime ? { Runtime: runtime } : {}),
        NetworkMode: 'none',
        CapDrop: ['ALL'],
        SecurityOpt: ['no-new-privileges'],
        ReadonlyRootfs: true,
        Init: true,
        IpcMode: 'private',
        ShmSize: shmMib * 1024 * 1024,
        Privileged: false,
        // Under host memory pressure the kernel picks sandbox processes before the daemon.
        OomScoreAdj: 500,
        Memory: memory,
        MemorySwap: memory,
        NanoCpus: Math.round((environment.cpu_millis ?? SANDBOX_DEFAULTS.cpu_millis) * 1e6),
        PidsLimit: environment.pids_limit ?? SANDBOX_DEFAULTS.pids_limit,
        // No one file past the Environment's disk size (a command that writes without bound gets
        // SIGXFSZ there); the workspace in all is watched through the host's free space.
        Ulimits: [{ Name: 'fsize', Soft: fileBytes(environment), Hard: fileBytes(environment) }],
        Tmpfs: {
          '/tmp': `rw,nosuid,nodev,size=${tmpMib}m,mode=1777`,
          [SANDBOX_DEFAULTS.home]: `rw,nosuid,nodev,size=${homeMib}m,uid=${uid},gid=${gid},mode=0700`,
        },
        Mounts: volume ? [{ Type: 'volume', Source: volume, Target: SANDBOX_DEFAULTS.workspace }] : [],
        RestartPolicy: { Name: 'no' },
        LogConfig: { Type: 'none', Config: {} },
      },
    };
  }

  private async start(session: SandboxSession, environment: SandboxEnvironment): Promise<Sandbox> {
    const name = this.containerName(session.id);
    const image = await this.resolveImage(environment);
    const existing = this.docker.getContainer(name);
    const info = await existing.inspect().catch((err: unknown) => {
      if (statusCode(err) === 404) return undefined;
      throw new SandboxError('docker_unavailable', `docker: ${(err as Error).message}`, { cause: err });
    });
    if (info) {
      const imageId = await this.docker.getImage(image).inspect().then((i) => i.Id);
      if (info.Image === imageId) {
        if (!info.State.Running) await existing.start().catch(() => {});
        const again = await existing.inspect().catch(() => undefined);
        if (again?.State.Running) return this.track(session.id, existing, Date.parse(info.Created), true);
      }
      // Wrong image or unable to run: recreate; the workspace volume keeps the files.
      await this.removeContainer(name);
    }
    const volume = this.volumeName(session.id);
    await this.docker.createVolume({ Name: volume, Labels: this.labels(session.id) });
    const tier = environment.tier ?? 'container';
    let runtime: string | undefined;
    if (tier === 'gvisor') {
      runtime = this.tierProbe.last().find((v) => v.tier === 'gvisor' && v.ok)?.runtime;
      if (!runtime) throw new SandboxError('tier_unsatisfied', 'this runner has no verified gVisor runtime (runsc)');
    }
    let container: Docker.Container;
    try {
      container = await this.docker.createContainer({ ...this.containerOptions(name, image, environment, volume, runtime), Labels: this.labels(session.id) });
    } catch (err) {
      throw new SandboxError('start_failed', `creating the sandbox failed: ${(err as Error).message}`, { cause: err });
    }
    try {
      await container.start();
    } catch (err) {
      await container.remove({ force: true }).catch(() => {});
      throw new SandboxError('start_failed', `starting the sandbox failed: ${(err as Error).message}`, { cause: err });
    }
    return this.track(session.id, container, Date.now(), false);
  }

  private track(sessionId: string, container: Docker.Container, createdAt: number, reused: boolean): Sandbox {
    const sandbox: Sandbox = { sessionId, driver: 'docker', ref: container.id, workspace: SANDBOX_DEFAULTS.workspace, createdAt, reused };
    // An adopted container may carry earlier OOM kills: -1 means "read the counter before trusting it".
    this.live.set(sessionId, { sandbox, container, oomKills: reused ? -1 : 0 });
    return sandbox;
  }

  private container(sandbox: Sandbox): Tracked {
    const tracked = this.live.get(sandbox.sessionId);
    if (!tracked || tracked.sandbox.ref !== sandbox.ref) {
      throw new SandboxError('not_found', `no live sandbox for ${sandbox.sessionId}`);
    }
    return tracked;
  }

  /**
   * Starts `argv` under the process-group wrapper (so a kill takes its whole tree) as a hijacked
   * exec stream. A container found not running (killed to bound a cancel, died) is restarted once,
   * unless the sandbox was suspended or removed meanwhile.
   */
  private async startWrapped(
    tracked: Tracked, sandbox: Sandbox, execId: string, argv: string[], options: { cwd?: string; env?: Record<string, string> }, stdin: boolean,
  ): Promise<{ exec: Docker.Exec; stream: NodeJS.ReadWriteStream }> {
    const createExec = (): Promise<Docker.Exec> =>
      tracked.container.exec({
        Cmd: ['setsid', '-w', 'bash', '-c', WRAPPER, 'agentplane-exec', execId, ...argv],
        AttachStdout: true,
        AttachStderr: true,
        AttachStdin: stdin,
        WorkingDir: options.cwd ?? sandbox.workspace,
        Env: Object.entries(options.env ?? {}).map(([k, v]) => `${k}=${v}`),
      });
    try {
      const exec = await createExec().catch(async (err: unknown) => {
        if (statusCode(err) !== 409) throw err;
        // Suspended or removed since this exec began (a lost lease, an idle sweep, the Session's
        // end): it stays down. Restarting it here would run the command after the lease is gone.
        if (this.live.get(sandbox.sessionId) !== tracked) throw new SandboxError('not_found', `the sandbox of ${sandbox.sessionId} was stopped`);
        this.log.warn({ session: sandbox.sessionId }, 'sandbox container was not running: restarting it');
        await withTimeout(tracked.container.start(), this.startTimeoutMs, () => new Error('restart timeout'));
        tracked.oomKills = -1;
        return createExec();
      });
      const stream = (await exec.start({ hijack: true, stdin })) as NodeJS.ReadWriteStream;
      return { exec, stream };
    } catch (err) {
      if (err instanceof SandboxError) throw err;
      throw new SandboxError('exec_failed', `docker exec failed: ${(err as Error).message}`, { cause: err });
    }
  }

  async exec(sandbox: Sandbox, command: Command, options: ExecOptions = {}): Promise<ExecResult> {
    const env = await this.commandEnv(this.container(sandbox), options.env);
    if (env) options = { ...options, env };
    const first = await this.execOnce(sandbox, command, options);
    if (options.signal?.aborted || !(await this.processLimitExhausted(sandbox, first))) return first;
    // Processes left running by earlier commands hold every process the sandbox may have: nothing
    // starts in it any more (not this command, not a kill), in this Run or the next, until the
    // container stops. It is restarted (the workspace stays) and the command, which never
    // started, runs once more, with what remains of its time.
    const tracked = this.container(sandbox);
    this.log.warn({ session: sandbox.sessionId }, 'the sandbox\'s process limit is exhausted by processes left running: restarting its container');
    await tracked.container.kill({ signal: 'SIGKILL' }).catch(() => undefined);
    await withTimeout(tracked.container.wait({ condition: 'not-running' }), this.cancelTimeoutMs, () => new Error('stop timeout')).catch(() => undefined);
    const timeoutMs = Math.max(1, (options.timeoutMs ?? EXEC_DEFAULTS.timeoutMs) - first.durationMs);
    const again = await this.execOnce(sandbox, command, { ...options, timeoutMs });
    const note = '[the sandbox\'s process limit was exhausted by processes left running: they were stopped and the sandbox restarted; the workspace is kept]';
    return { ...again, stderr: again.stderr ? `${note}\n${again.stderr}` : `${note}\n`, durationMs: first.durationMs + again.durationMs };
  }

  /**
   * Whether a command could not start because the sandbox has no process left to give (its pids
   * limit): the wrapper's own fork failed, or the engine could not start the exec's first process
   * while the container's process count is at its limit. Nothing of the command ran.
   */
  private async processLimitExhausted(sandbox: Sandbox, r: ExecResult): Promise<boolean> {
    if (r.exitCode === 0 || r.timedOut || r.killed) return false;
    if (r.stdout === '' && /^setsid: fork: Resource temporarily unavailable\n?$/.test(r.stderr)) return true;
    // The engine's own failures to start the exec (runc's init could not fork or start a thread).
    const engine = (r.exitCode === 126 && r.stderr === '' && /^OCI runtime exec failed: /.test(r.stdout))
      || (r.stdout === '' && r.stderr.startsWith('runtime/cgo: pthread_create failed: Resource temporarily unavailable\n'));
    if (!engine) return false;
    const tracked = this.live.get(sandbox.sessionId);
    const stats = (await tracked?.container.stats({ stream: false, 'one-shot': true } as { stream: false }).catch(() => undefined)) as { pids_stats?: { current?: number; limit?: number } } | undefined;
    const { current, limit } = stats?.pids_stats ?? {};
    return current !== undefined && limit !== undefined && limit > 0 && current >= limit - EXEC_PROCESS_HEADROOM;
  }

  private async execOnce(sandbox: Sandbox, command: Command, options: ExecOptions): Promise<ExecResult> {
    const tracked = this.container(sandbox);
    const started = Date.now();
    const execId = randomBytes(8).toString('hex');
    const argv = Array.isArray(command) ? command : ['bash', '-c', command.script];
    const timeoutMs = options.timeoutMs ?? EXEC_DEFAULTS.timeoutMs;
    const maxOutput = options.maxOutputBytes ?? EXEC_DEFAULTS.maxOutputBytes;
    const stdout = new CappedBuffer(maxOutput, runawayBytes(maxOutput));
    const stderr = new CappedBuffer(maxOutput, runawayBytes(maxOutput));
    const hasStdin = options.stdin !== undefined;
    if (options.signal?.aborted) {
      return { exitCode: 137, stdout: '', stderr: '', truncated: false, timedOut: false, killed: true, oomKilled: false, durationMs: 0 };
    }

    // Starting the command is bounded too: an engine slow to create or start the exec must not
    // hold the call past its timeout or interrupt. A start that comes later is killed: within the
    // cancel bound before this returns, else whenever it comes.
    const starting = (async () => {
      if (tracked.oomKills < 0) tracked.oomKills = await this.readOomKills(tracked);
      return this.startWrapped(tracked, sandbox, execId, argv, options, hasStdin);
    })();
    const gaveUp = await this.startBound(starting, timeoutMs, options.signal);
    if (gaveUp) {
      const late = starting.then(({ stream }) => {
        stream.resume();
        return this.killTree(tracked, execId, streamEnd(stream), stream);
      }, () => undefined);
      await withTimeout(late, this.cancelTimeoutMs, () => new Error('cancel bound passed')).catch(() => undefined);
      return {
        exitCode: 137, stdout: '', stderr: '', truncated: false, timedOut: gaveUp === 'timeout', killed: gaveUp === 'abort', oomKilled: false,
        durationMs: Date.now() - started,
      };
    }
    const { exec, stream } = await starting;
    this.docker.modem.demuxStream(stream, stdout, stderr);
    const ended = streamEnd(stream);
    if (hasStdin) {
      stream.write(typeof options.stdin === 'string' ? Buffer.from(options.stdin) : (options.stdin as Buffer));
      stream.end();
    }

    let timedOut = false;
    let killed = false;
    let capped = false;
    let diskLow: DiskLow | null = null;
    let killing: Promise<void> | undefined;
    const kill = (why: 'timeout' | 'abort' | 'cap' | 'disk'): void => {
      if (killing) return;
      if (why === 'timeout') timedOut = true;
      else if (why === 'abort') killed = true;
      else if (why === 'cap') capped = true;
      killing = this.killTree(tracked, execId, ended, stream);
    };
    // The host disk under its reserve: the command is ended (one that removes files is done
    // before the first look).
    let over = false;
    const diskTimer = setInterval(() => {
      void this.disk.low().then((low) => {
        if (!low || killing || over) return;
        diskLow = low;
        kill('disk');
      });
    }, DISK_CHECK_MS);
    // Output past the cap is only discarded, and a chatty command (a build, an install) runs on to
    // its end. One that writes without bound (`cat /dev/zero`, `yes`) would burn CPU here and in
    // the sandbox until its timeout: it is ended once a stream passes the runaway bound.
    const onRunaway = (): void => kill('cap');
    stdout.once('runaway', onRunaway);
    stderr.once('runaway', onRunaway);
    const timer = setTimeout(() => kill('timeout'), timeoutMs);
    const onAbort = (): void => kill('abort');
    options.signal?.addEventListener('abort', onAbort, { once: true });
    // An abort that came while the exec was being created and started has fired already: a
    // listener added after it never runs, and the command would run to its own end.
    if (options.signal?.aborted) onAbort();
    try {
      await ended;
    } finally {
      over = true;
      clearTimeout(timer);
      clearInterval(diskTimer);
      options.signal?.removeEventListener('abort', onAbort);
    }
    if (killing) await killing;

    let exitCode = 137;
    try {
      const info = await exec.inspect();
      if (typeof info.ExitCode === 'number' && !info.Running) exitCode = info.ExitCode;
    } catch {
      // The container went away (killed to bound a cancel): report the kill.
    }
    // setsid reports a child that died of a signal on stderr with its own status: normalise to 128+9.
    let errText = stderr.text();
    const setsidNote = /setsid: child \d+ did not exit normally[^\n]*\n?$/;
    if (setsidNote.test(errText)) {
      errText = errText.replace(setsidNote, '');
      exitCode = 137;
    }
    if (timedOut || killed || capped || diskLow) exitCode = 137;
    if (capped) errText = withNote(errText, runawayNote(maxOutput));
    if (diskLow) errText = withNote(errText, diskLowNote(diskLow));
    let oomKilled = false;
    if (exitCode === 137 && !timedOut && !killed && !capped && !diskLow) {
      const count = await this.readOomKills(tracked);
      oomKilled = count > tracked.oomKills;
      tracked.oomKills = Math.max(count, tracked.oomKills);
      // Killed by nothing of this runner nor the kernel: the container may have been removed from
      // outside the runner while the command ran. There is then no result to report (the command
      // did not fail): the caller gets an error, as for an exec that could not start.
      if (!oomKilled && (await this.lost(sandbox))) {
        throw new SandboxError('exec_failed', `the sandbox container of ${sandbox.sessionId} was removed while the command ran`);
      }
    }
    return {
      exitCode,
      stdout: stdout.text(),
      stderr: errText,
      truncated: stdout.truncated || stderr.truncated,
      timedOut,
      killed,
      oomKilled,
      durationMs: Date.now() - started,
    };
  }

  /**
   * Waits for a command's start, at most `timeoutMs` and until `signal` aborts: undefined when it
   * started (or failed to) in time, else what ended the wait.
   */
  private async startBound(starting: Promise<unknown>, timeoutMs: number, signal: AbortSignal | undefined): Promise<'timeout' | 'abort' | undefined> {
    let timer: NodeJS.Timeout | undefined;
    let onAbort: (() => void) | undefined;
    try {
      return await Promise.race([
        starting.then(() => undefined, () => undefined),
        new Promise<'timeout'>((resolve) => {
          timer = setTimeout(() => resolve('timeout'), timeoutMs);
        }),
        new Promise<'abort'>((resolve) => {
          onAbort = () => resolve('abort');
          signal?.addEventListener('abort', onAbort, { once: true });
        }),
      ]);
    } finally {
      clearTimeout(timer);
      if (onAbort) signal?.removeEventListener('abort', onAbort);
    }
  }

  /**
   * Starts a command under the same process-group wrapper as `exec`, attached with stdin open
   * (a hijacked exec stream): the caller writes its stdin and reads stdout and stderr as they
   * come. `kill()` takes the process group down, bounded like a cancel.
   */
  async spawn(sandbox: Sandbox, command: Command, options: SpawnOptions = {}): Promise<SandboxProcess> {
    const tracked = this.container(sandbox);
    const argv = Array.isArray(command) ? command : ['bash', '-c', command.script];
    const env = await this.commandEnv(tracked, options.env);
    return this.spawnWrapped(tracked, argv, env ? { ...options, env } : options);
  }

  /**
   * Output the reader does not take holds the command back (`demuxHeld`) instead of piling up
   * here: the reader reads both streams. Once killed, what nobody reads is dropped, so the
   * command's end is seen however its reader left its streams.
   */
  private async spawnWrapped(tracked: Tracked, argv: string[], options: SpawnOptions): Promise<SandboxProcess> {
    const execId = randomBytes(8).toString('hex');
    const { exec, stream } = await this.startWrapped(tracked, tracked.sandbox, execId, argv, options, true);
    const stdout = new PassThrough();
    const stderr = new PassThrough();
    const demux = demuxHeld(stream, stdout, stderr);
    const stdin = new PassThrough();
    // Ending stdin half-closes the exec stream: the command reads end of file.
    stdin.pipe(stream as unknown as NodeJS.WritableStream);
    stdin.on('error', () => {});
    const ended = streamEnd(stream).then(() => {
      stdout.end();
      stderr.end();
    });
    let killing: Promise<void> | undefined;
    const result = ended.then(async () => {
      if (killing) await killing;
      let exitCode = 137;
      try {
        const info = await exec.inspect();
        if (typeof info.ExitCode === 'number' && !info.Running) exitCode = info.ExitCode;
      } catch {
        // The container went away (killed to bound a cancel).
      }
      return { exitCode: killing ? 137 : exitCode, killed: killing !== undefined };
    });
    return {
      stdin,
      stdout,
      stderr,
      wait: () => result,
      kill: async () => {
        demux.release();
        killing ??= this.killTree(tracked, execId, ended, stream);
        await killing;
        await result;
      },
    };
  }

  /**
   * Kills the command's process group through a second exec; when that does not end the command
   * within the cancel bound (the pid file was removed, dockerd hangs), the container is killed.
   */
  private async killTree(tracked: Tracked, execId: string, ended: Promise<void>, stream: NodeJS.ReadWriteStream): Promise<void> {
    const deadline = this.cancelTimeoutMs;
    const attempt = (async () => {
      const killer = await tracked.container.exec({ Cmd: ['bash', '-c', KILLER, 'agentplane-kill', execId], AttachStdout: true, AttachStderr: true });
      const s = (await killer.start({ hijack: true, stdin: false })) as NodeJS.ReadableStream;
      s.resume();
      await new Promise<void>((resolve) => {
        s.on('end', resolve);
        s.on('close', resolve);
        s.on('error', () => resolve());
      });
      await ended;
    })();
    try {
      await withTimeout(attempt, deadline, () => new Error('cancel bound passed'));
    } catch (err) {
      this.log.warn({ session: tracked.sandbox.sessionId, err: (err as Error).message }, 'killing the sandbox container to bound a cancel');
      await tracked.container.kill({ signal: 'SIGKILL' }).catch(() => {});
      (stream as unknown as { destroy?: () => void }).destroy?.();
      // The next exec (or ensure) restarts the container; the workspace volume is intact.
    }
  }

  private async readOomKills(tracked: Tracked): Promise<number> {
    const script = 'cat /sys/fs/cgroup/memory/memory.oom_control 2>/dev/null || cat /sys/fs/cgroup/memory.events 2>/dev/null';
    try {
      const exec = await tracked.container.exec({ Cmd: ['bash', '-c', script], AttachStdout: true, AttachStderr: true });
      const stream = (await exec.start({ hijack: true, stdin: false })) as NodeJS.ReadableStream;
      const out = new CappedBuffer(8192);
      const err = new CappedBuffer(8192);
      this.docker.modem.demuxStream(stream, out, err);
      await new Promise<void>((resolve) => {
        stream.on('end', resolve);
        stream.on('close', resolve);
        stream.on('error', () => resolve());
      });
      const match = /oom_kill\s+(\d+)/.exec(out.text());
      return match?.[1] ? Number(match[1]) : 0;
    } catch {
      return 0;
    }
  }

  async writeFiles(sandbox: Sandbox, files: Array<{ path: string; data: Buffer; mode?: number; readOnly?: boolean }>): Promise<void> {
    const tracked = this.container(sandbox);
    const { uid, gid } = SANDBOX_DEFAULTS;
    const dirs = new Set<string>();
    const entries: TarEntry[] = [];
    // Directories any writable file needs stay the sandbox user's; the rest of a read-only tree is root's.
    const writableDirs = new Set<string>();
    for (const file of files) {
      if (file.readOnly) continue;
      const parts = normaliseRelative(file.path).split('/');
      for (let i = 1; i < parts.length; i++) writableDirs.add(parts.slice(0, i).join('/'));
    }
    for (const file of files) {
      const rel = normaliseRelative(file.path);
      const parts = rel.split('/');
      for (let i = 1; i < parts.length; i++) {
        const dir = parts.slice(0, i).join('/');
        if (!dirs.has(dir)) {
          dirs.add(dir);
          const locked = file.readOnly === true && !writableDirs.has(dir) && i > 1;
          entries.push(locked ? { type: 'dir', path: dir, mode: 0o555, uid: 0, gid: 0 } : { type: 'dir', path: dir, mode: 0o755, uid, gid });
        }
      }
      entries.push(file.readOnly
        ? { type: 'file', path: rel, data: file.data, mode: 0o444, uid: 0, gid: 0 }
        : { type: 'file', path: rel, data: file.data, mode: file.mode ?? 0o644, uid, gid });
    }
    try {
      await tracked.container.putArchive(createTar(entries), { path: sandbox.workspace });
    } catch (err) {
      throw new SandboxError('exec_failed', `copying files into the sandbox failed: ${(err as Error).message}`, { cause: err });
    }
  }

  async usage(sandbox: Sandbox): Promise<ComputeUsage | undefined> {
    const tracked = this.live.get(sandbox.sessionId);
    if (!tracked) return undefined;
    try {
      const stats = (await tracked.container.stats({ stream: false, 'one-shot': true } as { stream: false })) as unknown as {
        cpu_stats?: { cpu_usage?: { total_usage?: number } };
        memory_stats?: { max_usage?: number; usage?: number };
      };
      return {
        cpu_nanos: stats.cpu_stats?.cpu_usage?.total_usage ?? 0,
        memory_peak_bytes: stats.memory_stats?.max_usage ?? stats.memory_stats?.usage ?? 0,
      };
    } catch {
      return undefined;
    }
  }

  private async removeContainer(nameOrId: string): Promise<void> {
    try {
      await this.docker.getContainer(nameOrId).remove({ force: true, v: true });
    } catch (err) {
      if (statusCode(err) !== 404 && statusCode(err) !== 409) throw err;
    }
  }

  private async removeVolume(name: string): Promise<void> {
    for (let attempt = 0; attempt < 5; attempt++) {
      try {
        await this.docker.getVolume(name).remove({ force: true });
        return;
      } catch (err) {
        if (statusCode(err) === 404) return;
        if (statusCode(err) !== 409 || attempt === 4) throw err;
        await sleep(100); // still in use while the container is being removed
      }
    }
  }

  async destroy(sessionId: string): Promise<void> {
    this.live.delete(sessionId);
    // The volume is tried even when removing the container failed: that failure may have left no
    // container behind, and the workspace would then stay forever. The first failure is still
    // thrown: the caller keeps the sandbox and tries again.
    const container = await this.removeContainer(this.containerName(sessionId)).then(() => undefined, (err: unknown) => ({ err }));
    const volume = await this.removeVolume(this.volumeName(sessionId)).then(() => undefined, (err: unknown) => ({ err }));
    const failed = container ?? volume;
    if (failed) throw failed.err;
  }

  async suspend(sessionId: string): Promise<void> {
    this.live.delete(sessionId);
    const container = this.docker.getContainer(this.containerName(sessionId));
    try {
      await container.kill({ signal: 'SIGKILL' });
    } catch (err) {
      if (statusCode(err) !== 404 && statusCode(err) !== 409) throw err;
      return;
    }
    // The kill is asynchronous: an `ensure` right after must not find it still running and keep it.
    await withTimeout(container.wait({ condition: 'not-running' }), this.cancelTimeoutMs, () => new Error('stop timeout')).catch(() => undefined);
  }

  async lost(sandbox: Sandbox, graceMs: number = LOST_GRACE_MS): Promise<boolean> {
    const tracked = this.live.get(sandbox.sessionId);
    // Suspended or removed by this runner (a lost lease, the Session's end): not lost.
    if (!tracked || tracked.sandbox.ref !== sandbox.ref) return false;
    // A forced removal kills the container's processes first and shows as `removing` only once the
    // engine has seen it stop: a command it cut off can end while the container still reads
    // `running`. A container that keeps running for the grace is there.
    const deadline = Date.now() + graceMs;
    for (;;) {
      const info = await tracked.container.inspect().catch(() => undefined);
      if (!info) return true;
      if (info.State.Status === 'removing' || info.State.Status === 'dead') return true;
      if (!info.State.Running || Date.now() >= deadline) return false;
      await sleep(50);
    }
  }

  async sandboxSessions(runnerId: string): Promise<string[]> {
    const filters = JSON.stringify({ label: [`${SANDBOX_LABELS.managed}=true`, `${SANDBOX_LABELS.runner}=${runnerId}`] });
    const [containers, { Volumes }] = await Promise.all([this.docker.listContainers({ all: true, filters }), this.docker.listVolumes({ filters })]);
    const sessions = new Set<string>();
    for (const c of containers) if (c.Labels[SANDBOX_LABELS.session]) sessions.add(c.Labels[SANDBOX_LABELS.session] as string);
    for (const v of Volumes ?? []) if (v.Labels?.[SANDBOX_LABELS.session]) sessions.add(v.Labels[SANDBOX_LABELS.session] as string);
    return [...sessions];
  }

  async reapOrphans(runnerId: string, keepSessionIds: Iterable<string>, options: ReapOptions = {}): Promise<string[]> {
    const keep = new Set(keepSessionIds);
    const keepWorkspaces = new Set(options.keepWorkspacesOf ?? []);
    const filters = { label: [`${SANDBOX_LABELS.managed}=true`, `${SANDBOX_LABELS.runner}=${runnerId}`] };
    const reaped = new Set<string>();
    const containers = await this.docker.listContainers({ all: true, filters: JSON.stringify(filters) });
    for (const c of containers) {
      const session = c.Labels[SANDBOX_LABELS.session] ?? '';
      if (keep.has(session)) continue;
      // One container that cannot go now does not keep the others (or the caller's start) back.
      const removed = await this.removeContainer(c.Id).then(() => true, (err: unknown) => {
        this.log.warn({ container: c.Id, err: (err as Error).message }, 'container not reaped');
        return false;
      });
      if (!removed) continue;
      if (runnerId === this.runnerId) this.live.delete(session);
      // A canary has no Session.
      if (session) reaped.add(session);
    }
    const { Volumes } = await this.docker.listVolumes({ filters: JSON.stringify(filters) });
    for (const v of Volumes ?? []) {
      const session = v.Labels?.[SANDBOX_LABELS.session] ?? '';
      if (keep.has(session) || keepWorkspaces.has(session)) continue;
      await this.removeVolume(v.Name).catch((err: unknown) => this.log.warn({ volume: v.Name, err: (err as Error).message }, 'volume not reaped'));
      reaped.add(session);
    }
    // `sandboxes_of`, not `runner`: the daemon's logger already names this runner as `runner`,
    // and the reaped sandboxes may be another (gone) runner's.
    if (reaped.size > 0) this.log.info({ sandboxes_of: runnerId, sessions: [...reaped] }, 'reaped orphan sandboxes');
    return [...reaped];
  }
}

/** Resolves when an exec stream has ended, closed or failed. */
function streamEnd(stream: NodeJS.ReadableStream): Promise<void> {
  return new Promise<void>((resolve) => {
    stream.on('end', resolve);
    stream.on('close', resolve);
    stream.on('error', () => resolve());
  });
}

/** A workspace-relative path without `..` escapes. */
export function normaliseRelative(path: string): string {
  const parts: string[] = [];
  for (const part of path.replace(/^\/+/, '').split('/')) {
    if (part === '' || part === '.') continue;
    if (part === '..') throw new SandboxError('invalid_path', `path escapes the workspace: ${path}`);
    // A NUL ends a name where an archive header and the kernel read it (`..\0` is `..`).
    if (part.includes('\0')) throw new SandboxError('invalid_path', `a NUL is no part of a path: ${JSON.stringify(path)}`);
    parts.push(part);
  }
  if (parts.length === 0) throw new SandboxError('invalid_path', `empty path: ${path}`);
  return parts.join('/');
}
