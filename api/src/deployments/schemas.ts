import { Cursor, DIGEST_PATTERN, Id, LogicalKey, Metadata, Nullable, Obj, Timestamp, Type, type Static } from '@agentplane/core';
import { ImageReference, Network, Packages, Resources, ResourcesInput, Retention, HarnessKind, ManagedTopology } from '@agentplane/domain';
import { CreateSessionBody } from '../sessions/schemas.js';

const Digest = () => Type.String({ pattern: DIGEST_PATTERN });
const Positive = () => Type.Integer({ minimum: 1 });
const DisplayName = () => Type.String({ minLength: 1, maxLength: 200 });
const Status = Type.Union([Type.Literal('active'), Type.Literal('archived')]);

// ---- AgentDeployment ------------------------------------------------------------------------

export const AgentDeploymentSchema = Obj({
  id: Id('agentDeployment'), workspace_id: Id('workspace'), agent_id: Id('agent'), key: Type.String(), display_name: Nullable(Type.String()),
  status: Status, current_revision_number: Type.Integer({ minimum: 0 }), resource_version: Positive(),
  created_at: Timestamp(), updated_at: Timestamp(), archived_at: Nullable(Timestamp()),
});

export const CreateDeploymentBody = Obj({
  agent_id: Id('agent'),
  key: LogicalKey(),
  display_name: Type.Optional(Nullable(DisplayName())),
});

export const ListDeploymentsQuery = Obj({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100 })),
  page: Type.Optional(Cursor()),
  key: Type.Optional(LogicalKey()),
  status: Type.Optional(Status),
});

export const PatchDeploymentBody = Obj(
  { expected_resource_version: Positive(), display_name: Type.Optional(Nullable(DisplayName())), status: Type.Optional(Status) },
  { minProperties: 2 },
);

export const ManagedTarget = Obj({
  type: Type.Literal('managed'),
  harness_profile_id: Id('harnessProfile'),
  harness_profile_revision_number: Positive(),
  sandbox_profile_id: Id('sandboxProfile'),
  sandbox_profile_revision_number: Positive(),
  runner_pool_id: Type.Optional(Nullable(Id('runnerPool'))),
  harness_topology: ManagedTopology,
});
export const ConnectedTarget = Obj({
  type: Type.Literal('connected'),
  connected_harness_id: Id('connectedHarness'),
  capability_set_digest: Digest(),
  harness_topology: Type.Literal('connected'),
});
/** Closed discriminated union on `type`. */
export const ExecutionTarget = Type.Union([ManagedTarget, ConnectedTarget]);
export type ExecutionTargetT = Static<typeof ExecutionTarget>;

const SkillSelection = Obj({ skill_id: Type.String({ pattern: '^skill_[0-9a-f]{32}$' }), skill_revision_number: Positive() });
const BindingSelection = Obj({ agent_deployment_connection_binding_id: Id('agentDeploymentConnectionBinding'), binding_revision_number: Positive() });
const RosterEntry = Obj({
  position: Type.Integer({ minimum: 0 }), member_agent_id: Id('agent'), member_agent_release_number: Positive(),
  member_agent_deployment_id: Id('agentDeployment'), member_agent_deployment_revision_number: Positive(),
});
const RosterSnapshot = Obj({ entries: Type.Array(RosterEntry, { maxItems: 64 }) });

export const PublishRevisionBody = Obj({
  expected_resource_version: Positive(),
  agent_release_number: Positive(),
  model_routing: Obj({ model_routing_profile_id: Id('modelRoutingProfile'), model_routing_profile_revision_number: Positive() }),
  execution_target: ExecutionTarget,
  skill_selections: Type.Array(SkillSelection, { maxItems: 64 }),
  connection_binding_selections: Type.Array(BindingSelection, { maxItems: 64 }),
  roster_snapshot: Type.Optional(RosterSnapshot),
});
export type PublishRevisionInput = Static<typeof PublishRevisionBody>;

export const RevisionSchema = Obj({
  id: Id('agentDeploymentRevision'), agent_deployment_id: Id('agentDeployment'), workspace_id: Id('workspace'), revision_number: Positive(),
  agent_id: Id('agent'), agent_release_number: Positive(), model_routing_profile_id: Id('modelRoutingProfile'),
  model_routing_profile_revision_number: Positive(), execution_target: ExecutionTarget, skill_selections: Type.Array(SkillSelection),
  connection_binding_selections: Type.Array(BindingSelection), roster_snapshot: Nullable(RosterSnapshot),
  resolved_configuration_sha256: Digest(),
  published_by: Obj({ kind: Type.Union([Type.Literal('system'), Type.Literal('api_key')]), api_key_id: Type.Optional(Type.String()) }),
  published_at: Timestamp(),
});

export const DeployBody = Obj({ agent_release_number: Positive(), target_workspace_id: Id('workspace') });
export const DeployResult = Obj({
  outcome: Type.Union([Type.Literal('published'), Type.Literal('unchanged'), Type.Literal('head_only')]),
  agent_deployment: AgentDeploymentSchema,
  revision: Nullable(RevisionSchema),
  missing_profiles: Type.Array(Type.String()),
});

/** A Session created against a deployment: the Session create body without `agent` and `environment_id`. */
const { agent: _agent, environment_id: _env, ...sessionFields } = CreateSessionBody.properties;
export const DeploymentSessionBody = Obj(sessionFields);

// ---- Connection bindings --------------------------------------------------------------------

export const BindingSchema = Obj({
  id: Id('agentDeploymentConnectionBinding'), workspace_id: Id('workspace'), agent_deployment_id: Id('agentDeployment'),
  integration_connection_id: Id('connection'), key: Type.String(), display_name: Nullable(Type.String()), status: Status,
  current_revision_number: Type.Integer({ minimum: 0 }), resource_version: Positive(), created_at: Timestamp(), updated_at: Timestamp(),
});
export const CreateBindingBody = Obj({
  agent_deployment_id: Id('agentDeployment'), integration_connection_id: Id('connection'), key: LogicalKey(),
  display_name: Type.Optional(Nullable(DisplayName())),
});
export const PatchBindingBody = Obj(
  { expected_resource_version: Positive(), display_name: Type.Optional(Nullable(DisplayName())), status: Type.Optional(Status) },
  { minProperties: 1 },
);
const ToolName = Type.String({ pattern: '^[A-Za-z0-9_.-]{1,128}$' });
export const PublishBindingRevisionBody = Obj({
  expected_resource_version: Type.Optional(Positive()),
  tool_selection: Type.Array(ToolName, { maxItems: 256, uniqueItems: true }),
  tool_aliases: Type.Record(Type.String({ pattern: '^[A-Za-z0-9_.-]{1,128}$' }), ToolName, { maxProperties: 256 }),
  argument_policy: Type.Union([Type.Literal('default'), Type.Literal('strict')]),
});
export const BindingRevisionSchema = Obj({
  agent_deployment_connection_binding_id: Id('agentDeploymentConnectionBinding'), workspace_id: Id('workspace'),
  binding_revision_number: Positive(), tool_selection: Type.Array(Type.String()), tool_aliases: Type.Record(Type.String(), Type.String()),
  argument_policy: Type.Union([Type.Literal('default'), Type.Literal('strict')]), published_at: Timestamp(),
});

// ---- ConnectedHarness -----------------------------------------------------------------------

export const ConnectedHarnessSchema = Obj({
  id: Id('connectedHarness'), workspace_id: Id('workspace'), key: Type.String(), display_name: Nullable(Type.String()),
  capability_set_digest: Digest(), status: Status, resource_version: Positive(), created_at: Timestamp(), updated_at: Timestamp(),
});
export const CreateConnectedHarnessBody = Obj({ key: LogicalKey(), display_name: Type.Optional(Nullable(DisplayName())), capability_set_digest: Digest() });

// ---- Harness and sandbox profiles -----------------------------------------------------------

const HarnessConfig = {
  display_name: Type.Optional(Nullable(DisplayName())),
  kind: HarnessKind,
  supported_topologies: Type.Optional(Type.Array(ManagedTopology, { minItems: 1, maxItems: 2, uniqueItems: true })),
  connected_harness_id: Type.Optional(Nullable(Id('connectedHarness'))),
  metadata: Type.Optional(Metadata()),
};
export const CreateHarnessProfileBody = Obj({ key: LogicalKey(), ...HarnessConfig });
export const HarnessRevisionBody = Obj({ expected_revision_number: Positive(), ...HarnessConfig });
export const HarnessProfileSchema = Obj({
  id: Id('harnessProfile'), type: Type.Literal('harness_profile'), workspace_id: Id('workspace'), key: Type.String(),
  display_name: Nullable(Type.String()), kind: HarnessKind, supported_topologies: Type.Array(ManagedTopology),
  connected_harness_id: Nullable(Id('connectedHarness')), metadata: Metadata(), revision_number: Positive(),
  archived_at: Nullable(Timestamp()), created_at: Timestamp(), updated_at: Timestamp(),
});

const SandboxConfig = {
  display_name: Type.Optional(Nullable(DisplayName())),
  image: ImageReference(),
  resources: Type.Optional(ResourcesInput),
  network: Type.Optional(Network),
  retention_mode: Type.Optional(Retention),
  packages: Type.Optional(Packages),
  metadata: Type.Optional(Metadata()),
};
export const CreateSandboxProfileBody = Obj({ key: LogicalKey(), ...SandboxConfig });
export const SandboxRevisionBody = Obj({ expected_revision_number: Positive(), ...SandboxConfig });
export const SandboxProfileSchema = Obj({
  id: Id('sandboxProfile'), type: Type.Literal('sandbox_profile'), workspace_id: Id('workspace'), key: Type.String(),
  display_name: Nullable(Type.String()), image: Type.String(), driver: Type.Literal('docker'), tier: Type.Literal('container'),
  resources: Resources, network: Network, retention_mode: Retention, packages: Packages, metadata: Metadata(), revision_number: Positive(),
  archived_at: Nullable(Timestamp()), created_at: Timestamp(), updated_at: Timestamp(),
});

export const ProfileListQuery = Obj({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100 })),
  page: Type.Optional(Cursor()),
  key: Type.Optional(LogicalKey()),
});
