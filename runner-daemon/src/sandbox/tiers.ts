/**
 * Isolation tiers of the Docker driver, claimed only once a canary sandbox has run under them
 * the commands a Run relies on (`CANARY_STEPS`: a runtime can start containers and still fail
 * those, like old runsc releases that refuse the statx flags coreutils pass).
 *
 * - `container`: runc (the engine's default runtime): Linux namespaces, cgroups, no capabilities,
 *   seccomp; the sandbox shares the host kernel.
 * - `gvisor`: the `runsc` runtime: the sandbox's system calls are served by gVisor's user-space
 *   kernel, so a kernel exploit inside it meets gVisor, not the host kernel.
 *
 * The engine's runtimes (`docker info` → Runtimes) and the sandbox image are read again whenever
 * the report is refreshed; a change (runsc added or removed, the image rebuilt) runs the canaries
 * again, so the report follows the machine.
 */
import { basename } from 'node:path';
import type Docker from 'dockerode';

export type IsolationTier = 'container' | 'gvisor';

export interface TierVerdict {
  tier: IsolationTier;
  /** The Docker runtime the tier starts sandboxes with (undefined: the engine's default). */
  runtime: string | undefined;
  ok: boolean;
  detail: string;
  ms: number;
}

/** The configured runtime that is gVisor's `runsc`, by name or by its binary's path. */
export function gvisorRuntimeOf(runtimes: Record<string, { path?: string } | undefined>): string | undefined {
  for (const [name, r] of Object.entries(runtimes)) {
    if (name === 'runsc' || (r?.path && basename(r.path) === 'runsc')) return name;
  }
  return undefined;
}

/**
 * Runs one canary: the caller's sandbox container options, with the commands a Run relies on;
 * throws (its message is the verdict's `detail`) when any of them fails.
 */
export type CanaryRun = (runtime: string | undefined) => Promise<void>;

export class TierProbe {
  private verdicts: TierVerdict[] = [];
  private signature = '';
  private running: Promise<TierVerdict[]> | null = null;

  constructor(
    private readonly docker: Docker,
    private readonly image: () => Promise<string | undefined>,
    private readonly canary: CanaryRun,
    /** Tiers the operator lets this runner offer (undefined: every tier the engine can run). */
    private readonly allowed?: readonly IsolationTier[],
  ) {}

  /** The tiers whose canary passed, for the engine's runtimes and image as they are now. */
  async verified(): Promise<TierVerdict[]> {
    if (this.running) return this.running;
    this.running = this.refresh().finally(() => (this.running = null));
    return this.running;
  }

  /** The last verdicts without probing again. */
  last(): TierVerdict[] {
    return this.verdicts;
  }

  private async refresh(): Promise<TierVerdict[]> {
    let runtimes: Record<string, { path?: string }>;
    let imageId: string;
    try {
      const info = (await this.docker.info()) as { Runtimes?: Record<string, { path?: string }> };
      runtimes = info.Runtimes ?? {};
      const image = await this.image();
      imageId = image ? ((await this.docker.getImage(image).inspect()) as { Id: string }).Id : 'none';
    } catch (err) {
      this.verdicts = [];
      this.signature = '';
      void err;
      return this.verdicts;
    }
    const gvisor = gvisorRuntimeOf(runtimes);
    const signature = JSON.stringify({ imageId, gvisor: gvisor ? runtimes[gvisor] : null });
    if (signature === this.signature) return this.verdicts;
    const wanted = ([{ tier: 'container', runtime: undefined }, ...(gvisor ? [{ tier: 'gvisor', runtime: gvisor }] : [])] as { tier: IsolationTier; runtime: string | undefined }[])
      .filter((w) => !this.allowed || this.allowed.includes(w.tier));
    this.verdicts = await Promise.all(wanted.map(async (w) => {
      const started = Date.now();
      try {
        await this.canary(w.runtime);
        return { ...w, ok: true, detail: 'canary sandbox ran', ms: Date.now() - started };
      } catch (err) {
        return { ...w, ok: false, detail: err instanceof Error ? err.message : String(err), ms: Date.now() - started };
      }
    }));
    this.signature = signature;
    return this.verdicts;
  }
}
