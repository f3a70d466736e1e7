import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { mcpProxy, type McpCallCheck, type RuntimeMcpGrant } from './mcp-proxy.js';

/** The runtime endpoint as the proxy reaches it: it records what arrived and answers every call. */
let upstream: Server;
const arrived: string[] = [];
let baseUrl = '';

beforeAll(async () => {
  upstream = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      arrived.push(Buffer.concat(chunks).toString('utf8'));
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ jsonrpc: '2.0', id: 1, result: { content: [{ type: 'text', text: 'ran' }] } }));
    });
  });
  await new Promise<void>((resolve) => upstream.listen(0, '127.0.0.1', resolve));
  baseUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
});
afterAll(() => upstream.close());

/** One request through the proxy, served by a throwaway server of its own. */
async function through(grant: RuntimeMcpGrant, check: McpCallCheck, server: string, body: unknown): Promise<{ status: number; body: { result?: { isError?: boolean; content?: { text: string }[] }; error?: unknown } }> {
  const handle = mcpProxy(grant, new AbortController().signal, check);
  const front = createServer((req: IncomingMessage, res: ServerResponse) => void handle(req, res));
  await new Promise<void>((resolve) => front.listen(0, '127.0.0.1', resolve));
  try {
    return await new Promise((resolve, reject) => {
      const req = request({ host: '127.0.0.1', port: (front.address() as AddressInfo).port, path: `/mcp/${server}`, method: 'POST', headers: { 'content-type': 'application/json' } }, (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body: JSON.parse(Buffer.concat(chunks).toString('utf8')) as never }));
      });
      req.on('error', reject);
      req.end(JSON.stringify(body));
    });
  } finally {
    front.close();
  }
}

describe('the ACP agent\'s MCP proxy', () => {
  const grant = (): RuntimeMcpGrant => ({
    baseUrl, bearer: 'b',
    servers: [{ name: 'asks', connection_id: 'conn_a', permission: 'always_ask' }, { name: 'free', connection_id: 'conn_f', permission: 'always_allow' }],
  });
  const call = (name: string) => ({ jsonrpc: '2.0', id: 7, method: 'tools/call', params: { name, arguments: { x: 1 } } });

  it('decides each tools/call before it leaves: a refusal is the tool\'s result and nothing is sent', async () => {
    const seen: string[] = [];
    const check: McpCallCheck = async (server, c) => {
      seen.push(`${server.name}:${c.name}`);
      return server.permission === 'always_allow' && c.name !== 'danger' ? null : `Not run: ${c.name}`;
    };
    arrived.length = 0;
    const refused = await through(grant(), check, 'asks', call('anything'));
    expect(refused).toMatchObject({ status: 200, body: { result: { isError: true, content: [{ text: 'Not run: anything' }] } } });
    const denied = await through(grant(), check, 'free', call('danger'));
    expect(denied.body.result?.isError).toBe(true);
    expect(arrived).toEqual([]);
    const allowed = await through(grant(), check, 'free', call('fine'));
    expect(allowed.body.result?.content?.[0]?.text).toBe('ran');
    expect(arrived).toHaveLength(1);
    // Other methods are not tool calls: they go through undecided.
    await through(grant(), check, 'asks', { jsonrpc: '2.0', id: 1, method: 'tools/list' });
    expect(arrived).toHaveLength(2);
    expect(seen).toEqual(['asks:anything', 'free:danger', 'free:fine']);
  });

  it('refuses a batch holding a tool call instead of sending it undecided', async () => {
    arrived.length = 0;
    const batch = await through(grant(), async () => null, 'free', [call('fine')]);
    expect(batch.status).toBe(400);
    expect(arrived).toEqual([]);
  });
});
