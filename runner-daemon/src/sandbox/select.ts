/**
 * Driver selection at daemon start: `docker` when dockerd answers, otherwise the unisolated
 * `process` driver (only when the operator allows it).
 */
import Docker from 'dockerode';
import type { Logger } from '@agentplane/core';
import { dockerAvailable, type SandboxAttribution } from '@agentplane/sandbox';
import { DockerDriver, type DockerDriverOptions } from './docker-driver.js';
import { loadManifest } from './image.js';
import { ProcessDriver } from './process-driver.js';
import type { IsolationTier } from './tiers.js';
import type { SandboxDriver } from './types.js';

export interface SelectDriverOptions {
  runnerId: string;
  dataDir: string;
  docker?: Docker;
  /** Fall back to the unisolated process driver when Docker is unavailable. Default true. */
  allowProcess?: boolean;
  logger?: Logger;
  /** Labels recording who the sandboxes belong to (docker driver). */
  attribution?: SandboxAttribution;
  /** Isolation tiers the Docker driver may offer (default: every verified tier). */
  tiers?: readonly IsolationTier[];
  /** Offer browser observation with this image (docker driver). */
  browserImage?: string;
  /**
   * The sandbox image of Environments that name none, and of the tier canaries (docker driver;
   * default the built-in image, built offline when missing). Another image is used as it is: it
   * must be present.
   */
  defaultImage?: string;
  /** Egress of allowlist sandboxes (docker driver). */
  egress?: DockerDriverOptions['egress'];
}

export async function selectDriver(options: SelectDriverOptions): Promise<SandboxDriver | undefined> {
  const docker = options.docker ?? new Docker();
  if (await dockerAvailable(docker)) {
    return new DockerDriver({
      runnerId: options.runnerId, docker, logger: options.logger,
      ...(options.attribution ? { attribution: options.attribution } : {}), ...(options.tiers ? { tiers: options.tiers } : {}),
      ...(options.browserImage ? { browserImage: options.browserImage } : {}),
      ...(options.egress ? { egress: options.egress } : {}),
      ...(options.defaultImage ? { defaultImage: options.defaultImage, buildDefaultImage: options.defaultImage === `${loadManifest().repository}:latest` } : {}),
    });
  }
  if (options.allowProcess === false) return undefined;
  options.logger?.warn('Docker is unavailable: using the process driver (tier process, UNISOLATED)');
  return new ProcessDriver({ runnerId: options.runnerId, dataDir: options.dataDir, logger: options.logger });
}
