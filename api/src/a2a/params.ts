/**
 * The JSON-RPC envelope and each method's params, checked at the edge before anything reads
 * them (docs/A2A.md, "Envelope and params"). The SDK's own decoding (`fromJSON`) is lenient: it
 * turns a string into a boolean, a word into NaN, drops unknown fields and throws on a `null`
 * part. Here every request is held to closed schemas first, so what the SDK then decodes is what
 * the client meant. Field lists follow the A2A v1.0 request messages; as ProtoJSON readers do,
 * the proto field name (`context_id`) is accepted for the JSON name (`contextId`), never both.
 */
import { Role, TaskState } from '@a2a-js/sdk';
import { ApiError, Obj, Type, validator, type TSchema } from '@agentplane/core';

type Json = Record<string, unknown>;
const isObj = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

/** The methods served (A2A v1.0, JSON-RPC binding). */
export const A2A_METHODS = ['SendMessage', 'SendStreamingMessage', 'GetTask', 'ListTasks', 'CancelTask', 'SubscribeToTask'] as const;
export type A2aMethod = (typeof A2A_METHODS)[number];

/** A refusal of the envelope (JSON-RPC -32600) or of the params (-32602), with what is wrong. */
export class ParamsError extends Error {
  constructor(readonly kind: 'request' | 'params', message: string) {
    super(message);
    this.name = 'ParamsError';
  }
}

// ---- the envelope ----------------------------------------------------------------------------

const Envelope = Obj({
  jsonrpc: Type.Literal('2.0'),
  // JSON-RPC 2.0: a string, a number (integers here, as the SDK reads them) or null.
  id: Type.Optional(Type.Union([Type.String(), Type.Integer(), Type.Null()])),
  method: Type.String({ minLength: 1 }),
  params: Type.Optional(Type.Unknown()),
});
const checkEnvelope = validator(Envelope, 'body', 'request');

/** One JSON-RPC request object, with an id: anything else is an invalid request. */
export function envelopeOf(body: unknown): { id: string | number | null; method: string; params: unknown } {
  if (Array.isArray(body)) throw new ParamsError('request', 'batch requests are not served: send one JSON-RPC request object');
  if (!isObj(body)) throw new ParamsError('request', 'the request must be a JSON-RPC request object');
  try {
    checkEnvelope(body);
  } catch (err) {
    if (err instanceof ApiError) throw new ParamsError('request', err.message);
    throw err;
  }
  // Every A2A method answers: a notification (no id) would run with nobody to tell the outcome.
  if (!('id' in body)) throw new ParamsError('request', 'request.id is required: notifications (requests without an id) are not served');
  return { id: body.id as string | number | null, method: body.method as string, params: body.params };
}

// ---- the params ------------------------------------------------------------------------------

/** Each field's proto name, where it differs from its JSON name. */
const PROTO_NAMES: Readonly<Record<string, string>> = {
  messageId: 'message_id', contextId: 'context_id', taskId: 'task_id', referenceTaskIds: 'reference_task_ids', mediaType: 'media_type',
  acceptedOutputModes: 'accepted_output_modes', taskPushNotificationConfig: 'task_push_notification_config',
  historyLength: 'history_length', returnImmediately: 'return_immediately', pageSize: 'page_size', pageToken: 'page_token',
  statusTimestampAfter: 'status_timestamp_after', includeArtifacts: 'include_artifacts',
};

/** A closed object whose fields may also be spelled by their proto names. */
function Proto(properties: Record<string, TSchema>): TSchema {
  const all: Record<string, TSchema> = {};
  for (const [k, s] of Object.entries(properties)) {
    all[k] = s;
    const alias = PROTO_NAMES[k];
    if (alias) all[alias] = s;
  }
  return Obj(all);
}

const enumNames = (e: Record<string, string | number>) => Object.keys(e).filter((k) => Number.isNaN(Number(k)) && (e[k] as number) >= 0);
const Str = () => Type.String();
const Metadata = () => Type.Object({});
const HistoryLength = () => Type.Integer({ minimum: 0 });
// A2A: 1 to 100 tasks a page (absent: 50). A size outside is refused, not clamped.
const PageSize = () => Type.Integer({ minimum: 1, maximum: 100 });
/** Push configuration, in either protocol version's name: refused (push notifications are not served), whatever its shape. */
const PushConfig = () => Type.Unknown();

const Part = Proto({
  text: Type.Optional(Str()),
  raw: Type.Optional(Type.String({ pattern: '^[A-Za-z0-9+/_-]*={0,2}$' })),
  url: Type.Optional(Str()),
  data: Type.Optional(Type.Unknown()),
  metadata: Type.Optional(Metadata()),
  filename: Type.Optional(Str()),
  mediaType: Type.Optional(Str()),
});

const Message = Proto({
  messageId: Type.Optional(Str()),
  contextId: Type.Optional(Str()),
  taskId: Type.Optional(Str()),
  role: Type.Literal(Role[Role.ROLE_USER] as 'ROLE_USER'),
  parts: Type.Array(Part),
  metadata: Type.Optional(Metadata()),
  extensions: Type.Optional(Type.Array(Str())),
  referenceTaskIds: Type.Optional(Type.Array(Str())),
});

const Configuration = Proto({
  acceptedOutputModes: Type.Optional(Type.Array(Str())),
  taskPushNotificationConfig: Type.Optional(PushConfig()),
  // A2A 0.3's name of the same thing.
  pushNotificationConfig: Type.Optional(PushConfig()),
  historyLength: Type.Optional(HistoryLength()),
  returnImmediately: Type.Optional(Type.Boolean()),
});

const Tenant = () => Type.Optional(Str());

const SendMessage = Proto({
  tenant: Tenant(),
  message: Message,
  configuration: Type.Optional(Configuration),
  metadata: Type.Optional(Metadata()),
});

const TaskId = () => Type.String({ minLength: 1 });

const PARAMS: Readonly<Record<A2aMethod, TSchema>> = {
  SendMessage,
  SendStreamingMessage: SendMessage,
  GetTask: Proto({ tenant: Tenant(), id: TaskId(), historyLength: Type.Optional(HistoryLength()) }),
  ListTasks: Proto({
    tenant: Tenant(),
    contextId: Type.Optional(Str()),
    status: Type.Optional(Type.Union(enumNames(TaskState as unknown as Record<string, number>).map((n) => Type.Literal(n)))),
    pageSize: Type.Optional(PageSize()),
    pageToken: Type.Optional(Type.String({ maxLength: 512 })),
    historyLength: Type.Optional(HistoryLength()),
    statusTimestampAfter: Type.Optional(Type.String({ format: 'date-time' })),
    includeArtifacts: Type.Optional(Type.Boolean()),
  }),
  CancelTask: Proto({ tenant: Tenant(), id: TaskId(), metadata: Type.Optional(Metadata()) }),
  SubscribeToTask: Proto({ tenant: Tenant(), id: TaskId() }),
};
const checks = Object.fromEntries(Object.entries(PARAMS).map(([m, s]) => [m, validator(s, 'body', 'params')])) as Record<A2aMethod, (v: unknown) => unknown>;

/** A field sent under both of its names: which one the SDK would read is not the client's to guess. */
function twice(obj: Json, where: string): void {
  for (const [json, proto] of Object.entries(PROTO_NAMES)) {
    if (json in obj && proto in obj) throw new ParamsError('params', `${where}: '${json}' and '${proto}' are the same field; send one`);
  }
}

/**
 * The params of one served method, checked: a closed schema per method (unknown fields, wrong
 * types and out-of-range numbers refused), then what a schema does not say well: a part carries
 * exactly one content field, and no field is sent under both its names.
 */
export function checkParams(method: A2aMethod, params: unknown): Json {
  if (!isObj(params)) throw new ParamsError('params', `params: ${params === undefined ? `${method} takes params` : 'must be an object'}`);
  try {
    checks[method](params);
  } catch (err) {
    if (err instanceof ApiError) throw new ParamsError('params', err.message);
    throw err;
  }
  twice(params, 'params');
  if (isObj(params.configuration)) twice(params.configuration, 'params.configuration');
  if (isObj(params.message)) {
    const message = params.message;
    twice(message, 'params.message');
    (message.parts as Json[]).forEach((part, i) => {
      twice(part, `params.message.parts.${i}`);
      const content = ['text', 'raw', 'url', 'data'].filter((k) => k in part);
      if (content.length !== 1) {
        throw new ParamsError('params', `params.message.parts.${i}: a part carries exactly one of 'text', 'raw', 'url', 'data'${content.length > 1 ? ` (it has ${content.map((k) => `'${k}'`).join(', ')})` : ''}`);
      }
    });
  }
  return params;
}

/** Push configuration in a send, in either protocol version's name. */
export function namesPushConfig(params: unknown): boolean {
  const cfg = isObj(params) ? params.configuration : undefined;
  return isObj(cfg) && ['taskPushNotificationConfig', 'task_push_notification_config', 'pushNotificationConfig'].some((k) => k in cfg);
}
