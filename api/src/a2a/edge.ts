/**
 * The A2A v1.0 edge: per active AgentInstallation and SurfaceScope, a public Agent Card and a
 * JSON-RPC endpoint (docs/A2A.md). The SDK's JsonRpcTransportHandler parses and frames JSON-RPC
 * and its SSE helpers frame streams; this module admits each request first: credential (audience
 * `a2a`), placement, A2A-Version, the JSON-RPC envelope and the method's params (params.ts),
 * refused features, PermissionAssignments and ActionPolicies, then writes the request's audit
 * record (every request past the credential has one, refusals included).
 */
import type Koa from 'koa';
import { formatSSEErrorEvent, formatSSEEvent, Message, SSE_HEADERS } from '@a2a-js/sdk';
import {
  A2A_ERROR_CODE, A2AError, ExtendedAgentCardNotConfiguredError, JsonRpcTransportError, PushNotificationNotSupportedError,
  RequestMalformedError, UnsupportedOperationError, VersionNotSupportedError,
} from '@a2a-js/sdk/errors';
import { JsonRpcTransportHandler, ServerCallContext, validateVersion, type A2ARequestHandler } from '@a2a-js/sdk/server';
import { ApiError, closedLabel, Counter, ERROR_STATUS, isId, reportIncident, type Logger } from '@agentplane/core';
import { traceOf } from '../http/router.js';
import type { ApiDeps } from '../deps.js';
import { authenticate, DisabledWorkspaceError } from '../http/authenticate.js';
import { readJsonBody } from '../http/body.js';
import type { Caller } from '../http/caller.js';
import { ifNoneMatchHits } from '../http/conditional.js';
import { enforceRateLimit } from '../http/rate-limit.js';
import type { PermissionAction } from '../governance/permissions.js';
import type { AuditOutcome } from '../audit/store.js';
import { boundaryRefusal, type ToolCall } from '../governance/policy-eval.js';
import { A2A_PREFIX, parseA2aPath, resolvePlacement, type Placement } from './placement.js';
import { buildCard, CARD_MAX_AGE_SECONDS, cardFor } from './card.js';
import { CALL_STATE_KEY, SessionTaskHandler, type A2aCall } from './handler.js';
import { A2A_METHODS, checkParams, envelopeOf, namesPushConfig, ParamsError, type A2aMethod } from './params.js';

export { A2A_METHODS };
const MAX_BODY_BYTES = 4 * 1024 * 1024;
const METRIC_METHODS = [...A2A_METHODS, 'card', 'other'] as const;
/** An audit record's action names a method from a closed set: a made-up method is `a2a.other`. */
const AUDIT_METHODS = [...A2A_METHODS, 'request'] as const;
const auditMethod = (method: string): string => closedLabel(method, AUDIT_METHODS);

/**
 * A JSON-RPC envelope error (parse error, invalid request, method not found) as its code and
 * message alone: no A2A error detail, whose reason would name another error.
 */
const envelopeError = (code: number, message: string): A2AError => new JsonRpcTransportError({ jsonrpc: '2.0', id: null, error: { code, message } });
const OUTCOMES = ['ok', 'rpc_error', 'unauthenticated', 'denied', 'not_found', 'rate_limited', 'not_modified'] as const;

/** What each method needs on the installed agent and on the SurfaceScope (docs/A2A.md, "Governance"). */
function actionsFor(method: A2aMethod, continuing: boolean): PermissionAction[] {
  switch (method) {
    case 'SendMessage': return continuing ? ['invoke', 'steer'] : ['invoke'];
    case 'SendStreamingMessage': return continuing ? ['invoke', 'steer', 'observe'] : ['invoke', 'observe'];
    case 'CancelTask': return ['steer'];
    default: return ['observe'];
  }
}

/**
 * Methods that follow a task's log until it settles (a stream, a blocking send): while they last,
 * their credential and grants are checked again at each keep-alive period, as a REST stream's are.
 */
const FOLLOWING: ReadonlySet<A2aMethod> = new Set(['SendMessage', 'SendStreamingMessage', 'SubscribeToTask']);

/** JSON-RPC and A2A error codes by name (A2A 1.0, section 8): an audit record's `detail`. */
const RPC_ERROR_NAMES: Readonly<Record<number, string>> = {
  [-32700]: 'JSONParseError', [-32600]: 'InvalidRequestError', [-32601]: 'MethodNotFoundError', [-32602]: 'InvalidParamsError',
  [-32603]: 'InternalError', [-32001]: 'TaskNotFoundError', [-32002]: 'TaskNotCancelableError',
  [-32003]: 'PushNotificationNotSupportedError', [-32004]: 'UnsupportedOperationError', [-32005]: 'ContentTypeNotSupportedError',
  [-32006]: 'InvalidAgentResponseError', [-32007]: 'ExtendedAgentCardNotConfiguredError',
  [-32008]: 'ExtensionSupportRequiredError', [-32009]: 'VersionNotSupportedError',
};

/**
 * What an audit record says of a JSON-RPC error: the platform's error type when the handler
 * failed with one (its message starts with it), else the error code's name; never the message,
 * which may repeat what the caller sent.
 */
export function rpcErrorDetail(error: { code?: unknown; message?: unknown }): string {
  const head = /^([a-z_]+\.[a-z_]+): /.exec(typeof error.message === 'string' ? error.message : '')?.[1];
  if (head && head in ERROR_STATUS) return head;
  return (typeof error.code === 'number' ? RPC_ERROR_NAMES[error.code] : undefined) ?? 'rpc_error';
}

type Json = Record<string, unknown>;
const isObj = (v: unknown): v is Json => typeof v === 'object' && v !== null && !Array.isArray(v);

function flatten(headers: Koa.Context['headers']): Record<string, string | undefined> {
  const out: Record<string, string | undefined> = {};
  for (const [k, v] of Object.entries(headers)) out[k] = Array.isArray(v) ? v.join(', ') : v;
  return out;
}

/** The request id in a handler call's arguments (its ServerCallContext carries the call's state). */
function requestIdIn(args: readonly unknown[]): string | undefined {
  const ctx = args.find((a): a is ServerCallContext => a instanceof ServerCallContext);
  return (ctx?.state.get(CALL_STATE_KEY) as A2aCall | undefined)?.requestId;
}

/** Handler failures that are not A2A errors: the platform's own typed errors keep their type; anything else is an incident. */
function shield(handler: A2ARequestHandler, log: Logger): A2ARequestHandler {
  const convert = (err: unknown, args: readonly unknown[]): unknown => {
    if (err instanceof A2AError) return err;
    if (err instanceof ApiError) return new Error(`${err.type}: ${err.message}`);
    return new Error(reportIncident(log, err, 'A2A request handler failed', requestIdIn(args)).message);
  };
  return new Proxy(handler, {
    get(target, prop, receiver) {
      const value: unknown = Reflect.get(target, prop, receiver);
      if (typeof value !== 'function') return value;
      return (...args: unknown[]) => {
        const r: unknown = (value as (...a: unknown[]) => unknown).apply(target, args);
        if (r instanceof Promise) return r.catch((err: unknown) => { throw convert(err, args); });
        if (isObj(r) && Symbol.asyncIterator in r) {
          const gen = r as unknown as AsyncGenerator<unknown>;
          return (async function* shielded() {
            try {
              yield* gen;
            } catch (err) {
              throw convert(err, args);
            }
          })();
        }
        return r;
      };
    },
  });
}

export function a2aEdge(deps: ApiDeps): Koa.Middleware {
  const transport = new JsonRpcTransportHandler(shield(new SessionTaskHandler(), deps.log));
  const requests = new Counter({
    name: 'agentplane_a2a_requests_total', help: 'A2A requests (Agent Card and JSON-RPC) by method and outcome',
    labelNames: ['method', 'outcome'], registers: [deps.metrics],
  });
  const count = (method: string, outcome: (typeof OUTCOMES)[number]) =>
    requests.inc({ method: closedLabel(method, METRIC_METHODS), outcome });

  const wire = (ctx: Koa.Context, err: ApiError, extra: Record<string, string> = {}) => {
    ctx.status = err.status;
    for (const [k, v] of Object.entries({ ...err.headers, ...extra })) ctx.set(k, v);
    ctx.type = 'application/json';
    ctx.body = JSON.stringify(err.toWire(deps.config.docsUrl));
  };

  async function card(ctx: Koa.Context, p: { workspaceId: string; installationId: string; scopeId: string }): Promise<void> {
    let placement: Placement;
    try {
      placement = await resolvePlacement(deps, p.workspaceId, p.installationId, p.scopeId);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      count('card', 'not_found');
      return wire(ctx, err);
    }
    const { json, etag } = buildCard(placement, deps.config.publicBaseUrl);
    ctx.set('Cache-Control', `public, max-age=${CARD_MAX_AGE_SECONDS}`);
    ctx.set('ETag', etag);
    if (ifNoneMatchHits(ctx.get('If-None-Match'), etag)) {
      count('card', 'not_modified');
      ctx.status = 304;
      return;
    }
    count('card', 'ok');
    ctx.status = 200;
    ctx.type = 'application/json';
    ctx.body = JSON.stringify(json);
  }

  async function audit(c: { caller: Caller; workspaceId: string; requestId: string }, method: string, target: string | null, outcome: AuditOutcome, status: number, detail: string | null): Promise<void> {
    try {
      await deps.audit.append(c.workspaceId, {
        actor: { id: c.caller.principalId ?? c.caller.credentialId, credential_id: c.caller.credentialId },
        action: `a2a.${auditMethod(method)}`, target, outcome, status, detail, request_id: c.requestId,
      });
    } catch (err) {
      deps.log.error({ err, action: `a2a.${auditMethod(method)}`, request_id: c.requestId }, 'audit append failed');
    }
  }

  /** The PermissionAssignments a method needs, live, on the installed Agent and on the SurfaceScope (403 `policy.denied`). */
  async function requireGrants(placement: Placement, principalId: string, method: A2aMethod, continuing: boolean): Promise<void> {
    const ws = placement.workspaceId;
    const chain = (await deps.surfaceScopes.inheritanceChain(ws, placement.scope.id)).map((s) => s.id);
    for (const action of actionsFor(method, continuing)) {
      await deps.permissions.require(ws, principalId, action, { type: 'agent', id: placement.agent.id });
      await deps.permissions.require(ws, principalId, action, { type: 'surface_scope', id: placement.scope.id, inheritsFrom: chain });
    }
  }

  /**
   * For a request that outlives its admission: the refusal its credential or grants meet now
   * (a revoked credential, a suspended Principal, a revoked or narrowed assignment), or null while
   * they still admit it. A check that fails for another reason keeps the request going, as a REST
   * stream's keep-alive does.
   */
  async function nowRefused(headers: Readonly<Record<string, string | undefined>>, placement: Placement, principalId: string, method: A2aMethod, continuing: boolean): Promise<ApiError | null> {
    try {
      const again = await authenticate(headers, deps);
      if (again.kind !== 'principal_credential' || again.audience !== 'a2a' || again.principalId !== principalId || again.workspaceId !== placement.workspaceId) {
        throw new ApiError('auth.invalid_key', 'A2A takes a Principal access credential with audience a2a');
      }
      await requireGrants(placement, principalId, method, continuing);
      return null;
    } catch (err) {
      return err instanceof ApiError ? err : null;
    }
  }

  async function rpc(ctx: Koa.Context, p: { workspaceId: string; installationId: string; scopeId: string }): Promise<void> {
    const headers = flatten(ctx.headers);
    const requestId = String(ctx.state.requestId ?? '');
    // 1. A Principal credential with audience a2a: nothing else (an api_mcp bearer is refused here).
    let caller: Caller;
    // A credential whose Workspace is disabled is known (the refusal carries it): it is refused
    // (403 `auth.disabled_tenancy`, naming the Workspace) once it is an a2a credential, and that
    // refusal is recorded in the Workspace, as a REST request's is.
    let disabled: DisabledWorkspaceError | null = null;
    try {
      try {
        caller = await authenticate(headers, deps, ctx.req.socket);
      } catch (err) {
        if (!(err instanceof DisabledWorkspaceError)) throw err;
        caller = err.caller;
        disabled = err;
      }
      if (caller.kind !== 'principal_credential') throw new ApiError('auth.invalid_key', 'A2A takes a Principal access credential with audience a2a');
      if (caller.audience !== 'a2a') throw new ApiError('auth.invalid_key', `a credential with audience '${caller.audience ?? 'none'}' is not accepted by the A2A endpoint`);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      count('other', 'unauthenticated');
      return wire(ctx, err, err.status === 401 ? { 'WWW-Authenticate': 'Bearer' } : {});
    }
    if (disabled !== null) {
      count('other', 'denied');
      // The body is not read: no method to name. The record is the credential's Workspace's.
      if (caller.workspaceId) {
        const target = caller.workspaceId === p.workspaceId ? p.installationId : null;
        await audit({ caller, workspaceId: caller.workspaceId, requestId }, 'request', target, 'denied', disabled.status, disabled.type);
      }
      return wire(ctx, disabled);
    }
    const principalId = caller.principalId ?? '';
    const base = { caller, workspaceId: p.workspaceId, requestId };
    if (caller.workspaceId) ctx.set('Service-Workspace-Id', caller.workspaceId);
    // The credential binds its Workspace: another Workspace's endpoint does not exist for it.
    if (caller.workspaceId !== p.workspaceId) {
      count('other', 'not_found');
      return wire(ctx, new ApiError('validation.not_found', 'no A2A agent is served here: workspace'));
    }
    try {
      await enforceRateLimit(deps.redis, caller.credentialId, caller.rateLimitPerMinute);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      count('other', 'rate_limited');
      await audit(base, 'request', p.installationId, 'denied', err.status, err.type);
      return wire(ctx, err);
    }
    // 2. The placement, rechecked on every request.
    let placement: Placement;
    try {
      placement = await resolvePlacement(deps, p.workspaceId, p.installationId, p.scopeId);
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      count('other', 'not_found');
      await audit(base, 'request', p.installationId, 'failed', err.status, err.type);
      return wire(ctx, err);
    }
    // 3. The body. One that is not JSON (none at all, or one that does not parse) is the JSON-RPC
    // parse error, answered (5) after the same checks as any request.
    let body: unknown;
    let notJson: string | null = null;
    try {
      body = await readJsonBody(ctx.req, MAX_BODY_BYTES);
      if (body === undefined) notJson = 'the request has no body; one JSON-RPC request is expected';
    } catch (err) {
      if (!(err instanceof ApiError)) throw err;
      body = undefined;
      if (err.status === 413) {
        // Refused before the body was read: no method to name.
        count('other', 'rpc_error');
        await audit(base, 'request', placement.installation.id, 'failed', err.status, err.type);
        return wire(ctx, err);
      }
      // Not JSON, not application/json, nested too deep, cut short: no message to dispatch.
      notJson = err.message;
    }
    const msg = isObj(body) ? body : null;
    // A request whose method cannot be read is recorded as `a2a.request` (docs/A2A.md, step 9).
    const method = typeof msg?.method === 'string' ? msg.method : 'request';
    // The id answered until the envelope is checked: one JSON-RPC allows, else null.
    let id: string | number | null = msg && (typeof msg.id === 'string' || Number.isInteger(msg.id)) ? (msg.id as string | number) : null;
    const refuse = async (err: A2AError) => {
      const error = JsonRpcTransportHandler.mapToJSONRPCError(err);
      count(method, 'rpc_error');
      await audit(base, method, placement.installation.id, 'failed', 200, rpcErrorDetail(error));
      ctx.status = 200;
      ctx.type = 'application/json';
      ctx.body = JSON.stringify({ jsonrpc: '2.0', id, error });
    };
    const card = cardFor(placement, deps.config.publicBaseUrl);
    // 4. A2A-Version: exactly 1.0 (an absent header is refused, not read as 0.3); no extensions.
    const version = headers['a2a-version']?.trim() ?? '';
    try {
      if (version === '') throw new VersionNotSupportedError('the A2A-Version header is required (supported: 1.0)');
      validateVersion(version, card, 'JSONRPC');
    } catch (err) {
      if (err instanceof A2AError) return refuse(err);
      throw err;
    }
    if ((headers['a2a-extensions'] ?? '').trim() !== '') return refuse(new UnsupportedOperationError('protocol extensions are not supported'));
    // 5. One JSON-RPC 2.0 request object with an id. A body that is not one is answered with id
    // null (JSON-RPC 2.0, section 5): a parse error, else an invalid request; nothing runs.
    if (notJson !== null) {
      id = null;
      return refuse(envelopeError(A2A_ERROR_CODE.PARSE_ERROR, notJson));
    }
    let params: Json;
    let known: A2aMethod | null;
    try {
      const envelope = envelopeOf(body);
      id = envelope.id;
      known = (A2A_METHODS as readonly string[]).includes(method) ? (method as A2aMethod) : null;
      params = isObj(envelope.params) ? envelope.params : {};
      // 6. Refused features a request names outside its typed params.
      if ('tenant' in params) return refuse(new UnsupportedOperationError('the A2A tenant field is not accepted: the endpoint names its placement'));
      if ((known === 'SendMessage' || known === 'SendStreamingMessage') && namesPushConfig(params)) {
        return refuse(new PushNotificationNotSupportedError('push notifications are not supported'));
      }
      // A method this endpoint does not serve, whatever its params (which JSON-RPC lets a
      // request leave out): -32601, before any params are read and before any grant is checked.
      if (!known) {
        // The push methods are A2A's, refused as push notifications are (-32003).
        if (/PushNotificationConfigs?$/.test(method)) return refuse(new PushNotificationNotSupportedError('push notifications are not supported'));
        // So is the extended card, which is not offered (the card says so): -32007.
        if (method === 'GetExtendedAgentCard') return refuse(new ExtendedAgentCardNotConfiguredError('no extended Agent Card is configured'));
        return refuse(envelopeError(A2A_ERROR_CODE.METHOD_NOT_FOUND, `Method not found: ${method.slice(0, 64)}`));
      }
      // 7. The method's params against its closed schema, before anything decodes them.
      checkParams(known, envelope.params);
    } catch (err) {
      if (!(err instanceof ParamsError)) throw err;
      if (err.kind === 'request') {
        id = null;
        return refuse(envelopeError(A2A_ERROR_CODE.INVALID_REQUEST, err.message));
      }
      return refuse(new RequestMalformedError(err.message));
    }
    // 8. Governance: never agent to agent inside one Workspace; PermissionAssignments; ActionPolicies.
    let continuing = false;
    let recordTarget = placement.installation.id;
    if (known) {
      try {
        if (await deps.installations.installationOfPrincipal(p.workspaceId, principalId)) {
          throw new ApiError('policy.denied', 'an A2A task never connects two agents inside one Workspace: this Principal is an installed agent');
        }
        // Read as the SDK's own decoding will (it also takes `task_id` and `context_id`), so
        // what decides the grants needed is what the handler then acts on. The params passed
        // their schema: the decoding cannot trip on them.
        const sends = known === 'SendMessage' || known === 'SendStreamingMessage';
        const message = sends ? Message.fromJSON(params.message as Json) : null;
        continuing = message !== null && (message.taskId !== '' || message.contextId !== '');
        // The task a call names (a well-formed Session id), which its records name (docs/A2A.md).
        const named = message !== null ? message.taskId || message.contextId : (params as { id?: unknown }).id;
        if (typeof named === 'string' && isId('session', named)) recordTarget = named;
        await requireGrants(placement, principalId, known, continuing);
        const actor = { id: principalId, credential_id: caller.credentialId };
        const calls: ToolCall[] = [{ kind: 'a2a', name: known, principal_id: principalId, input: params }];
        if (sends) calls.push({ kind: 'drive', name: 'user.message', principal_id: principalId, input: params });
        if (known === 'CancelTask') calls.push({ kind: 'drive', name: 'user.interrupt', principal_id: principalId, input: params });
        for (const call of calls) {
          const d = await deps.policies.decide(p.workspaceId, call, { actor, target: recordTarget, request_id: requestId, refusesApproval: true });
          const refused = boundaryRefusal(d);
          if (refused) throw refused;
        }
      } catch (err) {
        if (!(err instanceof ApiError)) throw err;
        count(method, 'denied');
        await audit(base, method, recordTarget, 'denied', err.status, err.type);
        return wire(ctx, err);
      }
    }
    // 9. Dispatch through the SDK's JSON-RPC transport.
    const abort = new AbortController();
    const onClose = () => abort.abort();
    ctx.res.on('close', onClose);
    const call: A2aCall = {
      deps, caller: { ...caller, principalId, workspaceId: p.workspaceId }, placement, card,
      signal: AbortSignal.any([abort.signal, deps.shutdownSignal]), requestId, trace: traceOf(ctx),
    };
    const context = new ServerCallContext({
      requestedVersion: version, user: { isAuthenticated: true, userName: principalId }, state: new Map([[CALL_STATE_KEY, call]]),
    });
    const target = () => call.target ?? placement.installation.id;
    // A request that follows a task's log ends once its credential or grants no longer admit it:
    // the refusal is its answer (or, once a stream has begun, its last event) and its record.
    const cut: { refused: ApiError | null; finished: boolean } = { refused: null, finished: false };
    // Read through a call: the refusal arrives from the timer, between the awaits below, or from
    // the handler (an answer's ActionPolicies), which the SDK would turn into an internal error.
    const refusal = (): ApiError | null => cut.refused ?? call.denied ?? null;
    const following = known !== null && FOLLOWING.has(known) ? known : null;
    const recheck = following === null ? undefined : setInterval(() => {
      void nowRefused(headers, placement, principalId, following, continuing).then((err) => {
        if (err === null || cut.finished || cut.refused !== null) return;
        cut.refused = err;
        abort.abort();
      });
    }, deps.config.sseKeepaliveMs);
    recheck?.unref();
    const deny = async (err: ApiError): Promise<void> => {
      count(method, 'denied');
      await audit(base, method, target(), 'denied', err.status, err.type);
      wire(ctx, err, err.status === 401 ? { 'WWW-Authenticate': 'Bearer' } : {});
    };
    try {
      const out = await transport.handle(body as Json, context);
      if (!(Symbol.asyncIterator in out)) {
        const refused = refusal();
        if (refused !== null) return deny(refused);
        const failed = 'error' in out && out.error !== undefined;
        count(method, failed ? 'rpc_error' : 'ok');
        await audit(base, method, target(), failed ? 'failed' : 'succeeded', 200, failed ? rpcErrorDetail(out.error as { code?: unknown; message?: unknown }) : null);
        ctx.status = 200;
        ctx.type = 'application/json';
        ctx.body = JSON.stringify(out);
        return;
      }
      // Streams: the first event (or the error before it) decides between SSE and a JSON error.
      const it = out[Symbol.asyncIterator]();
      let first: IteratorResult<unknown>;
      try {
        first = await it.next();
      } catch (err) {
        const refused = refusal();
        if (refused !== null) return deny(refused);
        // A platform error keeps its type (its message starts with it), as in a non-stream answer.
        const error = JsonRpcTransportHandler.mapToJSONRPCError(err);
        count(method, 'rpc_error');
        await audit(base, method, target(), 'failed', 200, rpcErrorDetail(error));
        ctx.status = 200;
        ctx.type = 'application/json';
        ctx.body = JSON.stringify({ jsonrpc: '2.0', id, error });
        return;
      }
      const refusedEarly = refusal();
      if (refusedEarly !== null) {
        await it.return?.(undefined);
        return deny(refusedEarly);
      }
      ctx.respond = false;
      const res = ctx.res;
      res.writeHead(200, { ...SSE_HEADERS, 'Request-Id': requestId, 'Service-Workspace-Id': p.workspaceId });
      let outcome: AuditOutcome = 'succeeded';
      let detail: string | null = null;
      try {
        if (!first.done) res.write(formatSSEEvent(first.value));
        for (;;) {
          const next = await it.next();
          if (next.done) break;
          if (res.writableEnded || res.destroyed) break;
          res.write(formatSSEEvent(next.value));
        }
      } catch (err) {
        const error = JsonRpcTransportHandler.mapToJSONRPCError(err);
        outcome = 'failed';
        detail = rpcErrorDetail(error);
        if (!res.writableEnded && !res.destroyed) {
          res.write(formatSSEErrorEvent({ jsonrpc: '2.0', id, error }));
        }
      } finally {
        await it.return?.(undefined);
        const refused = refusal();
        if (refused !== null && outcome === 'succeeded') {
          // The stream ended because its caller is no longer admitted: its last event says why.
          outcome = 'denied';
          detail = refused.type;
          const error = JsonRpcTransportHandler.mapToJSONRPCError(new Error(`${refused.type}: ${refused.message}`));
          if (!res.writableEnded && !res.destroyed) res.write(formatSSEErrorEvent({ jsonrpc: '2.0', id, error }));
        }
        if (!res.writableEnded) res.end();
      }
      count(method, outcome === 'succeeded' ? 'ok' : outcome === 'denied' ? 'denied' : 'rpc_error');
      await audit(base, method, target(), outcome, 200, detail);
    } finally {
      cut.finished = true;
      clearInterval(recheck);
      ctx.res.off('close', onClose);
      abort.abort();
    }
  }

  return async (ctx, next) => {
    if (!ctx.path.startsWith(A2A_PREFIX)) return next();
    const p = parseA2aPath(ctx.path);
    if (!p) return next();
    if (p.card) {
      if (ctx.method !== 'GET' && ctx.method !== 'HEAD') {
        ctx.set('Allow', 'GET, HEAD');
        return wire(ctx, new ApiError('validation.malformed', `${ctx.method} is not served on an Agent Card; use GET`), {});
      }
      return card(ctx, p);
    }
    if (ctx.method !== 'POST') {
      ctx.set('Allow', 'POST');
      return wire(ctx, new ApiError('validation.malformed', `${ctx.method} is not served on an A2A endpoint; use POST (JSON-RPC)`));
    }
    return rpc(ctx, p);
  };
}
