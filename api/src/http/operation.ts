import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Static, TSchema } from '@agentplane/core';
import type { Role } from '@agentplane/domain';
import type { Caller } from './caller.js';
import type { ApiDeps } from '../deps.js';
import type { Context, Logger } from '@agentplane/core';
import type { PermissionAction } from '../governance/permissions.js';
import type { KeyedRequest } from './idempotency.js';

export type HttpMethod = 'GET' | 'POST' | 'PATCH' | 'PUT' | 'DELETE';

export const CURRENT_VERSION = '2026-08-27';

/** Who may call an operation. */
export type AuthPolicy =
  | { kind: 'none' }
  | {
      kind: 'bearer';
      /** API-key roles admitted. */
      roles: readonly Role[];
      /** Only organization-scoped keys (of those roles). */
      organizationScope?: boolean;
      /** Principal access credentials (audience api_mcp) are admitted. */
      principal?: boolean;
      /** Runner credentials are admitted. */
      runner?: boolean;
    };

/**
 * The audit record the pipeline writes for an operation (docs/GOVERNANCE.md, "Audit log"). Every
 * mutating operation (any method but GET) declares one; `false` marks a POST that changes nothing
 * (a search or an export). The action recorded is the operationId.
 */
export type AuditDeclaration =
  | false
  | {
      /** Where the target id comes from: a path parameter's name, or `response` (the `id` of the returned resource). */
      target: string;
      /**
       * With `target: 'response'`, the top-level property of the response that holds the resource
       * (e.g. `runner_credential`), when the response nests it beside other fields: its `id` is the
       * target and, for a credential-free call, its `workspace_id` the Workspace recorded in.
       * Nothing else of the response is recorded.
       */
      resource?: string;
      /**
       * The operation also acts in another Workspace, named by this top-level body field (a
       * deploy into a target Workspace): that Workspace gets the record too, when it is another
       * one inside the caller's boundary, with as target the `id` of the response's `resource`
       * property (what was made there), else the same target.
       */
      alsoIn?: { workspaceField: string; resource?: string };
    };

/**
 * The PermissionAssignment a Principal access credential needs for an operation, checked live by
 * the pipeline on every such request (API keys keep role-based access; docs/GOVERNANCE.md).
 */
export interface PermissionDeclaration {
  action: PermissionAction;
  /**
   * What the request acts on: `workspace`; a path parameter holding an `agent_` or `sess_` id; or
   * `body.agent` (the Agent a new Session runs; an inline agent needs the grant on the Workspace).
   */
  target: string;
  /** The request's drive events (see `actionPolicy`): each payload's `authored_by` must be the calling Principal itself. */
  authorIsCaller?: boolean;
  /**
   * The body's `resources` and `vault_ids` are attached to a Session by the caller, whose Runs
   * then read (or write) them: a `memory` resource needs `read` on its MemoryStore (`manage` for
   * `read_write`); any other resource, and any vault, `manage` on the Workspace.
   */
  attachments?: boolean;
}

/**
 * A drive event an operation makes itself rather than carries in its body (a skill proposal's
 * verification drives its Session with `user.define_outcome`): the event's type, and the body
 * field naming the Principal it is authored by (absent from the body: the calling Principal).
 */
export interface MadeDrive {
  type: string;
  authorField: string;
}

export type IdempotencyMode = 'none' | 'optional' | 'required';

/** Where an operation shows up on the MCP edge. */
export type McpExposure = 'compact' | 'full' | 'never';

export interface JsonResult {
  kind?: 'json';
  status: number;
  body: unknown;
  headers?: Record<string, string>;
  /**
   * The answer repeats an earlier request's (a redelivered webhook, recognised by its own id):
   * like an Idempotency-Key replay, it is not a new audit record.
   */
  replay?: true;
}

export interface StreamResult {
  kind: 'stream';
  /** Writes the whole response (status, headers, body) and resolves when it ends. */
  write(res: ServerResponse, signal: AbortSignal): Promise<void>;
}

export type OperationResult = JsonResult | StreamResult;

export interface OperationRequest<P, Q, B> {
  caller: Caller;
  params: P;
  query: Q;
  body: B;
  headers: Readonly<Record<string, string | undefined>>;
  /** This request's id (the `Request-Id` response header; audit records carry it). */
  requestId: string;
  /**
   * The trace context of the request's span, when tracing is on: hand it (as `trace`/`parent`)
   * to the work that makes spans for the request, whose parent it is (there is no active context
   * in the API: docs/ARCHITECTURE.md).
   */
  trace: Context | undefined;
  idempotencyKey: string | undefined;
  /**
   * With an Idempotency-Key, once the key is taken for this request: the ids a create derives
   * from the key and the request's fingerprint, so a retry whose first attempt died after
   * writing finds what it wrote (`KeyedRequest`). Undefined without a key.
   */
  keyed: KeyedRequest | undefined;
  deps: ApiDeps;
  /** The request's logger: its lines carry `request_id`. */
  log: Logger;
  /** The client's address as this process sees it (the TCP peer; proxy headers are not trusted), when known. */
  clientAddress: string | null;
  /**
   * For work that outlives the request (a stream): whether its credential still authenticates
   * and, for a Principal, the operation's declared PermissionAssignment still holds.
   */
  stillAllowed: () => Promise<boolean>;
}

/**
 * A request body that is not JSON (e.g. a multipart upload). The pipeline hands the raw
 * request stream to `receive` after authentication, the version header, the rate limit and
 * path/query validation; what it returns is the handler's `body`. Idempotency fingerprints
 * `fingerprint(body)`; a value the handler never used (a replay, a failed handler) is
 * `discard`ed.
 */
export interface UploadBody {
  /** For OpenAPI, e.g. `multipart/form-data`. */
  contentType: string;
  /** JSON schema of the parts, for OpenAPI. */
  schema: TSchema;
  receive(stream: IncomingMessage, deps: ApiDeps): Promise<Record<string, unknown>>;
  fingerprint(body: Record<string, unknown>): unknown;
  discard(body: Record<string, unknown>, deps: ApiDeps): Promise<void>;
}

export interface Operation<P extends TSchema = TSchema, Q extends TSchema = TSchema, B extends TSchema = TSchema> {
  /** `group.camelName`; MCP tool name flattens the dot. */
  operationId: string;
  method: HttpMethod;
  /** OpenAPI-style path: `/v1/sessions/{session_id}`. */
  path: string;
  summary: string;
  auth: AuthPolicy;
  /** Accepted `Service-Version` values; `null` = the header is not required (unversioned routes). */
  versions?: readonly string[] | null;
  params?: P;
  query?: Q;
  body?: B;
  /** A larger JSON body ceiling than the default (413 while the body streams in), e.g. Project trees. */
  bodyLimitBytes?: number;
  /** Set instead of `body` for operations whose body is not JSON. */
  upload?: UploadBody;
  /** JSON schema of the success body, for OpenAPI. */
  response?: TSchema;
  successStatus?: number;
  idempotency?: IdempotencyMode;
  /**
   * Where an Idempotency-Key's record is kept: the Workspace the request acts in (the default), or
   * `organization` for an operation on the Organization itself (its Workspaces, its API keys),
   * whose request is the same whichever Workspace an organization key has selected.
   */
  idempotencyScope?: 'organization';
  /** The response carries a secret: replays are sealed at rest and the operation is REST-only. */
  sensitive?: boolean;
  mcp?: McpExposure;
  /** Required on every non-GET operation: the pipeline appends one audit record per attempt. */
  audit?: AuditDeclaration;
  /** Principal credentials: the assignment required (operations admitting them must declare one, but GETs whose path names no resource). */
  permission?: PermissionDeclaration;
  /**
   * Where the request's drive events are: `drive`, the body is one; `initial_events`, the body's
   * `initial_events` (a Session created with its first messages); a `MadeDrive`, the one event
   * the operation makes itself. Each is an ActionPolicy call of kind `drive` named by its
   * `type`, made for its `authored_by` Principal; the pipeline refuses the request unless the
   * policies allow every one (and, with `authorIsCaller`, a Principal credential authors each
   * itself).
   */
  actionPolicy?: 'drive' | 'initial_events' | MadeDrive;
  /**
   * MCP: the operation belongs to the closed, read-only catalog a Principal credential gets on
   * `/v1/mcp` (the contract's exact AgentDefinition, MemoryStore and SurfaceScope reads). Only
   * for GET operations whose auth admits Principal credentials; the handler checks the
   * Principal's live PermissionAssignment and ActionPolicy. Other tools are denied to them.
   */
  mcpPrincipal?: boolean;
  /**
   * For sensitive operations: may a stored response still be replayed? Called with the stored body;
   * returning false makes the retry fail closed with `idempotency.conflict`.
   */
  replayable?: (storedBody: unknown, deps: ApiDeps) => Promise<boolean>;
  /**
   * Erasure-safe replay, for an operation whose answer holds content an erasure must take away
   * (a Session, a drive event): an Idempotency-Key keeps only `keep(body)` of a success (opaque
   * ids), and its replay answers `rehydrate(kept)`, read live at that moment, so a replay after
   * the resource was erased is its 404, never the erased content.
   */
  erasureSafe?: {
    keep(body: unknown): unknown;
    rehydrate(kept: unknown, req: { caller: Caller; params: unknown; deps: ApiDeps }): Promise<unknown>;
  };
  handler(req: OperationRequest<Static<P>, Static<Q>, Static<B>>): Promise<OperationResult>;
}

/** Identity function that keeps the schema generics for the handler's types. */
export function defineOperation<P extends TSchema, Q extends TSchema, B extends TSchema>(op: Operation<P, Q, B>): Operation {
  return op as unknown as Operation;
}

export const json = (status: number, body: unknown, headers?: Record<string, string>): JsonResult =>
  headers ? { status, body, headers } : { status, body };
