import { lookup } from 'node:dns/promises';
import { readFileSync } from 'node:fs';
import { createRequire, syncBuiltinESMExports } from 'node:module';
import { createServer, type AddressInfo, type Server, type Socket } from 'node:net';
import { hostname } from 'node:os';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import type { HttpClient } from '@agentplane/client';
import { A2aToolCalls, type A2aCallSettings, type ToolSourceDoc } from '@agentplane/api';
import { RedisRuntimeBearers, type RuntimeGrant } from '@agentplane/domain';
import { LeaseFence } from '@agentplane/lease';
import { connectRedis, EventLog, type Redis } from '@agentplane/store';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type TurnPlatform } from './harness/turns.js';
import { startMcpUpstream, type McpUpstream } from './harness/mcp-upstream.js';
import { errMsg, errType } from './harness/governance.js';
import { startSdkPeer, type SdkPeer } from './harness/a2a-peer.js';

/**
 * The outbound address guard on the other places a workspace member points the control plane at
 * a URL of their choosing: MCP Connections (the api connects to them for every Run's tool call),
 * skill sources (the api runs git against them) and A2A tool sources (the api calls their peer
 * for every tool call). On a platform in its default,
 * production mode, an address that is loopback, private, link-local (cloud metadata),
 * unique-local or otherwise reserved is refused when the URL is written (400
 * `validation.malformed`), and a name that resolves to one is refused when the platform is about
 * to connect, before any connection is made. `AGENTPLANE_MODE=development` allows loopback
 * (the tests' own servers) and `EGRESS_ALLOW_PRIVATE_NETWORKS=true` (formerly
 * `WEBHOOK_ALLOW_PRIVATE_NETWORKS`, still read) every range, exactly as for webhook endpoints.
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

describe('A2A tool sources', () => {
  /** The platform's own default: production, no private networks. */
  const PRODUCTION: A2aCallSettings = {
    policy: { initialMs: 20, factor: 2, maxMs: 60, jitter: 0.2, maxRetryAfterMs: 1_000, requestTimeoutMs: 1_000 },
    deadlineMs: 5_000, sweepMs: 60_000, egress: { development: false, allowPrivate: false },
  };
  let peer: SdkPeer;
  let session: { id: string; workspace_id: string };
  let thread: string;
  let calls: A2aToolCalls;
  let n = 0;
  beforeAll(async () => {
    peer = await startSdkPeer(undefined, { instant: true });
    const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'a2a-caller', model: 'default' })).id;
    session = await api.post<{ id: string; workspace_id: string }>('/v1/sessions', { agent, environment_id: t.envId });
    thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${session.id}/threads`)).data[0]!.id;
    calls = new A2aToolCalls(redis, new EventLog(redis), PRODUCTION);
  });
  afterAll(async () => {
    await peer?.close();
  });

  /** A synced source whose peer's JSON-RPC interface is `rpcUrl` (what a sync of its signed card records). */
  const sourceAt = (rpcUrl: string): ToolSourceDoc => ({
    id: `tsrc_${'a'.repeat(32)}`, version: 1, created_at: new Date().toISOString(), updated_at: new Date().toISOString(),
    type: 'tool_source', workspace_id: session.workspace_id, name: 'peer', provider: 'peer',
    provider_package: { id: `ppkg_${'a'.repeat(32)}`, package_version: 1, digest: 'sha256:0' },
    source: { kind: 'a2a', card_url: new URL('/.well-known/agent-card.json', rpcUrl).href, verification_keys: [] },
    revision: 1, sync: { state: 'synced', checked_at: new Date().toISOString(), rejection: null },
    discovery: {
      card_digest: 'sha256:0', key_id: 'k1', agent_name: 'peer', agent_version: '1', interface: { url: rpcUrl, protocol_binding: 'JSONRPC', protocol_version: '1.0' },
      streaming: false, push_notifications: false, security: { kind: 'bearer', scheme_name: 'bearer' },
    },
    tools: [{ name: 'a2a_peer_summarize', skill_id: 'summarize', description: 'Summarizes text', approval: 'always_ask' }],
  });
  const call = (rpcUrl: string) => calls.invoke({
    workspace_id: session.workspace_id, session_id: session.id, session_thread_id: thread, call_id: `toolu_${String(++n).padStart(32, '0')}`,
    source: sourceAt(rpcUrl), tool: 'a2a_peer_summarize', text: 'hello', headers: { authorization: 'Bearer from-vault' },
  });
  const aliased = () => {
    const url = new URL(peer.rpcUrl);
    url.hostname = alias!;
    return url.href;
  };

  describe.skipIf(alias === null)('a name that resolves to an internal address', () => {
    it('is refused when the call is made: the peer is never reached, and the call ends as an error', async () => {
      const r = await call(aliased());
      expect(r.outcome.status).toBe('error');
      expect(r.outcome.text).toMatch(/private or reserved address/);
      expect(r.event).toMatchObject({ type: 'exec.tool_invocation', payload: { status: 'error' } });
      expect(peer.calls).toEqual([]);
    });

    it('a DNS answer that changes after the check (rebinding) cannot redirect the call: it connects to the address checked', async () => {
      // The guard's lookup sees a public address; any other resolution of the name (a fetch of
      // its own) still gets the real, loopback answer: what a rebinding DNS server does.
      type Lookup = (host: string, options?: unknown) => Promise<unknown>;
      const dns = createRequire(import.meta.url)('node:dns/promises') as { lookup: Lookup };
      const real = dns.lookup;
      const asked: string[] = [];
      dns.lookup = async (host, options) => {
        if (host !== alias) return real(host, options);
        asked.push(host);
        // TEST-NET-1 (RFC 5737): public to the guard, and nothing answers there.
        return [{ address: '192.0.2.1', family: 4 }];
      };
      syncBuiltinESMExports();
      try {
        const r = await call(aliased());
        expect(asked).toContain(alias);
        expect(r.outcome.status).toBe('error');
        expect(peer.calls).toEqual([]);
      } finally {
        dns.lookup = real;
        syncBuiltinESMExports();
      }
    }, 30_000);
  });

  it('a peer the guard allows is called (development mode: loopback)', async () => {
    const dev = new A2aToolCalls(redis, new EventLog(redis), { ...PRODUCTION, egress: { development: true, allowPrivate: false } });
    const before = peer.calls.length;
    const r = await dev.invoke({
      workspace_id: session.workspace_id, session_id: session.id, session_thread_id: thread, call_id: `toolu_${String(++n).padStart(32, '0')}`,
      source: sourceAt(peer.rpcUrl), tool: 'a2a_peer_summarize', text: 'hello', headers: { authorization: 'Bearer from-vault' },
    });
    expect(r.outcome).toMatchObject({ status: 'completed', text: 'done: hello' });
    expect(peer.calls.slice(before).map((c) => c.method)).toContain('SendMessage');
  });
});

describe('the allow settings', () => {
  it('development mode allows loopback only; EGRESS_ALLOW_PRIVATE_NETWORKS allows every range', async () => {
    const [dev, priv] = await Promise.all([
      startPlatform({ env: { AGENTPLANE_MODE: 'development', SKILL_SOURCES_ALLOW_LOCAL: 'false' } }),
      startPlatform({ env: { EGRESS_ALLOW_PRIVATE_NETWORKS: 'true' } }),
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

  it('WEBHOOK_ALLOW_PRIVATE_NETWORKS, its former name, is still read, and the api says it is deprecated', async () => {
    const old = await startPlatform({ env: { WEBHOOK_ALLOW_PRIVATE_NETWORKS: 'true' } });
    try {
      expect((await old.root.request('POST', '/v1/connections', { body: { name: 'x', url: 'http://10.0.0.5/mcp' } })).status).toBe(201);
      expect((await old.root.request('POST', '/v1/connections', { body: { name: 'y', url: 'http://127.0.0.1:9/mcp' } })).status).toBe(201);
      // The api's start-up lines (the platform's log is its children's stdout).
      const warned = await waitFor('the deprecation warning', async () => readFileSync(old.logFile, 'utf8').split('\n')
        .filter((l) => l.startsWith('{')).map((l) => JSON.parse(l) as Record<string, unknown>)
        .find((l) => l.name === 'api' && l.setting === 'WEBHOOK_ALLOW_PRIVATE_NETWORKS'), 10_000);
      expect(warned).toMatchObject({
        level: 40, use: 'EGRESS_ALLOW_PRIVATE_NETWORKS', msg: 'WEBHOOK_ALLOW_PRIVATE_NETWORKS is deprecated; set EGRESS_ALLOW_PRIVATE_NETWORKS instead',
      });
    } finally {
      await old.stop();
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
