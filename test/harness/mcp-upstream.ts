/**
 * An external MCP server for tests, as a Connection or an agent's `mcp_servers` entry points
 * at: the SDK's own server (v2), stateless (a fresh server per request, JSON responses), serving
 * 2025-era clients (initialize handshake) and 2026-07-28 ones, on loopback at
 * `http://127.0.0.1:<port>/mcp`.
 *
 * It always serves `echo` (`{text}` → `echo: <text>`); `tools` adds argument-less tools that
 * answer a fixed text. With `token`, every request must carry `Authorization: Bearer <token>`
 * (401 otherwise).
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { createMcpHandler, Server as McpServer, type CallToolResult, type Tool } from '@modelcontextprotocol/server';
import { toNodeHandler } from '@modelcontextprotocol/node';

export interface FixedTool {
  name: string;
  description: string;
  /** The text every call answers with. */
  reply: string;
}

export interface McpUpstreamOptions {
  /** Required bearer token; without it, requests are not checked. */
  token?: string;
  /** Tools served after `echo`, in this order. */
  tools?: FixedTool[];
}

export interface McpUpstream {
  /** `http://127.0.0.1:<port>/mcp` */
  url: string;
  /** Every request received (before the token check), with its Authorization header. */
  calls: Array<{ auth: string | undefined }>;
  close(): Promise<void>;
}

function mcpServer(fixed: FixedTool[]): McpServer {
  const tools: Tool[] = [
    { name: 'echo', description: 'Echo text', inputSchema: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] } },
    ...fixed.map((t) => ({ name: t.name, description: t.description, inputSchema: { type: 'object' as const, properties: {} } })),
  ];
  const server = new McpServer({ name: 'upstream', version: '1.0.0' }, { capabilities: { tools: { listChanged: false } } });
  server.setRequestHandler('tools/list', () => ({ tools }));
  server.setRequestHandler('tools/call', (request): CallToolResult => {
    const { name, arguments: args } = request.params;
    if (name === 'echo') {
      const text = args?.text;
      if (typeof text !== 'string') return { content: [{ type: 'text', text: 'echo: `text` must be a string' }], isError: true };
      return { content: [{ type: 'text', text: `echo: ${text}` }] };
    }
    const t = fixed.find((x) => x.name === name);
    if (!t) return { content: [{ type: 'text', text: `unknown tool ${name}` }], isError: true };
    return { content: [{ type: 'text', text: t.reply }] };
  });
  return server;
}

export async function startMcpUpstream(options: McpUpstreamOptions = {}): Promise<McpUpstream> {
  const calls: McpUpstream['calls'] = [];
  // The SDK prints a notice about json response mode on creation; keep test output clean.
  const { warn } = console;
  console.warn = () => undefined;
  let handler: ReturnType<typeof createMcpHandler>;
  try {
    handler = createMcpHandler(() => mcpServer(options.tools ?? []), { legacy: 'stateless', responseMode: 'json' });
  } finally {
    console.warn = warn;
  }
  const serve = toNodeHandler(handler);
  const server: Server = createServer((req, res) => {
    calls.push({ auth: req.headers.authorization });
    if (options.token !== undefined && req.headers.authorization !== `Bearer ${options.token}`) {
      res.writeHead(401).end();
      return;
    }
    void serve(req, res);
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`,
    calls,
    close: () => new Promise<void>((r) => {
      server.closeAllConnections();
      server.close(() => r());
    }),
  };
}
