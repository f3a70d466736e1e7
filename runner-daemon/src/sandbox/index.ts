export * from './types.js';
export { DockerDriver, SANDBOX_DEFAULTS, normaliseRelative, type DockerDriverOptions } from './docker-driver.js';
export { ProcessDriver, type ProcessDriverOptions } from './process-driver.js';
export { ensureSandboxImage, ensureSandboxImageIfDocker, assembleRootfs, loadManifest, SandboxImageError, type SandboxImage, type EnsureSandboxImageOptions } from './image.js';
export { materializeResources, resolvedSource, workspacePath, MATERIALIZED_MARKER, type ResolvedResource, type ResourceSource, type ResourceContent, type MaterializeResult } from './resources.js';
export { createTar, type TarEntry } from './tar.js';
export { selectDriver, type SelectDriverOptions } from './select.js';
export { SandboxManager, type SandboxManagerOptions } from './manager.js';
export { sandboxPreflight, type PreflightCheck, type PreflightReport } from './preflight.js';
