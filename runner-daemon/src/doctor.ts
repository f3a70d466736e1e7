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
          ? 'the credential is revoked: pair this machine again (agentplane-runner pair --force; a managed pool\'s runner: enroll --force)'
          : probe.status === 403
            ? 'the owner Principal or the Workspace of this runner is not active'
            : probe.status ? 'check that the API hosts the runner gateway (GATEWAY_EMBEDDED)' : 'check proxies: WebSocket upgrades must pass through',
      };
  out.push(verdict);
  return out;
}

/**
 * What the canary proves from inside, with shell built-ins only (any image has a shell): not root,
 * no capabilities (effective or bounding), no-new-privileges, a root mounted read-only, no network
 * interface but `lo`. The first that does not hold is printed and the canary exits 3: an engine
 * that ignores a flag is caught here rather than reported as isolation.
 */
export const CANARY_PROOF = [
  'fail() { echo "$1"; exit 3; }',
  'uid=; eff=; bnd=; nnp=',
  'while read -r k v _; do case "$k" in Uid:) uid=$v;; CapEff:) eff=$v;; CapBnd:) bnd=$v;; NoNewPrivs:) nnp=$v;; esac; done < /proc/self/status',
  '[ -n "$uid" ] && [ "$uid" != 0 ] || fail "runs as root"',
  // The bounding set: a non-root process has no effective capabilities either way.
  'case "$eff$bnd" in \'\'|*[!0]*) fail "capabilities not dropped (CapEff $eff, CapBnd $bnd)";; esac',
  '[ "$nnp" = 1 ] || fail "no-new-privileges not set"',
  // The mount, not a write: the root directory is not the sandbox user's to write anyway.
  'while read -r _ mnt _ opts _; do [ "$mnt" = / ] && case ",$opts," in *,ro,*) ;; *) fail "root filesystem writable";; esac; done < /proc/mounts',
  'for i in /sys/class/net/*; do [ "${i##*/}" = lo ] || fail "network interface ${i##*/} present"; done',
  'exit 0',
].join('\n');

/**
 * The doctor's canary container: the sandbox user, no network, read-only root, no capabilities,
 * no-new-privileges, each proved from inside (`CANARY_PROOF`). Labelled like the runner's own
 * sandboxes, so that a doctor killed before removing it leaves nothing the reapers would not find.
 */
export function canaryOptions(image: string, config: Pick<DaemonConfig, 'configDir' | 'sandboxScope'>, cred: RunnerCredentialFile | null): Docker.ContainerCreateOptions {
  const attribution = attributionLabels({
    home: config.configDir,
    ...(cred ? { workspaceId: cred.workspace_id } : {}),
    ...(config.sandboxScope ? { scope: config.sandboxScope } : {}),
  });
  return {
    Image: image,
    Cmd: ['/bin/sh', '-c', CANARY_PROOF],
    User: '10001:10001',
    Labels: canaryLabels(cred?.runner_id, attribution),
    NetworkDisabled: true,
    HostConfig: { NetworkMode: 'none', ReadonlyRootfs: true, CapDrop: ['ALL'], SecurityOpt: ['no-new-privileges'], PidsLimit: 64, Memory: 64 * 1024 * 1024, AutoRemove: false },
  };
}

export async function checkDocker(docker: Docker, image: string, canary: Docker.ContainerCreateOptions): Promise<Check[]> {
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
    if (res.StatusCode !== 0) {
      // What the canary found (its output; not readable under every log driver).
      const c = container;
      const said = await timeout(c.logs({ stdout: true, stderr: true }), 5000, 'canary logs').then((b) => demuxedText(b as unknown as Buffer), () => '');
      throw new Error(res.StatusCode === 3 && said ? `the canary's isolation does not hold: ${said}` : `canary exited with ${res.StatusCode}${said ? `: ${said}` : ''}`);
    }
    await container.remove({ force: true });
    container = undefined;
    out.push({ name: 'canary container starts and is torn down', ok: true, detail: `no network, read-only root, all capabilities dropped, no-new-privileges, not root (proved inside); ${Date.now() - started} ms` });
  } catch (err) {
    out.push({ name: 'canary container starts and is torn down', ok: false, detail: err instanceof Error ? err.message : String(err), fix: 'check `docker run --rm --network none ' + image + " /bin/sh -c 'exit 0'` by hand; look at dockerd logs and the storage driver" });
  } finally {
    if (container) await container.remove({ force: true }).catch(() => undefined);
  }
  return out;
}

/** The text of a non-TTY container's log (8-byte frame headers stripped), trimmed and bounded. */
function demuxedText(buf: Buffer): string {
  const parts: Buffer[] = [];
  let i = 0;
  while (i + 8 <= buf.length) {
    const size = buf.readUInt32BE(i + 4);
    parts.push(buf.subarray(i + 8, i + 8 + size));
    i += 8 + size;
  }
  return Buffer.concat(parts).toString('utf8').trim().slice(0, 500);
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
