import { Obj, Type, type Static } from '@agentplane/core';
import type { Redis } from '@agentplane/store';
import { VersionedStore, type VersionedDoc } from '../versioned.js';
import type { Environment } from '../environments/model.js';
import type { Network, Packages, Resources } from '../environments/model.js';

/**
 * HarnessProfiles (`hprof_`) and SandboxProfiles (`sprof_`): what runs the agent loop and what
 * the sandbox is, each a head with immutable numbered revisions (docs/DEPLOYMENTS.md). They are
 * stored as versioned documents: the head is the latest revision and `version` is its
 * `revision_number`; `…:v<n>` keeps revision n for ever.
 */

/** The harness kinds: the platform's own agent loop, or a customer-operated ConnectedHarness. */
export const HarnessKind = Type.Union([Type.Literal('builtin'), Type.Literal('connected')]);
/** Topologies the built-in loop can run in (both exist in the runner). */
export const ManagedTopology = Type.Union([Type.Literal('split'), Type.Literal('colocated')]);

export interface HarnessProfile extends VersionedDoc {
  type: 'harness_profile';
  workspace_id: string;
  key: string;
  display_name: string | null;
  kind: Static<typeof HarnessKind>;
  /** `builtin`: where the loop may run (`split`: in the runner; `colocated`: inside the sandbox). Empty for `connected`. */
  supported_topologies: Static<typeof ManagedTopology>[];
  /** `connected`: the ConnectedHarness this profile names (null for `builtin`). */
  connected_harness_id: string | null;
  metadata: Record<string, string>;
}

export interface SandboxProfile extends VersionedDoc {
  type: 'sandbox_profile';
  workspace_id: string;
  key: string;
  display_name: string | null;
  image: string;
  driver: 'docker';
  tier: 'container';
  resources: Static<typeof Resources>;
  network: Static<typeof Network>;
  retention_mode: 'durable' | 'ephemeral';
  packages: Static<typeof Packages>;
  metadata: Record<string, string>;
}

export function harnessProfileStore(redis: Redis): VersionedStore<HarnessProfile> {
  return new VersionedStore<HarnessProfile>(redis, 'harness_profiles', 'harness profile');
}
export function sandboxProfileStore(redis: Redis, options: { cacheVersions?: boolean } = {}): VersionedStore<SandboxProfile> {
  return new VersionedStore<SandboxProfile>(redis, 'sandbox_profiles', 'sandbox profile', options);
}

/**
 * Environments map onto SandboxProfiles: an Environment version is a SandboxProfile revision's
 * fields plus a harness choice (`harness_topology`). A Session created against a deployment
 * records the pinned SandboxProfile as its `environment_id`/`environment_version`; this reads
 * either kind as the sandbox a Run gets (the topology then comes from the deployment pin).
 */
export async function sandboxVersion(
  src: { environments: VersionedStore<Environment>; sandboxProfiles?: VersionedStore<SandboxProfile> | undefined },
  workspaceId: string,
  id: string,
  version: number,
): Promise<Environment> {
  if (!id.startsWith('sprof_') || !src.sandboxProfiles) return src.environments.getVersion(workspaceId, id, version);
  const p = await src.sandboxProfiles.getVersion(workspaceId, id, version);
  return {
    id: p.id, type: 'environment', workspace_id: p.workspace_id, name: p.key, description: p.display_name, image: p.image,
    driver: p.driver, tier: p.tier, resources: p.resources, network: p.network, retention_mode: p.retention_mode,
    harness_topology: 'split', packages: p.packages, metadata: p.metadata, version: p.version, archived_at: null,
    created_at: p.created_at, updated_at: p.updated_at,
  };
}

/** What a Session created against a deployment (and each of its Runs) carries. */
export const DeploymentPinSchema = Obj({
  agent_deployment_id: Type.String(),
  agent_deployment_revision_id: Type.String(),
  revision_number: Type.Integer({ minimum: 1 }),
  runner_pool_id: Type.Union([Type.String(), Type.Null()]),
  harness_topology: ManagedTopology,
  harness_profile_id: Type.String(),
  harness_profile_revision_number: Type.Integer({ minimum: 1 }),
  /** The routing profile revision model steps of the Session use (not the profile's latest). */
  model_routing_profile_id: Type.String(),
  model_routing_profile_revision_number: Type.Integer({ minimum: 1 }),
  connection_binding_selections: Type.Array(Obj({ agent_deployment_connection_binding_id: Type.String(), binding_revision_number: Type.Integer({ minimum: 1 }) })),
});
export type DeploymentPin = Static<typeof DeploymentPinSchema>;
