import Docker from 'dockerode';

/**
 * Sandboxes of runners that tests killed with SIGKILL have no daemon left to reap them, and
 * runners stopped cleanly keep their Sessions' workspaces (durable retention): remove every
 * agentplane-managed container and workspace volume created during this test run.
 */
export default function setup(): () => Promise<void> {
  const started = Math.floor(Date.now() / 1000) - 1;
  return async () => {
    const docker = new Docker();
    const filters = JSON.stringify({ label: ['agentplane.managed=true'] });
    try {
      const list = await docker.listContainers({ all: true, filters });
      await Promise.all(list.filter((c) => c.Created >= started).map((c) => docker.getContainer(c.Id).remove({ force: true, v: true }).catch(() => undefined)));
      const { Volumes } = await docker.listVolumes({ filters });
      const fresh = (Volumes ?? []).filter((v) => {
        const created = Date.parse((v as { CreatedAt?: string }).CreatedAt ?? '');
        return Number.isFinite(created) && created / 1000 >= started;
      });
      await Promise.all(fresh.map((v) => docker.getVolume(v.Name).remove({ force: true }).catch(() => undefined)));
    } catch {
      // No Docker engine: nothing to clean.
    }
  };
}
