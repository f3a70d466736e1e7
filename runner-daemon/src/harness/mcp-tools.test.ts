import { createServer, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import { connectMcpTools, offeredToolName, withoutCollisions, type ListedTool } from './mcp-tools.js';

/**
 * A stand-in for the control plane's runtime endpoints: a JSON-RPC MCP server per path
 * (`/v1/runtime/mcp/<id>`) that lists the tools given for it and answers nothing else.
 */
let server: Server;
let baseUrl = '';
const toolsByConnection: Record<string, string[]> = {
  conn_a: ['deploy.prod', 'deploy_prod', 'status', 'x__y'],
  conn_b: ['y', 'status'],
  conn_c: [`${'l'.repeat(70)}1`, `${'l'.repeat(70)}2`, 'short'],
};

const body = (req: IncomingMessage): Promise<string> => new Promise((resolve) => {
  let s = '';
  req.on('data', (c: Buffer) => (s += c.toString()));
  req.on('end', () => resolve(s));
});

beforeAll(async () => {
  server = createServer((req, res) => {
    void (async () => {
      const id = /^\/v1\/runtime\/mcp\/([a-z_]+)$/.exec(req.url ?? '')?.[1];
      if (req.method !== 'POST' || !id) return void res.writeHead(405).end();
      const msg = JSON.parse(await body(req)) as { id?: number; method: string; params?: { protocolVersion?: string } };
      if (msg.id === undefined) return void res.writeHead(202).end();
      const result = msg.method === 'initialize'
        ? { protocolVersion: msg.params?.protocolVersion ?? '2025-06-18', capabilities: { tools: {} }, serverInfo: { name: 'stand-in', version: '1.0.0' } }
        : msg.method === 'tools/list'
          ? { tools: (toolsByConnection[id] ?? []).map((name) => ({ name, inputSchema: { type: 'object' } })) }
          : undefined;
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify(result ? { jsonrpc: '2.0', id: msg.id, result } : { jsonrpc: '2.0', id: msg.id, error: { code: -32601, message: 'not found' } }));
    })();
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  baseUrl = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
});

afterAll(async () => {
  server.closeAllConnections();
  await new Promise<void>((r) => server.close(() => r()));
});

/** A logger whose warnings are kept: the fields each names, and its message. */
function recorder() {
  const lines: string[] = [];
  const log = createLogger({ name: 'test', level: 'warn', destination: { write: (s: string) => void lines.push(s) } });
  const warnings = () => lines.map((l) => JSON.parse(l) as Record<string, unknown>).map(({ offered_name, tools, msg }) => ({ fields: { offered_name, tools }, message: String(msg) }));
  return { warnings, log };
}

describe('offered MCP tool names', () => {
  it('are <server>__<tool>, other characters as _, at most 64 characters', () => {
    expect(offeredToolName('ops', 'deploy.prod')).toBe('ops__deploy_prod');
    expect(offeredToolName('ops', 'x__y')).toBe(offeredToolName('ops__x', 'y'));
    expect(offeredToolName('ops', 'l'.repeat(80))).toHaveLength(64);
  });

  it('leaves out every tool whose offered name another tool shares, with a warning naming them', () => {
    const listed = (server: string, connection_id: string, name: string): ListedTool => ({
      server, connection_id, name,
      tool: { type: 'external', permission: 'always_ask', mcp: { connection_id, tool: name }, spec: { name: offeredToolName(server, name), description: name, input_schema: {} }, call: () => Promise.resolve({ content: '', is_error: false }) },
    });
    const { warnings, log } = recorder();
    const kept = withoutCollisions([listed('ops', 'conn_a', 'deploy.prod'), listed('ops', 'conn_a', 'status'), listed('ops', 'conn_a', 'deploy_prod')], log);
    expect(kept.map((t) => (t.type === 'external' ? t.spec.name : ''))).toEqual(['ops__status']);
    expect(warnings()).toHaveLength(1);
    expect(warnings()[0]?.fields).toEqual({
      offered_name: 'ops__deploy_prod',
      tools: [{ server: 'ops', connection_id: 'conn_a', tool: 'deploy.prod' }, { server: 'ops', connection_id: 'conn_a', tool: 'deploy_prod' }],
    });
  });

  it('connectMcpTools offers none of the tools that collide, on one server or across servers, and all the others', async () => {
    const { warnings, log } = recorder();
    const mcp = await connectMcpTools(baseUrl, {
      bearer: 'ap_rt_test',
      servers: [
        { name: 'ops', connection_id: 'conn_a', permission: 'always_ask' },
        { name: 'ops__x', connection_id: 'conn_b', permission: 'always_ask' },
        { name: 'long', connection_id: 'conn_c', permission: 'always_allow' },
      ],
    }, log, new AbortController().signal);
    try {
      const offered = mcp.tools.map((t) => (t.type === 'external' ? [t.spec.name, t.mcp?.connection_id, t.mcp?.tool] : []));
      expect(offered).toEqual([
        ['ops__status', 'conn_a', 'status'],
        ['ops__x__status', 'conn_b', 'status'],
        ['long__short', 'conn_c', 'short'],
      ]);
      // Each name the model is offered is one tool's.
      const names = mcp.tools.map((t) => (t.type === 'external' ? t.spec.name : ''));
      expect(new Set(names).size).toBe(names.length);
      expect(warnings().map((w) => w.fields.offered_name)).toEqual(['ops__deploy_prod', 'ops__x__y', `long__${'l'.repeat(58)}`]);
      expect(warnings().every((w) => /left out/.test(w.message))).toBe(true);
    } finally {
      await mcp.close();
    }
  });
});
