import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { RedisRuntimeBearers, type RuntimeGrant } from '@agentplane/domain';
import { LeaseFence } from '@agentplane/lease';
import { connectRedis, type Redis } from '@agentplane/store';
import { startPlatform, type Platform } from './harness/platform.js';

/** What the platform reads of one upstream answer at most: 4 MiB and its framing. */
const CEILING = 4 * 1024 * 1024 + 64 * 1024;
/** What the oversized upstream offers: far past the ceiling, then it holds the answer open. */
const OFFERED = 32 * 1024 * 1024;

let p: Platform;
let redis: Redis;
let bearers: RedisRuntimeBearers;
let fence: LeaseFence;

beforeAll(async () => {
  // Its MCP upstreams listen on loopback: reachable in development mode only (the outbound address guard).
  p = await startPlatform({ env: { AGENTPLANE_MODE: 'development' } });
  redis = connectRedis(p.redisUrl(), { name: 'test' });
  fence = new LeaseFence(redis);
  bearers = new RedisRuntimeBearers(redis);
});
afterAll(async () => {
  await redis?.quit();
  await p?.stop();
});

let leaseSeq = 0;
/** A live lease on a fresh Session (the Session's fence) and the grant a runtime bearer for it carries. */
async function grant(connections: RuntimeGrant['connections']): Promise<RuntimeGrant> {
  const n = ++leaseSeq;
  const sessionId = `sess_${(0xb16 * 0x1000 + n).toString(16).padStart(32, '0')}`;
  const leaseId = `lease-limits-${n}`;
  const runId = `run_${'b'.repeat(31)}${n.toString(16)}`;
  await fence.claim({ sessionId, token: leaseId, runnerId: 'runner_test', attempt: 1, runId }, 60_000);
  return {
    run_id: runId, session_id: sessionId, workspace_id: p.bootstrap.workspace_id, organization_id: p.bootstrap.organization_id,
    lease_id: leaseId, expires_at: new Date(Date.now() + 120_000).toISOString(), connections,
  };
}

interface Oversized {
  url: string;
  /** Settles when an oversized answer's connection closes: whether the whole offer was written before it did. */
  answers: Array<Promise<{ wroteAll: boolean }>>;
  close(): Promise<void>;
}

/**
 * A hand-written MCP server (2025-era handshake) whose `method` answers are a JSON-RPC response
 * that never ends: OFFERED bytes of one text value, written as fast as they are read, then held open.
 */
async function oversizedUpstream(method: 'tools/call' | 'tools/list'): Promise<Oversized> {
  const answers: Oversized['answers'] = [];
  const reply = (res: ServerResponse, id: unknown, result: unknown) =>
    res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id, result }));
  const server: Server = createServer((req: IncomingMessage, res: ServerResponse) => {
    if (req.method !== 'POST') {
      res.writeHead(405).end();
      return;
    }
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const msg = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { id?: unknown; method: string; params?: { protocolVersion?: string } };
      if (msg.id === undefined) {
        res.writeHead(202).end();
        return;
      }
      if (msg.method === 'initialize') {
        reply(res, msg.id, { protocolVersion: msg.params?.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: 'oversized', version: '1' } });
        return;
      }
      if (msg.method !== method) {
        if (msg.method === 'tools/list') reply(res, msg.id, { tools: [{ name: 'flood', inputSchema: { type: 'object', properties: {} } }] });
        else res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: msg.id, error: { code: -32601, message: 'no' } }));
        return;
      }
      answers.push(new Promise((resolve) => {
        let written = 0;
        let wroteAll = false;
        res.on('close', () => resolve({ wroteAll }));
        res.writeHead(200, { 'content-type': 'application/json' });
        res.write(`{"jsonrpc":"2.0","id":${JSON.stringify(msg.id)},"result":{"content":[{"type":"text","text":"`);
        const chunk = Buffer.alloc(64 * 1024, 'a');
        const pump = () => {
          while (written < OFFERED && !res.destroyed) {
            written += chunk.length;
            if (!res.write(chunk)) {
              res.once('drain', pump);
              return;
            }
          }
          if (written >= OFFERED) wroteAll = true;
        };
        pump();
      }));
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`,
    answers,
    close: () => new Promise<void>((r) => {
      server.closeAllConnections();
      server.close(() => r());
    }),
  };
}

async function runtimeClient(connectionId: string, bearer: string): Promise<Client> {
  const client = new Client({ name: 'harness', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`${p.baseUrl}/v1/runtime/mcp/${connectionId}`), {
    requestInit: { headers: { Authorization: `Bearer ${bearer}` } },
  }));
  return client;
}

describe('/v1/runtime/mcp/{connection_id}: upstream answers past the size limits', () => {
  it('a tools/call answer is read only up to the ceiling: the call fails at once and the upstream connection is closed', async () => {
    const up = await oversizedUpstream('tools/call');
    try {
      const conn = await p.root.post<{ id: string }>('/v1/connections', { name: 'oversized call', url: up.url });
      const client = await runtimeClient(conn.id, await bearers.mint(await grant({ [conn.id]: { default: 'allow' } })));
      try {
        const r = await client.callTool({ name: 'flood', arguments: {} });
        expect(r.isError).toBe(true);
        const text = (r.content as { text: string }[])[0]?.text ?? '';
        expect(text).toContain(`${CEILING}-byte`);
        expect(Buffer.byteLength(text)).toBeLessThan(4096);
      } finally {
        await client.close();
      }
      expect(up.answers).toHaveLength(1);
      // Closed by the platform while the upstream was still writing, not read to the end.
      expect(await up.answers[0]).toEqual({ wroteAll: false });
    } finally {
      await up.close();
    }
  });

  it('a tools/list answer too: the list fails with an internal error, the upstream connection is closed', async () => {
    const up = await oversizedUpstream('tools/list');
    try {
      const conn = await p.root.post<{ id: string }>('/v1/connections', { name: 'oversized list', url: up.url });
      const client = await runtimeClient(conn.id, await bearers.mint(await grant({ [conn.id]: { default: 'allow' } })));
      try {
        const failed = await client.listTools().then(() => 'listed', (err: unknown) => String(err instanceof Error ? err.message : err));
        expect(failed).toContain(`${CEILING}-byte`);
      } finally {
        await client.close();
      }
      expect(up.answers).toHaveLength(1);
      expect(await up.answers[0]).toEqual({ wroteAll: false });
    } finally {
      await up.close();
    }
  });

  it('a tool list whose pages are each small but together past 4 MiB is refused as a whole, not served cut or oversized', async () => {
    // Six pages of one tool each, 1 MiB of description a tool: every answer is well under the ceiling.
    const description = 'd'.repeat(1024 * 1024);
    const server = createServer((req, res) => {
      if (req.method !== 'POST') {
        res.writeHead(405).end();
        return;
      }
      const chunks: Buffer[] = [];
      req.on('data', (c: Buffer) => chunks.push(c));
      req.on('end', () => {
        const msg = JSON.parse(Buffer.concat(chunks).toString('utf8')) as { id?: unknown; method: string; params?: { protocolVersion?: string; cursor?: string } };
        if (msg.id === undefined) {
          res.writeHead(202).end();
          return;
        }
        let result: unknown;
        if (msg.method === 'initialize') result = { protocolVersion: msg.params?.protocolVersion, capabilities: { tools: {} }, serverInfo: { name: 'paged', version: '1' } };
        else if (msg.method === 'tools/list') {
          const page = Number(msg.params?.cursor ?? '0');
          result = { tools: [{ name: `tool_${page}`, description, inputSchema: { type: 'object', properties: {} } }], ...(page < 5 ? { nextCursor: String(page + 1) } : {}) };
        } else result = {};
        res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ jsonrpc: '2.0', id: msg.id, result }));
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    try {
      const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/mcp`;
      const conn = await p.root.post<{ id: string }>('/v1/connections', { name: 'paged', url });
      const client = await runtimeClient(conn.id, await bearers.mint(await grant({ [conn.id]: { default: 'allow' } })));
      try {
        const failed = await client.listTools().then((r) => `listed ${r.tools.length}`, (err: unknown) => String(err instanceof Error ? err.message : err));
        expect(failed).toContain(`${4 * 1024 * 1024}-byte`);
      } finally {
        await client.close();
      }
    } finally {
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    }
  });
});
