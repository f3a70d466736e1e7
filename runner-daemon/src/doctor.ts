import { execFile } from 'node:child_process';
import { promisify } from 'node:util';
import type Docker from 'dockerode';
import { apiUrl } from '@agentplane/core';
import { dockerFacts } from './capabilities.js';
import type { RunnerCredentialFile } from '@agentplane/protocol';
import { attributionLabels, canaryLabels, probeCredential } from '@agentplane/sandbox';
import type { DaemonConfig } from './config.js';

export interface Check {
  name: string;
  ok: boolean;
  detail: string;
  /** What to do when it fails. */
  fix?: string;
  /** Could not be checked (fails, as its outcome is unknown). */
  unknown?: boolean;
}

const run = promisify(execFile);

const timeout = <T>(p: Promise<T>, ms: number, what: string): Promise<T> =>
  Promise.race([p, new Promise<never>((_, rej) => setTimeout(() => rej(new Error(`${what} timed out after ${ms} ms`)), ms).unref())]);

/** Paired, control plane reachable, runner credential accepted (reported, as unknown, even when it cannot be checked). */
export async function checkControlPlane(cred: RunnerCredentialFile | null): Promise<Check[]> {
  if (!cred) {
    return [{ name: 'paired', ok: false, detail: 'no runner credential in the config directory', fix: 'run `agentplane-runner pair --code <code> --url <base url>`' }];
  }
  const out: Check[] = [{ name: 'paired', ok: true, detail: `runner ${cred.runner_id} (pool ${cred.runner_pool_id})` }];
  try {
    const r = await timeout(fetch(apiUrl(cred.base_url, '/healthz')), 5000, 'health check');
    out.push(r.ok
      ? { name: 'control plane reachable', ok: true, detail: `${cred.base_url} answered ${r.status}` }
      : { name: 'control plane reachable', ok: false, detail: `${cred.base_url}/healthz answered ${r.status}`, fix: 'check that the API is running and healthy' });
  } catch (err) {
    out.push({ name: 'control plane reachable', ok: false, detail: `${cred.base_url}: ${err instanceof Error ? err.message : String(err)}`, fix: 'check the URL, DNS, proxy and firewall between this machine and the API' });
    // Not omitted: a credential nobody could check is not a passed check.
    out.push({ name: 'runner credential accepted', ok: false, unknown: true, detail: 'unknown: not checked, the control plane cannot be reached', fix: 'make the control plane reachable, then run doctor again' });
    return out;
  }
  // Upgrade only (no hello): proves the credential without disturbing a running daemon.
  const probe = await probeCredential(cred.base_url, cred.secret);
  const verdict: Check = probe.verdict === 'accepted'
    ? { name: 'runner credential accepted', ok: true, detail: probe.detail }
    : {
        name: 'runner credential accepted', ok: false, detail: probe.detail,
        fix: probe.verdict === 'rejected'
          ? 'the credential is revoked: pair this machine again'
          : probe.status === 403
            ? 'the owner Principal or the Workspace of this runner is not active'
            : probe.status ? 'check that the API hosts the runner gateway (GATEWAY_EMBEDDED)' : 'check proxies: WebSocket upgrades must pass through',
      };
  out.push(verdict);
  return out;
}

/**
 * The doctor's canary container: no network, read-only root, no capabilities. Labelled like the
 * runner's own sandboxes, so that a doctor killed before removing it leaves nothing the reapers
 * would not find.
 */
export function canaryOptions(image: string, config: Pick<DaemonConfig, 'configDir' | 'sandboxScope'>, cred: RunnerCredentialFile | null): Docker.ContainerCreateOptions {
  const attribution = attributionLabels({
    home: config.configDir,
    ...(cred ? { workspaceId: cred.workspace_id } : {}),
    ...(config.sandboxScope ? { scope: config.sandboxScope } : {}),
  });
  return {
    Image: image,
    Cmd: ['/bin/sh', '-c', 'exit 0'],
    Labels: canaryLabels(cred?.runner_id, attribution),
    NetworkDisabled: true,
    HostConfig: { NetworkMode: 'none', ReadonlyRootfs: true, CapDrop: ['ALL'], SecurityOpt: ['no-new-privileges'], PidsLimit: 64, Memory: 64 * 1024 * 1024, AutoRemove: false },
  };
}

async function checkDocker(docker: Docker, image: string, canary: Docker.ContainerCreateOptions): Promise<Check[]> {
  const facts = await dockerFacts(docker);
  if (!facts) {
    return [{ name: 'docker engine answers', ok: false, detail: 'no answer from the Docker engine', fix: 'start dockerd and make its socket readable by this user (e.g. add the user to the docker group), or set DOCKER_SOCKET' }];
  }
  const out: Check[] = [{ name: 'docker engine answers', ok: true, detail: `Docker ${facts.version} on ${facts.os}/${facts.architecture}, ${facts.ncpu} CPUs` }];
  try {
    await timeout(docker.getImage(image).inspect(), 5000, 'image inspect');
    out.push({ name: 'sandbox image present', ok: true, detail: image });
  } catch {
    out.push({ name: 'sandbox image present', ok: false, detail: `${image} is not in the local image store`, fix: `build or pull it: docker pull ${image} (or set SANDBOX_IMAGE)` });
    return out;
  }
  const started = Date.now();
  let container: Docker.Container | undefined;
  try {
    container = await timeout(
      docker.createContainer(canary),
      15000,
      'canary create',
    );
    await timeout(container.start(), 15000, 'canary start');
    const res = (await timeout(container.wait(), 15000, 'canary wait')) as { StatusCode?: number };
    if (res.StatusCode !== 0) throw new Error(`canary exited with ${res.StatusCode}`);
    await container.remove({ force: true });
    container = undefined;
    out.push({ name: 'canary container starts and is torn down', ok: true, detail: `no network, read-only root, all capabilities dropped; ${Date.now() - started} ms` });
  } catch (err) {
    out.push({ name: 'canary container starts and is torn down', ok: false, detail: err instanceof Error ? err.message : String(err), fix: 'check `docker run --rm --network none ' + image + " /bin/sh -c 'exit 0'` by hand; look at dockerd logs and the storage driver" });
  } finally {
    if (container) await container.remove({ force: true }).catch(() => undefined);
  }
  return out;
}

/** Repository resources are cloned on this machine (the sandbox has no network). */
async function checkGit(): Promise<Check> {
  try {
    const { stdout } = await timeout(run('git', ['--version']), 5000, 'git --version');
    return { name: 'git available (repository resources)', ok: true, detail: stdout.trim() };
  } catch (err) {
    return {
      name: 'git available (repository resources)', ok: false, detail: err instanceof Error ? err.message : String(err),
      fix: 'install git (apt-get install git); without it, Sessions with repository resources fail on this runner',
    };
  }
}

export async function runDoctor(config: DaemonConfig, cred: RunnerCredentialFile | null, docker: Docker): Promise<Check[]> {
  const [cp, dk, git] = await Promise.all([checkControlPlane(cred), checkDocker(docker, config.sandboxImage, canaryOptions(config.sandboxImage, config, cred)), checkGit()]);
  return [...cp, ...dk, git];
}
