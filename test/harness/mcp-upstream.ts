/**
 * An external MCP server for tests, as a Connection or an agent's `mcp_servers` entry points
 * at: the SDK's own server, stateless (a fresh server and transport per request, JSON
 * responses), on loopback at `http://127.0.0.1:<port>/mcp`.
 *
 * It always serves `echo` (`{text}` → `echo: <text>`); `tools` adds argument-less tools that
 * answer a fixed text. With `token`, every request must carry `Authorization: Bearer <token>`
 * (401 otherwise).
 */
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { McpServer } from '@modelcontextprotocol/sdk/server/mcp.js';
import { StreamableHTTPServerTransport } from '@modelcontextprotocol/sdk/server/streamableHttp.js';
import { z } from 'zod';

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

export async function startMcpUpstream(options: McpUpstreamOptions = {}): Promise<McpUpstream> {
  const calls: McpUpstream['calls'] = [];
  const server: Server = createServer(async (req, res) => {
    calls.push({ auth: req.headers.authorization });
    if (options.token !== undefined && req.headers.authorization !== `Bearer ${options.token}`) {
      res.writeHead(401).end();
      return;
    }
    const mcp = new McpServer({ name: 'upstream', version: '1.0.0' });
    mcp.registerTool('echo', { description: 'Echo text', inputSchema: { text: z.string() } }, async ({ text }) => ({
      content: [{ type: 'text', text: `echo: ${text}` }],
    }));
    for (const t of options.tools ?? []) {
      mcp.registerTool(t.name, { description: t.description, inputSchema: {} }, async () => ({ content: [{ type: 'text', text: t.reply }] }));
    }
    const transport = new StreamableHTTPServerTransport({ sessionIdGenerator: undefined, enableJsonResponse: true });
    res.on('close', () => {
      void transport.close();
      void mcp.close();
    });
    await mcp.connect(transport);
    await transport.handleRequest(req, res);
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
