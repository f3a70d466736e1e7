/**
 * The daemon's sandboxes: the driver chosen at start (Docker when the engine answers, else the
 * unisolated process driver, unless `--require-docker`), its manager, executor, verified tiers
 * and reaper. A daemon that started on the process driver keeps trying Docker with backoff and,
 * once the engine answers, switches to the container driver and reports its new capabilities.
 */
import { join } from 'node:path';
import type Docker from 'dockerode';
import { backoffDelay, type Logger } from '@agentplane/core';
import { probeInitialize } from './acp/client.js';
import { AcpHarnesses, installHarness, type InstalledHarness } from './acp/install.js';
import type { LeaseExecutor, RunnerAgent } from './agent.js';
import type { RunnerCredentialFile } from '@agentplane/protocol';
import type { DaemonConfig } from './config.js';
import { firstWilling, noopExecutor, turnExecutor } from './executors/index.js';
import type { RunnerMetrics } from './metrics.js';
import { dockerAvailable, SandboxReaper } from '@agentplane/sandbox';
import { DockerDriver, ensureSandboxImageIfDocker, loadManifest, SandboxManager, selectDriver } from './sandbox/index.js';
import type { SandboxDriver } from './sandbox/types.js';
import type { EgressDecision } from './sandbox/egress.js';
import { removeStaleCheckouts } from './sandbox/repository.js';

/** Docker did not answer at start and the process driver is refused (`--require-docker`). */
export class DockerUnavailableError extends Error {}

/** A startup step: rejects at once when the startup is aborted (a signal), whatever the step is doing. */
export type Step = <T>(p: Promise<T>) => Promise<T>;
const direct: Step = (p) => p;

export interface DaemonSandboxesOptions {
  config: DaemonConfig;
  cred: RunnerCredentialFile;
  docker: Docker;
  log: Logger;
  agent: RunnerAgent;
  metrics: RunnerMetrics;
}

async function prepareAcpHarnesses(config: DaemonConfig, driver: SandboxDriver, docker: Docker | undefined, log: Logger): Promise<AcpHarnesses> {
  const installed: InstalledHarness[] = [];
  for (const spec of config.acpHarnesses) {
    try {
      installed.push(await installHarness(spec, join(config.configDir, 'acp'), log));
    } catch (err) {
      log.warn({ harness: spec, err: err instanceof Error ? err.message : String(err) }, 'ACP harness could not be installed');
    }
  }
  const acp = new AcpHarnesses(installed, docker, log);
  await acp.probe(driver, config.sandboxImage, (d, sandbox, argv) => probeInitialize(d, sandbox, argv));
  return acp;
}

export class DaemonSandboxes {
  private current: SandboxDriver | undefined;
  private readonly managers: SandboxManager[] = [];
  /** Turn executors, the newest driver's first; the noop executor comes after them. */
  private readonly executors: LeaseExecutor[] = [];
  private reaper: SandboxReaper | undefined;
  private retryTimer: NodeJS.Timeout | undefined;
  private switching: Promise<void> | null = null;
  private stopped = false;

  constructor(private readonly o: DaemonSandboxesOptions) {}

  /** The driver sandboxes are made with now; null until the startup chose one. */
  get driver(): 'docker' | 'process' | null {
    return this.current?.name ?? null;
  }

  /**
   * Startup: the sandbox image (built offline when missing), the driver, the sandboxes an earlier
   * life left, the ACP harnesses, the tier canaries. Throws DockerUnavailableError when Docker does
   * not answer and the process driver is refused.
   */
  async start(step: Step): Promise<void> {
    const { config, log } = this.o;
    // Repository checkouts (and their git processes) of a runner process killed mid-fetch.
    const checkouts = await step(removeStaleCheckouts());
    if (checkouts.length > 0) log.info({ checkouts: checkouts.length }, 'removed the repository checkouts of runner processes that died mid-fetch');
    const image = await step(this.ensureImage());
    const driver = await step(this.select(!config.requireDocker));
    if (!driver) {
      throw new DockerUnavailableError(`the Docker engine (${config.dockerSocket ?? 'Docker\'s default socket'}) does not answer, and --require-docker ` +
        '(RUNNER_REQUIRE_DOCKER=true) refuses the unisolated process driver: start Docker (or fix DOCKER_SOCKET), then start the runner again');
    }
    await this.install(driver, step, image);
    if (driver.name === 'process') {
      log.warn({ retry_cap_ms: config.reconnectCapMs }, 'Docker is tried again with backoff: this runner switches to the container driver once it answers');
      this.retryDocker(0);
    }
  }

  /** On the daemon's stop: no more retries; every sandbox's processes stopped (workspaces kept). Returns the workspaces kept. */
  async shutdown(): Promise<number> {
    this.stopped = true;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    await this.switching?.catch(() => undefined);
    this.reaper?.stop();
    let kept = 0;
    for (const m of this.managers) {
      await m.shutdown();
      kept += m.sessions().length;
    }
    return kept;
  }

  /**
   * A stop during the startup: no more retries or sweeps, and nothing asked of Docker (which may
   * be what hangs). Nothing runs yet: the sandboxes an earlier life left were stopped by the
   * startup's reaping, their workspaces kept.
   */
  abandon(): void {
    this.stopped = true;
    if (this.retryTimer) clearTimeout(this.retryTimer);
    this.reaper?.stop();
    for (const m of this.managers) m.stop();
  }

  /** Whether any sandbox manager was set up (the startup got that far). */
  get started(): boolean {
    return this.managers.length > 0;
  }

  private ensureImage(): Promise<string | undefined> {
    const { config, docker, log } = this.o;
    // An image of the operator's own (--image, SANDBOX_IMAGE) is used as it is, never built: one
    // that is missing fails the tier canaries, and the daemon takes no work (said, and /healthz 503).
    if (config.sandboxImage !== `${loadManifest().repository}:latest`) {
      return docker.getImage(config.sandboxImage).inspect().then(() => config.sandboxImage, (err: unknown) => {
        if ((err as { statusCode?: unknown }).statusCode === 404) {
          log.warn({ image: config.sandboxImage }, 'the sandbox image is not present on this machine (pull or load it): no isolation tier can be verified');
        }
        return config.sandboxImage;
      });
    }
    return ensureSandboxImageIfDocker({ docker, onProgress: (line: string) => log.info(line) }).then((i) => i?.latest, (err: unknown) => {
      log.warn({ err: err instanceof Error ? err.message : String(err) }, 'sandbox image could not be built');
      return undefined;
    });
  }

  private select(allowProcess: boolean): Promise<SandboxDriver | undefined> {
    const { config, cred, docker, log } = this.o;
    return selectDriver({
      runnerId: cred.runner_id, dataDir: join(config.configDir, 'sandboxes'), docker, logger: log, allowProcess,
      attribution: { workspaceId: cred.workspace_id, home: config.configDir, ...(config.sandboxScope ? { scope: config.sandboxScope } : {}) },
      ...(config.tiers ? { tiers: config.tiers } : {}),
      ...(config.browserImage ? { browserImage: config.browserImage } : {}),
      defaultImage: config.sandboxImage,
      egress: {
        allowPrivate: config.egressAllowPrivate,
        onDecision: (d: EgressDecision) => this.o.metrics.egressConnections.inc({ outcome: d.outcome }),
      },
    });
  }

  /** Sets up a driver: reaps what an earlier life left, installs harnesses, verifies tiers, then takes work with it. */
  private async install(driver: SandboxDriver, step: Step, image: string | undefined): Promise<void> {
    const { config, cred, docker, log, agent, metrics } = this.o;
    const sandboxes = new SandboxManager({
      driver, runnerId: cred.runner_id, logger: log, idleSuspendMs: config.sandboxIdleSuspendMs, idleExpireMs: config.sandboxIdleExpireMs,
    });
    this.managers.push(sandboxes);
    const reaped = await step(sandboxes.start().catch((err: unknown) => {
      log.warn({ err: err instanceof Error ? err.message : String(err) }, 'could not reap sandboxes of an earlier run');
      return [] as string[];
    }));
    if (reaped.length > 0) log.info({ reaped: reaped.length, kept_workspaces: sandboxes.sessions().length }, 'stopped sandboxes left by an earlier run of this runner');
    // ACP agent harnesses: installed with npm on this machine, layered into the sandbox image, probed.
    const acp = config.acpHarnesses.length > 0 ? await step(prepareAcpHarnesses(config, driver, driver instanceof DockerDriver ? docker : undefined, log)) : undefined;
    if (driver instanceof DockerDriver) {
      // Claim a tier only after a canary sandbox ran under it; re-checked with every capability refresh.
      const verdicts = await step(driver.verifyTiers());
      // A tier that fails its canary is a warning when it was asked for (RUNNER_TIERS) or is the
      // baseline container tier; an optional tier this host cannot give (a runsc too old) is news.
      for (const v of verdicts) {
        const level = v.ok ? 'info' : v.tier === 'container' || config.tiers?.includes(v.tier) ? 'warn' : 'info';
        log[level]({ tier: v.tier, runtime: v.runtime ?? 'default', ms: v.ms, detail: v.detail }, v.ok ? 'isolation tier verified' : `${v.tier} tier not offered: ${v.detail}`);
      }
      agent.tierSource = async () => (await driver.verifyTiers()).filter((v) => v.ok).map((v) => v.tier);
      if (driver.browserImage) {
        // Browser observation is claimed only once a canary browser ran in a sandbox of its image.
        const b = await step(driver.verifyBrowser());
        (b.accessibility_tree && b.screenshot ? log.info : log.warn).call(log, { image: driver.browserImage, ms: b.ms, detail: b.detail }, b.accessibility_tree && b.screenshot ? 'browser observation verified' : 'browser observation unavailable');
        agent.browserSource = async () => {
          const v = await driver.verifyBrowser();
          return { accessibility_tree: v.accessibility_tree, screenshot: v.screenshot };
        };
      }
    }
    if (acp) agent.acpSource = () => ({ driver: driver.name, harnesses: acp.report() });
    // The newest driver takes the offers it can run; the earlier one keeps serving what only it can.
    this.executors.unshift(turnExecutor({ sandboxes, log, baseUrl: cred.base_url, repositoryMaxBytes: config.repositoryMaxBytes, metrics, ...(acp ? { acp } : {}) }));
    agent.executor = firstWilling(...this.executors, noopExecutor);
    this.current = driver;
    agent.processSource = () => this.managers.some((m) => m.driver.name === 'process');
    metrics.sandboxDriver.set({ driver: 'docker' }, driver.name === 'docker' ? 1 : 0);
    metrics.sandboxDriver.set({ driver: 'process' }, driver.name === 'process' ? 1 : 0);
    log.info({ driver: driver.name, tiers: driver.capabilities().tiers, image }, 'sandbox driver ready');
    // Sandboxes of gone runners of this machine (credential deleted or revoked) go after a grace period.
    if (driver.name === 'docker' && !this.reaper) {
      this.reaper = new SandboxReaper({
        docker, scope: config.sandboxScope, selfRunnerId: cred.runner_id, graceMs: config.sandboxReapGraceMs,
        intervalMs: config.sandboxReapIntervalMs, logger: log,
      });
      this.reaper.start();
    }
  }

  private retryDocker(attempt: number): void {
    if (this.stopped) return;
    const { reconnectBaseMs: base, reconnectCapMs: cap } = this.o.config;
    const delay = Math.max(base, backoffDelay(attempt, base, cap));
    this.retryTimer = setTimeout(() => void this.tryDocker(attempt), delay);
    this.retryTimer.unref();
  }

  private async tryDocker(attempt: number): Promise<void> {
    if (this.stopped) return;
    if (!(await dockerAvailable(this.o.docker))) return this.retryDocker(attempt + 1);
    if (this.stopped) return;
    this.o.log.warn('Docker answers now: switching from the process driver to the container driver');
    this.switching = this.switchToDocker();
    try {
      await this.switching;
    } catch (err) {
      this.o.log.warn({ err: err instanceof Error ? err.message : String(err) }, 'could not switch to the container driver; Docker is tried again');
      this.retryDocker(attempt + 1);
    } finally {
      this.switching = null;
    }
  }

  private async switchToDocker(): Promise<void> {
    const image = await this.ensureImage();
    const driver = await this.select(false);
    if (!driver) throw new Error('the Docker engine stopped answering');
    await this.install(driver, direct, image);
    // Hello carried the process driver's capabilities: report the Docker provider now.
    this.o.agent.capabilitiesChanged();
    this.o.log.warn({ driver: driver.name, tiers: driver.capabilities().tiers }, 'switched to the container driver: Docker sandboxes are offered from now on');
  }
}
