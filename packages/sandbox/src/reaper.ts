/**
 * Sandboxes and workspace volumes that outlive the runner (or the whole platform) that made them.
 *
 * A runner labels what it creates with its id, its config directory (where its credential lives)
 * and the Workspace that issued the credential. A sandbox of another runner of this machine is
 * reapable when that runner is gone for good: its credential file no longer exists (or now holds
 * another runner: it was re-paired), or the control plane refuses the credential (revoked or
 * unknown). A runner whose control plane cannot be reached is kept: a platform that is merely
 * down keeps its durable workspaces. Sandboxes of this runner itself are not judged here: the
 * control plane answers for their Sessions (`sandboxes.report` → `sandboxes.release`).
 *
 * Only containers and volumes labelled `agentplane.managed=true` in the caller's scope are ever
 * looked at; each is inspected again right before removal and left alone if that label is gone.
 */
import { existsSync, readFileSync } from 'node:fs';
import { hostname } from 'node:os';
import type Docker from 'dockerode';
import type { Logger } from '@agentplane/core';
import { credentialPath } from '@agentplane/protocol';
import { SANDBOX_LABELS } from './labels.js';
import { probeCredential, type CredentialProbe } from './probe.js';

export interface ManagedItem {
  kind: 'container' | 'volume';
  /** Container id or volume name. */
  id: string;
  name: string;
  runner: string;
  session: string;
  workspace: string | null;
  home: string | null;
  host: string | null;
  /** Container state (`running`, `exited`, …); null for volumes. */
  state: string | null;
}

export type RunnerVerdict =
  /** This runner itself: its Sessions are answered by the control plane, not judged here. */
  | 'self'
  /** The credential is still accepted, or its control plane cannot be reached: kept. */
  | 'live'
  | 'unreachable'
  /** No credential file at the labelled home any more, or it now holds another runner. */
  | 'credential_gone'
  /** The control plane refuses the credential (revoked, or unknown to it). */
  | 'credential_revoked'
  /** Made before sandboxes recorded their runner's home: nothing to judge by; kept. */
  | 'unattributed'
  /** A runner of another machine sharing this Docker engine: its home is not ours to read; kept. */
  | 'other_host';

export interface RunnerJudgement {
  runner: string;
  verdict: RunnerVerdict;
  reapable: boolean;
  detail: string;
  home: string | null;
}

export interface ReapPlan {
  scope: string | null;
  runners: RunnerJudgement[];
  /** Items whose runner is gone, with the reason. */
  reapable: Array<ManagedItem & { reason: RunnerVerdict }>;
  /** Items kept (runner live, unreachable, unattributed, or this runner). */
  kept: number;
  /** Every item surveyed (with `items: 'all'`). */
  items?: ManagedItem[];
}

export interface SurveyOptions {
  docker: Docker;
  /** Only items of this scope (label `agentplane.scope`); absent: only items without a scope label. */
  scope?: string | undefined;
}

export interface PlanOptions extends SurveyOptions {
  /** This runner's id: its own items are never judged here. */
  selfRunnerId?: string | undefined;
  /** Credential check (default: a WebSocket upgrade against the credential's control plane). */
  probe?: (baseUrl: string, secret: string) => Promise<CredentialProbe>;
  /** This machine's host name (default `os.hostname()`). */
  host?: string;
  /** Also return every surveyed item in the plan. */
  items?: 'all';
}

const statusCode = (err: unknown): number | undefined => (err as { statusCode?: number } | null)?.statusCode;

function inScope(labels: Record<string, string> | undefined, scope: string | undefined): boolean {
  const own = labels?.[SANDBOX_LABELS.scope];
  return scope ? own === scope : !own;
}

/** Every managed container and volume of the scope on this machine. */
export async function surveyManaged(o: SurveyOptions): Promise<ManagedItem[]> {
  const label = [`${SANDBOX_LABELS.managed}=true`, ...(o.scope ? [`${SANDBOX_LABELS.scope}=${o.scope}`] : [])];
  const filters = JSON.stringify({ label });
  const [containers, { Volumes }] = await Promise.all([o.docker.listContainers({ all: true, filters }), o.docker.listVolumes({ filters })]);
  const items: ManagedItem[] = [];
  for (const c of containers) {
    if (c.Labels[SANDBOX_LABELS.managed] !== 'true' || !inScope(c.Labels, o.scope)) continue;
    items.push({
      kind: 'container', id: c.Id, name: (c.Names[0] ?? c.Id).replace(/^\//, ''), runner: c.Labels[SANDBOX_LABELS.runner] ?? '',
      session: c.Labels[SANDBOX_LABELS.session] ?? '', workspace: c.Labels[SANDBOX_LABELS.workspace] ?? null,
      home: c.Labels[SANDBOX_LABELS.home] ?? null, host: c.Labels[SANDBOX_LABELS.host] ?? null, state: c.State ?? null,
    });
  }
  for (const v of Volumes ?? []) {
    const labels = v.Labels ?? {};
    if (labels[SANDBOX_LABELS.managed] !== 'true' || !inScope(labels, o.scope)) continue;
    items.push({
      kind: 'volume', id: v.Name, name: v.Name, runner: labels[SANDBOX_LABELS.runner] ?? '', session: labels[SANDBOX_LABELS.session] ?? '',
      workspace: labels[SANDBOX_LABELS.workspace] ?? null, home: labels[SANDBOX_LABELS.home] ?? null, host: labels[SANDBOX_LABELS.host] ?? null, state: null,
    });
  }
  return items;
}

interface StoredCredential {
  base_url?: string;
  secret?: string;
  runner_id?: string;
}

async function judge(runner: string, home: string | null, host: string | null, o: PlanOptions): Promise<RunnerJudgement> {
  const base = { runner, home };
  if (o.selfRunnerId && runner === o.selfRunnerId) return { ...base, verdict: 'self', reapable: false, detail: 'this runner' };
  if (!home) return { ...base, verdict: 'unattributed', reapable: false, detail: 'no agentplane.home label (made by an older runner)' };
  const me = o.host ?? hostname();
  if (host !== me) return { ...base, verdict: 'other_host', reapable: false, detail: `made by a runner on host ${host ?? '?'} (this is ${me})` };
  const file = credentialPath(home);
  if (!existsSync(file)) return { ...base, verdict: 'credential_gone', reapable: true, detail: `${file} no longer exists` };
  let cred: StoredCredential;
  try {
    cred = JSON.parse(readFileSync(file, 'utf8')) as StoredCredential;
  } catch (err) {
    return { ...base, verdict: 'unreachable', reapable: false, detail: `${file} unreadable: ${err instanceof Error ? err.message : String(err)}` };
  }
  if (cred.runner_id !== runner) return { ...base, verdict: 'credential_gone', reapable: true, detail: `${file} now holds runner ${cred.runner_id ?? '?'}` };
  if (!cred.base_url || !cred.secret) return { ...base, verdict: 'unreachable', reapable: false, detail: `${file} has no control-plane URL or secret` };
  const probe = await (o.probe ?? probeCredential)(cred.base_url, cred.secret);
  if (probe.verdict === 'rejected') return { ...base, verdict: 'credential_revoked', reapable: true, detail: `${probe.url}: ${probe.detail}` };
  if (probe.verdict === 'accepted') return { ...base, verdict: 'live', reapable: false, detail: `credential accepted by ${probe.url}` };
  return { ...base, verdict: 'unreachable', reapable: false, detail: `${probe.url}: ${probe.detail}` };
}

/** What could be reaped now: the items of runners of this machine that are gone. */
export async function planReap(o: PlanOptions): Promise<ReapPlan> {
  const items = await surveyManaged(o);
  const homes = new Map<string, ManagedItem>();
  for (const i of items) if (!homes.has(i.runner) || (!homes.get(i.runner)?.home && i.home)) homes.set(i.runner, i);
  const runners = await Promise.all([...homes].map(([runner, i]) => judge(runner, i.home, i.host, o)));
  const byRunner = new Map(runners.map((r) => [r.runner, r]));
  const reapable: ReapPlan['reapable'] = [];
  let kept = 0;
  for (const i of items) {
    const j = byRunner.get(i.runner);
    if (j?.reapable) reapable.push({ ...i, reason: j.verdict });
    else kept += 1;
  }
  // Containers before volumes: a volume cannot go while its container exists.
  reapable.sort((a, b) => (a.kind === b.kind ? 0 : a.kind === 'container' ? -1 : 1));
  return { scope: o.scope ?? null, runners, reapable, kept, ...(o.items === 'all' ? { items } : {}) };
}

export interface ReapResult {
  reaped: Array<ManagedItem & { reason: RunnerVerdict }>;
  failed: Array<ManagedItem & { reason: RunnerVerdict; error: string }>;
}

/** Whether the item still exists and still carries the managed label (never touch anything else). */
async function stillManaged(docker: Docker, item: ManagedItem): Promise<boolean> {
  try {
    const labels = item.kind === 'container'
      ? (await docker.getContainer(item.id).inspect()).Config.Labels
      : (await docker.getVolume(item.id).inspect()).Labels;
    return labels?.[SANDBOX_LABELS.managed] === 'true';
  } catch (err) {
    if (statusCode(err) === 404) return false;
    throw err;
  }
}

/**
 * A reaped item's log fields. Not `name` and `runner`: a line's `name` is its logger's and the
 * daemon's logger names its own runner as `runner`, while the item is a gone runner's.
 */
function logged(item: ManagedItem): { kind: ManagedItem['kind']; resource: string; gone_runner: string } {
  return { kind: item.kind, resource: item.name, gone_runner: item.runner };
}

/** Removes planned items (containers first), one log line per reaped item. */
export async function reapItems(docker: Docker, items: ReapPlan['reapable'], log?: Logger): Promise<ReapResult> {
  const out: ReapResult = { reaped: [], failed: [] };
  const ordered = [...items].sort((a, b) => (a.kind === b.kind ? 0 : a.kind === 'container' ? -1 : 1));
  for (const item of ordered) {
    try {
      if (!(await stillManaged(docker, item))) continue;
      if (item.kind === 'container') await docker.getContainer(item.id).remove({ force: true, v: true });
      else await removeVolume(docker, item.id);
      out.reaped.push(item);
      log?.info({ ...logged(item), session: item.session, reason: item.reason }, `reaped the ${item.kind} of a gone runner`);
    } catch (err) {
      if (statusCode(err) === 404) continue;
      const error = err instanceof Error ? err.message : String(err);
      out.failed.push({ ...item, error });
      log?.warn({ ...logged(item), err: error }, `could not reap the ${item.kind} of a gone runner`);
    }
  }
  return out;
}

async function removeVolume(docker: Docker, name: string): Promise<void> {
  for (let attempt = 0; ; attempt++) {
    try {
      await docker.getVolume(name).remove({ force: true });
      return;
    } catch (err) {
      // Still in use while its container is being removed.
      if (statusCode(err) !== 409 || attempt >= 10) throw err;
      await new Promise((r) => setTimeout(r, 100));
    }
  }
}

export interface SandboxReaperOptions extends PlanOptions {
  /** An item is reaped once it has been seen reapable for this long. */
  graceMs: number;
  /** Time between passes (the first runs at `start`); 0: only at start. */
  intervalMs: number;
  logger: Logger;
  now?: () => number;
}

/**
 * The runner's periodic reaper: at start and every `intervalMs`, plans; items reapable for at
 * least `graceMs` (seen in an earlier pass) are removed.
 */
export class SandboxReaper {
  private readonly firstSeen = new Map<string, number>();
  private timer: NodeJS.Timeout | undefined;
  private running: Promise<ReapResult> | undefined;
  private readonly now: () => number;

  constructor(private readonly o: SandboxReaperOptions) {
    this.now = o.now ?? Date.now;
  }

  start(): void {
    const tick = (): void => {
      this.pass().catch((err: unknown) => this.o.logger.warn({ err: err instanceof Error ? err.message : String(err) }, 'sandbox reaper pass failed'));
    };
    tick();
    if (this.o.intervalMs > 0 && !this.timer) {
      this.timer = setInterval(tick, this.o.intervalMs);
      this.timer.unref();
    }
  }

  stop(): void {
    if (this.timer) clearInterval(this.timer);
    this.timer = undefined;
  }

  /** One pass (passes never overlap). */
  pass(): Promise<ReapResult> {
    this.running ??= this.passOnce().finally(() => {
      this.running = undefined;
    });
    return this.running;
  }

  private async passOnce(): Promise<ReapResult> {
    const plan = await planReap(this.o);
    const now = this.now();
    const seen = new Set<string>();
    const due: ReapPlan['reapable'] = [];
    for (const item of plan.reapable) {
      const key = `${item.kind}:${item.id}`;
      seen.add(key);
      const first = this.firstSeen.get(key);
      if (first === undefined) {
        this.firstSeen.set(key, now);
        if (this.o.graceMs > 0) {
          this.o.logger.info({ ...logged(item), reason: item.reason, grace_ms: this.o.graceMs }, `the ${item.kind} of a gone runner will be reaped after the grace period`);
          continue;
        }
      } else if (now - first < this.o.graceMs) continue;
      due.push(item);
    }
    for (const key of [...this.firstSeen.keys()]) if (!seen.has(key)) this.firstSeen.delete(key);
    const result = await reapItems(this.o.docker, due, this.o.logger);
    for (const item of result.reaped) this.firstSeen.delete(`${item.kind}:${item.id}`);
    return result;
  }
}
