import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { apiUrl, type Logger } from '@agentplane/core';
import type { AgentTool } from './events.js';

export interface RuntimeMcp {
  bearer: string;
  /** `path`: the runtime endpoint serving the server (default `/v1/runtime/mcp/{connection_id}`; memory stores: `/v1/runtime/memory/{id}`). */
  servers: { name: string; connection_id: string; permission: 'always_allow' | 'always_ask'; path?: string }[];
}

export interface McpTools {
  tools: AgentTool[];
  close(): Promise<void>;
}

const TOOL_NAME = /[^a-zA-Z0-9_-]/g;

/**
 * The name a runtime tool is offered to the model under: `<server>__<tool>`, characters outside
 * `[A-Za-z0-9_-]` as `_`, at most 64 characters. Distinct tools may share it (`deploy.prod` and
 * `deploy_prod` of one server, server `ops` with tool `x__y` and server `ops__x` with tool `y`,
 * two long names alike in their first 64 characters); `withoutCollisions` leaves those out.
 */
export function offeredToolName(server: string, tool: string): string {
  return `${server}__${tool}`.replace(TOOL_NAME, '_').slice(0, 64);
}

/** One MCP tool as listed, before it is offered: its server and its name at the runtime endpoint. */
export interface ListedTool {
  server: string;
  connection_id: string;
  /** The tool's name at the endpoint (a deployment alias when it has one). */
  name: string;
  tool: AgentTool & { type: 'external' };
}

/**
 * The listed tools whose offered name no other listed tool shares, in order. Tools that share
 * one are all left out (the harness could not tell which one the model meant, and a confirmation
 * of a use under that name would name neither), each name with a warning naming its tools; the
 * turn runs with the others.
 */
export function withoutCollisions(listed: ListedTool[], log: Pick<Logger, 'warn'>): AgentTool[] {
  const byName = new Map<string, ListedTool[]>();
  for (const t of listed) {
    const same = byName.get(t.tool.spec.name);
    if (same) same.push(t);
    else byName.set(t.tool.spec.name, [t]);
  }
  for (const [name, same] of byName) {
    if (same.length < 2) continue;
    log.warn(
      { offered_name: name, tools: same.map((t) => ({ server: t.server, connection_id: t.connection_id, tool: t.name })) },
      'MCP tools offered under the same name; all of them are left out of this turn',
    );
  }
  return listed.flatMap((t) => ((byName.get(t.tool.spec.name)?.length ?? 0) > 1 ? [] : [t.tool]));
}

/**
 * The agent's MCP tools for one Run, through the control plane's runtime endpoint
 * (`/v1/runtime/mcp/{connection_id}`) with the lease's runtime bearer. Each tool is offered
 * to the model as `<server>__<tool>` (`offeredToolName`). The bearer is accepted only once the
 * lease fence is claimed, so connecting is retried briefly right after the lease is accepted. A
 * server that cannot be reached (or whose tools cannot be listed) is left out, with a log line
 * naming its Connection; the turn runs with the other servers' tools. Tools offered under the
 * same name are left out too (`withoutCollisions`).
 */
export async function connectMcpTools(baseUrl: string, runtime: RuntimeMcp, log: Logger, signal: AbortSignal): Promise<McpTools> {
  const clients: Client[] = [];
  const listedTools: ListedTool[] = [];
  for (const server of runtime.servers) {
    const path = server.path !== undefined && /^\/v1\/runtime\/[a-z]+\/[A-Za-z0-9_]+$/.test(server.path) ? server.path : `/v1/runtime/mcp/${encodeURIComponent(server.connection_id)}`;
    const url = apiUrl(baseUrl, path);
    let client: Client | undefined;
    for (let attempt = 0; attempt < 20 && !signal.aborted; attempt++) {
      const c = new Client({ name: 'agentplane-runner', version: '0.1.0' });
      try {
        await c.connect(new StreamableHTTPClientTransport(url, { requestInit: { headers: { authorization: `Bearer ${runtime.bearer}` } } }));
        client = c;
        break;
      } catch {
        await c.close().catch(() => undefined);
        await new Promise((r) => setTimeout(r, 250));
      }
    }
    if (!client) {
      log.warn({ server: server.name, connection_id: server.connection_id }, 'MCP server unreachable through the runtime endpoint; its tools are left out');
      continue;
    }
    // The endpoint answers for the Connection's own server: one that is down (or fails its
    // tools/list) costs the turn that server's tools, never the turn.
    let listed: Awaited<ReturnType<Client['listTools']>>;
    try {
      listed = await client.listTools();
    } catch (err) {
      await client.close().catch(() => undefined);
      log.warn({ server: server.name, connection_id: server.connection_id, err: (err as Error).message }, 'MCP server unreachable (its tools/list failed); its tools are left out of this turn');
      continue;
    }
    clients.push(client);
    const c = client;
    for (const t of listed.tools) {
      const name = offeredToolName(server.name, t.name);
      listedTools.push({ server: server.name, connection_id: server.connection_id, name: t.name, tool: {
        type: 'external',
        permission: server.permission,
        // Governance names the upstream tool, also when a deployment's binding offers it under an alias.
        mcp: { connection_id: server.connection_id, tool: typeof t._meta?.['dev.agentplane/upstream_tool'] === 'string' ? t._meta['dev.agentplane/upstream_tool'] : t.name },
        spec: { name, description: t.description ?? t.name, input_schema: t.inputSchema as Record<string, unknown> },
        async call(input, callSignal, toolUseId) {
          // The tool use id names the call to the control plane (an A2A tool call is exactly-once under it).
          const meta = toolUseId ? { _meta: { 'dev.agentplane/tool_use_id': toolUseId } } : {};
          const r = await c.callTool({ name: t.name, arguments: (input ?? {}) as Record<string, unknown>, ...meta }, { signal: callSignal });
          const content = r.content.map((b) => (b.type === 'text' ? b.text : `[${b.type}]`)).join('\n');
          return { content, is_error: r.isError === true };
        },
      } });
    }
  }
  return {
    tools: withoutCollisions(listedTools, log),
    async close() {
      await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
    },
  };
}
