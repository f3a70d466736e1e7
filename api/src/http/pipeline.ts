import type { IncomingMessage } from 'node:http';
import { ApiError, isId, newRequestId, validator, type Context, type Logger, type TSchema } from '@agentplane/core';
import { tags } from '@agentplane/store';
import type { ApiDeps } from '../deps.js';
import { ANONYMOUS, type Caller } from './caller.js';
import { actsInDisabledDefault, authenticate, authorize, DisabledWorkspaceError, disabledWorkspace } from './authenticate.js';
import { enforceRateLimit } from './rate-limit.js';
import { IDEMPOTENCY_KEY_RE, type KeyedRequest } from './idempotency.js';
import type { AuditOutcome } from '../audit/store.js';
import { targetTypeOf, type CheckTarget } from '../governance/permissions.js';
import { boundaryRefusal, type ToolCall } from '../governance/policy-eval.js';
import { CURRENT_VERSION, type AuditDeclaration, type PermissionDeclaration, type HttpMethod, type Operation, type OperationResult } from './operation.js';
import { workspaceInBoundary } from './workspace-scope.js';
import { bindPage, pageBinding, unbindCursor } from './page-binding.js';

/** One request as the pipeline sees it, whichever edge it came in on (REST or MCP). */
export interface RawRequest {
  method: HttpMethod;
  /** Lower-cased header names. */
  headers: Readonly<Record<string, string | undefined>>;
  params: Record<string, string>;
  query: Record<string, unknown>;
  /** Parsed JSON body, or undefined when none was sent. */
  body: unknown;
  /** The unread request body, for operations with an `upload` body (REST edge only). */
  stream?: IncomingMessage;
  /**
   * Set only by an edge that has already authenticated this same HTTP request with these same
   * headers and counted it against the caller's rate limit (the MCP edge: one POST /v1/mcp is
   * one request, whatever it dispatches). The bearer is not resolved twice and the request is
   * not counted twice; authorisation, version, validation and idempotency still run.
   */
  admitted?: Caller;
  /**
   * The edge that admitted the caller found its Workspace disabled: refused here as a REST
   * request's bearer would be (named, recorded), but for the operations that still reach it.
   */
  admittedDisabled?: DisabledWorkspaceError;
  /** The connection (socket) the request came on: a bearer is digested once per connection. */
  connection?: object;
  /** The edge's id for this request (the `Request-Id` it answers with). */
  requestId: string;
  /** The trace context of the request's span (tracing on): the parent of the spans made for it. */
  trace?: Context | undefined;
  /** MCP `tools/call`: the tool name, an ActionPolicy call of kind `api` checked before the handler. */
  mcpTool?: string;
  /**
   * What the edge found wrong with the call's own envelope (an MCP tool call's arguments that are
   * not `{path, query, body, idempotency_key}`): raised where the request is validated, after
   * authentication and authorisation, so it is refused in the order a REST request's malformed
   * body is, and recorded like one.
   */
  refused?: ApiError;
  /** Told who the caller is as soon as the bearer is resolved (the REST edge names its Workspace). */
  authenticated?(caller: Caller): void;
}

export { newRequestId };

/** What the pipeline learnt about a request before it finished or failed (for the audit record). */
interface Progress {
  caller: Caller;
  params: Record<string, unknown>;
  /** `params` passed the path's schema (before, they are the request's raw segments). */
  paramsChecked: boolean;
  /** The request's body once it passed its schema. */
  body?: unknown;
  replayed: boolean;
  /**
   * ActionPolicy decisions of an operation whose target is the resource it creates: recorded once
   * the response names it (or with no target, when the request fails).
   */
  decisions: Array<(target: string | null) => Promise<void>>;
}

export const VERSION_HEADER = 'service-version';

const EMPTY = Object.freeze({}) as Record<string, never>;

/** The operations that still reach a disabled Workspace their path names: the one that re-enables it. */
const REACHES_DISABLED_WORKSPACE: ReadonlySet<string> = new Set(['organizations.updateWorkspace']);

/**
 * Whether an organization key whose Workspace (selected, or its default one) is disabled may still call `op`: an
 * organization-level operation, the PATCH that re-enables that Workspace, or an operation on a
 * path that names another Workspace (whose own status then decides, in `run`).
 */
function reachesDisabledWorkspace(op: Operation, caller: Caller, params: Readonly<Record<string, string>>): boolean {
  if (caller.scope !== 'organization') return false;
  if (op.auth.kind === 'bearer' && op.auth.organizationScope) return true;
  const named = params.workspace_id;
  if (named !== undefined && named !== caller.workspaceId) return true;
  return REACHES_DISABLED_WORKSPACE.has(op.operationId) && named === caller.workspaceId;
}

/**
 * A validator compiled on its first use: the API answers its first request (after a start or a
 * crash) without first compiling a few hundred schemas; `compileAll` (a unit test) keeps a broken
 * schema from waiting for its first request to show.
 */
function compiled(schema: TSchema | undefined, part: 'path' | 'query' | 'body'): ((v: unknown) => unknown) | undefined {
  if (!schema) return undefined;
  let fn: ((v: unknown) => unknown) | undefined;
  return (v: unknown) => (fn ??= validator(schema, part))(v);
}

/** Operation plus its validators (each compiled on first use); built once at start-up. */
export interface PreparedOperation {
  op: Operation;
  validatePath?: ((v: unknown) => unknown) | undefined;
  validateQuery?: ((v: unknown) => unknown) | undefined;
  validateBody?: ((v: unknown) => unknown) | undefined;
  /** A list (its query takes `page`): its cursors are bound to it (page-binding.ts). */
  pages?: boolean;
}

export function prepare(op: Operation): PreparedOperation {
  return {
    op,
    validatePath: compiled(op.params, 'path'),
    validateQuery: compiled(op.query, 'query'),
    validateBody: compiled(op.body, 'body'),
    pages: (op.query as { properties?: Record<string, unknown> } | undefined)?.properties?.['page'] !== undefined,
  };
}

/** Compiles every schema of these operations now (throws on the first that does not compile). */
export function compileAll(ops: readonly Operation[]): number {
  let n = 0;
  for (const op of ops) {
    if (op.params) validator(op.params, 'path');
    if (op.query) validator(op.query, 'query');
    if (op.body) validator(op.body, 'body');
    n++;
  }
  return n;
}

function checkVersion(op: Operation, headers: RawRequest['headers']): void {
  if (op.versions === null) return;
  const accepted = op.versions ?? [CURRENT_VERSION];
  const got = headers[VERSION_HEADER];
  if (!got) throw new ApiError('validation.malformed', `the Service-Version header is required (accepted: ${accepted.join(', ')})`);
  if (!accepted.includes(got)) {
    throw new ApiError('validation.malformed', `Service-Version '${got}' is not supported here (accepted: ${accepted.join(', ')})`);
  }
}

/**
 * The shared middleware of every /v1 operation, in order: authenticate and authorise,
 * version header, rate limit, schema validation of path, query and body, Idempotency-Key,
 * then the handler, then the operation's audit record (every attempt of a mutation by an
 * authenticated caller: done, refused or failed; an idempotent replay is not a new record).
 * Returns the response to send; throws ApiError for the client's mistakes.
 */
export function execute(prepared: PreparedOperation, raw: RawRequest, deps: ApiDeps): Promise<{ caller: Caller; result: OperationResult }> {
  const { requestId } = raw;
  const progress: Progress = { caller: ANONYMOUS, params: raw.params, paramsChecked: false, replayed: false, decisions: [] };
  const audit = prepared.op.audit;
  // Nothing to record (reads): no wrapper around the run, so no extra promises per request.
  if (!audit) return run(prepared, raw, deps, requestId, progress);
  return audited(prepared, raw, deps, requestId, progress, audit);
}

async function audited(
  prepared: PreparedOperation, raw: RawRequest, deps: ApiDeps, requestId: string, progress: Progress, audit: Exclude<Operation['audit'], false | undefined>,
): Promise<{ caller: Caller; result: OperationResult }> {
  try {
    const out = await run(prepared, raw, deps, requestId, progress);
    if (progress.decisions.length > 0) {
      const created = out.result.kind === 'stream' ? null : str(responseResource(out.result.body, audit.target === 'response' ? audit.resource : undefined).id);
      await recordDecisions(progress, out.result.kind !== 'stream' && out.result.status < 400 ? created : null);
    }
    if (!progress.replayed && !(out.result.kind !== 'stream' && out.result.replay)) {
      const status = out.result.kind === 'stream' ? 200 : out.result.status;
      await writeAudit(deps, prepared.op, audit, progress, requestId, {
        outcome: status < 400 ? 'succeeded' : status === 403 ? 'denied' : 'failed', status, detail: null,
        body: out.result.kind === 'stream' ? undefined : out.result.body,
      });
    }
    return out;
  } catch (err) {
    await recordDecisions(progress, null);
    if (progress.caller.kind !== 'anonymous') {
      const status = err instanceof ApiError ? err.status : 500;
      await writeAudit(deps, prepared.op, audit, progress, requestId, {
        outcome: status === 403 || status === 401 ? 'denied' : status >= 500 ? 'error' : 'failed', status,
        detail: err instanceof ApiError ? err.type : 'runtime.internal', body: undefined,
      });
    }
    throw err;
  }
}

async function recordDecisions(progress: Progress, target: string | null): Promise<void> {
  const pending = progress.decisions.splice(0);
  for (const record of pending) await record(target);
}

function responseResource(response: unknown, resource: string | undefined): Record<string, unknown> {
  const asObject = (v: unknown) => (typeof v === 'object' && v !== null ? (v as Record<string, unknown>) : {});
  const top = asObject(response);
  return resource === undefined ? top : asObject(top[resource]);
}

function str(v: unknown): string | null {
  return typeof v === 'string' && v.length > 0 ? v : null;
}

async function writeAudit(
  deps: ApiDeps, op: Operation, audit: Exclude<AuditDeclaration, false>, progress: Progress, requestId: string,
  r: { outcome: AuditOutcome; status: number; detail: string | null; body: unknown },
): Promise<void> {
  const action = op.operationId;
  // The resource a `response` target names: the response itself, or the property the declaration
  // names (only its `id` and `workspace_id` are read: nothing else of the response, a secret
  // beside it included, reaches the record).
  const body = responseResource(r.body, audit.target === 'response' ? audit.resource : undefined);
  // A credential-free call (a pairing redemption) is recorded in the Workspace its result belongs to.
  const workspaceId = progress.caller.workspaceId ?? str(body.workspace_id);
  if (!workspaceId) {
    // Only a credential-free call that failed has no Workspace to record in; a success that
    // finds none means the declaration does not match the response.
    if (r.outcome === 'succeeded') deps.log.error({ action, request_id: requestId }, 'audit record dropped: no workspace in the response (check the operation\'s audit declaration)');
    return;
  }
  const target = audit.target === 'response' ? str(body.id) : pathTarget(op, audit.target, progress);
  if (audit.target === 'response' && target === null && r.outcome === 'succeeded') {
    deps.log.error({ action, request_id: requestId }, 'audit record without its target: no id in the response (check the operation\'s audit declaration)');
  }
  const { caller } = progress;
  const record = (t: string | null) => ({
    actor: caller.kind === 'anonymous'
      ? { id: 'anonymous', credential_id: null }
      : { id: caller.principalId ?? caller.credentialId, credential_id: caller.credentialId },
    action,
    target: t,
    outcome: r.outcome,
    status: r.status,
    detail: r.detail,
    request_id: requestId,
  });
  try {
    await deps.audit.append(workspaceId, record(target));
    const elsewhere = audit.alsoIn ? await otherWorkspace(deps, audit.alsoIn.workspaceField, workspaceId, progress) : null;
    if (elsewhere !== null) {
      const made = audit.alsoIn?.resource === undefined ? target : str(responseResource(r.body, audit.alsoIn.resource).id);
      await deps.audit.append(elsewhere, record(made));
    }
  } catch (err) {
    // The mutation has happened; a failed audit append is logged loudly rather than undoing it.
    deps.log.error({ err, action, request_id: requestId }, 'audit append failed');
  }
}

/** The other Workspace a request's body names (`alsoIn`), when it is inside the caller's boundary. */
async function otherWorkspace(deps: ApiDeps, field: string, recordedIn: string, progress: Progress): Promise<string | null> {
  const named = typeof progress.body === 'object' && progress.body !== null ? str((progress.body as Record<string, unknown>)[field]) : null;
  if (named === null || named === recordedIn || progress.caller.kind === 'anonymous') return null;
  try {
    await workspaceInBoundary(progress.caller, named, deps);
    return named;
  } catch (err) {
    if (err instanceof ApiError) return null;
    throw err;
  }
}

/**
 * The path parameter an audit record names. A request refused before its path was checked (its
 * credential, its version header, or the path itself) names it only if it is well formed for that
 * parameter: the record holds ids, never text a caller chose.
 */
function pathTarget(op: Operation, name: string, progress: Progress): string | null {
  const value = str(progress.params[name]);
  if (value === null || progress.paramsChecked) return value;
  const schema = (op.params as { properties?: Record<string, TSchema> } | undefined)?.properties?.[name];
  if (schema === undefined) return null;
  try {
    validator(schema, 'path')(value);
    return value;
  } catch {
    return null;
  }
}

/**
 * What a handler is given. A class rather than an object literal with getters: the getters'
 * closures, made per request, kept the whole request alive past young-generation collections
 * (see RestRequest in router.ts).
 */
export class HandlerRequest {
  private requestLog: Logger | undefined;
  readonly headers: Readonly<Record<string, string | undefined>>;
  readonly requestId: string;
  /** Set once the request's Idempotency-Key is taken for it (`OperationRequest.keyed`). */
  keyed: KeyedRequest | undefined = undefined;

  constructor(
    private readonly op: Operation,
    readonly caller: Caller,
    readonly params: unknown,
    readonly query: unknown,
    readonly body: unknown,
    private readonly raw: RawRequest,
    readonly idempotencyKey: string | undefined,
    readonly deps: ApiDeps,
  ) {
    this.headers = raw.headers;
    this.requestId = raw.requestId;
  }

  /**
   * Whether the caller may still do what it began, for work that outlives the request's checks
   * (a stream asks at each keep-alive): its credential still authenticates and is still admitted
   * to the operation (an API key's role) and, for a Principal, the PermissionAssignment the
   * operation declares still holds. A function, to pass along.
   */
  get stillAllowed(): () => Promise<boolean> {
    return async () => {
      try {
        const caller = await authenticate(this.raw.headers, this.deps);
        if (actsInDisabledDefault(caller) && this.caller.workspaceId === caller.workspaceId) return false;
        if (this.op.auth.kind === 'bearer') authorize(caller, this.op.auth);
        if (caller.kind === 'principal_credential' && this.op.permission) {
          await checkPermission(this.op.permission, caller, this.params as Record<string, unknown>, this.body, [], this.deps);
        }
        return true;
      } catch (err) {
        if (err instanceof ApiError) return false;
        throw err;
      }
    };
  }

  /**
   * The address of the client as this process sees it: the TCP peer of the connection (proxy
   * headers such as X-Forwarded-For are not trusted); null when the request came another way.
   */
  get clientAddress(): string | null {
    const c = this.raw.connection as { remoteAddress?: unknown } | undefined;
    return typeof c?.remoteAddress === 'string' ? c.remoteAddress : null;
  }

  /** Read through: a request's trace context is made only if something under it asks for it. */
  get trace(): Context | undefined {
    return this.raw.trace;
  }

  /** The request's logger (its lines name the request), made when a handler first logs. */
  get log(): Logger {
    return (this.requestLog ??= this.deps.log.child({ request_id: this.requestId }));
  }
}

async function run(
  prepared: PreparedOperation, raw: RawRequest, deps: ApiDeps, requestId: string, progress: Progress,
): Promise<{ caller: Caller; result: OperationResult }> {
  const { op } = prepared;
  let caller: Caller = ANONYMOUS;
  if (op.auth.kind === 'bearer') {
    if (raw.admitted) {
      caller = raw.admitted;
      if (raw.admittedDisabled && !reachesDisabledWorkspace(op, caller, raw.params)) {
        progress.caller = caller;
        raw.authenticated?.(caller);
        throw raw.admittedDisabled;
      }
    } else {
      // Answered from the read cache without a promise on the hot path.
      try {
        const known = authenticate(raw.headers, deps, raw.connection);
        caller = known instanceof Promise ? await known : known;
      } catch (err) {
        if (!(err instanceof DisabledWorkspaceError)) throw err;
        // A disabled Workspace refuses the resolved caller (named in the answer, recorded), but
        // for an organization key's organization-level operations and the re-enabling PATCH.
        progress.caller = err.caller;
        raw.authenticated?.(err.caller);
        if (!reachesDisabledWorkspace(op, err.caller, raw.params)) throw err;
        caller = err.caller;
      }
    }
    progress.caller = caller;
    raw.authenticated?.(caller);
    authorize(caller, op.auth);
  }
  // A body too large was left unread: refused once the caller is known, before anything else of
  // the request is looked at (its version included).
  if (raw.refused?.type === 'validation.payload_too_large') throw raw.refused;
  checkVersion(op, raw.headers);
  if (caller.kind !== 'anonymous' && !raw.admitted && caller.rateLimitPerMinute !== null && caller.rateLimitPerMinute > 0) {
    await enforceRateLimit(deps.redis, caller.credentialId, caller.rateLimitPerMinute);
  }

  if (raw.refused) throw raw.refused;
  const params = prepared.validatePath ? prepared.validatePath({ ...raw.params }) : EMPTY;
  progress.params = params as Record<string, unknown>;
  progress.paramsChecked = true;
  const query = prepared.validateQuery ? prepared.validateQuery({ ...raw.query }) : rejectUnexpectedQuery(raw.query);
  let body: unknown = EMPTY;
  if (op.upload) {
    if (!raw.stream) throw new ApiError('validation.malformed', `${op.operationId} takes a ${op.upload.contentType} body, on the REST API only`);
  } else if (prepared.validateBody) {
    body = prepared.validateBody(raw.body === undefined ? {} : raw.body);
    progress.body = body;
  } else if (raw.body !== undefined && !isEmptyObject(raw.body)) {
    // An empty JSON object is the only body it takes (a client that always sends one); an empty
    // array is not an object, and is refused like any other body.
    throw new ApiError('validation.malformed', 'this operation takes no request body');
  }

  // A path that names a Workspace (`/v1/organizations/workspaces/{workspace_id}/…`) is where an
  // organization key acts, whatever its selector header says: the response, the audit record
  // and the idempotency scope name that Workspace once it is found inside the organization.
  // A disabled Workspace refuses it (403 `auth.disabled_tenancy`, as the selector header would),
  // except for the operation that re-enables it.
  const named = (params as { workspace_id?: unknown }).workspace_id;
  const reachesDisabled = REACHES_DISABLED_WORKSPACE.has(op.operationId);
  if (caller.scope === 'organization' && caller.kind !== 'anonymous' && typeof named === 'string' && named !== caller.workspaceId) {
    const ws = await workspaceInBoundary(caller, named, deps);
    caller = { ...caller, workspaceId: named };
    progress.caller = caller;
    raw.authenticated?.(caller);
    if (ws.status === 'disabled' && !reachesDisabled) throw disabledWorkspace();
  } else if (actsInDisabledDefault(caller) && !reachesDisabledWorkspace(op, caller, params as Readonly<Record<string, string>>)) {
    // An organization key without a selector, whose default Workspace is disabled: organization-
    // level operations still answer, nothing acts in that Workspace.
    throw disabledWorkspace();
  }

  const drives = driveEventsOf(op, body);
  if (caller.kind === 'principal_credential' && op.permission) await checkPermission(op.permission, caller, params as Record<string, unknown>, body, drives, deps);
  if (raw.mcpTool !== undefined || drives.length > 0) await checkPolicies(op, raw.mcpTool, caller, params as Record<string, unknown>, body, drives, deps, requestId, progress);

  const mode = op.idempotency ?? 'none';
  const idemKey = raw.headers['idempotency-key'];
  if (idemKey !== undefined && !IDEMPOTENCY_KEY_RE.test(idemKey)) {
    throw new ApiError('validation.malformed', 'Idempotency-Key must be 1 to 255 printable non-space ASCII characters');
  }
  if (mode === 'required' && idemKey === undefined) {
    throw new ApiError('validation.malformed', 'this operation requires an Idempotency-Key header');
  }

  if (op.upload && raw.stream) body = await op.upload.receive(raw.stream, deps);
  const upload = op.upload;
  const discard = async () => {
    if (upload) await upload.discard(body as Record<string, unknown>, deps).catch(() => undefined);
  };

  // A list's cursor is bound to the list, path and filters that issued it (lists are reads: no key).
  const binding = prepared.pages ? pageBinding(deps.config.masterKey, op.operationId, caller.workspaceId ?? null, params, query as Record<string, unknown>) : undefined;
  if (binding !== undefined && typeof (query as { page?: unknown }).page === 'string') {
    (query as { page: string }).page = unbindCursor((query as { page: string }).page, binding);
  }

  const req = new HandlerRequest(op, caller, params, query, body, raw, mode === 'none' ? undefined : idemKey, deps);

  if (mode === 'none' || idemKey === undefined) {
    try {
      const result = await op.handler(req as never);
      return { caller, result: binding !== undefined && result.kind !== 'stream' ? { ...result, body: bindPage(result.body, binding) } : result };
    } catch (err) {
      await discard();
      throw err;
    }
  }

  const tag = caller.workspaceId && op.idempotencyScope !== 'organization' ? tags.workspace(caller.workspaceId) : tags.org(caller.organizationId);
  const fpBody = upload ? upload.fingerprint(body as Record<string, unknown>) : body;
  const fp = deps.idempotency.fingerprint(op.operationId, { params, query, body: fpBody, credential: caller.credentialId });
  let begun;
  try {
    begun = await deps.idempotency.begin(tag, idemKey, fp);
  } catch (err) {
    await discard();
    throw err;
  }
  if (begun.kind === 'replay') {
    progress.replayed = true;
    await discard();
    if (op.replayable && begun.result.status < 300 && !(await op.replayable(begun.result.body, deps))) {
      throw new ApiError('idempotency.conflict', 'the original response holds a secret that is no longer live; it is not replayed');
    }
    if (op.erasureSafe && begun.result.status < 300) {
      return { caller, result: { ...begun.result, body: await op.erasureSafe.rehydrate(begun.result.body, { caller, params, deps }) } };
    }
    return { caller, result: begun.result };
  }
  req.keyed = deps.idempotency.keyed(tag, op.operationId, idemKey, fp);
  let result: OperationResult;
  try {
    result = await op.handler(req as never);
  } catch (err) {
    await discard();
    // A client error is the request's answer, replayed; a 429 is not: its limit clears (and a
    // retry then runs), like an unexpected failure, which frees the key too. Nor is the handler's
    // `idempotency.conflict` (what an earlier request under the key wrote is not this request's):
    // the key stays that earlier request's, whose retry is then answered.
    if (ApiError.isRefusal(err) && err.status !== 429 && err.type !== 'idempotency.conflict') {
      await deps.idempotency.complete(begun, { status: err.status, body: err.toWire(deps.config.docsUrl), headers: err.headers }, false);
    } else {
      await deps.idempotency.abandon(begun);
    }
    throw err;
  }
  if (result.kind === 'stream') {
    await deps.idempotency.abandon(begun);
    return { caller, result };
  }
  const kept = op.erasureSafe && result.status < 300 ? { ...result, body: op.erasureSafe.keep(result.body) } : result;
  await deps.idempotency.complete(begun, kept, op.sensitive ?? false);
  return { caller, result };
}

interface DriveCall {
  type: string;
  payload: { authored_by?: unknown } | undefined;
}

/** The drive events a request carries or makes, where its operation declares them (`actionPolicy`). */
function driveEventsOf(op: Operation, body: unknown): DriveCall[] {
  if (op.actionPolicy === undefined || typeof body !== 'object' || body === null) return [];
  if (typeof op.actionPolicy === 'object') {
    const author = (body as Record<string, unknown>)[op.actionPolicy.authorField];
    return [{ type: op.actionPolicy.type, payload: author === undefined ? undefined : { authored_by: author } }];
  }
  const events = op.actionPolicy === 'drive' ? [body] : (body as { initial_events?: unknown }).initial_events;
  if (!Array.isArray(events)) return [];
  return events.map((e: { type?: unknown; payload?: { authored_by?: unknown } }) => ({ type: String(e.type), payload: e.payload }));
}

/** The live PermissionAssignment check for a Principal credential (403 `policy.denied`). */
async function checkPermission(decl: PermissionDeclaration, caller: Caller, params: Record<string, unknown>, body: unknown, drives: readonly DriveCall[], deps: ApiDeps): Promise<void> {
  const ws = caller.workspaceId ?? '';
  const principal = caller.principalId ?? '';
  let target: CheckTarget = { type: 'workspace', id: ws };
  if (decl.target === 'body.agent') {
    const agent = (body as { agent?: unknown }).agent;
    const id = typeof agent === 'string' ? agent : typeof agent === 'object' && agent !== null ? (agent as { id?: unknown }).id : undefined;
    if (typeof id === 'string' && targetTypeOf(id) === 'agent') target = { type: 'agent', id };
  } else if (decl.target !== 'workspace') {
    let id = String(params[decl.target] ?? '');
    // An ActionApproval is governed as the Session whose tool use it holds.
    if (isId('approval', id)) id = (await deps.approvals.get(ws, id)).session_id;
    const type = targetTypeOf(id);
    if (type === 'session') {
      const s = await deps.sessions.store.get(ws, id);
      target = { type, id, agentId: s.agent.id };
    } else if (type === 'surface_scope') {
      // An assignment on an ancestor the scope inherits from covers it (docs/SURFACE_SCOPES.md).
      target = { type, id, inheritsFrom: (await deps.surfaceScopes.inheritanceChain(ws, id)).map((s) => s.id) };
    } else if (type) {
      // A resource absent from the caller's Workspace is 404 whatever the assignments say, as for
      // an API key (and a Session above): the check does not answer for ids it cannot find.
      if (type === 'agent') await deps.agents.get(ws, id);
      else if (type === 'memory_store') await deps.memory.getStore(ws, id);
      target = { type, id };
    }
  }
  await deps.permissions.require(ws, principal, decl.action, target);
  if (decl.attachments) await checkAttachments(ws, principal, body, deps);
  // A drive naming a File (an outcome's rubric) has the Session's grader read it and its
  // verdicts quote it back: governed as a `file` resource attached to the Session is.
  if (drives.some(namesFile)) await deps.permissions.require(ws, principal, 'manage', { type: 'workspace', id: ws });
  if (decl.authorIsCaller) {
    for (const d of drives) {
      const author = d.payload?.authored_by;
      if (author !== undefined && author !== principal) {
        throw new ApiError('policy.denied', `a Principal credential drives as its own Principal: authored_by must be ${principal}`);
      }
    }
  }
}

/** A `user.define_outcome` whose rubric is a File of the Workspace. */
function namesFile(d: DriveCall): boolean {
  if (d.type !== 'user.define_outcome') return false;
  const rubric = (d.payload as { rubric?: unknown } | undefined)?.rubric;
  return typeof rubric === 'object' && rubric !== null && (rubric as { type?: unknown }).type === 'file';
}

/**
 * What a Principal attaches to a Session its Runs can use, and it can read back through them: no
 * more than it could reach itself (see `PermissionDeclaration.attachments`).
 */
async function checkAttachments(ws: string, principal: string, body: unknown, deps: ApiDeps): Promise<void> {
  const b = body as { resources?: Array<{ type?: unknown; memory_store_id?: unknown; access?: unknown }>; vault_ids?: unknown[] };
  let others = (b.vault_ids?.length ?? 0) > 0;
  for (const r of b.resources ?? []) {
    if (r.type === 'memory' && typeof r.memory_store_id === 'string') {
      await deps.permissions.require(ws, principal, r.access === 'read_write' ? 'manage' : 'read', { type: 'memory_store', id: r.memory_store_id });
    } else {
      others = true;
    }
  }
  if (others) await deps.permissions.require(ws, principal, 'manage', { type: 'workspace', id: ws });
}

/**
 * ActionPolicies at the MCP edge (`api` calls, by tool name) and at session drive (`drive` calls,
 * by event type, for the event's author). Only `allow` passes: a `require_approval` cannot be
 * waited for at these boundaries and is refused naming the rule. Each decision's record names the
 * operation's target: the path parameter its audit declaration names (a skill proposal it
 * verifies), else the Session or Agent of the path; an operation whose target is the resource it
 * creates (a Session and its first messages) records its decisions once the response names it.
 */
async function checkPolicies(
  op: Operation, mcpTool: string | undefined, caller: Caller, params: Record<string, unknown>, body: unknown, drives: readonly DriveCall[],
  deps: ApiDeps, requestId: string, progress: Progress,
): Promise<void> {
  const ws = caller.workspaceId;
  if (!ws) return;
  const actor = { id: caller.principalId ?? caller.credentialId, credential_id: caller.credentialId };
  const declared = op.audit ? op.audit.target : undefined;
  const creates = declared === 'response';
  const target = (declared !== undefined && !creates ? str(params[declared]) : null) ?? str(params.session_id) ?? str(params.agent_id) ?? null;
  const calls: ToolCall[] = [];
  if (mcpTool !== undefined) calls.push({ kind: 'api', name: mcpTool, principal_id: caller.principalId ?? undefined, input: body });
  for (const d of drives) {
    const author = typeof d.payload?.authored_by === 'string' ? d.payload.authored_by : caller.principalId ?? undefined;
    calls.push({ kind: 'drive', name: d.type, principal_id: author, input: d.payload });
  }
  for (const call of calls) {
    const pending = await deps.policies.decideUnrecorded(ws, call, { actor, request_id: requestId, refusesApproval: true });
    const d = pending.decision;
    if (creates && d.decision === 'allow') progress.decisions.push(pending.record);
    else await pending.record(target);
    const refused = boundaryRefusal(d);
    if (refused) throw refused;
  }
}

function isEmptyObject(body: unknown): boolean {
  return typeof body === 'object' && body !== null && !Array.isArray(body) && Object.keys(body).length === 0;
}

function rejectUnexpectedQuery(query: Record<string, unknown>): Record<string, never> {
  const names = Object.keys(query);
  if (names.length > 0) throw new ApiError('validation.malformed', `query: unknown parameter '${names[0] as string}'`);
  return EMPTY;
}
