import { Id, Nullable, Obj, Timestamp, Type, Patch } from '@agentplane/core';

export const RoleSchema = Type.Union([
  Type.Literal('root'), Type.Literal('admin'), Type.Literal('developer'), Type.Literal('runner'), Type.Literal('viewer'),
]);
export const KeyScopeSchema = Type.Union([
  Obj({ type: Type.Literal('organization') }),
  Obj({ type: Type.Literal('workspace'), workspace_id: Id('workspace') }),
]);
const RateLimit = Nullable(Type.Integer({ minimum: 1, maximum: 1_000_000 }));

export const ApiKeySchema = Obj({
  id: Id('apiKey'), type: Type.Literal('api_key'), organization_id: Id('organization'), display_name: Type.String(),
  role: RoleSchema, scope: KeyScopeSchema, rate_limit_per_minute: RateLimit,
  status: Type.Union([Type.Literal('active'), Type.Literal('revoked')]), generation_number: Type.Integer(),
  secret_hint: Type.String(), revoked_at: Nullable(Timestamp()), version: Type.Integer(),
  created_at: Timestamp(), updated_at: Timestamp(),
  secret: Type.Optional(Type.String({ description: 'Returned once, on create and rotate' })),
});

export const CreateApiKeyBody = Obj({
  display_name: Type.String({ minLength: 1, maxLength: 200 }),
  role: RoleSchema,
  scope: KeyScopeSchema,
  rate_limit_per_minute: Type.Optional(RateLimit),
});

export const PatchApiKeyBody = Patch({
  expected_version: Type.Optional(Type.Integer({ minimum: 1 })),
  display_name: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
  role: Type.Optional(RoleSchema),
  rate_limit_per_minute: Type.Optional(RateLimit),
});

export const VersionFenceBody = Obj({ expected_version: Type.Optional(Type.Integer({ minimum: 1 })) });

export const WorkspaceSchema = Obj({
  id: Id('workspace'), type: Type.Literal('workspace'), organization_id: Id('organization'), name: Type.String(),
  status: Type.Union([Type.Literal('active'), Type.Literal('disabled')]), version: Type.Integer(),
  created_at: Timestamp(), updated_at: Timestamp(),
});

export const PrincipalSchema = Obj({
  id: Id('principal'), type: Type.Literal('principal'), workspace_id: Id('workspace'),
  external_subject_id: Type.String(), principal_type: Type.Union([Type.Literal('person'), Type.Literal('service')]),
  display_name: Type.String(), status: Type.Union([Type.Literal('active'), Type.Literal('suspended'), Type.Literal('deleted')]),
  suspended_at: Nullable(Timestamp()), deleted_at: Nullable(Timestamp()), version: Type.Integer(),
  created_at: Timestamp(), updated_at: Timestamp(),
});

export const CreatePrincipalBody = Obj({
  external_subject_id: Type.String({ minLength: 1, maxLength: 255 }),
  principal_type: Type.Union([Type.Literal('person'), Type.Literal('service')]),
  display_name: Type.String({ minLength: 1, maxLength: 200 }),
});

export const Audience = Type.Union([Type.Literal('api_mcp'), Type.Literal('a2a')]);

export const PrincipalCredentialSchema = Obj({
  id: Id('principalCredential'), type: Type.Literal('principal_access_credential'), workspace_id: Id('workspace'),
  principal_id: Id('principal'), audience: Audience, status: Type.Union([Type.Literal('active'), Type.Literal('revoked')]),
  generation_number: Type.Integer(), secret_hint: Type.String(), rotated_at: Nullable(Timestamp()),
  revoked_at: Nullable(Timestamp()), version: Type.Integer(), created_at: Timestamp(), updated_at: Timestamp(),
  secret: Type.Optional(Type.String()),
});

export const GenerationFenceBody = Obj({ expected_generation_number: Type.Integer({ minimum: 1 }) });
