import type Koa from 'koa';
import { Server, type CallToolResult, type Tool } from '@modelcontextprotocol/server';
import { ApiError, closedLabel, Counter, isId } from '@agentplane/core';
import type { ApiDeps } from '../deps.js';
import { recordRefusedCall, runtimeMcpEdge, runtimeRefusals } from '../mcp/runtime-edge.js';
import type { RuntimeBearerVerifier, RuntimeGrant } from '@agentplane/domain';
import { requireRuntimeToolCall, toolUseIdOf } from '../governance/run-tool-gate.js';
import { checkPath, MEMORY_LIMITS, type MemoryAuthor } from './model.js';

export const RUNTIME_MEMORY_PATH = /^\/v1\/runtime\/memory\/([^/]+)$/;

interface Context {
  grant: RuntimeGrant;
  storeId: string;
  access: 'read_only' | 'read_write';
  /** The request's id: its audit records carry it. */
  requestId: string;
}

const str = { type: 'string' } as const;
const TOOLS: (Tool & { write: boolean })[] = [
  {
    name: 'view', write: false,
    description: 'Read a memory document by path (its content and version), or list the documents under a directory path ending in "/" (or all, with no path).',
    inputSchema: { type: 'object', properties: { path: { ...str, description: 'document path, or a directory ending in "/"' } } },
  },
  {
    name: 'search', write: false,
    description: 'Full-text search over the memory documents. Returns ranked paths with snippets and a next_cursor for more.',
    inputSchema: { type: 'object', properties: { query: str, limit: { type: 'integer', minimum: 1, maximum: 50 }, cursor: str }, required: ['query'] },
  },
  {
    name: 'create', write: true,
    description: `Create a memory document at a new path (fails if one exists). Text up to ${MEMORY_LIMITS.maxContentBytes} bytes.`,
    inputSchema: { type: 'object', properties: { path: str, content: str }, required: ['path', 'content'] },
  },
  {
    name: 'edit', write: true,
    description: 'Change a memory document: replace old_text (which must occur exactly once) with new_text, or replace the whole content. Give expected_version to refuse the change if someone else wrote it since you read it.',
    inputSchema: { type: 'object', properties: { path: str, old_text: str, new_text: str, content: str, expected_version: { type: 'integer', minimum: 1 } }, required: ['path'] },
  },
  {
    name: 'delete', write: true,
    description: 'Delete a memory document (its history is kept).',
    inputSchema: { type: 'object', properties: { path: str, expected_version: { type: 'integer', minimum: 1 } }, required: ['path'] },
  },
];

const text = (value: unknown, isError = false): CallToolResult => ({ content: [{ type: 'text', text: typeof value === 'string' ? value : JSON.stringify(value) }], ...(isError ? { isError: true } : {}) });

function arg(input: Record<string, unknown>, name: string, required: true): string;
function arg(input: Record<string, unknown>, name: string, required?: false): string | undefined;
function arg(input: Record<string, unknown>, name: string, required = false): string | undefined {
  const v = input[name];
  if (v === undefined && !required) return undefined;
  if (typeof v !== 'string') throw new ApiError('validation.malformed', `${name}: a string is required`);
  return v;
}

function intArg(input: Record<string, unknown>, name: string): number | undefined {
  const v = input[name];
  if (v === undefined) return undefined;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < 0) throw new ApiError('validation.malformed', `${name}: a non-negative integer is required`);
  return v;
}

function pathArg(input: Record<string, unknown>): string {
  const p = arg(input, 'path', true);
  if (p.length === 0 || p.length > MEMORY_LIMITS.maxPathChars || p.startsWith('/') || p.endsWith('/') || /[\0-\x1f\x7f]/.test(p)) {
    throw new ApiError('validation.malformed', `path: 1 to ${MEMORY_LIMITS.maxPathChars} characters, no leading or trailing "/", no control characters`);
  }
  checkPath(p);
  return p;
}

/**
 * `POST /v1/runtime/memory/{memory_store_id}`: the harness's memory tools for one Run, as an MCP
 * server (tools `view`, `search`, `create`, `edit`, `delete`; a read-only attachment lists only
 * the first two). Authenticated by the lease's runtime bearer only, valid while the lease holds
 * the Session fence and only for the MemoryStores the Session's `memory` resources named when the
 * lease was granted. Every call passes the Workspace's ActionPolicies here, whatever the runner
 * decided before it called. Writes are attributed to the Run. The sandbox never talks to Redis: the
 * runner calls this endpoint on the harness's behalf.
 */
export function runtimeMemory(deps: ApiDeps, verifier: RuntimeBearerVerifier): Koa.Middleware {
  const calls = new Counter({ name: 'agentplane_runtime_memory_tool_calls_total', help: 'Memory tool calls by tool and outcome', labelNames: ['tool', 'outcome'], registers: [deps.metrics] });
  const toolNames = TOOLS.map((t) => t.name);

  async function call(ctx: Context, tool: string, input: Record<string, unknown>, toolUseId: string | undefined): Promise<CallToolResult> {
    const spec = TOOLS.find((t) => t.name === tool);
    if (!spec) return text(`unknown tool '${tool}'`, true);
    if (spec.write && ctx.access !== 'read_write') {
      throw new ApiError('policy.denied', `memory store ${ctx.storeId} is attached read-only to this Session`);
    }
    // The Workspace's ActionPolicies, decided here too (not only by the runner's check): a tool of
    // kind `mcp` whose connection_id is the store. The memory tools are the platform's own,
    // offered always_allow: no confirmation is asked for.
    await requireRuntimeToolCall(deps, ctx.grant, { connection_id: ctx.storeId, name: tool, input, tool_use_id: toolUseId, server: { kind: 'memory' } }, ctx.requestId);
    const mem = deps.memory;
    // The store may have been deleted since the lease was granted.
    await mem.getStore(ctx.grant.workspace_id, ctx.storeId);
    const author: MemoryAuthor = { kind: 'run', id: ctx.grant.run_id, session_id: ctx.grant.session_id };
    switch (tool) {
      case 'view': {
        const path = arg(input, 'path');
        if (path === undefined || path === '' || path.endsWith('/')) {
          const r = await mem.stores.list(ctx.storeId, { prefix: path || undefined, limit: 200 });
          return text({ documents: r.data.map((d) => ({ path: d.path, version: d.version, size_bytes: d.size_bytes })), truncated: r.next !== null });
        }
        const doc = await mem.stores.read(ctx.storeId, pathArg(input));
        if (!doc) return text(`no document at ${path}`, true);
        return text({ path: doc.path, version: doc.version, content: doc.content, metadata: doc.metadata, updated_at: doc.updated_at });
      }
      case 'search': {
        const limit = intArg(input, 'limit') ?? 10;
        return text(await mem.search(ctx.storeId, { query: arg(input, 'query', true), limit: Math.min(Math.max(limit, 1), 50), cursor: arg(input, 'cursor') }, 'input'));
      }
      case 'create': {
        const r = await mem.stores.write(ctx.storeId, { path: pathArg(input), content: arg(input, 'content', true), expectedVersion: 0 }, author, ctx.grant.workspace_id);
        return text({ path: r.document.path, version: r.document.version, created: true });
      }
      case 'edit': {
        const path = pathArg(input);
        const expected = intArg(input, 'expected_version');
        const current = await mem.stores.read(ctx.storeId, path);
        if (!current) return text(`no document at ${path}; use create`, true);
        let content = arg(input, 'content');
        const oldText = arg(input, 'old_text');
        if (content === undefined) {
          if (oldText === undefined || oldText === '') return text('give either content, or old_text and new_text', true);
          const at = current.content.indexOf(oldText);
          if (at < 0) return text(`old_text does not occur in ${path}`, true);
          if (current.content.indexOf(oldText, at + 1) >= 0) return text(`old_text occurs more than once in ${path}; give more context`, true);
          content = current.content.slice(0, at) + (arg(input, 'new_text') ?? '') + current.content.slice(at + oldText.length);
        }
        const r = await mem.stores.write(ctx.storeId, { path, content, expectedVersion: expected ?? current.version }, author, ctx.grant.workspace_id);
        return text({ path, version: r.document.version });
      }
      default: {
        const marker = await mem.stores.remove(ctx.storeId, pathArg(input), intArg(input, 'expected_version'), author, ctx.grant.workspace_id);
        return text({ path: marker.path, deleted: true, version: marker.version });
      }
    }
  }

  function buildServer(ctx: Context): Server {
    const server = new Server({ name: 'agentplane-memory', version: '0.1.0' }, { capabilities: { tools: { listChanged: false } } });
    server.setRequestHandler('tools/list', () => ({
      tools: TOOLS.filter((t) => !t.write || ctx.access === 'read_write').map(({ write: _w, ...t }) => t),
    }));
    /**
     * Every write a Run attempts through a memory tool is recorded in the Workspace's audit log,
     * as the Run (`memoryStores.runtimeCreate`, `…Edit`, `…Delete`; target the MemoryStore), as
     * the other runtime endpoints' writes are.
     */
    const record = (tool: string, outcome: 'succeeded' | 'failed' | 'denied', status: number, detail: string | null) => deps.audit.append(ctx.grant.workspace_id, {
      actor: { id: ctx.grant.run_id, credential_id: null }, action: `memoryStores.runtime${tool.charAt(0).toUpperCase()}${tool.slice(1)}`, target: ctx.storeId,
      outcome, status, detail, request_id: ctx.requestId,
    }).catch((err: unknown) => deps.log.error({ err, memory_store_id: ctx.storeId, tool }, 'audit append failed'));
    server.setRequestHandler('tools/call', async (request): Promise<CallToolResult> => {
      const tool = request.params.name;
      const writes = TOOLS.find((t) => t.name === tool)?.write === true;
      try {
        const r = await call(ctx, tool, (request.params.arguments ?? {}) as Record<string, unknown>, toolUseIdOf(request.params._meta));
        calls.inc({ tool: closedLabel(tool, toolNames), outcome: r.isError ? 'error' : 'ok' });
        if (writes) await record(tool, r.isError ? 'failed' : 'succeeded', r.isError ? 400 : 200, null);
        return r;
      } catch (err) {
        if (!(err instanceof ApiError)) throw err;
        calls.inc({ tool: closedLabel(tool, toolNames), outcome: 'error' });
        if (writes) await record(tool, err.status === 401 || err.status === 403 ? 'denied' : 'failed', err.status, err.type);
        return text(err.toWire(deps.config.docsUrl), true);
      }
    });
    return server;
  }

  return runtimeMcpEdge<Context>(deps, verifier, {
    path: RUNTIME_MEMORY_PATH,
    name: 'runtime memory',
    async authorize(grant, storeId, requestId) {
      const access = isId('memoryStore', storeId) ? grant.memory?.[storeId] : undefined;
      if (!access) return runtimeRefusals.denied(`run ${grant.run_id} has no memory store ${storeId}`);
      return { grant, storeId, access, requestId };
    },
    buildServer,
    // A write to a store the Run's grant does not hold is recorded as any refused write is.
    recordRefused: async (grant, id, tool, refusal, requestId) => {
      if (!TOOLS.some((t) => t.write && t.name === tool)) return;
      await recordRefusedCall(deps, grant, `memoryStores.runtime${tool.charAt(0).toUpperCase()}${tool.slice(1)}`, isId('memoryStore', id) ? id : null, refusal, requestId);
    },
  });
}
