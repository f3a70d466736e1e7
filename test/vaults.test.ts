import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import type { HttpClient } from '@agentplane/client';
import { RedisRuntimeBearers } from '@agentplane/domain';
import { LeaseFence } from '@agentplane/lease';
import { connectRedis, type Redis } from '@agentplane/store';
import type { Platform } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnPlatform } from './harness/turns.js';
import { startGitServer, type GitServer } from './harness/git-server.js';
import { startMcpUpstream, type McpUpstream } from './harness/mcp-upstream.js';
import { errType } from './harness/governance.js';

/**
 * Vaults end to end: sealed, never-shown, rotatable secrets; a private repository served over
 * HTTPS cloned with the Session's vault credential (which then appears in no event, log line or
 * sandbox file); `vault_ids` order deciding which secret is used, for git and for MCP headers.
 */
const TOKEN_A = 'vaulttokenAAAA0123456789abcdefXYZ';
const TOKEN_B = 'vaulttokenBBBB9876543210fedcbaQRS';
const MCP_TOKEN = 'mcpvaultsecret-55aa-0123456789';

let t: TurnPlatform;
let p: Platform;
let api: HttpClient;
let git: GitServer;
let upstream: McpUpstream;
let redis: Redis;

beforeAll(async () => {
  git = await startGitServer();
  await git.createRepo('private', { 'README.md': '# private\n', 'secret-plan.txt': 'launch on tuesday\n' }, { auth: { username: 'x-access-token', password: TOKEN_A } });
  upstream = await startMcpUpstream({ token: MCP_TOKEN, tools: [{ name: 'ping', description: 'Ping', reply: 'pong' }] });
  // Its MCP upstreams listen on loopback: reachable in development mode only (the outbound address guard).
  t = await startTurnPlatform({ name: 'vaults', env: { GIT_SSL_CAINFO: git.caFile, AGENTPLANE_MODE: 'development' } });
  ({ p } = t);
  // Vaults are written with admin keys: the root key of the bootstrap.
  api = p.root;
  redis = connectRedis(p.redisUrl(), { name: 'vaults-test' });
}, 180_000);
afterAll(async () => {
  await redis?.quit();
  await p?.stop();
  await upstream?.close();
  await git?.close();
});

const newVault = async (name: string) => (await api.post<{ id: string }>('/v1/vaults', { name })).id;
const putSecret = (vault: string, name: string, body: Json) => api.request<Json>('PUT', `/v1/vaults/${vault}/secrets/${name}`, { body });

describe('Vault secrets (REST)', () => {
  it('seals the value, never shows it, rotates by generation', async () => {
    const vault = await newVault('ci');
    expect(vault).toMatch(/^vlt_[0-9a-f]{32}$/);
    const put = await putSecret(vault, 'github', { kind: 'git_https', match: 'https://git.example.com/org', value: TOKEN_A, expected_generation: 0 });
    expect(put.status).toBe(200);
    expect(put.body.secrets).toEqual([expect.objectContaining({ name: 'github', kind: 'git_https', match: 'https://git.example.com/org', username: 'x-access-token', generation: 1, secret_hint: '…fXYZ' })]);
    expect(JSON.stringify(put.body)).not.toContain(TOKEN_A);
    expect(await redis.get(`ap:{w:${p.bootstrap.workspace_id}}:doc:${vault}`)).not.toContain(TOKEN_A);
    expect(JSON.stringify(await api.get(`/v1/vaults/${vault}`))).not.toContain(TOKEN_A);

    const rotated = await putSecret(vault, 'github', { kind: 'git_https', match: 'https://git.example.com/org', value: TOKEN_B, expected_generation: 1 });
    expect((rotated.body.secrets as Json[])[0]).toMatchObject({ generation: 2, secret_hint: '…aQRS' });
    const stale = await putSecret(vault, 'github', { kind: 'git_https', match: 'https://git.example.com/org', value: TOKEN_A, expected_generation: 1 });
    expect(stale.status).toBe(409);
    expect(errType(stale)).toBe('validation.conflict');

    const http = await putSecret(vault, 'plain', { kind: 'git_https', match: 'http://git.example.com', value: 'x' });
    expect(http.status).toBe(400);
    const userinfo = await putSecret(vault, 'plain', { kind: 'mcp_bearer', match: 'https://u:p@mcp.example.com', value: 'x' });
    expect(userinfo.status).toBe(400);
    expect((await api.request('DELETE', `/v1/vaults/${vault}/secrets/nope`)).status).toBe(404);

    // Secret-accepting operations are REST-only; a Session must name vaults of its Workspace.
    const tools = await fetch(`${p.baseUrl}/v1/mcp?catalog=full`, {
      method: 'POST',
      headers: { authorization: `Bearer ${p.bootstrap.root_key}`, 'content-type': 'application/json', 'mcp-protocol-version': '2025-11-25' },
      body: JSON.stringify({ jsonrpc: '2.0', id: 1, method: 'tools/list' }),
    });
    const names = ((await tools.json()) as { result: { tools: { name: string }[] } }).result.tools.map((x) => x.name);
    expect(names).toContain('vaults_getVault');
    expect(names).not.toContain('vaults_putSecret');
    const missing = await api.request('POST', '/v1/sessions', { body: { agent: { name: 'x', model: 'default' }, environment_id: t.envId, vault_ids: [`vlt_${'0'.repeat(32)}`] } });
    expect(missing.status).toBe(404);
  });
});

describe('Vault secret values and header names', () => {
  it('a value is at most 16 KiB of UTF-8 (bytes, not characters)', async () => {
    const vault = await newVault('sizes');
    const at = (value: string) => putSecret(vault, 'sized', { kind: 'git_https', match: 'https://git.example.com/org', value });
    expect((await at('a'.repeat(16_384))).status).toBe(200);
    // 5,461 × 3 bytes + 1 = 16,384 bytes: at the limit.
    expect((await at(`${'€'.repeat(5_461)}a`)).status).toBe(200);
    for (const value of ['€'.repeat(16_384), `${'€'.repeat(5_461)}ab`, 'a'.repeat(16_385)]) {
      const r = await at(value);
      expect(r.status, `${value.length} characters`).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
    const v = await api.get<{ secrets: Json[] }>(`/v1/vaults/${vault}`);
    expect(v.secrets).toEqual([expect.objectContaining({ name: 'sized', generation: 2 })]);
  });

  it('an mcp_header secret cannot set a framing or hop-by-hop header, and header values are visible ASCII', async () => {
    const vault = await newVault('headers');
    const header = (header_name: string, value = 'token-123') => putSecret(vault, 'h', { kind: 'mcp_header', match: 'https://mcp.example.com', header_name, value });
    for (const name of ['Host', 'content-length', 'Transfer-Encoding', 'CONNECTION', 'Keep-Alive', 'Upgrade', 'TE', 'Trailer', 'Proxy-Connection', 'Content-Type', 'Mcp-Session-Id', 'mcp-protocol-version']) {
      const r = await header(name);
      expect(r.status, name).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
    for (const value of ['a\u2028b', 'a\u0085b', 'caf\u00e9', 'tab\there\u007f', ' leading', 'trailing\t', 'x\u0000']) {
      for (const r of [await header('X-Api-Key', value), await putSecret(vault, 'b', { kind: 'mcp_bearer', match: 'https://mcp.example.com', value })]) {
        expect(r.status, JSON.stringify(value)).toBe(400);
        expect(errType(r)).toBe('validation.malformed');
      }
    }
    expect((await header('X-Api-Key', 'key with spaces\tand tab')).status).toBe(200);
    expect((await header('Authorization', 'Token abc=')).status).toBe(200);
    // Other kinds never go into a header as they are: a git password may be any text.
    expect((await putSecret(vault, 'g', { kind: 'git_https', match: 'https://git.example.com', value: 'p\u00e4ss\u2028word' })).status).toBe(200);
  });

  it('refuses vault names and secret values that are not well-formed Unicode (a lone surrogate)', async () => {
    const name = await api.request('POST', '/v1/vaults', { body: { name: 'ci \ud800' } });
    expect(name.status).toBe(400);
    expect(errType(name)).toBe('validation.malformed');
    const vault = await newVault('lone');
    const value = await putSecret(vault, 'g', { kind: 'git_https', match: 'https://git.example.com', value: 'password\udc00' });
    expect(value.status).toBe(400);
    expect(errType(value)).toBe('validation.malformed');
  });
});

describe('vault credentials for a private repository', () => {
  /** The agent runs `command` in the sandbox and replies with its output. */
  const shellAgent = (command: string) => ({
    name: 'reader', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
    system: SCRIPT([{ when: { on: 'tool_result' }, then: [{ reply: 'OUT {{tool_result}}' }] }, { then: [{ tool: 'bash', input: { command } }] }]),
  });
  let good: string;
  let bad: string;
  beforeAll(async () => {
    const origin = new URL(git.url('private')).origin;
    good = await newVault('good');
    bad = await newVault('bad');
    expect((await putSecret(good, 'git', { kind: 'git_https', match: origin, value: TOKEN_A })).status).toBe(200);
    expect((await putSecret(bad, 'git', { kind: 'git_https', match: `${origin}/private.git`, value: TOKEN_B })).status).toBe(200);
  });

  async function turn(vaultIds: string[], command: string): Promise<{ sessionId: string; events: { type: string; payload: Json }[] }> {
    const s = await t.api.post<{ id: string }>('/v1/sessions', {
      agent: shellAgent(command), environment_id: t.envId, vault_ids: vaultIds, resources: [{ type: 'repository', url: git.url('private') }],
    });
    await t.api.post(`/v1/sessions/${s.id}/events`, t.msg('go'));
    return { sessionId: s.id, events: await untilEvents(t.api, s.id, (e) => idleCount(e) >= 1, 120_000) };
  }

  it('clones with the first vault that holds a secret for it; the secret reaches no event, log line or sandbox file', async () => {
    // The scan builds the token inside the sandbox from two halves, so the command itself never carries it.
    const half = TOKEN_A.length / 2;
    const command = `cat private/secret-plan.txt; T="$(printf '%s%s' '${TOKEN_A.slice(0, half)}' '${TOKEN_A.slice(half)}')"; `
      + `B64="$(printf 'x-access-token:%s' "$T" | base64 -w0)"; `
      // A canary holding the token proves the scan finds it; it must be the only file listed.
      + `printf '%s' "$T" > canary.txt; `
      + `grep -rIlF -e "$T" -e "$B64" / --exclude-dir=proc --exclude-dir=sys --exclude-dir=dev 2>/dev/null | head -5; rm -f canary.txt; echo scanned`;
    const { sessionId, events } = await turn([good, bad], command);
    expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    // The file is there, and the scan found the token in no file but the canary.
    const output = JSON.stringify(events.filter((e) => e.type === 'agent.tool_result'));
    expect(output).toMatch(/launch on tuesday\\n[^\\"]*\/canary\.txt\\nscanned/);

    const all = JSON.stringify(await untilEvents(t.api, sessionId, (e) => idleCount(e) >= 1, 30_000));
    // The release of the credential to the runner is in the audit log, as the Run, target the vault that held it.
    const audit = await p.root.post<{ data: Json[] }>('/v1/audit/export', { action: 'vaults.releaseGitCredential', target: good });
    expect(audit.data.map((r) => [r.outcome, r.status, (r.actor as { credential_id: unknown }).credential_id])).toEqual([['succeeded', 200, null]]);
    expect((audit.data[0]?.actor as { id: string }).id).toMatch(/^run_/);
    for (const text of [all, JSON.stringify(audit), readFileSync(p.logFile, 'utf8')]) {
      expect(text).not.toContain(TOKEN_A);
      expect(text).not.toContain(Buffer.from(`x-access-token:${TOKEN_A}`).toString('base64'));
    }
  }, 240_000);

  it('vault_ids order decides: a first vault with a wrong secret for the repository wins, and the fetch fails', async () => {
    const { events } = await turn([bad, good], 'cat private/secret-plan.txt');
    const idle = events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason as Json;
    expect(idle).toMatchObject({ type: 'error' });
    expect(JSON.stringify(idle)).toMatch(/authentication|auth|401|could not read/i);
    for (const token of [TOKEN_A, TOKEN_B]) {
      expect(JSON.stringify(events)).not.toContain(token);
      expect(readFileSync(p.logFile, 'utf8')).not.toContain(token);
    }
  }, 240_000);
});

describe('vault headers for MCP Connections', () => {
  it('the runtime MCP proxy sends the first matching vault secret of the Session (read live)', async () => {
    const conn = (await api.post<{ id: string }>('/v1/connections', { name: 'pinger', url: upstream.url })).id;
    const wrong = await newVault('mcp-wrong');
    const right = await newVault('mcp-right');
    await putSecret(wrong, 'mcp', { kind: 'mcp_bearer', match: upstream.url, value: 'not-the-token' });
    await putSecret(right, 'mcp', { kind: 'mcp_bearer', match: new URL(upstream.url).origin, value: MCP_TOKEN });
    const session = await t.api.post<{ id: string }>('/v1/sessions', { agent: { name: 'm', model: 'default' }, environment_id: t.envId, vault_ids: [right, wrong] });

    const fence = new LeaseFence(redis);
    await fence.claim({ sessionId: session.id, token: 'lease-vault', runnerId: 'runner_test', attempt: 1, runId: `run_${'f'.repeat(32)}` }, 60_000);
    const bearer = await new RedisRuntimeBearers(redis).mint({
      run_id: `run_${'f'.repeat(32)}`, session_id: session.id, workspace_id: p.bootstrap.workspace_id, organization_id: p.bootstrap.organization_id,
      lease_id: 'lease-vault', expires_at: new Date(Date.now() + 120_000).toISOString(), connections: { [conn]: { default: 'allow' } },
    });
    const call = async (): Promise<{ isError: boolean; text: string }> => {
      const c = new Client({ name: 'harness', version: '1.0.0' });
      try {
        await c.connect(new StreamableHTTPClientTransport(new URL(`${p.baseUrl}/v1/runtime/mcp/${conn}`), { requestInit: { headers: { Authorization: `Bearer ${bearer}` } } }));
        const r = await c.callTool({ name: 'ping', arguments: {} });
        return { isError: r.isError === true, text: (r.content as { text: string }[])[0]?.text ?? '' };
      } finally {
        await c.close();
      }
    };
    const before = upstream.calls.length;
    expect(await call()).toEqual({ isError: false, text: 'pong' });
    expect(upstream.calls.slice(before).every((c) => c.auth === `Bearer ${MCP_TOKEN}`)).toBe(true);

    // Reorder: the wrong vault now comes first and wins; the upstream refuses it.
    await t.api.post(`/v1/sessions/${session.id}`, { vault_ids: [wrong, right] });
    const mark = upstream.calls.length;
    const refused = await call().catch((err: unknown) => ({ isError: true, text: String(err) }));
    expect(refused.isError).toBe(true);
    expect(upstream.calls.slice(mark).some((c) => c.auth === 'Bearer not-the-token')).toBe(true);
    expect(refused.text).not.toContain(MCP_TOKEN);
    expect(readFileSync(p.logFile, 'utf8')).not.toContain(MCP_TOKEN);
  });
});
