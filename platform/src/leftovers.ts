import type { Logger } from '@agentplane/core';
import { loadCredential } from '@agentplane/protocol';
import { dockerAvailable, dockerClient, planReap, SANDBOX_LABELS } from '@agentplane/sandbox';

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
  if (!(await dockerAvailable(docker))) return undefined;
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

/**
 * After the local runner has exited on a stop: containers of its that still run (it was killed
 * before it could stop them) are killed, so no sandbox keeps running after the platform. Their
 * workspace volumes stay, as after the runner's own clean stop. Gives up after `timeoutMs`.
 */
export async function stopRunnerSandboxes(o: Pick<LeftoverOptions, 'runnerDir' | 'dockerSocket'> & { timeoutMs?: number }): Promise<number> {
  const runner = loadCredential(o.runnerDir)?.runner_id;
  if (!runner) return 0;
  const docker = dockerClient(o.dockerSocket);
  const work = (async () => {
    const filters = JSON.stringify({ label: [`${SANDBOX_LABELS.managed}=true`, `${SANDBOX_LABELS.runner}=${runner}`], status: ['running', 'paused', 'restarting'] });
    const running = await docker.listContainers({ filters });
    await Promise.all(running.map((c) => docker.getContainer(c.Id).kill({ signal: 'SIGKILL' }).catch(() => undefined)));
    return running.length;
  })();
  let timer: NodeJS.Timeout | undefined;
  const timeout = new Promise<number>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`no answer from Docker within ${o.timeoutMs ?? 5000} ms`)), o.timeoutMs ?? 5000);
  });
  try {
    return await Promise.race([work, timeout]);
  } finally {
    clearTimeout(timer);
  }
}
