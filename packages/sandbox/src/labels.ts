/**
 * The labels a runner puts on every sandbox container and workspace volume it makes: whose they
 * are (runner, Session, the Workspace that issued the credential, the runner's config directory
 * and host) and in which reaping scope. What finds sandboxes later (the runner's own reapers,
 * `doctor` and `prune`, the platform after a stop) finds them by these labels alone.
 */
import { hostname } from 'node:os';

export const SANDBOX_LABELS = {
  managed: 'agentplane.managed',
  runner: 'agentplane.runner',
  session: 'agentplane.session',
  /** The Workspace of the control plane that issued the runner's credential. */
  workspace: 'agentplane.workspace',
  /** The runner's config directory on this machine (where its credential lives). */
  home: 'agentplane.home',
  /** The host name of the runner's machine: runner homes are only judged on the machine they name. */
  host: 'agentplane.host',
  /** Optional reaping scope: runners, `doctor` and `prune` only touch sandboxes of their own scope. */
  scope: 'agentplane.scope',
} as const;

/** Environment variable naming the reaping scope (unset: the default scope, no label). */
export const SANDBOX_SCOPE_ENV = 'AGENTPLANE_SANDBOX_SCOPE';

/**
 * Who a runner's sandboxes belong to, recorded as labels on every container and volume so that a
 * later runner (or `agentplane-runner prune`) can tell whether that runner still exists.
 */
export interface SandboxAttribution {
  /** Workspace id of the runner's credential (which control plane issued it). */
  workspaceId?: string;
  /** Absolute path of the runner's config directory. */
  home?: string;
  /** Reaping scope; absent in the default scope. */
  scope?: string;
  /** Host name of the runner's machine (default: this one's). */
  host?: string;
}

/** The attribution labels (only those that are set). */
export function attributionLabels(a: SandboxAttribution): Record<string, string> {
  return {
    ...(a.workspaceId ? { [SANDBOX_LABELS.workspace]: a.workspaceId } : {}),
    ...(a.home ? { [SANDBOX_LABELS.home]: a.home, [SANDBOX_LABELS.host]: a.host ?? hostname() } : {}),
    ...(a.scope ? { [SANDBOX_LABELS.scope]: a.scope } : {}),
  };
}

/**
 * A throwaway canary container's labels: managed and its runner's, like a sandbox, so that the
 * reapers remove one left behind by a runner (or doctor) killed half-way; no Session, so that it
 * is never adopted as a Session's workspace.
 */
export function canaryLabels(runnerId: string | undefined, attribution: Record<string, string>): Record<string, string> {
  return {
    ...attribution,
    [SANDBOX_LABELS.managed]: 'true',
    ...(runnerId ? { [SANDBOX_LABELS.runner]: runnerId } : {}),
    'dev.agentplane.canary': 'true',
  };
}
