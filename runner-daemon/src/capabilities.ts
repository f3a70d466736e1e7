import { accessSync, constants } from 'node:fs';
import { statfs } from 'node:fs/promises';
import { arch, cpus, freemem, platform, totalmem } from 'node:os';
import { delimiter, dirname, join } from 'node:path';
import type Docker from 'dockerode';
import * as si from 'systeminformation';
import { LEASE_SPEC_PROTOCOL, MODEL_GATEWAY_PROTOCOL, RUNNER_PROTOCOL_VERSIONS, type ProviderCapability, type RunnerCapabilities } from '@agentplane/protocol';

/**
 * Honest capabilities: every field comes from the host (the OS, systeminformation where the OS's
 * own figure is not the one wanted) or the Docker engine (ping/info). What cannot be established is left out, never invented.
 */
export interface HostFacts {
  cpus: number;
  memTotalMib: number;
  memAvailableMib: number;
  diskFreeMib: number | null;
  os: string;
  architecture: string;
  docker: DockerFacts | null;
  /** Docker isolation tiers whose canary sandbox ran (empty: claim no Docker provider). */
  tiers: string[];
  /** ACP agent harnesses installed and probed, and the driver whose sandboxes run them. */
  acp?: { driver: 'docker' | 'process'; harnesses: { package: string; version: string; harness_release_digest: string }[] };
  /**
   * Whether the process driver serves Runs here; false: no `process` provider is claimed (a
   * runner that started with Docker runs nothing unisolated). Absent: claimed.
   */
  processDriver?: boolean;
  /** What the browser canary proved (absent: the runner offers no browser). */
  browser?: { accessibility_tree: boolean; screenshot: boolean };
}

export interface DockerFacts {
  version: string;
  os: string;
  architecture: string;
  ncpu: number;
  memTotalMib: number;
  networkDrivers: string[];
  rootDir: string;
}

const MIB = 1024 * 1024;

/** Docker reports `x86_64`/`aarch64`; Node and OCI say `x64`→`amd64`, `arm64`. */
export function normalizeArch(a: string): string {
  const m: Record<string, string> = { x86_64: 'amd64', x64: 'amd64', amd64: 'amd64', aarch64: 'arm64', arm64: 'arm64', armv7l: 'arm', arm: 'arm' };
  return m[a] ?? a;
}

export async function dockerFacts(docker: Docker, timeoutMs = 3000): Promise<DockerFacts | null> {
  const withTimeout = <T>(p: Promise<T>) =>
    Promise.race([p, new Promise<never>((_, rej) => setTimeout(() => rej(new Error('docker timeout')), timeoutMs).unref())]);
  try {
    await withTimeout(docker.ping());
    const info = (await withTimeout(docker.info())) as {
      ServerVersion?: string; OSType?: string; Architecture?: string; NCPU?: number; MemTotal?: number;
      Plugins?: { Network?: string[] }; DockerRootDir?: string;
    };
    return {
      version: info.ServerVersion ?? 'unknown',
      os: info.OSType ?? 'linux',
      architecture: normalizeArch(info.Architecture ?? arch()),
      ncpu: info.NCPU ?? cpus().length,
      memTotalMib: Math.floor((info.MemTotal ?? 0) / MIB),
      networkDrivers: info.Plugins?.Network ?? [],
      rootDir: info.DockerRootDir ?? '/var/lib/docker',
    };
  } catch {
    return null;
  }
}

export function findExecutable(names: readonly string[], pathEnv = process.env.PATH ?? ''): string | null {
  for (const dir of pathEnv.split(delimiter)) {
    if (!dir) continue;
    for (const n of names) {
      const p = join(dir, n);
      try {
        accessSync(p, constants.X_OK);
        return p;
      } catch {
        /* not here */
      }
    }
  }
  return null;
}

/**
 * Memory available for new work. On Linux the kernel's MemAvailable, which Node's `freemem()`
 * reads (one read of /proc/meminfo); elsewhere `freemem()` counts only free pages, so
 * systeminformation's estimate of what can be reclaimed is used. Read on every heartbeat.
 */
export async function memoryAvailableMib(): Promise<number> {
  return Math.floor((platform() === 'linux' ? freemem() : (await si.mem()).available) / MIB);
}

/**
 * Free space for unprivileged writers on the filesystem that holds `path` (or its nearest
 * existing ancestor): one statfs, no `df` child process (systeminformation's fsSize spawned two
 * and cost about 30 ms of CPU a call here, once a minute).
 */
export async function diskFreeMib(path: string): Promise<number | null> {
  for (let p = path; ; p = dirname(p)) {
    try {
      const st = await statfs(p);
      return Math.floor((st.bavail * st.bsize) / MIB);
    } catch {
      if (dirname(p) === p) return null;
    }
  }
}

export async function hostFacts(docker: Docker): Promise<HostFacts> {
  const [memAvailableMib, d] = await Promise.all([memoryAvailableMib(), dockerFacts(docker)]);
  return {
    cpus: cpus().length,
    memTotalMib: Math.floor(totalmem() / MIB),
    memAvailableMib,
    // Where sandboxes write: the filesystem that holds the Docker root (or /).
    diskFreeMib: await diskFreeMib(d?.rootDir ?? '/'),
    os: platform(),
    architecture: normalizeArch(arch()),
    docker: d,
    tiers: [],
  };
}

export interface SlotPolicy {
  maxSlots: number | undefined;
  slotMemoryMib: number;
  maxDurationSeconds: number;
}

/** Slots really free now: bounded by CPUs (or the configured cap) and by available memory, minus held work. */
export function availableSlots(facts: HostFacts, policy: SlotPolicy, held: number): number {
  const cap = policy.maxSlots ?? facts.cpus;
  const byMemory = Math.floor(facts.memAvailableMib / policy.slotMemoryMib);
  return Math.max(0, Math.min(cap, byMemory) - held);
}

/** ACP over stdio and the harnesses, on the provider whose driver runs them (only once probed). */
function acpOf(facts: HostFacts, driver: 'docker' | 'process'): Pick<ProviderCapability, 'acp_transport' | 'acp_harnesses'> {
  if (!facts.acp || facts.acp.driver !== driver || facts.acp.harnesses.length === 0) return {};
  return { acp_transport: 'stdio', acp_harnesses: facts.acp.harnesses.map((h) => ({ ...h })) };
}

export function buildCapabilities(facts: HostFacts, policy: SlotPolicy, held: number): RunnerCapabilities {
  const providers: ProviderCapability[] = [];
  const d = facts.docker;
  // Docker is claimed only with the tiers a canary sandbox proved (docs/SANDBOX.md).
  if (d && facts.tiers.length > 0) {
    // `allowlist` is `none` plus the runner's egress proxy (docs/SANDBOX.md). Those are the only
    // modes a sandbox is created with: an engine's other network drivers are not claimed.
    const networkModes = d.networkDrivers.includes('null') ? ['none', 'allowlist'] : [];
    providers.push({
      id: 'docker',
      provider_revision: `docker-${d.version}`,
      drivers: ['docker'],
      launch_kinds: ['sandboxed'],
      tiers: [...facts.tiers],
      platforms: [{ os: d.os, architecture: d.architecture }],
      network_modes: networkModes,
      minimum_resources: { cpu_millis: 100, memory_mib: 64 },
      maximum_resources: {
        cpu_millis: d.ncpu * 1000,
        memory_mib: d.memTotalMib,
        ...(facts.diskFreeMib !== null ? { disk_mib: facts.diskFreeMib } : {}),
        max_duration_seconds: policy.maxDurationSeconds,
      },
      runtime_assurances: {
        network_isolation: networkModes.includes('none'), bounded_start: true, bounded_cancel: true, teardown: true, compute_accounting: true,
      },
      retention_modes: ['durable'],
      session_sandbox: true,
      // Session Files and repository snapshots are fetched and held by the runner, never the sandbox.
      snapshot_custody: 'runner',
      // Project revisions are fetched by the runner and placed in the workspace (docs/MEMORY.md).
      mount_kinds: ['uploaded_project'],
      max_mounts: 64,
      ...acpOf(facts, 'docker'),
      // Claimed only where the browser canary opened a page in a sandbox (docs/SANDBOX.md).
      ...(facts.browser?.accessibility_tree || facts.browser?.screenshot ? {
        browser_observation: { ...facts.browser },
        desktop_observation: { accessibility_tree: false, screenshot: false, window_inventory: false },
      } : {}),
    });
  }
  if (facts.processDriver !== false) providers.push({
    id: 'process',
    drivers: ['process'],
    launch_kinds: ['trusted'],
    tiers: ['process'],
    platforms: [{ os: facts.os, architecture: facts.architecture }],
    network_modes: ['host'],
    maximum_resources: {
      cpu_millis: facts.cpus * 1000,
      memory_mib: facts.memTotalMib,
      ...(facts.diskFreeMib !== null ? { disk_mib: facts.diskFreeMib } : {}),
      max_duration_seconds: policy.maxDurationSeconds,
    },
    runtime_assurances: { network_isolation: false, bounded_start: true, bounded_cancel: true, teardown: true, compute_accounting: false },
    retention_modes: ['durable'],
    session_sandbox: true,
    snapshot_custody: 'runner',
    mount_kinds: ['uploaded_project'],
    max_mounts: 64,
    ...acpOf(facts, 'process'),
  });
  return {
    protocol_versions: [...RUNNER_PROTOCOL_VERSIONS],
    available_slots: availableSlots(facts, policy, held),
    drivers: [...new Set(providers.flatMap((p) => p.drivers))],
    plane_protocols: [MODEL_GATEWAY_PROTOCOL, LEASE_SPEC_PROTOCOL],
    providers,
  };
}
