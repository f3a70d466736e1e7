import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Docker from 'dockerode';

/** Labels every sandbox of a test run, so that the run only ever removes what it created. */
export const SCOPE_ENV = 'AGENTPLANE_SANDBOX_SCOPE';
const SCOPE_LABEL = 'agentplane.scope';

/**
 * One reaping scope per test run: platforms and runners started by the tests inherit
 * AGENTPLANE_SANDBOX_SCOPE and label their sandboxes with it (agentplane.scope). Runners only reap
 * inside their scope, so concurrent test runs on one machine never touch each other's containers.
 * At the end, the run removes the containers and workspace volumes of its scope (and of
 * sub-scopes `<scope>-…` that single tests use): those of runners killed with SIGKILL, and the
 * workspaces runners stopped cleanly keep (durable retention). Nothing else on the machine.
 *
 * Temporary files too: the run gets its own temp root (TMPDIR, inherited by the test workers and
 * every platform and runner they start), removed whole at the end, so runner config dirs, data
 * dirs and uploads of a run never pile up in the machine's temp folder.
 */
export default function setup(): () => Promise<void> {
  const scope = process.env[SCOPE_ENV] || `test-${Date.now().toString(36)}-${randomBytes(4).toString('hex')}`;
  process.env[SCOPE_ENV] = scope;
  const tempRoot = mkdtempSync(join(tmpdir(), 'agentplane-test-'));
  process.env.TMPDIR = tempRoot;
  return async () => {
    const docker = new Docker();
    const mine = (labels: Record<string, string> | undefined | null): boolean => {
      const s = labels?.[SCOPE_LABEL];
      return labels?.['agentplane.managed'] === 'true' && !!s && (s === scope || s.startsWith(`${scope}-`));
    };
    const filters = JSON.stringify({ label: ['agentplane.managed=true', SCOPE_LABEL] });
    try {
      const list = await docker.listContainers({ all: true, filters });
      await Promise.all(list.filter((c) => mine(c.Labels)).map((c) => docker.getContainer(c.Id).remove({ force: true, v: true }).catch(() => undefined)));
      const { Volumes } = await docker.listVolumes({ filters });
      await Promise.all((Volumes ?? []).filter((v) => mine(v.Labels)).map((v) => docker.getVolume(v.Name).remove({ force: true }).catch(() => undefined)));
    } catch {
      // No Docker engine: nothing to clean.
    }
    rmSync(tempRoot, { recursive: true, force: true, maxRetries: 3 });
  };
}
