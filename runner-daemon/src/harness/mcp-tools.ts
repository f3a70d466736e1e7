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
 * The agent's MCP tools for one Run, through the control plane's runtime endpoint
 * (`/v1/runtime/mcp/{connection_id}`) with the lease's runtime bearer. Each tool is offered
 * to the model as `<server>__<tool>`. The bearer is accepted only once the lease fence is
 * claimed, so connecting is retried briefly right after the lease is accepted. A server that
 * cannot be reached (or whose tools cannot be listed) is left out, with a log line naming its
 * Connection; the turn runs with the other servers' tools.
 */
export async function connectMcpTools(baseUrl: string, runtime: RuntimeMcp, log: Logger, signal: AbortSignal): Promise<McpTools> {
  const clients: Client[] = [];
  const tools: AgentTool[] = [];
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
      const name = `${server.name}__${t.name}`.replace(TOOL_NAME, '_').slice(0, 64);
      tools.push({
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
      });
    }
  }
  return {
    tools,
    async close() {
      await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
    },
  };
}
