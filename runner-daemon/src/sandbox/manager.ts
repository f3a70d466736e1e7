/**
 * The sandbox lifecycle the runner drives from leases: on daemon start, kill what an earlier life
 * left running and adopt the kept workspaces; prepare a Session's sandbox when a lease is accepted
 * (materialising resources before the first Run); stop its processes when its lease is lost or it
 * sits idle; remove it and its workspace when the Session ends (archive, delete) or on idle expiry.
 */
import { createLogger, type Logger } from '@agentplane/core';
import { materializeResources, type MaterializeResult, type ResolvedResource, type ResourceSource } from './resources.js';
import { driverSatisfies, SandboxError, type EnvironmentRequirements, type Sandbox, type SandboxDriver, type SandboxEnvironment, type SandboxSession } from './types.js';

export interface SandboxManagerOptions {
  driver: SandboxDriver;
  runnerId: string;
  /** Stop an idle sandbox's processes (workspace kept) after this long without a Run. Default 10 min; 0 disables. */
  idleSuspendMs?: number;
  /** Remove an idle sandbox and its workspace after this long without a Run. Default 24 h; 0 disables. */
  idleExpireMs?: number;
  /** How often idle sandboxes are checked. Default 30 s. */
  sweepIntervalMs?: number;
  now?: () => number;
  logger?: Logger;
}

interface Entry {
  activeRuns: number;
  lastUsed: number;
  suspended: boolean;
  /**
   * The Session ended: the sandbox is removed once no Run uses it. A removal that failed is
   * retried by the sweep; the entry stays listed (and reported) until one succeeds.
   */
  ended: boolean;
  /** A removal in progress. */
  removing?: Promise<void>;
}

export class SandboxManager {
  readonly driver: SandboxDriver;
  private readonly entries = new Map<string, Entry>();
  private readonly now: () => number;
  private readonly log: Logger;
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly options: SandboxManagerOptions) {
    this.driver = options.driver;
    this.now = options.now ?? Date.now;
    this.log = options.logger ?? createLogger({ name: 'sandbox', level: 'warn' });
  }

  /**
   * At daemon start: stops every sandbox an earlier life of this runner left (no lease survives a
   * restart) but keeps their workspaces, which are adopted as idle: a Session that goes on finds
   * its files, an ended one is released on the first report, a forgotten one expires.
   */
  async start(): Promise<string[]> {
    try {
      const known = await this.driver.sandboxSessions(this.options.runnerId);
      try {
        return await this.driver.reapOrphans(this.options.runnerId, [], { keepWorkspacesOf: known });
      } finally {
        // Even when reaping failed: the kept workspaces are still this runner's to report and expire.
        for (const id of known) if (!this.entries.has(id)) this.entries.set(id, { activeRuns: 0, lastUsed: this.now(), suspended: true, ended: false });
      }
    } finally {
      // Without the sweep nothing idle would ever be suspended, expired or removed again.
      this.armSweep();
    }
  }

  private armSweep(): void {
    const interval = this.options.sweepIntervalMs ?? 30_000;
    if (interval > 0 && !this.timer) {
      this.timer = setInterval(() => {
        this.sweep().catch((err: unknown) => this.log.warn({ err: (err as Error).message }, 'sandbox sweep failed'));
      }, interval);
      this.timer.unref();
    }
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** Sessions whose sandbox or workspace this runner keeps. */
  sessions(): string[] {
    return [...this.entries.keys()];
  }

  /** On a clean daemon stop: no process keeps running; workspaces stay for the Sessions (durable retention). */
  async shutdown(): Promise<void> {
    this.stop();
    for (const id of this.entries.keys()) await this.driver.suspend(id).catch(() => undefined);
  }

  /** Whether this runner's driver may run an Environment (the scheduler should not offer otherwise). */
  eligible(requirements: EnvironmentRequirements): boolean {
    return driverSatisfies(this.driver, requirements);
  }

  /**
   * When a lease is accepted: the Session's sandbox (created or reused), with its resources in the
   * workspace. Pair every call with `runEnded`.
   */
  async prepare(
    session: SandboxSession,
    environment: SandboxEnvironment & { requirements?: EnvironmentRequirements },
    resources: ReadonlyArray<ResourceSource | ResolvedResource> = [],
    signal?: AbortSignal,
  ): Promise<{ sandbox: Sandbox; materialized?: MaterializeResult }> {
    const requirements = environment.requirements ?? { tier: environment.tier, network_mode: environment.network_mode };
    // A driver never verified (a manager used without the daemon's start-up probe) proves its tiers first.
    if (this.driver.verifyTiers && this.driver.capabilities().tiers.length === 0) await this.driver.verifyTiers();
    if (!driverSatisfies(this.driver, requirements)) {
      throw new SandboxError('tier_unsatisfied', `the ${this.driver.name} driver (tier ${this.driver.tier}) cannot run this Environment`);
    }
    // An idle expiry in progress finishes first: its removal must not race this Run's sandbox.
    await this.entries.get(session.id)?.removing?.catch(() => undefined);
    const entry = this.entries.get(session.id) ?? { activeRuns: 0, lastUsed: this.now(), suspended: false, ended: false };
    if (entry.ended) throw new SandboxError('not_found', `session ${session.id} has ended; its sandbox is being removed`);
    this.entries.set(session.id, entry);
    entry.activeRuns += 1;
    entry.lastUsed = this.now();
    try {
      const sandbox = await this.driver.ensure(session, environment);
      entry.suspended = false;
      const materialized = resources.length > 0 ? await materializeResources(this.driver, sandbox, resources, signal ? { signal } : {}) : undefined;
      return { sandbox, ...(materialized ? { materialized } : {}) };
    } catch (err) {
      entry.activeRuns -= 1;
      throw err;
    }
  }

  runEnded(sessionId: string): void {
    const entry = this.entries.get(sessionId);
    if (!entry) return;
    entry.activeRuns = Math.max(0, entry.activeRuns - 1);
    entry.lastUsed = this.now();
    if (entry.ended && entry.activeRuns === 0) {
      this.remove(sessionId, entry).catch((err: unknown) => this.log.warn({ session: sessionId, err: (err as Error).message }, 'sandbox removal failed; retried by the sweep'));
    }
  }

  /**
   * Removes the sandbox and its workspace. The entry goes only once that succeeded: until then
   * the sandbox is still listed in `sessions()` (so reported) and the sweep tries again.
   */
  private remove(sessionId: string, entry: Entry): Promise<void> {
    entry.removing ??= this.driver.destroy(sessionId).then(
      () => {
        if (this.entries.get(sessionId) === entry && entry.activeRuns === 0) this.entries.delete(sessionId);
      },
    ).finally(() => {
      entry.removing = undefined;
    });
    return entry.removing;
  }

  /**
   * The lease was lost (revoked, fenced, not resumed): the Run must stop here. The caller aborts
   * the harness signal; this kills every process in the sandbox at once, so nothing keeps working
   * for a Run another runner may now own. The workspace stays: the Session lives on, and its
   * rescheduled Run may come back here.
   */
  async leaseLost(sessionId: string): Promise<void> {
    const entry = this.entries.get(sessionId);
    if (entry) entry.suspended = true;
    await this.driver.suspend(sessionId);
  }

  /**
   * Session archived or deleted: the sandbox and its workspace go. A Run still using it finishes
   * first (an archived Session's turn under way runs to its end, or until it is interrupted: its
   * commands are not killed under it); no new Run is prepared here meanwhile.
   */
  async sessionEnded(sessionId: string): Promise<void> {
    const entry = this.entries.get(sessionId);
    if (entry && entry.activeRuns > 0) {
      entry.ended = true;
      return;
    }
    const ending = entry ?? { activeRuns: 0, lastUsed: this.now(), suspended: true, ended: true };
    ending.ended = true;
    this.entries.set(sessionId, ending);
    await this.remove(sessionId, ending);
  }

  /**
   * Suspends and expires idle sandboxes, and removes again those of ended Sessions whose removal
   * failed (reported as expired); returns what it did. One sandbox failing does not stop the pass.
   */
  async sweep(): Promise<{ suspended: string[]; expired: string[] }> {
    const suspendAfter = this.options.idleSuspendMs ?? 10 * 60_000;
    const expireAfter = this.options.idleExpireMs ?? 24 * 3600_000;
    const now = this.now();
    const suspended: string[] = [];
    const expired: string[] = [];
    for (const [sessionId, entry] of [...this.entries]) {
      if (entry.activeRuns > 0) continue;
      const idle = now - entry.lastUsed;
      try {
        if (entry.ended || (expireAfter > 0 && idle >= expireAfter)) {
          await this.remove(sessionId, entry);
          expired.push(sessionId);
        } else if (suspendAfter > 0 && idle >= suspendAfter && !entry.suspended) {
          entry.suspended = true;
          await this.driver.suspend(sessionId);
          suspended.push(sessionId);
        }
      } catch (err) {
        this.log.warn({ session: sessionId, err: (err as Error).message }, 'sandbox sweep failed for this sandbox');
      }
    }
    return { suspended, expired };
  }
}
