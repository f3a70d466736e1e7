import Docker from 'dockerode';

/**
 * Sandboxes of runners that tests killed with SIGKILL have no daemon left to reap them: remove
 * every agentplane-managed container created during this test run.
 */
export default function setup(): () => Promise<void> {
  const started = Math.floor(Date.now() / 1000) - 1;
  return async () => {
    const docker = new Docker();
    try {
      const list = await docker.listContainers({ all: true, filters: JSON.stringify({ label: ['agentplane.managed=true'] }) });
      await Promise.all(list.filter((c) => c.Created >= started).map((c) => docker.getContainer(c.Id).remove({ force: true, v: true }).catch(() => undefined)));
    } catch {
      // No Docker engine: nothing to clean.
    }
  };
}
