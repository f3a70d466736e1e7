/**
 * What the daemon's `/healthz` answers (served with `/metrics` on RUNNER_METRICS_ADDR): 200 when
 * it can take work, 503 otherwise, with the same fields either way.
 */
import type Docker from 'dockerode';
import { dockerAvailable } from '@agentplane/sandbox';

export interface RunnerHealth {
  /**
   * `ok`; or why the daemon cannot take work: `starting` (image check, tier canaries),
   * `disconnected` (no live connection to the control plane), `credential_refused` (the control
   * plane refused its credential for good: it stops), `docker_unavailable` (its sandbox driver is
   * Docker and the engine does not answer), `no_tiers` (Docker answers, but no isolation tier's
   * canary sandbox ran: no Run can be placed on it).
   */
  status: 'ok' | 'starting' | 'disconnected' | 'credential_refused' | 'docker_unavailable' | 'no_tiers';
  connected: boolean;
  /** The sandbox driver in use: `docker`, `process` (unisolated), or null while starting. */
  driver: 'docker' | 'process' | null;
  /** The Docker engine answered its last ping (checked at most every 2 s). */
  docker_ok: boolean;
  /** Draining: taking no new work (a drain asked by a signal, `drain` or the control plane). */
  draining: boolean;
  /** The isolation tiers offered now (those whose canary sandbox ran). */
  tiers: string[];
}

export interface HealthInput {
  started: boolean;
  connected: boolean;
  driver: 'docker' | 'process' | null;
  dockerOk: boolean;
  draining: boolean;
  tiers: string[];
  /** The control plane refused the credential for good: the daemon is stopping (exit code 5). */
  credentialRefused?: boolean;
}

export function runnerHealth(i: HealthInput): { code: 200 | 503; body: RunnerHealth } {
  const status: RunnerHealth['status'] = !i.started ? 'starting'
    : i.credentialRefused ? 'credential_refused'
      : !i.connected ? 'disconnected'
        : i.driver === 'docker' && !i.dockerOk ? 'docker_unavailable'
          : i.driver === 'docker' && i.tiers.length === 0 ? 'no_tiers'
            : 'ok';
  return {
    code: status === 'ok' ? 200 : 503,
    body: { status, connected: i.connected, driver: i.driver, docker_ok: i.dockerOk, draining: i.draining, tiers: [...i.tiers] },
  };
}

/** Whether the Docker engine answers, pinged at most once per `ttlMs` however often it is asked. */
export class DockerCheck {
  private last: { at: number; ok: boolean } | null = null;
  private pending: Promise<boolean> | null = null;

  constructor(
    private readonly docker: Docker,
    private readonly onResult: (ok: boolean) => void = () => undefined,
    private readonly ttlMs = 2_000,
    private readonly timeoutMs = 1_500,
  ) {}

  /** Forget the last answer: the next question pings (the engine was just seen to change). */
  reset(): void {
    this.last = null;
  }

  ok(): Promise<boolean> {
    if (this.last && Date.now() - this.last.at < this.ttlMs) return Promise.resolve(this.last.ok);
    this.pending ??= dockerAvailable(this.docker, this.timeoutMs).then((ok) => {
      this.last = { at: Date.now(), ok };
      this.pending = null;
      this.onResult(ok);
      return ok;
    });
    return this.pending;
  }
}
