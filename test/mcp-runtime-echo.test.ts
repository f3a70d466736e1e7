import { readFileSync } from 'node:fs';
import { createServer, type IncomingHttpHeaders, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { createMcpHandler, Server as McpServer, type CallToolResult } from '@modelcontextprotocol/server';
import { toNodeHandler } from '@modelcontextprotocol/node';
import { RedisRuntimeBearers, type RuntimeGrant } from '@agentplane/domain';
import { LeaseFence } from '@agentplane/lease';
import { connectRedis, type Redis } from '@agentplane/store';
import { startPlatform, type Platform } from './harness/platform.js';

/**
 * What an MCP server answers the runtime proxy may quote the credential the proxy sent it (a
 * Connection's token, a Session vault secret): the proxy takes it out of everything it passes on
 * to the Run (an upstream's failure, a tool result, an error result) and of its own log, and
 * does so in time linear in the answer's length (a long error body does not stall the API).
 */
const CONNECTION_TOKEN = 'conn-token-quoted-upstream-0123456789';
const VAULT_SECRET = 'vault-header-quoted-upstream-9876543210';

/** How the upstream answers: normally, or every tools/list with an HTTP error whose body is `listFailure`. */
let listFailure: string | null = null;
/** The headers of the request the upstream received last (the proxy's requests are sequential here). */
let lastHeaders: IncomingHttpHeaders = {};
let p: Platform;
let redis: Redis;
let upstream: Server;
let upstreamUrl: string;

beforeAll(async () => {
  const handler = createMcpHandler(() => {
    const s = new McpServer({ name: 'quoting-upstream', version: '1.0.0' }, { capabilities: { tools: { listChanged: false } } });
    s.setRequestHandler('tools/list', () => ({
      tools: ['whoami', 'refuse'].map((name) => ({ name, inputSchema: { type: 'object' as const, properties: {} } })),
    }));
    // Both tools quote the request's credentials back; `refuse` as an error result.
    s.setRequestHandler('tools/call', (request): CallToolResult => {
      const text = `you sent Authorization=${lastHeaders.authorization ?? ''} X-Api-Key=${String(lastHeaders['x-api-key'] ?? '')}`;
      return { content: [{ type: 'text', text }], structuredContent: { sent: text }, isError: request.params.name === 'refuse' };
    });
    return s;
  }, { legacy: 'stateless', responseMode: 'json' });
  const serve = toNodeHandler(handler);
  upstream = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const raw = Buffer.concat(chunks).toString('utf8');
      lastHeaders = req.headers;
      if (listFailure !== null && raw.includes('"tools/list"')) {
        res.writeHead(500, { 'content-type': 'text/plain' }).end(listFailure.replace('$AUTH', String(req.headers.authorization)));
        return;
      }
      const r = req as typeof req & { body?: unknown };
      r.body = raw ? JSON.parse(raw) : undefined;
      void serve(r, res, r.body);
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
  upstreamUrl = `http://127.0.0.1:${(upstream.address() as AddressInfo).port}/mcp`;
  // The upstream listens on loopback: reachable in development mode only (the outbound address guard).
  p = await startPlatform({ env: { AGENTPLANE_MODE: 'development' } });
  redis = connectRedis(p.redisUrl(), { name: 'mcp-runtime-echo-test' });
}, 120_000);
afterAll(async () => {
  await redis?.quit();
  await p?.stop();
  await new Promise<void>((r) => (upstream ? upstream.close(() => r()) : r()));
});

let leases = 0;

/** A runtime bearer for a new Session (naming `vaultIds`) holding a live lease, with `connections` granted. */
async function bearerFor(connections: RuntimeGrant['connections'], vaultIds: string[] = []): Promise<string> {
  const env = await p.root.post<{ id: string }>('/v1/environments', { name: `echo-env-${++leases}`, image: 'agentplane/sandbox:1' });
  const session = (await p.root.post<{ id: string }>('/v1/sessions', { agent: { name: 'echo', model: 'default' }, environment_id: env.id, vault_ids: vaultIds })).id;
  const run = `run_${leases.toString(16).padStart(32, '0')}`;
  const leaseId = `lease-echo-${leases}`;
  const fence = new LeaseFence(redis);
  expect(await fence.claim({ sessionId: session, token: leaseId, runnerId: 'runner_test', attempt: 1, runId: run }, 120_000)).toBe('ok');
  return new RedisRuntimeBearers(redis, fence).mint({
    run_id: run, session_id: session, workspace_id: p.bootstrap.workspace_id, organization_id: p.bootstrap.organization_id,
    lease_id: leaseId, expires_at: new Date(Date.now() + 180_000).toISOString(), connections,
  });
}

async function runtimeClient(connectionId: string, bearer: string): Promise<Client> {
  const client = new Client({ name: 'harness', version: '1.0.0' });
  await client.connect(new StreamableHTTPClientTransport(new URL(`${p.baseUrl}/v1/runtime/mcp/${connectionId}`), {
    requestInit: { headers: { Authorization: `Bearer ${bearer}` } },
  }));
  return client;
}

/** The answer to a request, or the message of the error it was answered with. */
const answer = (r: Promise<unknown>): Promise<string> => r.then((v) => JSON.stringify(v), (err: unknown) => (err as Error).message);

describe('the runtime MCP proxy and credentials an upstream quotes', () => {
  let connectionId: string;
  beforeAll(async () => {
    connectionId = (await p.root.post<{ id: string }>('/v1/connections', {
      name: 'quoting upstream', url: upstreamUrl, auth: { type: 'bearer', token: CONNECTION_TOKEN },
    })).id;
  });

  it("a failed upstream tools/list, also the strict binding's check of a call, reaches the Run without the Connection's token", async () => {
    const shaping = { agent_deployment_connection_binding_id: 'cbind_echo', binding_revision_number: 1, tool_selection: ['whoami'], tool_aliases: {}, argument_policy: 'strict' as const };
    const client = await runtimeClient(connectionId, await bearerFor({ [connectionId]: { default: 'allow', shaping } }));
    listFailure = 'the token $AUTH may not list tools';
    try {
      const listed = await answer(client.listTools());
      const called = await answer(client.callTool({ name: 'whoami', arguments: {} }));
      for (const text of [listed, called]) {
        expect(text).toContain('may not list tools');
        expect(text).not.toContain(CONNECTION_TOKEN);
        expect(text).not.toContain(CONNECTION_TOKEN.slice(4, 20));
      }
    } finally {
      listFailure = null;
      await client.close();
    }
    expect(readFileSync(p.logFile, 'utf8')).not.toContain(CONNECTION_TOKEN);
  });

  it('a tool result or error result quoting a Session vault secret reaches the Run without it', async () => {
    const vault = (await p.root.post<{ id: string }>('/v1/vaults', { name: 'quoted-header' })).id;
    const put = await p.root.request('PUT', `/v1/vaults/${vault}/secrets/api-key`, {
      body: { kind: 'mcp_header', match: upstreamUrl, header_name: 'X-Api-Key', value: VAULT_SECRET },
    });
    expect(put.status).toBe(200);
    const client = await runtimeClient(connectionId, await bearerFor({ [connectionId]: { default: 'allow' } }, [vault]));
    try {
      const ok = await client.callTool({ name: 'whoami', arguments: {} });
      const refused = await client.callTool({ name: 'refuse', arguments: {} });
      expect([ok.isError ?? false, refused.isError]).toEqual([false, true]);
      for (const r of [ok, refused]) {
        // The vault secret was sent (it replaces the Connection's token) and quoted back: not passed on.
        expect((r.content as { text: string }[])[0]?.text).toMatch(/^you sent Authorization= X-Api-Key=\[redacted\]$/);
        expect(JSON.stringify(r)).not.toContain(VAULT_SECRET);
        expect(JSON.stringify(r)).not.toContain(VAULT_SECRET.slice(3, 15));
      }
    } finally {
      await client.close();
    }
  });

  it('a long upstream error body is scrubbed in linear time: the API keeps answering', async () => {
    const client = await runtimeClient(connectionId, await bearerFor({ [connectionId]: { default: 'allow' } }));
    // One long word without white space (quadratic to scan for masked echoes position by position).
    listFailure = `${'x'.repeat(192 * 1024)}$AUTH`;
    try {
      const started = Date.now();
      const listing = answer(client.listTools());
      const health = await fetch(`${p.baseUrl}/healthz`);
      expect(health.status).toBe(200);
      const text = await listing;
      expect(Date.now() - started).toBeLessThan(5_000);
      expect(text).toContain('xxxxxxxx');
      expect(text).not.toContain(CONNECTION_TOKEN);
    } finally {
      listFailure = null;
      await client.close();
    }
  }, 120_000);
});
