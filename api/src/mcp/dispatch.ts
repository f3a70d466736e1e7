import { ApiError, reportIncident, type Context, type WireError } from '@agentplane/core';
import type { ApiDeps } from '../deps.js';
import type { Caller } from '../http/caller.js';
import { WORKSPACE_SELECTOR_HEADER, type DisabledWorkspaceError } from '../http/authenticate.js';
import { CURRENT_VERSION, type Operation } from '../http/operation.js';
import { execute, VERSION_HEADER, type PreparedOperation, type RawRequest } from '../http/pipeline.js';
import { SEARCH_TOOL, ToolCatalog, type ProjectedTool } from './catalog.js';
import { ErrorCode, isPlainObject, MAX_RESULT_CONTRIBUTION_BYTES, McpProtocolError } from './protocol.js';

/** A `tools/call` result (the MCP CallToolResult). */
export interface ToolResult {
  content: { type: 'text'; text: string }[];
  isError: boolean;
  _meta?: Record<string, unknown>;
}

/** The HTTP status of the synthesized REST call, for clients that want it. */
export const META_HTTP_STATUS = 'dev.agentplane/http_status';
/** Seconds until a rate limit or budget releases, when the REST error named it (Retry-After). */
export const META_RETRY_AFTER = 'dev.agentplane/retry_after_seconds';
/** Set when the REST call was an Idempotency-Key replay of an earlier call. */
export const META_REPLAYED = 'dev.agentplane/idempotent_replayed';

const ARGUMENT_KEYS = new Set(['path', 'query', 'body', 'idempotency_key']);

/** The newest dated version an operation accepts: internally dispatched calls use the latest. */
export function latestVersion(op: Operation): string | null {
  if (op.versions === null) return null;
  const accepted = op.versions ?? [CURRENT_VERSION];
  return [...accepted].sort().at(-1) ?? CURRENT_VERSION;
}

function errorResult(wire: WireError, status: number): ToolResult {
  return { content: [{ type: 'text', text: JSON.stringify(wire) }], isError: true, _meta: { [META_HTTP_STATUS]: status } };
}

export function apiErrorResult(err: ApiError, deps: ApiDeps): ToolResult {
  const result = errorResult(err.toWire(deps.config.docsUrl), err.status);
  const retryAfter = err.headers['Retry-After'];
  if (retryAfter !== undefined && result._meta) result._meta[META_RETRY_AFTER] = Number(retryAfter);
  return result;
}

/**
 * What is wrong with a tool call's arguments as an envelope (`{path, query, body,
 * idempotency_key}`, the key required for every mutation); the parts' contents are the
 * operation's schemas' to check.
 */
function argumentsProblem(p: ProjectedTool, a: unknown): ApiError | undefined {
  if (!isPlainObject(a)) return new ApiError('validation.malformed', 'arguments must be an object {path, query, body}');
  const unknown = Object.keys(a).find((k) => !ARGUMENT_KEYS.has(k) || (k === 'idempotency_key' && !p.requiresKey));
  if (unknown) return new ApiError('validation.malformed', `arguments: unknown field '${unknown}'`);
  for (const part of ['path', 'query'] as const) {
    if (a[part] !== undefined && !isPlainObject(a[part])) return new ApiError('validation.malformed', `arguments: ${part} must be an object`);
  }
  if (a.idempotency_key !== undefined && typeof a.idempotency_key !== 'string') {
    return new ApiError('validation.malformed', 'arguments: idempotency_key must be a string');
  }
  if (p.requiresKey && a.idempotency_key === undefined) {
    return new ApiError('validation.malformed', `${p.tool.name} requires idempotency_key (the Idempotency-Key of ${p.op.method} ${p.op.path})`);
  }
  return undefined;
}

/** The calling context of one MCP HTTP request. */
export interface CallContext {
  /** Authenticated and already counted against its rate limit by the edge. */
  caller: Caller;
  /** The original request's lower-cased headers (bearer, workspace selector). */
  headers: Readonly<Record<string, string | undefined>>;
  /** The HTTP request's id: the operation's audit record and any incident name it. */
  requestId: string;
  /** The HTTP request's trace context (tracing on): the parent of the spans the call makes. */
  trace?: Context | undefined;
  /** The caller's Workspace is disabled: the pipeline refuses the call unless its operation still reaches it. */
  disabled?: DisabledWorkspaceError | undefined;
}

/**
 * Runs tools: the search tool, or one REST operation in-process through the shared pipeline
 * (`execute`: authentication, authorisation, rate limit, validation, idempotency, handler),
 * never over loopback HTTP.
 */
export class ToolDispatcher {
  constructor(
    private readonly catalog: ToolCatalog,
    private readonly prepared: ReadonlyMap<string, PreparedOperation>,
    private readonly deps: ApiDeps,
  ) {}

  /**
   * `limited`: the edge found the caller over its rate limit. The call is then refused by the
   * pipeline where a REST request over its limit is (after authorisation, with nothing of its
   * arguments passed on), so a limited mutation is its audit record, as over REST.
   */
  async call(name: string, args: unknown, ctx: CallContext, limited?: ApiError): Promise<ToolResult> {
    const principal = ctx.caller.kind === 'principal_credential';
    if (name === SEARCH_TOOL && !principal) {
      const refusal = limited ?? ctx.disabled;
      return refusal ? apiErrorResult(refusal, this.deps) : this.search(args, ctx.caller);
    }
    const p = this.catalog.tools.get(name);
    if (!p) {
      if (limited) return apiErrorResult(limited, this.deps);
      if (principal || name === SEARCH_TOOL) return apiErrorResult(new ApiError('policy.denied', `the principal catalog does not include '${name}'`), this.deps);
      throw new McpProtocolError(ErrorCode.InvalidParams, `unknown tool '${name}'`);
    }
    if (principal && !ToolCatalog.principalAdmits(p)) {
      // Refused by the same pipeline as any call (after the role check, with nothing of its
      // arguments passed on), so a refused mutation is its audit record, as over REST.
      return this.dispatch(p, undefined, ctx, limited ?? new ApiError('policy.denied', `the principal catalog does not include '${name}'`));
    }
    return limited ? this.dispatch(p, undefined, ctx, limited) : this.dispatch(p, args, ctx);
  }

  private search(args: unknown, caller: Caller): ToolResult {
    if (!isPlainObject(args) || typeof args.query !== 'string' || args.query.length === 0 || args.query.length > 200) {
      return apiErrorResult(new ApiError('validation.malformed', 'arguments: query must be a string of 1 to 200 characters'), this.deps);
    }
    const limit = args.limit === undefined ? 10 : args.limit;
    if (typeof limit !== 'number' || !Number.isInteger(limit) || limit < 1 || limit > 50) {
      return apiErrorResult(new ApiError('validation.malformed', 'arguments: limit must be an integer from 1 to 50'), this.deps);
    }
    const unknown = Object.keys(args).find((k) => k !== 'query' && k !== 'limit');
    if (unknown) return apiErrorResult(new ApiError('validation.malformed', `arguments: unknown field '${unknown}'`), this.deps);
    const data = this.catalog.search(caller, args.query, limit).map((p) => ({
      name: p.tool.name,
      operation_id: p.op.operationId,
      method: p.op.method,
      path: p.op.path,
      summary: p.op.summary,
      requires_idempotency_key: p.requiresKey,
      listed_in_compact_catalog: p.compact,
      inputSchema: p.tool.inputSchema,
    }));
    return { content: [{ type: 'text', text: JSON.stringify({ data }) }], isError: false };
  }

  private async dispatch(p: ProjectedTool, args: unknown, ctx: CallContext, denied?: ApiError): Promise<ToolResult> {
    const given = args === undefined ? {} : args;
    // A malformed envelope (or a call refused before its arguments are read) still goes through
    // the pipeline (refused there, after authorisation, and recorded), with nothing of it passed on.
    const refused = denied ?? argumentsProblem(p, given);
    // Refused for its envelope (not before its arguments are read), the call keeps its path
    // parameters, which name its audit record's target (checked as well-formed ids there), as a
    // REST request refused for its body does.
    const a: Record<string, unknown> = !refused && isPlainObject(given)
      ? given
      : !denied && isPlainObject(given) && isPlainObject(given.path) ? { path: given.path } : {};
    const key = typeof a.idempotency_key === 'string' ? a.idempotency_key : undefined;

    const headers: Record<string, string | undefined> = { authorization: ctx.headers.authorization };
    const selector = ctx.headers[WORKSPACE_SELECTOR_HEADER];
    if (selector !== undefined) headers[WORKSPACE_SELECTOR_HEADER] = selector;
    const version = latestVersion(p.op);
    if (version) headers[VERSION_HEADER] = version;
    if (key !== undefined) headers['idempotency-key'] = key;

    const params: Record<string, string> = {};
    for (const [k, v] of Object.entries((a.path as Record<string, unknown> | undefined) ?? {})) {
      params[k] = typeof v === 'string' ? v : JSON.stringify(v);
    }
    const raw: RawRequest = {
      method: p.op.method,
      headers,
      params,
      query: { ...((a.query as Record<string, unknown> | undefined) ?? {}) },
      body: a.body,
      admitted: ctx.caller,
      ...(ctx.disabled ? { admittedDisabled: ctx.disabled } : {}),
      mcpTool: p.tool.name,
      requestId: ctx.requestId,
      trace: ctx.trace,
      ...(refused ? { refused } : {}),
    };
    const prepared = this.prepared.get(p.op.operationId);
    if (!prepared) throw new Error(`operation ${p.op.operationId} is not prepared`);
    try {
      const { result } = await execute(prepared, raw, this.deps);
      if (result.kind === 'stream') {
        return apiErrorResult(new ApiError('validation.malformed', `${p.tool.name} streams its response; streams are served over REST only`), this.deps);
      }
      const text = result.status === 204 ? '' : JSON.stringify(result.body ?? null);
      const bytes = Buffer.byteLength(text);
      if (bytes > MAX_RESULT_CONTRIBUTION_BYTES) {
        return apiErrorResult(new ApiError('validation.payload_too_large',
          `the REST result is ${bytes} bytes, over the ${MAX_RESULT_CONTRIBUTION_BYTES}-byte MCP result limit; narrow the call (for example a smaller limit)`), this.deps);
      }
      const meta: Record<string, unknown> = { [META_HTTP_STATUS]: result.status };
      if (result.headers?.['Idempotent-Replayed'] === 'true') meta[META_REPLAYED] = true;
      // Text only: the REST body is the tool's whole contribution, counted once against the 1 MiB limit.
      // A replayed stored failure comes back as a result with its 4xx status: still an error.
      return { content: [{ type: 'text', text }], isError: result.status >= 400, _meta: meta };
    } catch (err) {
      if (err instanceof ApiError) return apiErrorResult(err, this.deps);
      const inc = reportIncident(this.deps.log, err, 'unhandled error in an MCP tool call', ctx.requestId, { tool: p.tool.name });
      return apiErrorResult(new ApiError('runtime.internal', inc.message), this.deps);
    }
  }
}
