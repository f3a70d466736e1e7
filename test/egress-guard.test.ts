import { lookup } from 'node:dns/promises';
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { hostname } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import type { HttpClient } from '@agentplane/client';
import { RedisRuntimeBearers, type RuntimeGrant } from '@agentplane/domain';
import { LeaseFence } from '@agentplane/lease';
import { connectRedis, type Redis } from '@agentplane/store';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnPlatform } from './harness/turns.js';
import { startMcpUpstream, type McpUpstream } from './harness/mcp-upstream.js';
import { errMsg, errType } from './harness/governance.js';

/**
 * The outbound address guard on the two other places a workspace member points the control
 * plane at a URL of their choosing: MCP Connections (the api connects to them for every Run's
 * tool call) and skill sources (the api runs git against them). On a platform in its default,
 * production mode, an address that is loopback, private, link-local (cloud metadata),
 * unique-local or otherwise reserved is refused when the URL is written (400
 * `validation.malformed`), and a name that resolves to one is refused when the platform is about
 * to connect, before any connection is made. `AGENTPLANE_MODE=development` allows loopback
 * (the tests' own servers) and `WEBHOOK_ALLOW_PRIVATE_NETWORKS=true` every range, exactly as for
 * webhook endpoints.
 */

/**
 * A name of this machine that resolves to loopback only and is not a `localhost` name: what an
 * attacker's DNS name pointing at an internal address looks like to the platform. The check
 * when the URL is written cannot know where it points; only the check at connect time can.
 */
async function loopbackAlias(): Promise<string | null> {
  const name = hostname();
  if (!/^[a-z0-9.-]+$/i.test(name) || /(^|\.)localhost\.?$/i.test(name)) return null;
  try {
    const addrs = await lookup(name, { all: true });
    return addrs.length > 0 && addrs.every((a) => a.address.startsWith('127.') || a.address === '::1') ? name : null;
  } catch {
    return null;
  }
}
const alias = await loopbackAlias();

/** A TCP listener on loopback that only counts who connects (nothing gets that far past the guard). */
async function listener(): Promise<{ port: number; connections: () => number; close: () => Promise<void> }> {
  let n = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((s) => {
    n++;
    sockets.add(s);
    s.on('close', () => sockets.delete(s));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  return {
    port: (server.address() as AddressInfo).port,
    connections: () => n,
    close: () => new Promise<void>((r) => {
      for (const s of sockets) s.destroy();
      server.close(() => r());
    }),
  };
}

/** Loopback, private, link-local, unique-local and reserved targets, as literals and `localhost` names. */
const INTERNAL_HOSTS = [
  '127.0.0.1', '127.1.2.3', 'localhost', 'localhost.', 'api.localhost', '[::1]', '[::ffff:127.0.0.1]', '169.254.169.254', '10.0.0.5',
  '172.16.0.1', '192.168.1.1', '100.64.0.1', '0.0.0.0', '[fd00::1]', '[fe80::1]',
];

let t: TurnPlatform;
let p: Platform;
let api: HttpClient;
let redis: Redis;

beforeAll(async () => {
  // The default mode: production.
  t = await startTurnPlatform({ name: 'egress-guard' });
  ({ p, api } = t);
  redis = connectRedis(p.redisUrl(), { name: 'test' });
}, 180_000);
afterAll(async () => {
  await redis?.quit();
  await p?.stop();
});

describe('MCP Connections', () => {
  it('a URL naming an internal address is refused when it is written (create and re-point); nothing is stored', async () => {
    const count = async () => (await p.root.get<{ data: unknown[] }>('/v1/connections', { limit: 100 })).data.length;
    const before = await count();
    for (const host of INTERNAL_HOSTS) {
      for (const scheme of ['http', 'https']) {
        const r = await p.root.request('POST', '/v1/connections', { body: { name: 'internal', url: `${scheme}://${host}:8080/mcp` } });
        expect([host, scheme, r.status, errType(r)]).toEqual([host, scheme, 400, 'validation.malformed']);
      }
    }
    expect(await count()).toBe(before);

    const ok = await p.root.post<{ id: string; version: number; url: string }>('/v1/connections', { name: 'public', url: 'https://mcp.example.com/mcp' });
    const repoint = await p.root.request('PATCH', `/v1/connections/${ok.id}`, { body: { url: 'http://169.254.169.254/latest/meta-data' } });
    expect(repoint.status).toBe(400);
    expect(errType(repoint)).toBe('validation.malformed');
    expect(errMsg(repoint)).toContain('body.url');
    expect(await p.root.get(`/v1/connections/${ok.id}`)).toMatchObject({ url: 'https://mcp.example.com/mcp', version: ok.version });
  });

  describe.skipIf(alias === null)('a name that resolves to an internal address', () => {
    let upstream: McpUpstream;
    beforeAll(async () => {
      upstream = await startMcpUpstream();
    });
    afterAll(async () => {
      await upstream?.close();
    });

    it('is refused when the platform connects for a Run: the server is never reached', async () => {
      const port = new URL(upstream.url).port;
      const conn = await p.root.post<{ id: string }>('/v1/connections', { name: 'rebound', url: `http://${alias}:${port}/mcp` });
      // A Run's runtime bearer for the Connection, the way the lease work mints one.
      const sessionId = `sess_${'e'.repeat(32)}`;
      await new LeaseFence(redis).claim({ sessionId, token: 'lease-egress', runnerId: 'runner_test', attempt: 1, runId: `run_${'e'.repeat(32)}` }, 60_000);
      const grant: RuntimeGrant = {
        run_id: `run_${'e'.repeat(32)}`, session_id: sessionId, workspace_id: p.bootstrap.workspace_id, organization_id: p.bootstrap.organization_id,
        lease_id: 'lease-egress', expires_at: new Date(Date.now() + 120_000).toISOString(), connections: { [conn.id]: { default: 'allow' } },
      };
      const bearer = await new RedisRuntimeBearers(redis).mint(grant);
      const client = new Client({ name: 'harness', version: '1.0.0' });
      await client.connect(new StreamableHTTPClientTransport(new URL(`${p.baseUrl}/v1/runtime/mcp/${conn.id}`), {
        requestInit: { headers: { Authorization: `Bearer ${bearer}` } },
      }));
      try {
        await expect(client.listTools()).rejects.toThrow(/private or reserved address/);
        const called = await client.callTool({ name: 'echo', arguments: { text: 'hi' } });
        expect(called.isError).toBe(true);
        expect((called.content as Array<{ text: string }>)[0]?.text).toMatch(/private or reserved address/);
      } finally {
        await client.close();
      }
      expect(upstream.calls).toEqual([]);
    });
  });
});

describe('skill sources', () => {
  it('a git address naming an internal host is refused when it is written; nothing is stored', async () => {
    const urls = INTERNAL_HOSTS.flatMap((h) => [`https://${h}/team/skills.git`, `ssh://git@${h}/team/skills.git`]);
    // The scp-like form takes names and IPv4 literals only.
    urls.push('git@127.0.0.1:team/skills.git', 'git@localhost:team/skills.git', 'git@169.254.169.254:team/skills.git', 'git@10.1.2.3:team/skills.git');
    for (const url of urls) {
      const r = await api.request('POST', '/v1/skill-sources', { body: { name: 'internal', url } });
      expect([url, r.status, errType(r)]).toEqual([url, 400, 'validation.malformed']);
    }
    expect((await api.get<{ data: unknown[] }>('/v1/skill-sources')).data).toEqual([]);
    expect((await api.request('POST', '/v1/skill-sources', { body: { name: 'public', url: 'https://git.example.com/team/skills.git' } })).status).toBe(201);
    expect((await api.request('POST', '/v1/skill-sources', { body: { name: 'public-ssh', url: 'git@git.example.com:team/skills.git' } })).status).toBe(201);
  });

  describe.skipIf(alias === null)('a name that resolves to an internal address', () => {
    let target: Awaited<ReturnType<typeof listener>>;
    beforeAll(async () => {
      target = await listener();
    });
    afterAll(async () => {
      await target?.close();
    });

    it('is refused when a submission would run git against it: nothing connects', async () => {
      const id = await verifiedProposal();
      const current = await api.get<{ version: number }>(`/v1/skill-proposals/${id}`);
      for (const url of [`https://${alias}:${target.port}/team/skills.git`, `ssh://git@${alias}:${target.port}/team/skills.git`]) {
        const src = await api.post<{ id: string }>('/v1/skill-sources', { name: 'rebound', url });
        const r = await api.request('POST', `/v1/skill-proposals/${id}/submit`, { body: { expected_version: current.version, skill_source: src.id, principal: t.principal } });
        expect([url, r.status, errType(r)]).toEqual([url, 400, 'validation.malformed']);
        expect(errMsg(r)).toMatch(/private or reserved address/);
      }
      expect(await api.get(`/v1/skill-proposals/${id}`)).toMatchObject({ status: 'verified', version: current.version });
      expect(target.connections()).toBe(0);
    }, 300_000);
  });
});

describe('the allow settings', () => {
  it('development mode allows loopback only; WEBHOOK_ALLOW_PRIVATE_NETWORKS allows every range', async () => {
    const [dev, priv] = await Promise.all([
      startPlatform({ env: { AGENTPLANE_MODE: 'development', SKILL_SOURCES_ALLOW_LOCAL: 'false' } }),
      startPlatform({ env: { WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'true' } }),
    ]);
    try {
      const create = (q: Platform, path: string, url: string) => q.root.request('POST', path, { body: { name: 'x', url } });
      expect((await create(dev, '/v1/connections', 'http://127.0.0.1:9/mcp')).status).toBe(201);
      expect((await create(dev, '/v1/connections', 'http://localhost:9/mcp')).status).toBe(201);
      expect((await create(dev, '/v1/connections', 'http://10.0.0.5/mcp')).status).toBe(400);
      expect((await create(dev, '/v1/connections', 'http://169.254.169.254/mcp')).status).toBe(400);
      expect((await create(dev, '/v1/skill-sources', 'https://127.0.0.1:9/skills.git')).status).toBe(201);
      expect((await create(dev, '/v1/skill-sources', 'https://192.168.1.1/skills.git')).status).toBe(400);
      expect((await create(priv, '/v1/connections', 'http://10.0.0.5/mcp')).status).toBe(201);
      expect((await create(priv, '/v1/connections', 'http://127.0.0.1:9/mcp')).status).toBe(201);
      expect((await create(priv, '/v1/skill-sources', 'ssh://git@192.168.1.1/skills.git')).status).toBe(201);
    } finally {
      await Promise.all([dev.stop(), priv.stop()]);
    }
  }, 120_000);
});

// ---- a verified skill proposal (the scripted author and grader, a real runner) -------------

const AGENT = SCRIPT([
  { when: { user_contains: 'Greet the visitor' }, then: [{ tool: 'skill', input: { name: 'house-greeting' } }] },
  { when: { after_tool: 'skill', tool_result_contains: 'GREETING-OK' }, then: [{ reply: 'GREETING-OK, Ada!' }] },
  { then: [{ reply: 'Hello there' }] },
]);
const RUBRIC = `- The answer greets with GREETING-OK and the name\n\n\`\`\`scripted\n${JSON.stringify({ rules: [
  { when: { user_contains: 'GREETING-OK, Ada' }, then: [{ verdict: 'satisfied' }] }, { then: [{ verdict: 'needs_revision', explanation: 'no house greeting' }] },
] })}\n\`\`\`\n`;
const AUTHORED = {
  name: 'house-greeting', description: 'Greets visitors in the house style.', instructions: 'Greet with GREETING-OK followed by the visitor\'s name.',
  task: 'Greet the visitor named Ada.', rubric: RUBRIC,
};

async function verifiedProposal(): Promise<string> {
  const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'greeter', model: 'default', system: AGENT })).id;
  const source = (await api.post<{ id: string }>('/v1/sessions', { agent, environment_id: t.envId })).id;
  await api.post(`/v1/sessions/${source}/events`, t.msg('Please greet Bob at the door.'));
  await untilEvents(api, source, (e) => idleCount(e) >= 1, 120_000);
  const script = JSON.stringify({ rules: [{ then: [{ reply: JSON.stringify(AUTHORED) }] }] }).replace(/`/g, '\\u0060');
  const created = await api.request<{ id: string }>('POST', '/v1/skill-proposals', {
    body: { source_session_ids: [source], model_routing_profile_key: 'default', instructions: `\`\`\`scripted\n${script}\n\`\`\`` },
    headers: { 'service-version': '2026-08-29' },
  });
  expect(created.status).toBe(201);
  const id = created.body.id;
  const drafted = await waitFor('drafted', async () => {
    const x = await api.get<{ status: string; version: number }>(`/v1/skill-proposals/${id}`);
    return x.status === 'authoring' ? undefined : x;
  }, 60_000);
  expect(drafted.status).toBe('drafted');
  expect((await api.request('POST', `/v1/skill-proposals/${id}/verify`, { body: { expected_version: drafted.version, principal: t.principal } })).status).toBe(200);
  const done = await waitFor('verified', async () => {
    const x = await api.get<{ status: string }>(`/v1/skill-proposals/${id}`);
    return x.status === 'verifying' ? undefined : x;
  }, 120_000);
  expect(done.status).toBe('verified');
  return id;
}
