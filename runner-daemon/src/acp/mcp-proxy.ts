/**
 * The Session's MCP servers as an ACP agent inside the sandbox reaches them (docs/ACP.md):
 * `http://127.0.0.1:<port>/mcp/<server name>` on the sandbox's loopback, carried by the forwarder
 * to the runner, which forwards the request to the control plane's runtime MCP endpoint with the
 * lease's runtime bearer (which the agent never sees; it holds only the placeholder key). The
 * endpoint accepts the bearer only while the lease holds the Session's fence. Each `tools/call`
 * is decided here first (`McpCallCheck`): the Connection's `always_ask` and the Workspace's
 * ActionPolicies, which the built-in loop applies before its own calls.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Readable } from 'node:stream';

export interface RuntimeMcpGrant {
  baseUrl: string;
  bearer: string;
  servers: { name: string; connection_id: string; permission?: 'always_allow' | 'always_ask'; path?: string }[];
}

/**
 * Decides one `tools/call` before it leaves the runner: null to send it, else the refusal the
 * agent gets as the tool's result. The runtime bearer allows every call of a granted
 * Connection (the built-in loop asks before calling), so an ACP agent's calls are decided here.
 */
export type McpCallCheck = (server: RuntimeMcpGrant['servers'][number], call: { name: string; arguments: unknown }) => Promise<string | null>;

/** A JSON-RPC message that calls a tool. */
interface ToolsCall {
  jsonrpc: '2.0';
  id: string | number | null;
  method: 'tools/call';
  params: { name: string; arguments?: unknown };
}

function toolsCallIn(body: Buffer): ToolsCall | 'batch' | null {
  let msg: unknown;
  try {
    msg = JSON.parse(body.toString('utf8'));
  } catch {
    return null; // the endpoint answers what it cannot parse
  }
  if (Array.isArray(msg)) return msg.some((m) => (m as { method?: unknown } | null)?.method === 'tools/call') ? 'batch' : null;
  const m = msg as Partial<ToolsCall> | null;
  if (m?.method !== 'tools/call') return null;
  return { jsonrpc: '2.0', id: m.id ?? null, method: 'tools/call', params: { name: String(m.params?.name ?? ''), arguments: m.params?.arguments } };
}

function answer(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify(body));
}

const HOP = new Set(['host', 'authorization', 'x-api-key', 'connection', 'content-length', 'transfer-encoding', 'keep-alive']);

export function mcpProxy(grant: RuntimeMcpGrant, signal: AbortSignal, check?: McpCallCheck): (req: IncomingMessage, res: ServerResponse) => Promise<boolean> {
  return async (req, res) => {
    const m = /^\/mcp\/([^/?]+)/.exec(req.url ?? '');
    if (!m?.[1]) return false;
    const server = grant.servers.find((s) => s.name === decodeURIComponent(m[1] as string));
    if (!server) {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ error: 'no such MCP server on this Run' }));
      return true;
    }
    const path = server.path !== undefined && /^\/v1\/runtime\/[a-z]+\/[A-Za-z0-9_]+$/.test(server.path) ? server.path : `/v1/runtime/mcp/${encodeURIComponent(server.connection_id)}`;
    const headers: Record<string, string> = { authorization: `Bearer ${grant.bearer}` };
    for (const [k, v] of Object.entries(req.headers)) if (!HOP.has(k) && typeof v === 'string') headers[k] = v;
    const chunks: Buffer[] = [];
    for await (const c of req as AsyncIterable<Buffer>) chunks.push(c);
    const call = check && req.method === 'POST' ? toolsCallIn(Buffer.concat(chunks)) : null;
    if (call === 'batch') {
      answer(res, 400, { jsonrpc: '2.0', id: null, error: { code: -32600, message: 'tool calls are sent one per request' } });
      return true;
    }
    if (call && check) {
      const refusal = await check(server, { name: call.params.name, arguments: call.params.arguments ?? {} });
      if (refusal !== null) {
        answer(res, 200, { jsonrpc: '2.0', id: call.id, result: { content: [{ type: 'text', text: refusal }], isError: true } });
        return true;
      }
    }
    const ac = new AbortController();
    res.on('close', () => ac.abort());
    const upstream = await fetch(new URL(path, grant.baseUrl), {
      method: req.method ?? 'POST', headers, signal: AbortSignal.any([ac.signal, signal]),
      ...(chunks.length > 0 && req.method !== 'GET' ? { body: Buffer.concat(chunks) } : {}),
    });
    const out: Record<string, string> = {};
    upstream.headers.forEach((v, k) => {
      if (!HOP.has(k) && k !== 'content-encoding') out[k] = v;
    });
    res.writeHead(upstream.status, out);
    if (upstream.body) Readable.fromWeb(upstream.body as import('node:stream/web').ReadableStream).pipe(res);
    else res.end();
    return true;
  };
}
