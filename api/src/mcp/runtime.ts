import type Koa from 'koa';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createMcpHandler, ProtocolError, ProtocolErrorCode, Server, type AuthInfo, type CallToolResult, type Tool } from '@modelcontextprotocol/server';
import { toNodeHandler } from '@modelcontextprotocol/node';
import { ApiError, Counter, isId, reportIncident, scrubSecrets, newId } from '@agentplane/core';
import { tags } from '@agentplane/store';
import type { ApiDeps } from '../deps.js';
import { bearerToken } from '../http/authenticate.js';
import { requestIdOf } from '../http/router.js';
import type { Connection } from '@agentplane/domain';
import { ConnectionService } from '@agentplane/domain';
import { MAX_MESSAGE_BYTES } from './protocol.js';
import { guardedFetch } from './egress.js';
import type { EgressPolicy } from '@agentplane/core';
import { recordRefusedCall, refusedToolCall, refuseRuntimeRequest, runtimeMethodNotAllowed, runtimeRefusals, sdkConsoleToLog, type RuntimeRefusal } from './runtime-edge.js';
import { refusedUnconfirmed, requireRuntimeToolCall, toolUseIdOf } from '../governance/run-tool-gate.js';
import { argumentsOutsideSchema, exposedName, permissionOf, upstreamName, type ConnectionGrant, type RuntimeBearerVerifier, type RuntimeGrant } from '@agentplane/domain';

export const RUNTIME_PATH = /^\/v1\/runtime\/mcp\/([^/]+)$/;

/** One proxied tool call, for the session event log (the sessions work backs this). */
export interface ToolCallEvent {
  phase: 'started' | 'finished';
  tool_use_id: string;
  run_id: string;
  session_id: string;
  workspace_id: string;
  connection_id: string;
  tool: string;
  is_error?: boolean;
  duration_ms?: number;
}

/** Where the runtime endpoint reports tool calls. The default only logs (no payloads). */
export interface ToolCallObserver {
  toolCall(event: ToolCallEvent): Promise<void> | void;
}

export interface RuntimeMcpOptions {
  verifier: RuntimeBearerVerifier;
  observer?: ToolCallObserver;
  /** Per upstream request (connect, list page, call). */
  upstreamTimeoutMs?: number;
}

const SERVER_INFO = { name: 'agentplane-runtime', version: '0.1.0' };
/** Pages of an upstream tools/list walked at most. */
const LIST_MAX_PAGES = 50;

interface RequestContext {
  grant: RuntimeGrant;
  connectionGrant: ConnectionGrant;
  connection: Connection;
  /** Headers for the upstream: a Session vault secret for the Connection's URL, else the Connection's own token. */
  headers: Record<string, string>;
  /** The request's id: its audit records carry it. */
  requestId: string;
}

/** An MCP client to the Connection's server, opened lazily once per inbound request. */
class Upstream {
  private client: Client | null = null;
  constructor(
    private readonly connection: Connection,
    private readonly headers: Record<string, string>,
    private readonly timeoutMs: number,
    private readonly egress: EgressPolicy,
  ) {}

  async get(): Promise<Client> {
    if (this.client) return this.client;
    const client = new Client(SERVER_INFO, { capabilities: {}, listMaxPages: LIST_MAX_PAGES });
    // Every request to the server passes the outbound address guard (a Connection's host may
    // resolve to an internal address long after its URL was written).
    const transport = new StreamableHTTPClientTransport(new URL(this.connection.url), {
      requestInit: { headers: this.headers }, fetch: guardedFetch(this.egress),
    });
    try {
      await client.connect(transport, { timeout: this.timeoutMs });
    } catch (err) {
      throw new ProtocolError(ProtocolErrorCode.InternalError, this.scrub(`the MCP server of connection ${this.connection.id} is unreachable: ${(err as Error).message}`));
    }
    this.client = client;
    return client;
  }

  /**
   * `text` without the credential this upstream was sent (a Session vault secret or the
   * Connection's token): an upstream's error may quote the request's Authorization header, and
   * such text ends up in a tool result the event log keeps.
   */
  scrub(text: string): string {
    const sent = Object.values(this.headers).flatMap((v) => [v, v.replace(/^\s*\S+\s+/, '')]);
    return scrubSecrets(text, sent.filter((v) => v.length >= 8));
  }

  /**
   * A tool result without the credential this upstream was sent: a server may quote it in what it
   * answers (an error result saying which token it refused), and the result reaches the Run and
   * the event log. Every string is scrubbed but base64 payloads (an image's or audio's `data`, a
   * resource's `blob`), which hold no quoted text.
   */
  scrubResult(result: CallToolResult): CallToolResult {
    if (Object.keys(this.headers).length === 0) return result;
    const walk = (v: unknown, key: string | null, parent: Record<string, unknown> | null): unknown => {
      if (typeof v === 'string') {
        const binary = key === 'blob' || (key === 'data' && (parent?.type === 'image' || parent?.type === 'audio'));
        return binary ? v : this.scrub(v);
      }
      if (Array.isArray(v)) return v.map((x) => walk(x, null, null));
      if (v !== null && typeof v === 'object') {
        const o = v as Record<string, unknown>;
        return Object.fromEntries(Object.entries(o).map(([k, x]) => [k, walk(x, k, o)]));
      }
      return v;
    };
    return walk(result, null, null) as CallToolResult;
  }

  async close(): Promise<void> {
    const c = this.client;
    this.client = null;
    await c?.close().catch(() => undefined);
  }
}

/** A refused call's tool result: the wire error body of the refusal. */
function errorResult(err: ApiError, deps: ApiDeps): CallToolResult {
  return { content: [{ type: 'text', text: JSON.stringify(err.toWire(deps.config.docsUrl)) }], isError: true };
}

/**
 * Every upstream tool. A failure is rethrown with the credential sent upstream taken out of its
 * message (an upstream's HTTP error body or JSON-RPC error may quote it), keeping the code of an
 * upstream protocol error: callers answer it to the Run, or log it.
 */
async function upstreamTools(up: Upstream, timeoutMs: number): Promise<Tool[]> {
  const client = await up.get();
  try {
    // Without a cursor the client walks every page and returns them all; past LIST_MAX_PAGES (a
    // server whose cursor never ends) it throws, and the list fails rather than come back cut.
    return (await client.listTools(undefined, { timeout: timeoutMs })).tools;
  } catch (err) {
    if (err instanceof ProtocolError) throw new ProtocolError(err.code, up.scrub(err.message));
    throw new ProtocolError(ProtocolErrorCode.InternalError, up.scrub(`the upstream tools/list failed: ${(err as Error).message}`));
  }
}

/**
 * The upstream catalog, filtered and annotated by the grant's permission policy, then shaped by
 * the deployment's binding revision when there is one: only selected tools, under their alias,
 * and under `strict` with `additionalProperties: false` on an object input schema.
 */
async function listTools(up: Upstream, grant: ConnectionGrant, timeoutMs: number, upstream?: Tool[]): Promise<Tool[]> {
  const out: Tool[] = [];
  for (const t of upstream ?? await upstreamTools(up, timeoutMs)) {
    const permission = permissionOf(grant, t.name);
    if (permission === 'deny') continue;
    const name = grant.shaping ? exposedName(grant.shaping, t.name) : t.name;
    if (name === null) continue;
    const inputSchema = grant.shaping?.argument_policy === 'strict' ? { ...t.inputSchema, additionalProperties: false } : t.inputSchema;
    // Under an alias, `dev.agentplane/upstream_tool` keeps the upstream name: ActionPolicies name tools by it.
    const upstream = name !== t.name ? { 'dev.agentplane/upstream_tool': t.name } : {};
    out.push({ ...t, name, inputSchema, _meta: { ...(t._meta ?? {}), 'dev.agentplane/permission': permission, ...upstream } });
  }
  return out;
}

/**
 * `POST /v1/runtime/mcp/{connection_id}`: a Run's view of one attached Connection, for the
 * harness executing that Run. Authenticated by a runtime bearer only (minted per lease);
 * lists the upstream tools the agent version's policy admits and proxies calls through an
 * MCP client to the external server, each call once the Workspace's ActionPolicies allow it (and,
 * for a tool of an `always_ask` server, once the Session confirmed its use), each one an audit
 * record. Stateless: one SDK server and transport per request.
 */
export function runtimeMcp(deps: ApiDeps, options: RuntimeMcpOptions): Koa.Middleware {
  const connections = new ConnectionService(deps.docs, deps.secretBox);
  const timeoutMs = options.upstreamTimeoutMs ?? 60_000;
  const observer: ToolCallObserver = options.observer ?? {
    toolCall: (e) => deps.log.info({ ...e }, 'runtime MCP tool call'),
  };
  const calls = new Counter({ name: 'agentplane_runtime_mcp_tool_calls_total', help: 'Proxied runtime MCP tool calls by outcome (ok, error, denied, needs_approval: an always_ask tool without a confirmed use, rejected)', labelNames: ['outcome'] as const, registers: [deps.metrics] });

  /**
   * The Session's vaults, read live (a rotation or a `vault_ids` change counts from the next
   * request), in `vault_ids` order: the first holding an `mcp_bearer`/`mcp_header` secret for the
   * Connection's URL wins; without one, the Connection's own token. Values stay in this process.
   */
  async function upstreamHeaders(grant: RuntimeGrant, connection: Connection): Promise<Record<string, string>> {
    const session = await deps.sessions.store.get(grant.workspace_id, grant.session_id).catch(() => null);
    const secret = session ? await deps.vaults.resolve(grant.workspace_id, session.vault_ids, ['mcp_bearer', 'mcp_header'], connection.url) : null;
    if (secret) return secret.kind === 'mcp_header' && secret.header_name ? { [secret.header_name]: secret.value } : { Authorization: `Bearer ${secret.value}` };
    const token = connections.upstreamToken(connection);
    return token ? { Authorization: `Bearer ${token}` } : {};
  }

  const fail = (ctx: Koa.Context, r: RuntimeRefusal) => refuseRuntimeRequest(ctx, deps.config.docsUrl, r);

  /** One SDK server per request (both eras): the grant and Connection come in through authInfo. */
  function buildServer(context: RequestContext): Server {
    const { grant, connectionGrant: cg, connection } = context;
    const connectionId = connection.id;
    const up = new Upstream(connection, context.headers, timeoutMs, deps.config.webhooks.egress);
    const server = new Server(SERVER_INFO, { capabilities: { tools: { listChanged: false } } });
    server.onclose = () => void up.close();
    server.setRequestHandler('tools/list', async () => {
      try {
        const tools = await listTools(up, cg, timeoutMs);
        // Every page within the limit of one answer, the whole list may still not be: it is
        // refused as a whole (as an oversized call result is), never served cut.
        const bytes = Buffer.byteLength(JSON.stringify(tools));
        if (bytes > MAX_MESSAGE_BYTES) {
          throw new ProtocolError(ProtocolErrorCode.InternalError, `the upstream's tool list is ${bytes} bytes, over the ${MAX_MESSAGE_BYTES}-byte limit of one answer`);
        }
        return { tools };
      } catch (err) {
        if (err instanceof ProtocolError) throw err;
        throw new ProtocolError(ProtocolErrorCode.InternalError, up.scrub(`the upstream tools/list failed: ${(err as Error).message}`));
      } finally {
        await up.close();
      }
    });
    /**
     * Every tool call the Run makes here is one audit record of the Workspace, as the Run
     * (`connections.runtimeCallTool:<tool>`, target the Connection): succeeded, failed (the
     * arguments refused, an unknown tool, the upstream's failure) or denied (the agent's
     * permission: a deny, an always_ask use not confirmed; an ActionPolicy), with its status and
     * error type.
     */
    const record = (tool: string, outcome: 'succeeded' | 'failed' | 'denied', status: number, detail: string | null) => deps.audit.append(grant.workspace_id, {
      actor: { id: grant.run_id, credential_id: null }, action: `connections.runtimeCallTool:${tool}`, target: connectionId,
      outcome, status, detail, request_id: context.requestId,
    }).catch((err: unknown) => deps.log.error({ err, connection_id: connectionId, tool }, 'audit append failed'));
    /** A call refused before it reached the upstream: recorded, and answered with the refusal's wire body. */
    const refuse = async (tool: string, err: ApiError): Promise<CallToolResult> => {
      calls.inc({ outcome: refusedUnconfirmed(err) ? 'needs_approval' : err.type === 'policy.denied' ? 'denied' : 'rejected' });
      await record(tool, err.status === 401 || err.status === 403 ? 'denied' : 'failed', err.status, err.type);
      return errorResult(err, deps);
    };
    server.setRequestHandler('tools/call', async (request): Promise<CallToolResult> => {
      // Under a binding, the model calls a selected tool by its exposed name; the upstream gets its own.
      const tool = cg.shaping ? upstreamName(cg.shaping, request.params.name) : request.params.name;
      if (tool === null) {
        await up.close();
        await record(request.params.name, 'failed', 404, 'validation.not_found');
        throw new ProtocolError(ProtocolErrorCode.InvalidParams, `unknown tool '${request.params.name}' on connection ${connectionId}`);
      }
      const args = request.params.arguments ?? {};
      // The upstream's catalog, read at most once for this call (the gate's check that a confirmed
      // use's name is this tool's alone, a strict binding's schema).
      let catalog: Promise<Tool[]> | undefined;
      const upstreamCatalog = (): Promise<Tool[]> => (catalog ??= upstreamTools(up, timeoutMs));
      const permission = permissionOf(cg, tool);
      if (permission === 'deny') {
        return refuse(tool, new ApiError('policy.denied', `the agent's policy does not allow tool '${tool}' on connection ${connectionId}`));
      }
      // The Workspace's ActionPolicies, decided here as well as by the runner before it called,
      // then the agent's permission policy (an always_ask tool runs only for a confirmed use): a
      // refused call never reaches the upstream, whoever holds the bearer.
      try {
        await requireRuntimeToolCall(deps, grant, {
          connection_id: connectionId, name: tool, offered_name: request.params.name, input: args, tool_use_id: toolUseIdOf(request.params._meta),
          server: {
            kind: 'connection', url: connection.url, grant: permission,
            // As tools/list offers them: the grant's denied tools left out, the binding's aliases applied.
            tools: async () => (await listTools(up, cg, timeoutMs, await upstreamCatalog())).map((t) => ({
              name: typeof t._meta?.['dev.agentplane/upstream_tool'] === 'string' ? t._meta['dev.agentplane/upstream_tool'] : t.name, offered_name: t.name,
            })),
          },
        }, context.requestId);
      } catch (err) {
        // The gate may have opened the upstream to read its tools.
        await up.close();
        if (!(err instanceof ApiError)) throw err;
        return refuse(tool, err);
      }
      if (cg.shaping?.argument_policy === 'strict') {
        // The upstream's current schema decides; a tool it no longer lists is unknown.
        let listed: Tool | undefined;
        try {
          listed = (await upstreamCatalog()).find((t) => t.name === tool);
        } catch (err) {
          await up.close();
          await record(tool, 'failed', 502, null);
          throw err;
        }
        if (!listed) {
          await up.close();
          await record(tool, 'failed', 404, 'validation.not_found');
          throw new ProtocolError(ProtocolErrorCode.InvalidParams, `unknown tool '${request.params.name}' on connection ${connectionId}`);
        }
        const outside = argumentsOutsideSchema(listed.inputSchema, args);
        if (outside.length > 0) {
          await up.close();
          return refuse(tool, new ApiError('validation.malformed', `arguments.${outside[0] ?? ''}: tool '${request.params.name}' takes no argument named ${outside.map((a) => `'${a}'`).join(', ')} (the deployment's argument policy is strict)`));
        }
      }
      const base = { tool_use_id: newId('toolUse'), run_id: grant.run_id, session_id: grant.session_id, workspace_id: grant.workspace_id, connection_id: connectionId, tool };
      const started = Date.now();
      await observer.toolCall({ ...base, phase: 'started' });
      let result: CallToolResult;
      try {
        const client = await up.get();
        result = await client.callTool({ name: tool, arguments: args }, { timeout: timeoutMs });
        const bytes = Buffer.byteLength(JSON.stringify(result));
        if (bytes > MAX_MESSAGE_BYTES) {
          result = { content: [{ type: 'text', text: `the upstream result is ${bytes} bytes, over the ${MAX_MESSAGE_BYTES}-byte limit` }], isError: true };
        } else {
          result = up.scrubResult(result);
        }
      } catch (err) {
        const message = err instanceof ProtocolError ? err.message : `the upstream call failed: ${(err as Error).message}`;
        result = { content: [{ type: 'text', text: up.scrub(message) }], isError: true };
      } finally {
        await up.close();
      }
      calls.inc({ outcome: result.isError ? 'error' : 'ok' });
      // The upstream's own failure (an error result, or no answer) stands as a bad gateway.
      await record(tool, result.isError ? 'failed' : 'succeeded', result.isError ? 502 : 200, null);
      await observer.toolCall({ ...base, phase: 'finished', is_error: result.isError === true, duration_ms: Date.now() - started });
      return result;
    });
    return server;
  }

  // The SDK announces on the console that JSON responses drop mid-call notifications (this
  // endpoint sends none); it has no option to stay quiet, so its notice goes to the log.
  const handler = sdkConsoleToLog(deps.log, () => createMcpHandler(
    ({ authInfo }) => {
      const context = (authInfo?.extra as { context?: RequestContext } | undefined)?.context;
      if (!context) throw new Error('runtime MCP request without a verified grant');
      return buildServer(context);
    },
    { legacy: 'stateless', responseMode: 'json', maxRequestBodySize: MAX_MESSAGE_BYTES, onerror: (err) => deps.log.debug({ err: err.message }, 'runtime MCP request rejected') },
  ));
  const serve = toNodeHandler(handler, { maxRequestBodySize: MAX_MESSAGE_BYTES, onerror: (err) => deps.log.warn({ err: err.message }, 'runtime MCP adapter error') });

  return async (ctx, next) => {
    const m = RUNTIME_PATH.exec(ctx.path);
    if (!m) return next();
    try {
      await handle(ctx, m);
    } catch (err) {
      if (ctx.headerSent || ctx.respond === false) throw err;
      const inc = reportIncident(deps.log, err, 'unhandled error on the runtime MCP endpoint', requestIdOf(ctx), { path: ctx.path });
      fail(ctx, runtimeRefusals.internal(inc.message));
    }
  };

  async function handle(ctx: Koa.Context, m: RegExpExecArray): Promise<void> {
    if (ctx.method !== 'POST') return runtimeMethodNotAllowed(ctx);
    if (ctx.headers.origin !== undefined) return fail(ctx, runtimeRefusals.origin());
    const token = bearerToken(ctx.headers.authorization);
    const grant: RuntimeGrant | null = token ? await options.verifier.verify(token) : null;
    if (!grant) return fail(ctx, runtimeRefusals.bearer());
    const connectionId = m[1] ?? '';
    /** A refusal before the server is reached: a tool call it refuses is recorded like any other. */
    const refuseCall = async (r: RuntimeRefusal): Promise<void> => {
      const tool = await refusedToolCall(ctx);
      if (tool !== null) {
        await recordRefusedCall(deps, grant, `connections.runtimeCallTool:${tool}`, isId('connection', connectionId) ? connectionId : null, r.error, requestIdOf(ctx));
      }
      fail(ctx, r);
    };
    const cg = isId('connection', connectionId) ? grant.connections[connectionId] : undefined;
    if (!cg) return refuseCall(runtimeRefusals.denied(`run ${grant.run_id} has no connection ${connectionId}`));
    const connection = await deps.docs.get<Connection>(tags.workspace(grant.workspace_id), connectionId);
    if (!connection || connection.workspace_id !== grant.workspace_id || connection.status !== 'active') {
      return refuseCall(runtimeRefusals.notFound(`connection ${connectionId}`));
    }
    const context: RequestContext = { grant, connectionGrant: cg, connection, headers: await upstreamHeaders(grant, connection), requestId: requestIdOf(ctx) };
    const req = ctx.req as typeof ctx.req & { auth?: AuthInfo };
    req.auth = { token: token ?? '', clientId: grant.run_id, scopes: [], expiresAt: Math.floor(Date.parse(grant.expires_at) / 1000), extra: { context } };
    ctx.respond = false;
    await serve(req, ctx.res);
  }
}
