import { Obj, Type, type Static } from '@agentplane/core';
import type { VersionedDoc } from '../versioned.js';

const ResourceFields = {
  cpu_millis: Type.Integer({ minimum: 100, maximum: 256_000 }),
  memory_mib: Type.Integer({ minimum: 64, maximum: 1_048_576 }),
  disk_mib: Type.Integer({ minimum: 64, maximum: 10_485_760 }),
  max_duration_seconds: Type.Integer({ minimum: 10, maximum: 7 * 24 * 3600 }),
};
/** A sandbox's limits, as stored and answered: every field. */
export const Resources = Obj(ResourceFields);
/**
 * The limits a request sets: any of the fields (at least one); the others are the defaults on a
 * create, or what the current version has on an update (`withResources`).
 */
export const ResourcesInput = Obj({
  cpu_millis: Type.Optional(ResourceFields.cpu_millis),
  memory_mib: Type.Optional(ResourceFields.memory_mib),
  disk_mib: Type.Optional(ResourceFields.disk_mib),
  max_duration_seconds: Type.Optional(ResourceFields.max_duration_seconds),
}, { minProperties: 1 });
export type ResourceLimits = Static<typeof Resources>;
/** `host[:port]`: lower case, `*.` for subdomains, a port from 1 to 65535 written without leading zeros. */
const Host = Type.String({
  pattern: '^(\\*\\.)?[a-z0-9]([a-z0-9-]{0,62}\\.)*[a-z0-9-]{1,63}(:(6553[0-5]|655[0-2][0-9]|65[0-4][0-9]{2}|6[0-4][0-9]{3}|[1-5][0-9]{4}|[1-9][0-9]{0,3}))?$',
  maxLength: 260,
});
export const Network = Type.Union([
  Obj({ mode: Type.Literal('none') }),
  Obj({ mode: Type.Literal('allowlist'), allowed_hosts: Type.Array(Host, { minItems: 1, maxItems: 64, uniqueItems: true }) }),
]);
const PackageList = Type.Array(Type.String({ pattern: '^[A-Za-z0-9@][A-Za-z0-9@/._+:=<>~^-]{0,213}$' }), { maxItems: 256, uniqueItems: true });
export const Packages = Obj({ apt: Type.Optional(PackageList), npm: Type.Optional(PackageList), pip: Type.Optional(PackageList) });
export const Driver = Type.Literal('docker');
/** `container` (runc) or `gvisor` (runsc, a user-space kernel); only runners that verified the tier get the Run. */
export const Tier = Type.Union([Type.Literal('container'), Type.Literal('gvisor')]);
export const Retention = Type.Union([Type.Literal('durable'), Type.Literal('ephemeral')]);
/** Where the agent loop runs: in the runner, tools in the sandbox (`split`), or inside the sandbox (`colocated`). */
export const Topology = Type.Union([Type.Literal('split'), Type.Literal('colocated')]);

/**
 * A third-party agent harness spoken to over the Agent Client Protocol (docs/ACP.md): the npm
 * package a runner installs into a sandbox image layer (`name` or `name@version`) and the command
 * of that package (a `bin` name) that speaks ACP on its stdio. Absent: the built-in agent loop.
 */
export const AcpHarness = Obj({
  kind: Type.Literal('acp'),
  package: Type.String({ minLength: 1, maxLength: 214, pattern: '^(@[a-z0-9][a-z0-9._~-]*/)?[a-z0-9][a-z0-9._~-]*(@[0-9A-Za-z.+-]{1,64})?$' }),
  command: Type.String({ minLength: 1, maxLength: 128, pattern: '^[A-Za-z0-9@][A-Za-z0-9._@/-]*$' }),
  args: Type.Optional(Type.Array(Type.String({ maxLength: 1024 }), { maxItems: 32 })),
});
export type AcpHarnessSetting = Static<typeof AcpHarness>;

/**
 * A container image reference as the engine parses it (`[registry[:port]/]path[:tag][@digest]`):
 * lowercase path components joined by `.`, `_`, `__` or dashes; a first component that names a
 * registry (a dot, a port or `localhost`); a tag of word characters, dots and dashes; an
 * `algorithm:hex` digest. A reference the engine refuses as malformed could never start a
 * sandbox, and its refusal would read as the runner's failure.
 */
const IMAGE_PATH = '[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*';
const IMAGE_HOST_PART = '(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])';
const IMAGE_REGISTRY = `(?:(?:localhost|${IMAGE_HOST_PART}(?:\\.${IMAGE_HOST_PART})+)(?::[0-9]{1,5})?|${IMAGE_HOST_PART}:[0-9]{1,5})`;
export const IMAGE_REFERENCE_PATTERN =
  `^(?:${IMAGE_REGISTRY}/)?${IMAGE_PATH}(?:/${IMAGE_PATH})*(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?$`;
export const ImageReference = () => Type.String({ minLength: 1, maxLength: 512, pattern: IMAGE_REFERENCE_PATTERN });

export const DEFAULT_RESOURCES: ResourceLimits = { cpu_millis: 1000, memory_mib: 1024, disk_mib: 4096, max_duration_seconds: 3600 };

/** The limits a request's (partial) `resources` make over `base` (the defaults, or the current version's). */
export function withResources(base: ResourceLimits, given: Partial<ResourceLimits> | undefined): ResourceLimits {
  if (!given) return base;
  const out = { ...base };
  for (const k of Object.keys(base) as (keyof ResourceLimits)[]) {
    const v = given[k];
    if (v !== undefined) out[k] = v;
  }
  return out;
}


/** An execution Environment version: the image, limits and network a Session's sandboxes get. */
export interface Environment extends VersionedDoc {
  type: 'environment';
  workspace_id: string;
  name: string;
  description: string | null;
  image: string;
  driver: 'docker';
  tier: Static<typeof Tier>;
  resources: Static<typeof Resources>;
  network: Static<typeof Network>;
  retention_mode: 'durable' | 'ephemeral';
  /** Stored versions from before the field existed lack it: `present()` reads them as `split`. */
  harness_topology: Static<typeof Topology>;
  packages: Static<typeof Packages>;
  /** A third-party ACP agent harness instead of the built-in loop (absent: built-in). */
  harness?: AcpHarnessSetting | null;
  /**
   * Opt-in browser observation: the sandbox gets the browser image variant (Chromium) and the
   * agent's `browser_*` tools work; only runners that verified `browser_observation` get the Run.
   * Stored versions from before the field existed lack it: read as false.
   */
  browser?: boolean;
  metadata: Record<string, string>;
}
