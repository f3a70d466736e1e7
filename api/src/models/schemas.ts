import { Cursor, Id, LogicalKey, Nullable, Obj, Timestamp, Type } from '@agentplane/core';
import { PROVIDER_KEYS } from '@agentplane/models';

export const ProviderKeySchema = Type.Union(PROVIDER_KEYS.map((k) => Type.Literal(k)));
/**
 * Visible ASCII, inner spaces allowed: the key travels in an HTTP header, where a line break or
 * a character outside Latin-1 cannot go (such a key would fail every call as "unreachable").
 */
const Secret = Type.String({ minLength: 1, maxLength: 8192, pattern: '^[!-~](?:[ -~]*[!-~])?$', description: 'The provider API key (visible ASCII); sealed at rest, never returned' });
const BaseUrl = Type.String({ minLength: 8, maxLength: 2048, pattern: '^https?://', description: 'e.g. http://127.0.0.1:11434/v1 for Ollama' });

export const ModelCredentialSchema = Obj({
  id: Id('modelCredential'), workspace_id: Id('workspace'), key: LogicalKey(), display_name: Type.String(),
  provider_key: ProviderKeySchema, base_url: Nullable(Type.String()), custody_policy: Type.Literal('workspace_vault'),
  status: Type.Union([Type.Literal('active'), Type.Literal('revoked')]),
  health_status: Type.Union([Type.Literal('unknown'), Type.Literal('healthy'), Type.Literal('unhealthy')]),
  active_generation_number: Type.Integer({ minimum: 1 }), resource_version: Type.Integer({ minimum: 1 }),
  created_at: Timestamp(), updated_at: Timestamp(), revoked_at: Nullable(Timestamp()),
});

export const CreateModelCredentialBody = Obj({
  key: LogicalKey(),
  display_name: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
  provider_key: ProviderKeySchema,
  base_url: Type.Optional(Nullable(BaseUrl)),
  secret: Type.Optional(Secret),
});

export const RotateModelCredentialBody = Obj({
  secret: Secret,
  expected_generation_number: Type.Optional(Type.Integer({ minimum: 1 })),
});

export const RevokeModelCredentialBody = Obj({ expected_resource_version: Type.Optional(Type.Integer({ minimum: 1 })) });

const Constraints = Obj({
  tool_use: Type.Optional(Type.Boolean()),
  context_window_tokens: Type.Optional(Type.Integer({ minimum: 1 })),
  max_input_usd_per_mtok: Type.Optional(Type.Number({ minimum: 0 })),
  max_output_usd_per_mtok: Type.Optional(Type.Number({ minimum: 0 })),
});

export const CandidateSchema = Obj({
  credential_key: LogicalKey(),
  provider_model: Type.String({ minLength: 1, maxLength: 256 }),
  constraints: Type.Optional(Constraints),
});
const Candidates = Type.Array(CandidateSchema, { minItems: 1, maxItems: 16 });

export const RoutingProfileSchema = Obj({
  id: Id('modelRoutingProfile'), type: Type.Literal('model_routing_profile'), workspace_id: Id('workspace'), key: LogicalKey(),
  display_name: Type.String(), latest_revision_number: Type.Integer({ minimum: 1 }), candidates: Candidates,
  resource_version: Type.Integer({ minimum: 1 }), created_at: Timestamp(), updated_at: Timestamp(),
});

export const RoutingRevisionSchema = Obj({
  type: Type.Literal('model_routing_profile_revision'), model_routing_profile_id: Id('modelRoutingProfile'), workspace_id: Id('workspace'),
  revision_number: Type.Integer({ minimum: 1 }), candidates: Candidates, created_at: Timestamp(),
});

export const CreateRoutingProfileBody = Obj({
  key: LogicalKey(),
  display_name: Type.Optional(Type.String({ minLength: 1, maxLength: 200 })),
  candidates: Candidates,
});

export const CreateRevisionBody = Obj({
  expected_revision_number: Type.Optional(Type.Integer({ minimum: 1 })),
  candidates: Candidates,
});

export const KeyFilterQuery = {
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100, default: 20 })),
  page: Type.Optional(Cursor()),
  /** The logical-key filter: only the resource(s) holding this key. */
  key: Type.Optional(LogicalKey()),
};

// ---- model steps (model-gateway-v1 over REST) ----
/** An image's bytes, in padded base64 (what the providers take): anything else is the caller's mistake, refused here. */
const ImageData = Type.String({ minLength: 4, contentEncoding: 'base64', pattern: '^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$' });
const Block = Type.Union([
  Obj({ type: Type.Literal('text'), text: Type.String() }),
  Obj({ type: Type.Literal('thinking'), text: Type.String() }),
  Obj({ type: Type.Literal('tool_use'), id: Type.String({ minLength: 1, maxLength: 256 }), name: Type.String({ minLength: 1, maxLength: 128 }), input: Type.Unknown() }),
  Obj({ type: Type.Literal('tool_result'), tool_use_id: Type.String({ minLength: 1, maxLength: 256 }), content: Type.String(), is_error: Type.Optional(Type.Boolean()),
    images: Type.Optional(Type.Array(Obj({ type: Type.Literal('image'), media_type: Type.Union([Type.Literal('image/png'), Type.Literal('image/jpeg')]), data: ImageData }), { maxItems: 8 })),
  }),
]);
export const ModelRequestBody = Obj({
  routing_key: LogicalKey(),
  system: Type.Optional(Type.String({ maxLength: 1_000_000 })),
  messages: Type.Array(Obj({ role: Type.Union([Type.Literal('user'), Type.Literal('assistant')]), content: Type.Array(Block, { maxItems: 1000 }) }), { minItems: 1, maxItems: 10_000 }),
  tools: Type.Optional(Type.Array(Obj({ name: Type.String({ minLength: 1, maxLength: 128 }), description: Type.String({ maxLength: 10_000 }), input_schema: Type.Record(Type.String(), Type.Unknown()) }), { maxItems: 256 })),
  max_output_tokens: Type.Optional(Type.Integer({ minimum: 1, maximum: 1_000_000 })),
  temperature: Type.Optional(Type.Number({ minimum: 0, maximum: 2 })),
});

// ---- usage and budgets ----
const Usage = Obj({
  input_tokens: Type.Integer(), cached_input_tokens: Type.Integer(), cache_write_input_tokens: Type.Integer(),
  output_tokens: Type.Integer(), reasoning_output_tokens: Type.Integer(), total_tokens: Type.Integer(),
});
const Money = Obj({ amount: Type.Number({ minimum: 0 }), currency: Type.Literal('USD') });
export const UsageSummarySchema = Obj({ usage: Usage, list_cost: Money, steps: Type.Integer(), unpriced_steps: Type.Integer() });

export const WorkspaceBudgetSchema = Obj({
  workspace_id: Id('workspace'), max_list_cost: Money,
  period: Type.Union([Type.Literal('day'), Type.Literal('month'), Type.Literal('lifetime')]), updated_at: Timestamp(),
});
export const PutWorkspaceBudgetBody = Obj({
  max_list_cost: Obj({ amount: Type.Number({ exclusiveMinimum: 0, maximum: 1e9 }), currency: Type.Optional(Type.Literal('USD')) }),
  period: Type.Union([Type.Literal('day'), Type.Literal('month'), Type.Literal('lifetime')]),
});

export const WorkspaceUsageSchema = Obj({
  type: Type.Literal('workspace_model_usage'),
  workspace_id: Id('workspace'),
  total: UsageSummarySchema,
  current_day: Obj({ period_start: Timestamp(), summary: UsageSummarySchema }),
  current_month: Obj({ period_start: Timestamp(), summary: UsageSummarySchema }),
  budget: Nullable(WorkspaceBudgetSchema),
});

/** Per-day workspace usage (UTC days), oldest first; days with no model step are zeros. */
export const WorkspaceDailyUsageSchema = Obj({
  type: Type.Literal('workspace_model_usage_daily'),
  workspace_id: Id('workspace'),
  days: Type.Array(Obj({ date: Type.String({ pattern: '^\\d{4}-\\d{2}-\\d{2}$' }), summary: UsageSummarySchema })),
});

export const SessionUsageSchema = Obj({
  type: Type.Literal('session_model_usage'),
  session_id: Id('session'),
  thread_id: Nullable(Id('thread')),
  run_id: Nullable(Id('run')),
  summary: UsageSummarySchema,
});
