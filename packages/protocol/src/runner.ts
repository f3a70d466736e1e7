/**
 * The runner protocol: one WebSocket per runner daemon, JSON text frames, each a versioned
 * envelope `{v, type, id, re?, payload}`. Both ends validate every frame against the schemas
 * below (unknown fields rejected). docs/PROTOCOL.md describes every message.
 */
import { Obj, Type, validator, ApiError, apiUrl, jsonDepth, MAX_JSON_NESTING, type Static, type TSchema } from '@agentplane/core';

/** Protocol versions this build speaks, newest first. */
export const RUNNER_PROTOCOL_VERSIONS = [1] as const;
export const RUNNER_CONNECT_PATH = '/v1/runners/connect';

/** The runner gateway's WebSocket URL under a control-plane base URL (base path kept). */
export function runnerConnectUrl(baseUrl: string): URL {
  const url = apiUrl(baseUrl, RUNNER_CONNECT_PATH);
  url.protocol = url.protocol === 'https:' ? 'wss:' : 'ws:';
  return url;
}
/**
 * A runner that lists this in `plane_protocols` takes offers whose spec follows in a
 * `lease.spec` frame (docs/PROTOCOL.md, "Offers whose spec follows").
 */
export const LEASE_SPEC_PROTOCOL = 'lease-spec-v1';
/** WebSocket subprotocol token; the version itself is negotiated in hello/welcome. */
export const RUNNER_SUBPROTOCOL = 'agentplane.runner';

/** Defaults (docs/PROTOCOL.md, "Timing"). */
export const RUNNER_DEFAULTS = Object.freeze({
  heartbeatIntervalMs: 5_000,
  /** ≈ 3 × heartbeat + grace. */
  presenceTtlMs: 20_000,
  helloTimeoutMs: 10_000,
  maxFrameBytes: 1024 * 1024,
  reconnectBaseMs: 1_000,
  reconnectCapMs: 64_000,
});

/** WebSocket close codes used by the gateway and the daemon. */
export const CLOSE = Object.freeze({
  NORMAL: 1000,
  GOING_AWAY: 1001,
  /** Sent by the ws library itself for a frame above maxPayload. */
  MESSAGE_TOO_BIG: 1009,
  /** A frame that is not JSON, not a valid envelope, or not valid for its type. */
  MALFORMED: 4400,
  /** Missing, unknown or revoked credential. */
  UNAUTHORIZED: 4401,
  /** The credential's owner Principal is suspended or deleted, or its tenancy is disabled. */
  FORBIDDEN: 4403,
  /** No common protocol version. */
  UNSUPPORTED_VERSION: 4406,
  /** No hello within the hello timeout. */
  HELLO_TIMEOUT: 4408,
  /** A newer connection of the same runner replaced this one. */
  SUPERSEDED: 4409,
  /**
   * The runner stopped taking frames off its socket: more than the gateway's send bound waits for
   * it (docs/PROTOCOL.md, "Timing"). It reconnects and resumes its leases as after any lost socket.
   */
  BACKLOGGED: 4413,
  /** A frame out of sequence (e.g. a second hello, work before hello). */
  PROTOCOL_VIOLATION: 4422,
  /** Too many frames per second. */
  RATE_LIMITED: 4429,
  /** The runner drained and is leaving, or the gateway asks it to. */
  DRAINED: 4000,
});

export type CloseCode = (typeof CLOSE)[keyof typeof CLOSE];

/** Reason text for each close code (close reasons are ≤ 123 bytes). */
export const CLOSE_REASON: Readonly<Record<number, string>> = Object.freeze({
  1000: 'normal',
  1001: 'going away',
  1009: 'frame too large',
  4000: 'drained',
  4400: 'malformed frame',
  4401: 'unauthorized',
  4403: 'forbidden',
  4406: 'no common protocol version',
  4408: 'hello timeout',
  4409: 'superseded by a newer connection',
  4413: 'send backlog over the bound: the runner is not reading',
  4422: 'protocol violation',
  4429: 'rate limited',
});

// ---- Shared shapes ------------------------------------------------------------------------

const Str = (max = 256) => Type.String({ minLength: 1, maxLength: max });

/**
 * The Session event types a runner may append (`events.batch`): the agent's own events. The
 * turn's status (`session.*`), the drive events (`user.*`) and tool invocations the control
 * plane runs itself are written by the control plane only, so a runner cannot end a turn, speak
 * for a user or forge a platform event in a Session's log.
 */
export const RUNNER_EVENT_TYPES = ['agent.message', 'agent.thinking', 'agent.tool_use', 'agent.tool_result', 'agent.plan'] as const;
export type RunnerEventType = (typeof RUNNER_EVENT_TYPES)[number];
const NonNeg = () => Type.Integer({ minimum: 0 });
const Opt = Type.Optional;

export const ResourcesSchema = Obj({
  cpu_millis: Opt(NonNeg()),
  memory_mib: Opt(NonNeg()),
  disk_mib: Opt(NonNeg()),
  max_duration_seconds: Opt(NonNeg()),
});

export const ProviderCapabilitySchema = Obj({
  id: Str(128),
  provider_revision: Opt(Str(128)),
  materialization_revision: Opt(Str(128)),
  drivers: Type.Array(Str(64), { maxItems: 16 }),
  launch_kinds: Opt(Type.Array(Str(64), { maxItems: 16 })),
  tiers: Opt(Type.Array(Str(64), { maxItems: 16 })),
  platforms: Opt(Type.Array(Obj({ os: Str(64), architecture: Str(64) }), { maxItems: 16 })),
  network_modes: Opt(Type.Array(Str(64), { maxItems: 16 })),
  retention_modes: Opt(Type.Array(Str(64), { maxItems: 16 })),
  package_materialization: Opt(Type.Array(Str(64), { maxItems: 16 })),
  max_mounts: Opt(NonNeg()),
  minimum_resources: Opt(ResourcesSchema),
  maximum_resources: Opt(ResourcesSchema),
  browser_observation: Opt(Obj({ accessibility_tree: Type.Boolean(), screenshot: Type.Boolean() })),
  desktop_observation: Opt(Obj({ accessibility_tree: Type.Boolean(), screenshot: Type.Boolean(), window_inventory: Type.Boolean() })),
  harness_owned_models: Opt(
    Type.Array(
      Obj({
        kind: Str(64),
        harness_profile_id: Opt(Str(64)),
        harness_profile_revision_number: Opt(NonNeg()),
        harness_release_digest: Opt(Str(128)),
        provider: Opt(Str(128)),
        model: Opt(Str(128)),
      }),
      { maxItems: 64 },
    ),
  ),
  session_sandbox: Opt(Type.Boolean()),
  runtime_assurances: Opt(
    Obj({
      compute_accounting: Opt(Type.Boolean()),
      network_isolation: Opt(Type.Boolean()),
      bounded_start: Opt(Type.Boolean()),
      bounded_cancel: Opt(Type.Boolean()),
      teardown: Opt(Type.Boolean()),
    }),
  ),
  acp_transport: Opt(Str(64)),
  /** ACP agent harnesses installed into this provider's sandbox image layer and probed (docs/ACP.md). */
  acp_harnesses: Opt(
    Type.Array(
      Obj({ package: Str(214), version: Str(64), harness_release_digest: Str(128) }),
      { maxItems: 32 },
    ),
  ),
  snapshot_clone: Opt(Type.Boolean()),
  snapshot_custody: Opt(Str(64)),
  mount_kinds: Opt(Type.Array(Str(64), { maxItems: 16 })),
});

export const CapabilitiesSchema = Obj({
  protocol_versions: Type.Array(Type.Integer({ minimum: 1 }), { minItems: 1, maxItems: 16 }),
  available_slots: NonNeg(),
  drivers: Type.Array(Str(64), { maxItems: 16 }),
  plane_protocols: Type.Array(Str(64), { maxItems: 16 }),
  providers: Type.Array(ProviderCapabilitySchema, { maxItems: 16 }),
});

export type RunnerCapabilities = Static<typeof CapabilitiesSchema>;
export type ProviderCapability = Static<typeof ProviderCapabilitySchema>;

export const RunnerStatusSchema = Type.Union([Type.Literal('starting'), Type.Literal('ready'), Type.Literal('draining')]);
export type RunnerStatus = Static<typeof RunnerStatusSchema>;

/** Fencing token of every lease-bound frame: a runner that lost the lease cannot act on it. */
const LeaseRef = { lease_id: Str(128), attempt: Type.Integer({ minimum: 1 }) };
const LeaseRefSchema = Obj(LeaseRef);
export type LeaseRef = Static<typeof LeaseRefSchema>;

// ---- Payloads, one per message type ---------------------------------------------------------

export const PAYLOADS = {
  // runner → gateway
  hello: Obj({
    protocol_versions: Type.Array(Type.Integer({ minimum: 1 }), { minItems: 1, maxItems: 16 }),
    daemon_version: Str(64),
    status: RunnerStatusSchema,
    capabilities: CapabilitiesSchema,
    /** Leases the daemon still holds from an earlier connection (resumed, not re-offered). */
    held_leases: Type.Array(LeaseRefSchema, { maxItems: 1024 }),
  }),
  heartbeat: Obj({
    status: RunnerStatusSchema,
    available_slots: NonNeg(),
    held_leases: Type.Array(LeaseRefSchema, { maxItems: 1024 }),
    /** Sent only when capabilities changed since hello. */
    capabilities: Opt(CapabilitiesSchema),
  }),
  drained: Obj({ held_leases: Type.Array(LeaseRefSchema, { maxItems: 1024 }) }),
  'lease.accept': Obj(LeaseRef),
  'lease.reject': Obj({ ...LeaseRef, reason: Str(512) }),
  'lease.heartbeat': Obj(LeaseRef),
  'lease.complete': Obj({ ...LeaseRef, result: Opt(Type.Record(Type.String(), Type.Unknown())) }),
  'lease.fail': Obj({
    ...LeaseRef,
    /** infrastructure: retried elsewhere; work: the agent's own failure, not retried blindly. */
    failure_class: Type.Union([Type.Literal('infrastructure'), Type.Literal('work')]),
    reason: Str(2048),
  }),
  'events.batch': Obj({
    ...LeaseRef,
    session_id: Str(64),
    events: Type.Array(
      Obj({
        /** Idempotency: the same producer key is appended once; a retry gets the first seq back. */
        producer_key: Str(200),
        type: Type.Union(RUNNER_EVENT_TYPES.map((t) => Type.Literal(t))),
        payload: Type.Unknown(),
      }),
      { minItems: 1, maxItems: 256 },
    ),
  }),
  'model.request': Obj({
    ...LeaseRef,
    /** Chosen by the runner, unique per connection; deltas and end carry it. */
    stream_id: Str(128),
    request: Type.Unknown(),
  }),
  'model.cancel': Obj({ stream_id: Str(128) }),
  /**
   * Before running a tool use, the runner asks the control plane's ActionPolicies; it runs the
   * tool only on a `tool.decision` (same frame id in `re`) that says `allow`.
   */
  'tool.check': Obj({
    ...LeaseRef,
    tool_use_id: Str(128),
    tool: Obj({
      kind: Type.Union([Type.Literal('builtin'), Type.Literal('custom'), Type.Literal('mcp')]),
      name: Str(256),
      connection_id: Opt(Str(64)),
    }),
    input: Type.Unknown(),
  }),
  /**
   * The Sessions whose sandboxes this runner keeps (sent after welcome and periodically); the
   * gateway answers with sandboxes.release for those whose Session was archived or deleted.
   */
  'sandboxes.report': Obj({ session_ids: Type.Array(Str(64), { maxItems: 1024 }) }),

  // gateway → runner
  welcome: Obj({
    protocol_version: Type.Integer({ minimum: 1 }),
    runner_id: Str(64),
    runner_pool_id: Str(64),
    workspace_id: Str(64),
    generation: Type.Integer({ minimum: 1 }),
    heartbeat_interval_ms: Type.Integer({ minimum: 100 }),
    presence_ttl_ms: Type.Integer({ minimum: 100 }),
    max_frame_bytes: Type.Integer({ minimum: 1024 }),
    server_time: Type.String({ format: 'date-time' }),
    /** Leases from hello the gateway still recognises (the rest are revoked). */
    resumed_leases: Type.Array(LeaseRefSchema, { maxItems: 1024 }),
    /** Set when the pool or runner is already draining. */
    drain: Opt(Obj({ deadline: Type.String({ format: 'date-time' }), reason: Str(512) })),
  }),
  'heartbeat.ack': Obj({
    server_time: Type.String({ format: 'date-time' }),
    presence_expires_at: Type.String({ format: 'date-time' }),
    /** Cancellations ride on the heartbeat reply too, so a lost lease.cancel frame is repaired. */
    cancellations: Type.Array(Obj({ ...LeaseRef, reason: Str(512) }), { maxItems: 1024 }),
  }),
  drain: Obj({ deadline: Type.String({ format: 'date-time' }), reason: Str(512) }),
  /** The control plane lifted its drain: a runner it drained (and that stayed) takes work again. */
  resume: Obj({ reason: Str(512) }),
  'lease.offer': Obj({
    ...LeaseRef,
    run_id: Str(64),
    session_id: Str(64),
    thread_id: Opt(Str(64)),
    /** Accept within this window or the offer goes elsewhere. */
    accept_within_ms: Type.Integer({ minimum: 100 }),
    /** Lease length; renew with lease.heartbeat at about a third of it. */
    lease_ttl_ms: Type.Integer({ minimum: 1000 }),
    /**
     * The work itself (scheduler-defined: environment, agent snapshot, inputs). Absent only for a
     * runner that declares `lease-spec-v1` in `plane_protocols`: the spec then follows in a
     * `lease.spec` frame, so the runner accepts (and the lease is claimed) while it is built.
     */
    spec: Opt(Type.Record(Type.String(), Type.Unknown())),
  }),
  /**
   * The spec of an offer sent without one (`lease-spec-v1`): exactly one of `spec` and `error`.
   * `error`: the spec could not be built; the runner fails the lease as an infrastructure failure.
   */
  'lease.spec': Obj({
    ...LeaseRef,
    spec: Opt(Type.Record(Type.String(), Type.Unknown())),
    error: Opt(Str(512)),
  }),
  'lease.cancel': Obj({ ...LeaseRef, reason: Str(512), grace_ms: Type.Integer({ minimum: 0 }) }),
  'lease.revoked': Obj({ ...LeaseRef, reason: Str(512) }),
  'events.ack': Obj({
    ...LeaseRef,
    /** One per event of the batch, in order: the assigned sequence number. */
    seqs: Type.Array(Type.Integer({ minimum: 0 }), { maxItems: 256 }),
  }),
  'tool.decision': Obj({
    ...LeaseRef,
    tool_use_id: Str(128),
    decision: Type.Union([Type.Literal('allow'), Type.Literal('deny'), Type.Literal('require_approval')]),
    /** The deciding ActionPolicy, or null (default allow, or a refusal with no rule). */
    rule_id: Type.Union([Str(64), Type.Null()]),
    message: Str(2048),
  }),
  'model.delta': Obj({ stream_id: Str(128), event: Type.Unknown() }),
  'model.end': Obj({ stream_id: Str(128), event: Type.Unknown() }),
  /** Remove these Sessions' sandboxes and workspaces: the Session is archived or deleted. */
  'sandboxes.release': Obj({
    sessions: Type.Array(Obj({ session_id: Str(64), reason: Type.Union([Type.Literal('archived'), Type.Literal('deleted')]) }), { maxItems: 1024 }),
  }),

  // both directions
  ack: Obj({}),
  error: Obj({
    code: Str(64),
    message: Str(2048),
    retryable: Type.Boolean(),
  }),
} as const satisfies Record<string, TSchema>;

export type MessageType = keyof typeof PAYLOADS;
export type Payload<T extends MessageType> = Static<(typeof PAYLOADS)[T]>;

export const RUNNER_TO_GATEWAY = [
  'hello', 'heartbeat', 'drained', 'lease.accept', 'lease.reject', 'lease.heartbeat', 'lease.complete', 'lease.fail',
  'events.batch', 'model.request', 'model.cancel', 'tool.check', 'sandboxes.report', 'ack', 'error',
] as const satisfies readonly MessageType[];
export const GATEWAY_TO_RUNNER = [
  'welcome', 'heartbeat.ack', 'drain', 'resume', 'lease.offer', 'lease.spec', 'lease.cancel', 'lease.revoked', 'events.ack',
  'model.delta', 'model.end', 'tool.decision', 'sandboxes.release', 'ack', 'error',
] as const satisfies readonly MessageType[];

export type RunnerToGatewayType = (typeof RUNNER_TO_GATEWAY)[number];
export type GatewayToRunnerType = (typeof GATEWAY_TO_RUNNER)[number];

/** The envelope of every frame. `id` is unique per sender and connection; `re` names the frame answered. */
export interface Envelope<T extends MessageType = MessageType> {
  v: number;
  type: T;
  id: string;
  re?: string;
  /** W3C trace context of the span the frame was sent in (tracing on only; docs/PROTOCOL.md). */
  traceparent?: string;
  tracestate?: string;
  payload: Payload<T>;
}

export type AnyEnvelope = { [T in MessageType]: Envelope<T> }[MessageType];
export type RunnerMessage = { [T in RunnerToGatewayType]: Envelope<T> }[RunnerToGatewayType];
export type GatewayMessage = { [T in GatewayToRunnerType]: Envelope<T> }[GatewayToRunnerType];

const EnvelopeSchema = Obj({
  v: Type.Integer({ minimum: 1, maximum: 1000 }),
  type: Type.String({ minLength: 1, maxLength: 64 }),
  id: Type.String({ minLength: 1, maxLength: 128 }),
  re: Opt(Type.String({ minLength: 1, maxLength: 128 })),
  traceparent: Opt(Type.String({ pattern: '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$', maxLength: 55 })),
  tracestate: Opt(Type.String({ minLength: 1, maxLength: 512 })),
  payload: Type.Unknown(),
});
const checkEnvelope = validator(EnvelopeSchema, 'message');
const payloadCheckers = new Map<string, (v: unknown) => unknown>(
  Object.entries(PAYLOADS).map(([type, schema]) => [type, validator(schema as TSchema, 'message')]),
);

/** Why a frame was refused; the receiver closes with CLOSE.MALFORMED and this text. */
export class FrameError extends Error {
  constructor(message: string) {
    super(message);
    this.name = 'FrameError';
  }
}

/**
 * Parse and validate one frame arriving from `from`. Throws FrameError naming the first problem:
 * not JSON, bad envelope, unknown or wrong-direction type, invalid payload.
 */
export function parseFrame(data: string, from: 'runner'): RunnerMessage;
export function parseFrame(data: string, from: 'gateway'): GatewayMessage;
export function parseFrame(data: string, from: 'runner' | 'gateway'): AnyEnvelope {
  let value: unknown;
  if (jsonDepth(data) > MAX_JSON_NESTING) throw new FrameError(`frame nests deeper than ${MAX_JSON_NESTING} levels`);
  try {
    value = JSON.parse(data);
  } catch {
    throw new FrameError('frame is not JSON');
  }
  try {
    const env = checkEnvelope(value);
    const allowed: readonly string[] = from === 'runner' ? RUNNER_TO_GATEWAY : GATEWAY_TO_RUNNER;
    if (!allowed.includes(env.type)) throw new FrameError(`unknown message type '${env.type}' from the ${from}`);
    if (!(RUNNER_PROTOCOL_VERSIONS as readonly number[]).includes(env.v)) throw new FrameError(`unsupported envelope version ${env.v}`);
    const check = payloadCheckers.get(env.type);
    if (!check) throw new FrameError(`unknown message type '${env.type}'`);
    check(env.payload);
    return env as AnyEnvelope;
  } catch (err) {
    if (err instanceof FrameError) throw err;
    if (err instanceof ApiError) throw new FrameError(err.message);
    throw err;
  }
}

/** Build a frame; validates in development-critical paths too (a bug on our side is caught at the sender). */
export function frame<T extends MessageType>(type: T, id: string, payload: Payload<T>, re?: string, trace?: { traceparent?: string; tracestate?: string }): string {
  const check = payloadCheckers.get(type);
  if (check) {
    try {
      check(payload);
    } catch (err) {
      throw new FrameError(`refusing to send an invalid '${type}': ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  const env: Envelope<T> = re === undefined ? { v: 1, type, id, payload } : { v: 1, type, id, re, payload };
  if (trace?.traceparent) {
    env.traceparent = trace.traceparent;
    if (trace.tracestate) env.tracestate = trace.tracestate;
  }
  return JSON.stringify(env);
}

/** Highest version both sides speak, or null. */
export function negotiateVersion(offered: readonly number[], supported: readonly number[] = RUNNER_PROTOCOL_VERSIONS): number | null {
  const common = offered.filter((v) => supported.includes(v));
  return common.length === 0 ? null : Math.max(...common);
}

// ---- Presence (the API's RunnerPresence) ---------------------------------------------------

export interface RunnerPresence {
  runner: string;
  runner_pool: string;
  generation: number;
  placement: 'local' | 'managed';
  status: RunnerStatus;
  capabilities: RunnerCapabilities;
  placement_conformance_digests: string[];
  last_seen_at: string;
  expires_at: string;
  owner?: { principal: string; machine_label: string };
}
