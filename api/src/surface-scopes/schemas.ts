import { Id, Nullable, Obj, Timestamp, Type } from '@agentplane/core';

export const SCOPE_KINDS = ['root', 'team', 'channel', 'personal'] as const;
export type ScopeKind = (typeof SCOPE_KINDS)[number];
/** The first value of each is the contract's; the others are designed here (docs/SURFACE_SCOPES.md). */
export const VISIBILITIES = ['public', 'private'] as const;
export const MEMBERSHIPS = ['public', 'invite_only', 'verified'] as const;
export const INHERITANCES = ['inherit', 'isolate'] as const;
export const SCOPE_STATES = ['active', 'archived'] as const;

const lit = <T extends string>(values: readonly T[]) => Type.Union(values.map((v) => Type.Literal(v)));

export const ScopeKindSchema = lit(SCOPE_KINDS);
export const VisibilitySchema = lit(VISIBILITIES);
export const MembershipSchema = lit(MEMBERSHIPS);
export const InheritanceSchema = lit(INHERITANCES);

/** The length-1-to-512 string filter of `GET /v1/surface-scopes`: the external system's id of the scope. */
export const ExternalId = () => Type.String({ minLength: 1, maxLength: 512 });
const DisplayName = () => Type.String({ minLength: 1, maxLength: 256 });

export const VerifiedMemberSchema = Obj({
  principal_id: Id('principal'),
  external_identity_link_id: Nullable(Type.String({ minLength: 1, maxLength: 512 })),
  paired_at: Timestamp(),
});
export const VerifiedMemberInput = Obj({
  principal_id: Id('principal'),
  external_identity_link_id: Type.Optional(Nullable(Type.String({ minLength: 1, maxLength: 512 }))),
  paired_at: Type.Optional(Timestamp()),
});
export const MembershipAssertionSchema = Obj({
  asserted_at: Timestamp(),
  freshness_horizon_seconds: Type.Integer({ minimum: 1, maximum: 31_536_000 }),
});
const Count = () => Nullable(Type.Integer({ minimum: 0, maximum: 1_000_000_000 }));
export const AmbientPolicySchema = Obj({
  enabled: Type.Boolean(),
  muted: Type.Boolean(),
  max_responses_per_window: Count(),
  max_tokens_per_window: Count(),
  self_quiet_threshold: Nullable(Type.Number({ minimum: 0, maximum: 1 })),
});
export const AmbientPolicyInput = Obj({
  enabled: Type.Optional(Type.Boolean()),
  muted: Type.Optional(Type.Boolean()),
  max_responses_per_window: Type.Optional(Count()),
  max_tokens_per_window: Type.Optional(Count()),
  self_quiet_threshold: Type.Optional(Nullable(Type.Number({ minimum: 0, maximum: 1 }))),
});

export const SurfaceScopeSchema = Obj({
  id: Id('surfaceScope'),
  type: Type.Literal('surface_scope'),
  workspace_id: Id('workspace'),
  external_installation_id: Nullable(Id('externalInstallation')),
  external_id: Nullable(ExternalId()),
  kind: ScopeKindSchema,
  parent_id: Nullable(Id('surfaceScope')),
  display_name: DisplayName(),
  visibility: VisibilitySchema,
  membership: MembershipSchema,
  inheritance: InheritanceSchema,
  state: lit(SCOPE_STATES),
  verified_member: Nullable(VerifiedMemberSchema),
  membership_assertion: Nullable(MembershipAssertionSchema),
  ambient_policy: AmbientPolicySchema,
  version: Type.Integer(),
  created_at: Timestamp(),
  updated_at: Timestamp(),
  archived_at: Nullable(Timestamp()),
});

export const CreateSurfaceScopeBody = Obj({
  kind: ScopeKindSchema,
  parent_id: Type.Optional(Nullable(Id('surfaceScope'))),
  external_installation_id: Type.Optional(Nullable(Id('externalInstallation'))),
  external_id: Type.Optional(Nullable(ExternalId())),
  display_name: DisplayName(),
  visibility: Type.Optional(VisibilitySchema),
  membership: Type.Optional(MembershipSchema),
  inheritance: Type.Optional(InheritanceSchema),
  verified_member: Type.Optional(Nullable(VerifiedMemberInput)),
  membership_assertion: Type.Optional(Nullable(MembershipAssertionSchema)),
  ambient_policy: Type.Optional(AmbientPolicyInput),
});

export const UpdateSurfaceScopeBody = Obj({
  display_name: Type.Optional(DisplayName()),
  visibility: Type.Optional(VisibilitySchema),
  membership: Type.Optional(MembershipSchema),
  inheritance: Type.Optional(InheritanceSchema),
  verified_member: Type.Optional(Nullable(VerifiedMemberInput)),
  membership_assertion: Type.Optional(Nullable(MembershipAssertionSchema)),
  ambient_policy: Type.Optional(AmbientPolicyInput),
  expected_version: Type.Optional(Type.Integer({ minimum: 1 })),
});

export const ExternalInstallationSchema = Obj({
  id: Id('externalInstallation'),
  type: Type.Literal('external_installation'),
  workspace_id: Id('workspace'),
  provider: Type.String({ pattern: '^[a-z0-9](?:[a-z0-9._-]{0,62})$' }),
  external_id: ExternalId(),
  display_name: DisplayName(),
  state: lit(SCOPE_STATES),
  version: Type.Integer(),
  created_at: Timestamp(),
  updated_at: Timestamp(),
  archived_at: Nullable(Timestamp()),
});

export const CreateExternalInstallationBody = Obj({
  provider: Type.String({ pattern: '^[a-z0-9](?:[a-z0-9._-]{0,62})$' }),
  external_id: ExternalId(),
  display_name: DisplayName(),
});

export const EffectivePolicySchema = Obj({
  surface_scope_id: Id('surfaceScope'),
  /** The scope, then each ancestor it inherits from, nearest first. */
  inherits_from: Type.Array(Id('surfaceScope')),
  ambient_policy: AmbientPolicySchema,
});
