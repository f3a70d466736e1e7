import type { TSchema } from '@agentplane/core';
import type { Caller } from '../http/caller.js';
import { authorize } from '../http/authenticate.js';
import type { Operation } from '../http/operation.js';

/** The search tool: lets a client find (and then call) operations the compact catalog does not list. */
export const SEARCH_TOOL = 'agentplane_search_operations';

/**
 * Operation groups (the part of the operationId before the dot) that make up the compact
 * catalog besides operations marked `mcp: 'compact'`: the Session journey, agents, runs,
 * ActionApprovals, memory and usage. Groups that do not exist yet simply contribute nothing.
 */
export const COMPACT_GROUPS: ReadonlySet<string> = new Set([
  'sessions', 'threads', 'events', 'agents', 'environments', 'runs', 'approvals', 'memoryStores', 'memory', 'usage',
]);

/**
 * REST-only whatever an operation declares: pairing material (single-use proofs), capability
 * URLs and the runtime channel.
 */
const NEVER_PATH = /(pairing|\/runtime\/|capability-url)/i;
/**
 * REST-only unless the owner marks the operation `mcp: 'compact' | 'full'` explicitly (for
 * example a secret-free credential head): credentials and API keys, uploads (multipart) and
 * archive imports or exports (tar), recognised by their usual paths. Owners of operations
 * that accept or return secrets, multipart or tar mark them `mcp: 'never'` (or
 * `sensitive: true`); this is the safety net for the ones that forget.
 */
const UNLESS_MARKED_PATH = /(credential|api-keys|\/files\b|\/uploads?\b|\/import\b|\/export\b|\.tar\b)/i;

export interface McpTool {
  name: string;
  title: string;
  description: string;
  inputSchema: Record<string, unknown>;
  annotations: { readOnlyHint: boolean; destructiveHint: boolean; idempotentHint: boolean; openWorldHint: boolean };
}

/** One REST operation as an MCP tool. */
export interface ProjectedTool {
  op: Operation;
  tool: McpTool;
  group: string;
  compact: boolean;
  /** The tool requires `idempotency_key` (its REST operation takes an Idempotency-Key header). */
  requiresKey: boolean;
  /** Lower-cased text the search tool matches against. */
  haystack: string;
}

export const toolName = (operationId: string): string => operationId.replace(/\./g, '_');

/** Plain JSON Schema (TypeBox's symbol keys dropped). */
const plain = (s: TSchema): Record<string, unknown> => JSON.parse(JSON.stringify(s)) as Record<string, unknown>;

const hasProperties = (s: TSchema | undefined): boolean =>
  !!s && Object.keys((s as { properties?: Record<string, unknown> }).properties ?? {}).length > 0;
const hasRequired = (s: TSchema | undefined): boolean => ((s as { required?: unknown[] } | undefined)?.required ?? []).length > 0;

/** Is this operation ever exposed over MCP? */
export function isProjectable(op: Operation): boolean {
  if (op.mcp === 'never' || op.sensitive) return false;
  if (op.auth.kind !== 'bearer') return false;
  if (op.operationId.endsWith('Stream') || /\/stream$/.test(op.path)) return false;
  if (NEVER_PATH.test(op.path)) return false;
  return op.mcp !== undefined || !UNLESS_MARKED_PATH.test(op.path);
}

function project(op: Operation): ProjectedTool {
  const group = op.operationId.split('.')[0] ?? '';
  const mode = op.idempotency ?? 'none';
  // The contract: "Mutation tools whose REST operation takes an idempotency header require
  // idempotency_key". An optional REST header still counts as taking one: over MCP the key is
  // always required, so an agent retrying a tool call can never create twice.
  const requiresKey = op.method !== 'GET' && mode !== 'none';
  const properties: Record<string, unknown> = {};
  const required: string[] = [];
  if (op.params) {
    properties.path = plain(op.params);
    if (hasProperties(op.params)) required.push('path');
  }
  if (op.query) properties.query = plain(op.query);
  if (op.body) {
    properties.body = plain(op.body);
    if (hasRequired(op.body)) required.push('body');
  }
  if (requiresKey) {
    properties.idempotency_key = {
      type: 'string', minLength: 1, maxLength: 255, pattern: '^[\\x21-\\x7e]+$',
      description: 'Sent as the Idempotency-Key of the REST call: a retry with the same key and arguments replays the first result.',
    };
    required.push('idempotency_key');
  }
  const readOnly = op.method === 'GET';
  const tool: McpTool = {
    name: toolName(op.operationId),
    title: op.summary,
    description: `${op.summary}. REST: ${op.method} ${op.path}.${requiresKey ? ' Requires idempotency_key.' : ''}`,
    inputSchema: { type: 'object', properties, ...(required.length > 0 ? { required } : {}), additionalProperties: false },
    annotations: {
      readOnlyHint: readOnly,
      destructiveHint: op.method === 'DELETE',
      idempotentHint: readOnly || op.method === 'PUT' || op.method === 'DELETE' || requiresKey,
      openWorldHint: false,
    },
  };
  const compact = op.mcp === 'compact' || (op.mcp === undefined && COMPACT_GROUPS.has(group));
  const haystack = `${op.operationId} ${tool.name} ${op.method} ${op.path} ${op.summary} ${group}`.toLowerCase();
  return { op, tool, group, compact, requiresKey, haystack };
}

export const SEARCH_TOOL_DEF: McpTool = {
  name: SEARCH_TOOL,
  title: 'Search the operations of this API',
  description:
    'Search every operation of the agentplane REST API that is callable over MCP (by words in its name, path or summary). ' +
    'Each hit names a tool that can be called with tools/call even when tools/list does not list it.',
  inputSchema: {
    type: 'object',
    properties: {
      query: { type: 'string', minLength: 1, maxLength: 200, description: 'Words to look for, e.g. "create principal" or "sessions events".' },
      limit: { type: 'integer', minimum: 1, maximum: 50, description: 'At most this many hits (default 10).' },
    },
    required: ['query'],
    additionalProperties: false,
  },
  annotations: { readOnlyHint: true, destructiveHint: false, idempotentHint: true, openWorldHint: false },
};

/**
 * The projection of the operation table, computed once at start-up: every MCP-exposable
 * operation as a tool, indexed by tool name.
 */
/**
 * Target types whose assignments can satisfy an operation's permission (an Agent's covers its
 * Sessions; an ActionApproval is governed as its Session).
 */
const COVERING: Record<string, readonly string[]> = {
  agent_id: ['agent'], session_id: ['session', 'agent'], approval_id: ['session', 'agent'], memory_store_id: ['memory_store'], surface_scope_id: ['surface_scope'],
};

function holdsFor(held: ReadonlySet<string> | undefined, decl: { action: string; target: string }): boolean {
  if (!held) return false;
  if (held.has(decl.action)) return true;
  return (COVERING[decl.target] ?? []).some((type) => held.has(`${decl.action}@${type}`));
}

export class ToolCatalog {
  readonly tools: ReadonlyMap<string, ProjectedTool>;

  constructor(operations: readonly Operation[]) {
    const tools = new Map<string, ProjectedTool>();
    for (const op of operations) {
      if (op.mcpPrincipal && (op.method !== 'GET' || op.auth.kind !== 'bearer' || op.auth.principal !== true)) {
        throw new Error(`${op.operationId}: mcpPrincipal needs a GET operation whose auth admits Principal credentials`);
      }
      if (!isProjectable(op)) continue;
      const p = project(op);
      if (tools.has(p.tool.name) || p.tool.name === SEARCH_TOOL) throw new Error(`MCP tool name collision: ${p.tool.name}`);
      tools.set(p.tool.name, p);
    }
    this.tools = tools;
  }

  /** Principal credentials: the closed, read-only catalog (GET operations marked `mcpPrincipal`). */
  static principalAdmits(p: ProjectedTool): boolean {
    return p.op.mcpPrincipal === true && p.op.method === 'GET' && p.op.auth.kind === 'bearer' && p.op.auth.principal === true;
  }

  /** May this caller call the tool at all (kind, role and audience; the REST pipeline re-checks)? */
  admits(caller: Caller, p: ProjectedTool): boolean {
    if (caller.kind === 'principal_credential') return ToolCatalog.principalAdmits(p);
    if (p.op.auth.kind !== 'bearer') return false;
    try {
      authorize(caller, p.op.auth);
      return true;
    } catch {
      return false;
    }
  }

  /**
   * What `tools/list` answers for this caller and catalog choice. For a Principal credential,
   * `held` is what its live PermissionAssignments grant: `<action>` when held on the Workspace,
   * `<action>@<target type>` when held on some Agent, Session or MemoryStore. A tool whose
   * operation needs an action the Principal holds on no target of its kind is not listed.
   */
  list(caller: Caller, catalog: 'compact' | 'full', held?: ReadonlySet<string>): McpTool[] {
    const out: McpTool[] = [];
    const principal = caller.kind === 'principal_credential';
    for (const p of this.tools.values()) {
      if (!this.admits(caller, p)) continue;
      if (!principal && catalog === 'compact' && !p.compact) continue;
      if (principal && p.op.permission && !holdsFor(held, p.op.permission)) continue;
      out.push(p.tool);
    }
    if (!principal) out.push(SEARCH_TOOL_DEF);
    return out;
  }

  /** Ranked search over what the caller may call; every word must match somewhere. */
  search(caller: Caller, query: string, limit: number): ProjectedTool[] {
    const words = query.toLowerCase().split(/[^a-z0-9{}_/.-]+/).filter((w) => w.length > 0);
    if (words.length === 0) return [];
    const hits: { p: ProjectedTool; score: number }[] = [];
    for (const p of this.tools.values()) {
      if (!this.admits(caller, p)) continue;
      let score = 0;
      for (const w of words) {
        const stem = w.length > 3 && w.endsWith('s') ? w.slice(0, -1) : w;
        if (!p.haystack.includes(stem)) {
          score = -1;
          break;
        }
        score += p.op.operationId.toLowerCase().includes(stem) ? 2 : 1;
      }
      if (score > 0) hits.push({ p, score });
    }
    hits.sort((a, b) => b.score - a.score || a.p.tool.name.localeCompare(b.p.tool.name));
    return hits.slice(0, limit).map((h) => h.p);
  }
}
