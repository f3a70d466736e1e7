import { Id, Nullable, Obj, Patch, Timestamp, Type } from '@agentplane/core';
import { FEEDBACK_DISPOSITIONS } from './model.js';
import { MAX_PROMPT_BYTES } from './prompt.js';

const Missed = Type.Union([Type.Literal('fire_once'), Type.Literal('skip')]);
export const TriggerInput = Type.Union([
  Obj({ type: Type.Literal('schedule'), cron: Type.String({ minLength: 9, maxLength: 128 }), timezone: Type.Optional(Type.String({ minLength: 1, maxLength: 64 })), on_missed: Type.Optional(Missed) }),
  Obj({ type: Type.Literal('schedule'), interval_seconds: Type.Integer({ minimum: 1, maximum: 366 * 24 * 3600 }), on_missed: Type.Optional(Missed) }),
  Obj({ type: Type.Literal('webhook') }),
  Obj({
    type: Type.Literal('subscription'), event: Type.Literal('session.turn_ended'),
    filter: Type.Optional(Obj({
      stop_reasons: Type.Optional(Type.Array(Type.String({ pattern: '^[a-z_]{1,64}$' }), { maxItems: 16, uniqueItems: true })),
      agent_ids: Type.Optional(Type.Array(Id('agent'), { maxItems: 64, uniqueItems: true })),
    })),
  }),
  Obj({
    type: Type.Literal('subscription'), event: Type.Literal('webhook_endpoint.disabled'),
    filter: Type.Optional(Obj({ webhook_endpoint_ids: Type.Optional(Type.Array(Id('webhookEndpoint'), { maxItems: 64, uniqueItems: true })) })),
  }),
]);
/** An Agent id, or `{id, version}` as an Automation answers it (`version` null or absent: the current version at each firing). */
export const AgentRefInput = Type.Union([Id('agent'), Obj({ id: Id('agent'), version: Type.Optional(Nullable(Type.Integer({ minimum: 1 }))) })]);
export const BudgetInput = Obj({ max_list_cost: Obj({ amount: Type.Number({ minimum: 0, maximum: 1_000_000_000 }), currency: Type.Optional(Type.Literal('USD')) }) });
/** Byte length is checked after validation (64 KiB of UTF-8); characters bound it here. */
export const Prompt = Type.String({ minLength: 1, maxLength: MAX_PROMPT_BYTES });
export const Name = Type.String({ minLength: 1, maxLength: 200 });
export const MaxConcurrent = Type.Integer({ minimum: 1, maximum: 100 });

export const CreateAutomationBody = Obj({
  name: Name,
  principal_id: Id('principal'),
  agent: AgentRefInput,
  environment_id: Id('environment'),
  prompt: Prompt,
  budget: Type.Optional(Nullable(BudgetInput)),
  max_concurrent_firings: Type.Optional(MaxConcurrent),
  trigger: TriggerInput,
});

export const UpdateAutomationBody = Patch({
  expected_version: Type.Integer({ minimum: 1 }),
  name: Type.Optional(Name),
  principal_id: Type.Optional(Id('principal')),
  agent: Type.Optional(AgentRefInput),
  environment_id: Type.Optional(Id('environment')),
  prompt: Type.Optional(Prompt),
  budget: Type.Optional(Nullable(BudgetInput)),
  max_concurrent_firings: Type.Optional(MaxConcurrent),
  trigger: Type.Optional(TriggerInput),
});

const TriggerView = Type.Union([
  Obj({ type: Type.Literal('schedule'), cron: Type.String(), timezone: Type.String(), on_missed: Missed }),
  Obj({ type: Type.Literal('schedule'), interval_seconds: Type.Integer(), on_missed: Missed }),
  Obj({ type: Type.Literal('webhook') }),
  Obj({ type: Type.Literal('subscription'), event: Type.Literal('session.turn_ended'), filter: Obj({ stop_reasons: Type.Array(Type.String()), agent_ids: Type.Array(Id('agent')) }) }),
  Obj({ type: Type.Literal('subscription'), event: Type.Literal('webhook_endpoint.disabled'), filter: Obj({ webhook_endpoint_ids: Type.Array(Id('webhookEndpoint')) }) }),
]);
export const AutomationSchema = Obj({
  id: Id('automation'), type: Type.Literal('automation'), workspace_id: Id('workspace'), name: Type.String(),
  status: Type.Union([Type.Literal('active'), Type.Literal('paused')]), principal_id: Id('principal'),
  agent: Obj({ id: Id('agent'), version: Nullable(Type.Integer()) }), environment_id: Id('environment'), prompt: Type.String(),
  budget: Nullable(Obj({ max_list_cost: Obj({ amount: Type.Number(), currency: Type.Literal('USD') }) })),
  max_concurrent_firings: Type.Integer(), trigger: TriggerView,
  webhook: Nullable(Obj({ ingest_path: Type.String(), secret_generation: Type.Integer(), previous_secret_expires_at: Nullable(Timestamp()) })),
  next_fire_at: Type.Optional(Nullable(Timestamp())),
  metrics: Type.Optional(Obj({ fires: Type.Integer(), admission_refusals: Type.Integer(), failures: Type.Integer(), skipped: Type.Integer(), succeeded: Type.Integer() })),
  signing_secret: Type.Optional(Type.String({ description: 'webhook triggers: returned once, on create and rotation' })),
  version: Type.Integer(), created_at: Timestamp(), updated_at: Timestamp(),
});

const FiringStatus = Type.Union(['pending', 'running', 'completed', 'refused', 'skipped', 'failed'].map((s) => Type.Literal(s)));
export const FiringSchema = Obj({
  id: Id('automationFiring'), type: Type.Literal('automation_firing'), workspace_id: Id('workspace'), automation_id: Id('automation'),
  source: Obj({
    kind: Type.Union([Type.Literal('manual'), Type.Literal('schedule'), Type.Literal('webhook'), Type.Literal('subscription')]),
    delivery_id: Type.Optional(Type.String()), scheduled_at: Type.Optional(Timestamp()), event_type: Type.Optional(Type.String()), event_id: Type.Optional(Type.String()),
  }),
  status: FiringStatus, attempt_count: Type.Integer(), outcome: Nullable(Type.Union([Type.Literal('succeeded'), Type.Literal('failed'), Type.Literal('canceled')])),
  session_id: Nullable(Id('session')), run_id: Nullable(Id('run')), error: Nullable(Type.String()),
  admission: Obj({ disposition: Type.String(), check_configured: Type.Boolean() }),
  started_at: Nullable(Timestamp()), ended_at: Nullable(Timestamp()), stop_reason: Nullable(Type.String()),
  duplicate: Type.Optional(Type.Boolean()),
  version: Type.Integer(), created_at: Timestamp(), updated_at: Timestamp(),
});

export const Disposition = Type.Union(FEEDBACK_DISPOSITIONS.map((d) => Type.Literal(d)));
export const FeedbackSchema = Obj({
  id: Id('firingFeedback'), workspace_id: Id('workspace'), automation_id: Id('automation'), firing_id: Id('automationFiring'),
  authored_by: Id('principal'), disposition: Disposition, version: Type.Integer(), created_at: Timestamp(), updated_at: Timestamp(),
});

const Applicable = Type.Object({ applicable: Type.Boolean() }, { additionalProperties: true });
export const TraceSchema = Obj({
  authority: Type.Literal('firing_receipt_and_session_event_log'),
  firing: Type.Object({}, { additionalProperties: true }),
  filtering: Applicable, steps: Applicable, children: Applicable, execution: Applicable, delivery: Applicable, outcome_attempts: Applicable,
  admission: Obj({ disposition: Type.String(), check_configured: Type.Boolean(), check_usage: Type.Record(Type.String(), Type.Integer()) }),
  outcome: Obj({
    outcome_id: Nullable(Type.String()), result: Nullable(Type.String()), evaluation_count: Type.Integer(), revision_count: Type.Integer(),
    report: Obj({ status: Type.String(), output_count: Type.Integer(), accepted_count: Type.Integer() }),
  }),
  feedback: Obj({ total: Type.Integer(), by_disposition: Type.Record(Type.String(), Type.Integer()) }),
  completeness: Obj({ status: Type.Union(['complete', 'open', 'truncated', 'expired', 'erased'].map((s) => Type.Literal(s))), through_sequence: Type.Integer() }),
});
