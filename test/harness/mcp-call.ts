/** One stateless (2026-07-28) MCP `tools/call` over raw HTTP; returns the tool result. */
export interface McpToolResult {
  isError?: boolean;
  content: { type: string; text: string }[];
}

export async function mcpCall(
  baseUrl: string, token: string, name: string, args: Record<string, unknown> = {}, extraHeaders: Record<string, string> = {},
): Promise<{ status: number; result: McpToolResult | undefined; error: { code: number; message: string } | undefined; headers: Headers }> {
  const version = '2026-07-28';
  const r = await fetch(`${baseUrl}/v1/mcp`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json',
      accept: 'application/json, text/event-stream',
      authorization: `Bearer ${token}`,
      'mcp-protocol-version': version,
      'mcp-method': 'tools/call',
      'mcp-name': name,
      ...extraHeaders,
    },
    body: JSON.stringify({
      jsonrpc: '2.0', id: 1, method: 'tools/call',
      params: {
        name, arguments: args,
        _meta: { 'io.modelcontextprotocol/protocolVersion': version, 'io.modelcontextprotocol/clientCapabilities': {}, 'io.modelcontextprotocol/clientInfo': { name: 'test', version: '1' } },
      },
    }),
  });
  const text = await r.text();
  const body = (text ? JSON.parse(text) : {}) as { result?: McpToolResult; error?: { code: number; message: string } };
  return { status: r.status, result: body.result, error: body.error, headers: r.headers };
}

/** The JSON body a tool result carries. */
export const toolBody = (r: McpToolResult | undefined): Record<string, unknown> => JSON.parse(r?.content[0]?.text ?? 'null') as Record<string, unknown>;

/** One stateless (2026-07-28) MCP `tools/list`; returns the tool names. */
export async function mcpToolNames(baseUrl: string, token: string): Promise<string[]> {
  const version = '2026-07-28';
  const r = await fetch(`${baseUrl}/v1/mcp`, {
    method: 'POST',
    headers: {
      'content-type': 'application/json', accept: 'application/json, text/event-stream', authorization: `Bearer ${token}`,
      'mcp-protocol-version': version, 'mcp-method': 'tools/list',
    },
    body: JSON.stringify({
      jsonrpc: '2.0', id: 1, method: 'tools/list',
      params: { _meta: { 'io.modelcontextprotocol/protocolVersion': version, 'io.modelcontextprotocol/clientCapabilities': {}, 'io.modelcontextprotocol/clientInfo': { name: 'test', version: '1' } } },
    }),
  });
  const body = (await r.json()) as { result?: { tools: { name: string }[] } };
  return (body.result?.tools ?? []).map((t) => t.name);
}
