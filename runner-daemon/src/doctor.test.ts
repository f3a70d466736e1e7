import { randomBytes } from 'node:crypto';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import Docker from 'dockerode';
import { describe, expect, it } from 'vitest';
import type { RunnerCredentialFile } from '@agentplane/protocol';
import { canaryOptions, checkControlPlane, checkDocker } from './doctor.js';
import { ensureSandboxImage } from './sandbox/image.js';
import { SANDBOX_LABELS } from '@agentplane/sandbox';

/** A local port nothing listens on (a server's, once closed). */
async function closedPort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  const { port } = server.address() as AddressInfo;
  await new Promise<void>((r) => server.close(() => r()));
  return port;
}

const cred = (baseUrl: string): RunnerCredentialFile => ({
  base_url: baseUrl, secret: 's', runner_id: 'runner_1', runner_credential_id: 'rcred_1', runner_pool_id: 'rpool_1',
  workspace_id: 'wksp_1', machine_label: 'box', paired_at: '2026-01-01T00:00:00.000Z',
});

describe('doctor: control plane checks', () => {
  it('reports the credential check as failed (unknown) when the control plane cannot be reached, instead of omitting it', async () => {
    const checks = await checkControlPlane(cred(`http://127.0.0.1:${await closedPort()}`));
    expect(checks.map((c) => c.name)).toEqual(['paired', 'control plane reachable', 'runner credential accepted']);
    expect(checks[1]).toMatchObject({ ok: false });
    expect(checks[2]).toMatchObject({ ok: false, unknown: true });
    expect(checks[2]?.detail).toMatch(/^unknown/);
    expect(checks[2]?.fix).toBeTruthy();
  });

  it('without a credential there is nothing to check but pairing', async () => {
    expect(await checkControlPlane(null)).toMatchObject([{ name: 'paired', ok: false }]);
  });
});

describe('doctor: the canary container', () => {
  it('is labelled managed and its runner\'s, like a sandbox, so that the reapers find one left behind', () => {
    const config = { configDir: '/home/runner/.agentplane/runner', sandboxScope: 'scope_1' };
    const { Labels } = canaryOptions('agentplane/sandbox:latest', config, cred('http://127.0.0.1:1'));
    expect(Labels).toMatchObject({
      [SANDBOX_LABELS.managed]: 'true', [SANDBOX_LABELS.runner]: 'runner_1', [SANDBOX_LABELS.home]: config.configDir,
      [SANDBOX_LABELS.workspace]: 'wksp_1', [SANDBOX_LABELS.scope]: 'scope_1', 'dev.agentplane.canary': 'true',
    });
    // Never a Session's: it is not adopted as a kept workspace.
    expect(Labels).not.toHaveProperty(SANDBOX_LABELS.session);
    // Unpaired: no runner yet, but still managed and attributed to this config directory.
    expect(canaryOptions('agentplane/sandbox:latest', config, null).Labels).toMatchObject({ [SANDBOX_LABELS.managed]: 'true', [SANDBOX_LABELS.home]: config.configDir });
  });
});

/**
 * The canary reports isolation only where it proved it from inside: an engine that does not apply
 * a flag (here: the flag left out of the options) fails the check, naming what does not hold.
 */
describe('doctor: the canary proves what it reports', () => {
  const docker = new Docker();
  const config = { configDir: `/tmp/doctor-${randomBytes(4).toString('hex')}`, sandboxScope: `doctor-${randomBytes(4).toString('hex')}` };
  const canaryCheck = async (tweak: (o: Docker.ContainerCreateOptions) => Docker.ContainerCreateOptions) => {
    const image = (await ensureSandboxImage({ docker })).tag;
    const checks = await checkDocker(docker, image, tweak(canaryOptions(image, config, null)));
    return checks.find((c) => c.name === 'canary container starts and is torn down');
  };
  const host = (o: Docker.ContainerCreateOptions, h: Docker.HostConfig): Docker.ContainerCreateOptions => ({ ...o, HostConfig: { ...o.HostConfig, ...h } });

  it('passes with the sandbox flags', async () => {
    expect(await canaryCheck((o) => o)).toMatchObject({ ok: true, detail: expect.stringContaining('proved inside') });
  }, 120_000);

  it.each([
    ['a writable root', (o: Docker.ContainerCreateOptions) => host(o, { ReadonlyRootfs: false }), 'root filesystem writable'],
    ['capabilities', (o: Docker.ContainerCreateOptions) => host(o, { CapDrop: [] }), 'capabilities not dropped'],
    ['no no-new-privileges', (o: Docker.ContainerCreateOptions) => host(o, { SecurityOpt: [] }), 'no-new-privileges not set'],
    ['root', (o: Docker.ContainerCreateOptions) => ({ ...o, User: '0:0' }), 'runs as root'],
    ['a network', (o: Docker.ContainerCreateOptions) => ({ ...host(o, { NetworkMode: 'bridge' }), NetworkDisabled: false }), 'network interface eth0 present'],
  ])('fails when the container has %s', async (_what, tweak, why) => {
    const check = await canaryCheck(tweak);
    expect(check).toMatchObject({ ok: false });
    expect(check?.detail).toContain(why);
    const left = await docker.listContainers({ all: true, filters: JSON.stringify({ label: [`agentplane.scope=${config.sandboxScope}`] }) });
    expect(left).toEqual([]);
  }, 120_000);
});
