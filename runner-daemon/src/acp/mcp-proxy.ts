/**
 * The Session's MCP servers as an ACP agent inside the sandbox reaches them (docs/ACP.md):
 * `http://127.0.0.1:<port>/mcp/<server name>` on the sandbox's loopback, carried by the forwarder
 * to the runner, which forwards the request to the control plane's runtime MCP endpoint with the
 * lease's runtime bearer (which the agent never sees; it holds only the placeholder key). The
 * endpoint accepts the bearer only while the lease holds the Session's fence, and applies the
 * Connections' permission policies as for the built-in loop.
 */
import type { IncomingMessage, ServerResponse } from 'node:http';
import { Readable } from 'node:stream';

export interface RuntimeMcpGrant {
  baseUrl: string;
  bearer: string;
  servers: { name: string; connection_id: string; path?: string }[];
}

const HOP = new Set(['host', 'authorization', 'x-api-key', 'connection', 'content-length', 'transfer-encoding', 'keep-alive']);

export function mcpProxy(grant: RuntimeMcpGrant, signal: AbortSignal): (req: IncomingMessage, res: ServerResponse) => Promise<boolean> {
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
