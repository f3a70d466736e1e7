import { randomBytes } from 'node:crypto';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CANARY_STEPS, DockerDriver } from './docker-driver.js';
import { ensureSandboxImage } from './image.js';
import { createTar } from './tar.js';
import { gvisorRuntimeOf } from './tiers.js';
import { attributionLabels, canaryLabels, SANDBOX_LABELS, SANDBOX_SCOPE_ENV } from '@agentplane/sandbox';

/**
 * A tier is claimed only once its canary ran what a Run needs: coreutils that a runtime may break
 * (old runsc releases refuse the statx flags `ls` and `stat` pass, while `exit 0` still works) and
 * a write to the workspace volume.
 */
const docker = new Docker();
const runnerId = `rtest-${randomBytes(4).toString('hex')}`;
const image = (await ensureSandboxImage({ docker })).tag;
const runtimes = await docker.info().then((i: { Runtimes?: Record<string, { path?: string }> }) => i.Runtimes ?? {}, () => ({}));
const runsc = gvisorRuntimeOf(runtimes);

/** What `ls /` writes under `runtime` in a container of the sandbox image (empty: it worked). */
async function lsFailure(runtime: string): Promise<string> {
  const container = await docker.createContainer({
    Image: image, Cmd: ['/bin/sh', '-c', 'ls / >/dev/null 2>/tmp/err || { cat /tmp/err >&2; exit 2; }'], User: '10001:10001',
    Labels: canaryLabels(runnerId, attributionLabels({ scope: process.env[SANDBOX_SCOPE_ENV] })),
    NetworkDisabled: true, Tty: true, HostConfig: { Runtime: runtime, NetworkMode: 'none', AutoRemove: false },
  });
  try {
    await container.start();
    const { StatusCode } = (await container.wait()) as { StatusCode: number };
    if (StatusCode === 0) return '';
    const logs = await container.logs({ stdout: true, stderr: true });
    return logs.toString('utf8').trim() || `exit ${StatusCode}`;
  } finally {
    await container.remove({ force: true, v: true }).catch(() => undefined);
  }
}
const runscLsFailure = runsc ? await lsFailure(runsc) : '';

describe('the tier canary', () => {
  afterAll(async () => {
    await new DockerDriver({ runnerId, docker }).reapOrphans(runnerId, []);
  });

  describe('with an image whose `ls` fails', () => {
    const tag = `agentplane-test/broken-ls:${randomBytes(4).toString('hex')}`;
    beforeAll(async () => {
      // The sandbox image with an `ls` that fails as it does under a runtime that refuses statx flags.
      const ls = "#!/bin/sh\necho \"ls: cannot access '/': Invalid argument\" >&2\nexit 2\n";
      const context = createTar([
        { type: 'file', path: 'Dockerfile', data: Buffer.from(`FROM ${image}\nCOPY ls /usr/bin/ls\n`), mode: 0o644 },
        { type: 'file', path: 'ls', data: Buffer.from(ls), mode: 0o755 },
      ]);
      const stream = await docker.buildImage(Buffer.from(context) as unknown as NodeJS.ReadableStream, { t: tag, rm: true, forcerm: true });
      await new Promise<void>((resolve, reject) => docker.modem.followProgress(stream, (err: Error | null, out: Array<{ error?: string }>) => {
        const failed = err ?? out.find((o) => o.error);
        if (failed) reject(failed instanceof Error ? failed : new Error(failed.error));
        else resolve();
      }));
    }, 120_000);
    afterAll(async () => {
      await docker.getImage(tag).remove({ force: true }).catch(() => undefined);
    });

    it('does not claim the tier, and says which command failed and how', async () => {
      const driver = new DockerDriver({ runnerId, docker, defaultImage: tag, buildDefaultImage: false, tiers: ['container'] });
      const verdicts = await driver.verifyTiers();
      expect(verdicts).toEqual([expect.objectContaining({ tier: 'container', ok: false, detail: "`ls /` failed in the canary: ls: cannot access '/': Invalid argument" })]);
      expect(driver.capabilities().tiers).toEqual([]);
      // Nothing of the canary is left: no container, no volume.
      const filters = JSON.stringify({ label: [`dev.agentplane.canary=true`, `agentplane.runner=${runnerId}`] });
      expect(await docker.listContainers({ all: true, filters })).toEqual([]);
    }, 60_000);
  });

  it('runs every step as the sandbox user in a writable workspace, and claims the tier', async () => {
    expect(CANARY_STEPS).toEqual(expect.arrayContaining(['ls /', 'stat /']));
    // The canary's container options, as the driver asks the engine for them.
    const created: Docker.ContainerCreateOptions[] = [];
    const watched = new Proxy(docker, {
      get(target, key) {
        if (key === 'createContainer') return (o: Docker.ContainerCreateOptions) => (created.push(o), target.createContainer(o));
        const v: unknown = Reflect.get(target, key);
        return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(target) : v;
      },
    });
    const driver = new DockerDriver({ runnerId, docker: watched, tiers: ['container'] });
    expect(await driver.verifyTiers()).toEqual([expect.objectContaining({ tier: 'container', ok: true })]);
    expect(driver.capabilities().tiers).toEqual(['container']);
    expect(created.flatMap((o) => o.HostConfig?.Mounts ?? []).map((m) => m.VolumeOptions?.Labels?.[SANDBOX_LABELS.runner])).toEqual([runnerId]);
    // Its workspace volume went with it (counted by this runner's canary labels: other tests
    // make and remove volumes on the same engine meanwhile).
    const filters = JSON.stringify({ label: ['dev.agentplane.canary=true', `${SANDBOX_LABELS.runner}=${runnerId}`] });
    expect((await docker.listVolumes({ filters })).Volumes ?? []).toEqual([]);
  }, 60_000);

  // This machine's runsc cannot run coreutils' `ls` (too old for its statx flags): gvisor is not claimed.
  describe.skipIf(!runsc || !runscLsFailure)('under a runsc that cannot run `ls`', () => {
    it('does not claim gvisor, and reports why', async () => {
      const driver = new DockerDriver({ runnerId, docker });
      const verdicts = await driver.verifyTiers();
      expect(verdicts.find((v) => v.tier === 'container')).toMatchObject({ ok: true });
      const gvisor = verdicts.find((v) => v.tier === 'gvisor');
      expect(gvisor).toMatchObject({ ok: false, runtime: runsc });
      expect(gvisor?.detail).toMatch(/^`ls \/` failed in the canary: ls: .*Invalid argument.* too old\?\)$/);
      expect(driver.capabilities().tiers).toEqual(['container']);
      await expect(driver.ensure({ id: `sess_${randomBytes(8).toString('hex')}` }, { tier: 'gvisor' })).rejects.toMatchObject({ reason: 'tier_unsatisfied' });
    }, 60_000);
  });

  // Where runsc runs `ls`, the canary passes and gvisor is claimed.
  describe.skipIf(!runsc || !!runscLsFailure)('under a runsc that runs `ls`', () => {
    it('claims gvisor', async () => {
      const driver = new DockerDriver({ runnerId, docker });
      expect((await driver.verifyTiers()).find((v) => v.tier === 'gvisor')).toMatchObject({ ok: true, runtime: runsc });
      expect(driver.capabilities().tiers).toEqual(expect.arrayContaining(['container', 'gvisor']));
    }, 60_000);
  });
});
