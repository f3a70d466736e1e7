import type { Logger } from '@agentplane/core';
import { dockerClient, loadCredential } from '@agentplane/runner-daemon';
import { DockerDriver, planReap } from '@agentplane/runner-daemon/sandbox';

export interface LeftoverOptions {
  runnerDir: string;
  dockerSocket?: string | undefined;
  scope?: string | undefined;
  log: Logger;
}

/**
 * On a first boot (empty data directory): managed sandboxes and workspace volumes already on this
 * machine belong to an earlier platform. Say so once, with the command that removes them; runners
 * that are live (another platform running here) are not counted.
 */
export async function reportEarlierSandboxes(o: LeftoverOptions): Promise<{ containers: number; volumes: number; prunable: number } | undefined> {
  const docker = dockerClient(o.dockerSocket);
  if (!(await DockerDriver.available(docker))) return undefined;
  const self = loadCredential(o.runnerDir)?.runner_id;
  const plan = await planReap({ docker, scope: o.scope, selfRunnerId: self, items: 'all' });
  const live = new Set(plan.runners.filter((r) => r.verdict === 'live' || r.verdict === 'self' || r.verdict === 'other_host').map((r) => r.runner));
  const earlier = (plan.items ?? []).filter((i) => !live.has(i.runner));
  if (earlier.length === 0) return { containers: 0, volumes: 0, prunable: 0 };
  const containers = earlier.filter((i) => i.kind === 'container').length;
  const volumes = earlier.length - containers;
  const env = o.scope ? `AGENTPLANE_SANDBOX_SCOPE=${o.scope} ` : '';
  const command = `${env}node runner-daemon/dist/cli.js prune --config-dir ${o.runnerDir}`;
  o.log.warn(
    { containers, volumes, prunable_now: plan.reapable.length, runners: new Set(earlier.map((i) => i.runner)).size, command, list: `${env}node runner-daemon/dist/cli.js doctor --config-dir ${o.runnerDir}` },
    `this machine keeps ${containers} sandbox container(s) and ${volumes} workspace volume(s) of an earlier platform; remove them with: ${command} ` +
      '(the local runner also removes those whose runner is gone after SANDBOX_REAP_GRACE_SECONDS)',
  );
  return { containers, volumes, prunable: plan.reapable.length };
}
