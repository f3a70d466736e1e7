import { ApiError, check, Cursor, Id, Metadata, Nullable, Obj, Type, type Static, type TSchema } from '@agentplane/core';
import { McpServers, Tools } from '@agentplane/domain';
import { AgentConfigFields } from '../agents/schemas.js';

// ---- drive events ------------------------------------------------------------------------------

export const DRIVE_EVENT_TYPES = [
  'user.message', 'user.interrupt', 'user.custom_tool_result', 'user.tool_confirmation', 'user.question_answer', 'user.define_outcome',
] as const;
export type DriveEventType = (typeof DRIVE_EVENT_TYPES)[number];

const CausedBy = Obj({
  kind: Type.Union([Type.Literal('api'), Type.Literal('mcp'), Type.Literal('automation'), Type.Literal('a2a')]),
  id: Type.Optional(Type.String({ minLength: 1, maxLength: 255 })),
});
const Common = { authored_by: Id('principal'), caused_by: CausedBy };
const ThreadRef = Type.Optional(Id('thread'));
const ToolUseId = Type.String({ pattern: '^toolu_[0-9A-Za-z]{1,64}$' });
const TextBlock = Obj({ type: Type.Literal('text'), text: Type.String({ maxLength: 1_000_000 }) });
/** A message's text, as a string or blocks: never empty, as a block or as the whole (providers refuse an empty text block). */
const Content = Type.Union([
  Type.String({ minLength: 1, maxLength: 1_000_000 }),
  Type.Array(Obj({ type: Type.Literal('text'), text: Type.String({ minLength: 1, maxLength: 1_000_000 }) }), { minItems: 1, maxItems: 100 }),
]);
const AnyJson = Type.Unsafe<unknown>({});
/** One answer to one question of `ask_user`: free text, chosen options, or both (an "other" answer). */
const QuestionAnswer = Obj({
  text: Type.Optional(Type.String({ maxLength: 16_384 })),
  selected: Type.Optional(Type.Array(Type.String({ minLength: 1, maxLength: 200 }), { maxItems: 16, uniqueItems: true })),
}, { minProperties: 1 });

export const DRIVE_PAYLOADS: Record<DriveEventType, TSchema> = {
  'user.message': Obj({ ...Common, content: Content, session_thread_id: ThreadRef }),
  'user.interrupt': Obj({ ...Common, session_thread_id: ThreadRef }),
  'user.custom_tool_result': Obj({
    ...Common, tool_use_id: ToolUseId, session_thread_id: ThreadRef,
    result: Type.Union([Type.String({ maxLength: 1_000_000 }), Type.Array(TextBlock, { maxItems: 100 }), Type.Record(Type.String(), AnyJson)]),
    is_error: Type.Optional(Type.Boolean()),
  }),
  'user.tool_confirmation': Obj({
    ...Common, tool_use_id: ToolUseId, session_thread_id: ThreadRef,
    result: Type.Union([Type.Literal('allow'), Type.Literal('deny')]),
    deny_message: Type.Optional(Type.String({ maxLength: 4096 })),
  }),
  'user.question_answer': Obj({
    ...Common, tool_use_id: ToolUseId, session_thread_id: ThreadRef,
    /** One answer per question, in the order asked (docs/OUTCOMES.md, "Questions"). Exactly one of `answers` and `declined`. */
    answers: Type.Optional(Type.Array(QuestionAnswer, { minItems: 1, maxItems: 8 })),
    /** The Session declines to answer; the agent is told so (with the reason, when given). */
    declined: Type.Optional(Type.Literal(true)),
    reason: Type.Optional(Type.String({ maxLength: 4096 })),
  }),
  'user.define_outcome': Obj({
    ...Common,
    description: Type.String({ minLength: 1, maxLength: 16_384 }),
    /** Markdown text, or a File of this workspace holding it (docs/OUTCOMES.md). */
    rubric: Type.Union([Type.String({ minLength: 1, maxLength: 65_536 }), Obj({ type: Type.Literal('file'), file_id: Id('file') })]),
    max_iterations: Type.Optional(Type.Integer({ minimum: 1, maximum: 20, default: 3 })),
    /** The grader's routing profile key for this outcome (else the workspace default). */
    grader_model: Type.Optional(Type.String({ pattern: '^[a-z0-9](?:[a-z0-9._-]{0,93})$' })),
  }),
};

export const DriveEventBody = Obj({
  type: Type.Union(DRIVE_EVENT_TYPES.map((t) => Type.Literal(t))),
  payload: Type.Unsafe<Record<string, unknown>>({ type: 'object', description: 'Per-type payload; see docs/API.md' }),
});

export interface DrivePayload {
  authored_by: string;
  caused_by: { kind: string; id?: string };
  session_thread_id?: string;
  tool_use_id?: string;
  [k: string]: unknown;
}

/** Validate a drive event's payload against its type, naming the field as `<where>.payload.<field>`. */
export function checkDrivePayload(type: DriveEventType, payload: unknown, where = 'body'): DrivePayload {
  try {
    const checked = check(DRIVE_PAYLOADS[type], payload) as DrivePayload;
    // A reason for a denial given with an allow would be stored and never read.
    if (type === 'user.tool_confirmation' && checked.result === 'allow' && checked.deny_message !== undefined) {
      throw new ApiError('validation.malformed', "body.deny_message: only a 'deny' result takes one");
    }
    return checked;
  } catch (err) {
    if (err instanceof ApiError) throw new ApiError(err.type, err.message.replace(/^body/, `${where}.payload`));
    throw err;
  }
}

// ---- sessions --------------------------------------------------------------------------------

const AgentRef = Obj({ id: Id('agent'), version: Type.Optional(Type.Integer({ minimum: 1 })) });
const InlineAgent = Obj(AgentConfigFields);
export const SessionAgentInput = Type.Union([Id('agent'), AgentRef, InlineAgent]);

export const Budget = Obj({ max_list_cost: Obj({ amount: Type.Number({ minimum: 0, maximum: 1_000_000_000 }), currency: Type.Optional(Type.Literal('USD')) }) });

export const ResourceInput = Type.Union([
  Obj({ type: Type.Literal('repository'), url: Type.String({ pattern: '^(https://|git@)', maxLength: 2048 }), ref: Type.Optional(Nullable(Type.String({ minLength: 1, maxLength: 255 }))), mount_path: Type.Optional(Nullable(Type.String({ pattern: '^/', maxLength: 1024 }))) }),
  Obj({ type: Type.Literal('file'), file_id: Id('file'), mount_path: Type.Optional(Nullable(Type.String({ pattern: '^/', maxLength: 1024 }))) }),
  Obj({ type: Type.Literal('memory'), memory_store_id: Id('memoryStore'), access: Type.Optional(Type.Union([Type.Literal('read_only'), Type.Literal('read_write')])) }),
  Obj({ type: Type.Literal('uploaded_project'), project_id: Id('project'), revision_number: Type.Optional(Type.Integer({ minimum: 1 })), mount_path: Type.Optional(Nullable(Type.String({ pattern: '^/', maxLength: 1024 }))) }),
]);
export const ResourceUpdate = Obj(
  {
    ref: Type.Optional(Nullable(Type.String({ minLength: 1, maxLength: 255 }))),
    mount_path: Type.Optional(Nullable(Type.String({ pattern: '^/', maxLength: 1024 }))),
    access: Type.Optional(Type.Union([Type.Literal('read_only'), Type.Literal('read_write')])),
  },
  { minProperties: 1 },
);

export const InitialEvent = Obj({ type: DriveEventBody.properties.type, payload: DriveEventBody.properties.payload });

export const CreateSessionBody = Obj({
  agent: SessionAgentInput,
  environment_id: Id('environment'),
  budget: Type.Optional(Nullable(Budget)),
  initial_events: Type.Optional(Type.Array(InitialEvent, { maxItems: 50 })),
  metadata: Type.Optional(Metadata()),
  resources: Type.Optional(Type.Array(ResourceInput, { maxItems: 64 })),
  title: Type.Optional(Nullable(Type.String({ maxLength: 500 }))),
  vault_ids: Type.Optional(Type.Array(Id('vault'), { maxItems: 32, uniqueItems: true })),
});
export type CreateSessionInput = Static<typeof CreateSessionBody>;

export const UpdateSessionBody = Obj(
  {
    agent: Type.Optional(Obj({ mcp_servers: Type.Optional(McpServers), tools: Type.Optional(Tools) }, { minProperties: 1 })),
    budget: Type.Optional(Nullable(Budget)),
    metadata: Type.Optional(Metadata()),
    title: Type.Optional(Nullable(Type.String({ maxLength: 500 }))),
    vault_ids: Type.Optional(Type.Array(Id('vault'), { maxItems: 32, uniqueItems: true })),
  },
  { minProperties: 1 },
);

export const ListSessionsQuery = Obj({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 100, default: 20 })),
  page: Type.Optional(Cursor()),
  order: Type.Optional(Type.Union([Type.Literal('desc'), Type.Literal('asc')], { default: 'desc' })),
  agent_id: Type.Optional(Id('agent')),
  automation_id: Type.Optional(Id('automation')),
  created_after: Type.Optional(Type.String({ format: 'date-time' })),
  created_before: Type.Optional(Type.String({ format: 'date-time' })),
  include_archived: Type.Optional(Type.Boolean({ default: false })),
});

export const SessionPath = Obj({ session_id: Id('session') });
export const ResourcePath = Obj({ session_id: Id('session'), resource_id: Id('resource') });
export const ThreadPath = Obj({ session_id: Id('session'), thread_id: Id('thread') });

export const StreamQuery = Obj({
  event_deltas: Type.Optional(Type.String({ pattern: '^(agent\\.message|agent\\.thinking)(,(agent\\.message|agent\\.thinking))?$' })),
  /** Same as the Last-Event-ID header (for clients that cannot set headers). */
  last_event_id: Type.Optional(Type.Integer({ minimum: 0 })),
});

export const ThreadListQuery = Obj({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 1000 })),
  page: Type.Optional(Cursor()),
});

export const ThreadEventsQuery = Obj({
  limit: Type.Optional(Type.Integer({ minimum: 1, maximum: 1000, default: 100 })),
  after: Type.Optional(Type.Integer({ minimum: 0 })),
  page: Type.Optional(Cursor()),
});
