import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { createLogger, newId, SecretBox } from '@agentplane/core';
import { connectRedis, DocumentStore, type Redis } from '@agentplane/store';
import type { ModelRequest, ModelStreamEvent, TokenUsage } from '@agentplane/protocol';
import { createModelsModule, ModelStreams, type ModelFrame, type ModelsModule } from '@agentplane/api';
import { startPlatform, type Platform } from './harness/platform.js';
import { postModelStep, stepEvents } from './harness/model-steps.js';
import { startAnthropicServer, startOpenAiServer, type ProviderServer } from './fixtures/provider-servers.js';

const OPENAI_SECRET = 'sk-openai-TESTSECRET-0123456789abcdef';
const OPENAI_SECRET_2 = 'sk-openai-ROTATED-SECRET-fedcba9876543210';
const ANTHROPIC_SECRET = 'sk-ant-TESTSECRET-aaaabbbbccccdddd';
const WRONG_SECRET = 'sk-openai-WRONGSECRET-5555666677778888';
const SECRETS = [OPENAI_SECRET, OPENAI_SECRET_2, ANTHROPIC_SECRET, WRONG_SECRET];

let p: Platform;
let oai: ProviderServer;
let ant: ProviderServer;
let oaiFlaky: ProviderServer;
let ws: string;
let c: HttpClient;
const seenBodies: string[] = [];
let pricesFile = '';

const errType = (r: { body: unknown }) => (r.body as { error?: { type?: string } }).error?.type;

async function req(method: string, path: string, body?: unknown, client: HttpClient = c) {
  const r = await client.request(method, path, body === undefined ? {} : { body });
  seenBodies.push(JSON.stringify(r.body));
  return r;
}

/** POST a model step and collect the SSE events (or the JSON error). */
async function step(request: Omit<ModelRequest, 'tools'> & { tools?: ModelRequest['tools'] }, workspace = ws, signal?: AbortSignal): Promise<{ status: number; events: ModelStreamEvent[]; body: unknown; retryAfter: string | null }> {
  const r = await postModelStep(p.baseUrl, c, workspace, request, signal);
  const text = r.text;
  seenBodies.push(text);
  if (r.status !== 200) return { status: r.status, events: [], body: JSON.parse(text) as unknown, retryAfter: r.headers.get('retry-after') };
  const events = stepEvents(text);
  return { status: 200, events, body: null, retryAfter: null };
}

const user = (text: string): ModelRequest['messages'] => [{ role: 'user', content: [{ type: 'text', text }] }];
const textOf = (events: ModelStreamEvent[]) => events.flatMap((e) => (e.type === 'text_delta' ? [e.text] : [])).join('');
const endOf = (events: ModelStreamEvent[]) => {
  const e = events.at(-1);
  if (e?.type !== 'end') throw new Error(`no end event: ${JSON.stringify(e)}`);
  return e;
};

async function credential(key: string, body: Record<string, unknown>) {
  const r = await req('POST', `/v1/organizations/workspaces/${ws}/model-credentials`, { key, ...body });
  expect(r.status).toBe(201);
  return r.body as { id: string; key: string; active_generation_number: number; resource_version: number };
}
async function profile(key: string, candidates: unknown[]) {
  const r = await req('POST', `/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key, candidates });
  expect(r.status).toBe(201);
  return r.body as { id: string; latest_revision_number: number };
}

beforeAll(async () => {
  [oai, ant, oaiFlaky] = await Promise.all([
    startOpenAiServer({ apiKey: OPENAI_SECRET }),
    startAnthropicServer({ apiKey: ANTHROPIC_SECRET }),
    startOpenAiServer({ apiKey: OPENAI_SECRET }),
  ]);
  const { mkdtempSync } = await import('node:fs');
  const { tmpdir } = await import('node:os');
  const dir = mkdtempSync(join(tmpdir(), 'agentplane-prices-'));
  pricesFile = join(dir, 'prices.json');
  // Priced so that budgets can be spent in a test: 1000 USD per million tokens.
  writeFileSync(pricesFile, JSON.stringify({ scripted: { 'scripted-priced': { input: 1000, output: 1000 } }, openai: { 'local-model': { input: 1, output: 2 } } }));
  p = await startPlatform({ env: { MODEL_PRICES_FILE: pricesFile, MODEL_PROVIDER_TIMEOUT_MS: '1500' } });
  const w = await p.root.request('POST', `/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { body: { name: 'models' } });
  expect(w.status).toBe(201);
  ws = (w.body as { id: string }).id;
  c = p.root.with({ workspaceId: ws });
});
afterAll(async () => {
  await p?.stop();
  await Promise.all([oai?.close(), ant?.close(), oaiFlaky?.close()]);
});

describe('defaults: a new workspace works with no external model', () => {
  it('lists the scripted default credential and routing profile', async () => {
    const creds = await req('GET', `/v1/organizations/workspaces/${ws}/model-credentials`);
    expect(creds.status).toBe(200);
    const data = (creds.body as { data: Record<string, unknown>[] }).data;
    expect(data).toHaveLength(1);
    expect(Object.keys(data[0] ?? {}).sort()).toEqual([
      'active_generation_number', 'base_url', 'created_at', 'custody_policy', 'display_name', 'health_status', 'id', 'key',
      'provider_key', 'resource_version', 'revoked_at', 'status', 'updated_at', 'workspace_id',
    ]);
    expect(data[0]).toMatchObject({ key: 'default', provider_key: 'scripted', custody_policy: 'workspace_vault', status: 'active', workspace_id: ws, base_url: null });
    const profiles = await req('GET', `/v1/organizations/workspaces/${ws}/model-routing-profiles`, undefined);
    expect((profiles.body as { data: unknown[] }).data).toEqual([
      expect.objectContaining({ key: 'default', latest_revision_number: 1, candidates: [{ credential_key: 'default', provider_model: 'scripted-1' }] }),
    ]);
  });

  it('capabilities and OpenAPI list the model access operations', async () => {
    const caps = await req('GET', '/v1/support/capabilities');
    const area = (caps.body as { data: { area: string; readiness: string; operations: string[] }[] }).data.find((a) => a.area === 'model_access');
    expect(area?.readiness).toBe('alpha');
    expect(area?.operations).toEqual(expect.arrayContaining(['models.listModelCredentials', 'models.runModelStepStream', 'models.getWorkspaceUsage']));
    const doc = await fetch(`${p.baseUrl}/v1/openapi.json`).then((r) => r.json() as Promise<{ paths: Record<string, unknown> }>);
    expect(Object.keys(doc.paths)).toEqual(expect.arrayContaining([
      '/v1/organizations/workspaces/{workspace_id}/model-credentials', '/v1/model-routing-profiles/{model_routing_profile_id}/revisions',
    ]));
  });

  it('runs a step on the default profile and streams text in several deltas', async () => {
    const r = await step({ routing_key: 'default', messages: user('hello platform') });
    expect(r.status).toBe(200);
    expect(textOf(r.events)).toBe('You said: hello platform');
    expect(r.events.filter((e) => e.type === 'text_delta').length).toBe(4);
    expect(endOf(r.events)).toMatchObject({ stop_reason: 'end_turn', provider: 'scripted', model: 'scripted-1' });
  });
});

describe('ModelCredentials', () => {
  let cred: { id: string };
  it('creates with a secret that is never returned', async () => {
    cred = await credential('local-openai', { provider_key: 'openai', base_url: oai.url, secret: OPENAI_SECRET, display_name: 'Local OpenAI-compatible' });
    expect(cred).toMatchObject({ key: 'local-openai', active_generation_number: 1, resource_version: 1, health_status: 'unknown', revoked_at: null });
    expect(JSON.stringify(cred)).not.toContain(OPENAI_SECRET);
    const got = await req('GET', `/v1/model-credentials/${cred.id}`);
    expect(got.status).toBe(200);
    expect(got.body).toEqual(cred);
  });

  it('filters the list by logical key (`key`) and pages with limit/page', async () => {
    await credential('local-anthropic', { provider_key: 'anthropic', base_url: ant.url, secret: ANTHROPIC_SECRET });
    const one = await req('GET', `/v1/organizations/workspaces/${ws}/model-credentials?key=local-openai`);
    expect((one.body as { data: { id: string }[] }).data.map((d) => d.id)).toEqual([cred.id]);
    const page1 = await req('GET', `/v1/organizations/workspaces/${ws}/model-credentials?limit=2`);
    const b1 = page1.body as { data: unknown[]; next_page: string | null };
    expect(b1.data).toHaveLength(2);
    expect(b1.next_page).toMatch(/^c1_/);
    const page2 = await req('GET', `/v1/organizations/workspaces/${ws}/model-credentials?limit=2&page=${b1.next_page}`);
    expect((page2.body as { data: unknown[]; next_page: null }).data).toHaveLength(1);
    const bad = await req('GET', `/v1/organizations/workspaces/${ws}/model-credentials?key=Not_A_Key`);
    expect([bad.status, errType(bad)]).toEqual([400, 'validation.malformed']);
  });

  it('rejects client mistakes with exact statuses', async () => {
    const path = `/v1/organizations/workspaces/${ws}/model-credentials`;
    const dup = await req('POST', path, { key: 'local-openai', provider_key: 'openai', base_url: oai.url });
    expect([dup.status, errType(dup)]).toEqual([409, 'validation.conflict']);
    const unknown = await req('POST', path, { key: 'x1', provider_key: 'openai', surprise: true });
    expect([unknown.status, errType(unknown)]).toEqual([400, 'validation.malformed']);
    const provider = await req('POST', path, { key: 'x2', provider_key: 'gemini' });
    expect(provider.status).toBe(400);
    const url = await req('POST', path, { key: 'x3', provider_key: 'openai', base_url: 'ftp://example.com' });
    expect(url.status).toBe(400);
    const scripted = await req('POST', path, { key: 'x4', provider_key: 'scripted', secret: 'nope' });
    expect(scripted.status).toBe(400);
    const missing = await req('POST', path, { key: 'x5', provider_key: 'anthropic' });
    expect(missing.status).toBe(400);
    const publicKeyless = await req('POST', path, { key: 'x6', provider_key: 'openai' });
    expect(publicKeyless.status).toBe(400);
    const other = await req('GET', `/v1/organizations/workspaces/wrkspc_${'0'.repeat(32)}/model-credentials`);
    expect([other.status, errType(other)]).toEqual([404, 'validation.not_found']);
    const none = await req('GET', `/v1/model-credentials/mcred_${'0'.repeat(32)}`);
    expect(none.status).toBe(404);
  });

  it('health check probes the provider and records health_status', async () => {
    const ok = await req('POST', `/v1/model-credentials/${cred.id}/health-check`, {});
    expect(ok.status).toBe(200);
    expect(ok.body).toMatchObject({ health_status: 'healthy', resource_version: 2 });
    const bad = await credential('bad-key', { provider_key: 'openai', base_url: oai.url, secret: WRONG_SECRET });
    const r = await req('POST', `/v1/model-credentials/${bad.id}/health-check`, {});
    expect(r.body).toMatchObject({ health_status: 'unhealthy' });
  });
});

describe('routing, fallback and eligibility', () => {
  it('a step through an OpenAI-compatible server uses the decrypted secret', async () => {
    await profile('fast', [{ credential_key: 'local-openai', provider_model: 'local-model' }]);
    oai.behavior = { ...oai.behavior, mode: 'text', text: 'Hi from the local server.' };
    const r = await step({ routing_key: 'fast', messages: user('hi') });
    expect(textOf(r.events)).toBe('Hi from the local server.');
    expect(endOf(r.events)).toMatchObject({ provider: 'openai', model: 'local-model', stop_reason: 'end_turn' });
    expect(oai.requests.at(-1)?.headers.authorization).toBe(`Bearer ${OPENAI_SECRET}`);
  });

  it('tool calls come back assembled', async () => {
    oai.behavior = { ...oai.behavior, mode: 'tool' };
    const r = await step({ routing_key: 'fast', messages: user('weather?'), tools: [{ name: 'get_weather', description: 'w', input_schema: { type: 'object' } }] });
    expect(r.events.filter((e) => e.type === 'tool_use')).toHaveLength(2);
    expect(endOf(r.events).stop_reason).toBe('tool_use');
    oai.behavior = { ...oai.behavior, mode: 'text' };
  });

  it('falls back to the next candidate on 429, 5xx and timeouts', async () => {
    await credential('flaky', { provider_key: 'openai', base_url: oaiFlaky.url, secret: OPENAI_SECRET });
    await profile('resilient', [
      { credential_key: 'flaky', provider_model: 'local-model' },
      { credential_key: 'local-anthropic', provider_model: 'claude-sonnet-4-5' },
    ]);
    ant.behavior = { ...ant.behavior, mode: 'text', text: 'Served by the fallback.' };
    for (const mode of ['rate_limit', 'server_error', 'hang'] as const) {
      oaiFlaky.behavior = { ...oaiFlaky.behavior, mode, retryAfter: '9' };
      const before = oaiFlaky.requests.length;
      const r = await step({ routing_key: 'resilient', messages: user('hello') });
      expect(oaiFlaky.requests.length).toBe(before + 1);
      expect(textOf(r.events)).toBe('Served by the fallback.');
      expect(endOf(r.events)).toMatchObject({ provider: 'anthropic', model: 'claude-sonnet-4-5' });
    }
    // Every candidate throttled for longer than a step waits: the workspace's providers' rate
    // limits were reached (not the platform's capacity), retryable after the shortest Retry-After.
    oaiFlaky.behavior = { ...oaiFlaky.behavior, mode: 'rate_limit', retryAfter: '90' };
    ant.behavior = { ...ant.behavior, mode: 'rate_limit', retryAfter: '40' };
    const before = ant.requests.length;
    const r = await step({ routing_key: 'resilient', messages: user('hello') });
    expect(r.events).toEqual([{ type: 'error', error: expect.objectContaining({ type: 'budget.exceeded', retryable: true, retry_after_seconds: 40 }) }]);
    expect(ant.requests.length).toBe(before + 1);
    ant.behavior = { ...ant.behavior, mode: 'text' };
    oaiFlaky.behavior = { ...oaiFlaky.behavior, mode: 'text' };
  });

  it('waits out a short throttle of every candidate and tries them again, twice at most', async () => {
    await profile('throttled', [{ credential_key: 'flaky', provider_model: 'local-model' }]);
    // Throttled once (Retry-After: 1), then served: the step is served after the wait.
    oaiFlaky.behavior = { ...oaiFlaky.behavior, mode: 'rate_limit', retryAfter: '1', failTimes: 1, text: 'Served after the wait.' };
    let before = oaiFlaky.requests.length;
    const served = await step({ routing_key: 'throttled', messages: user('hello') });
    expect(textOf(served.events)).toBe('Served after the wait.');
    expect(oaiFlaky.requests.length).toBe(before + 2);
    // Throttled throughout: two waits, three tries, then the limit is the step's error.
    oaiFlaky.behavior = { ...oaiFlaky.behavior, mode: 'rate_limit', retryAfter: '1', failTimes: null };
    before = oaiFlaky.requests.length;
    const limited = await step({ routing_key: 'throttled', messages: user('hello') });
    expect(limited.events).toEqual([{ type: 'error', error: expect.objectContaining({ type: 'budget.exceeded', retryable: true, retry_after_seconds: 1 }) }]);
    expect(oaiFlaky.requests.length).toBe(before + 3);
    oaiFlaky.behavior = { ...oaiFlaky.behavior, mode: 'text' };
  });

  it("the workspace's own providers failing is never the platform's capacity: server errors, an unreachable provider, a cut stream", async () => {
    await credential('down', { provider_key: 'openai', base_url: 'http://127.0.0.1:9/v1', secret: OPENAI_SECRET });
    await profile('own-providers', [
      { credential_key: 'flaky', provider_model: 'local-model' },
      { credential_key: 'down', provider_model: 'local-model' },
    ]);
    const internal = expect.objectContaining({ type: 'runtime.internal', retryable: true, message: expect.stringMatching(/; incident reference inc_[0-9a-f]{16}$/) });
    // One candidate answers 503, the other cannot be reached.
    oaiFlaky.behavior = { ...oaiFlaky.behavior, mode: 'server_error' };
    const failed = await step({ routing_key: 'own-providers', messages: user('hello') });
    expect(failed.events).toEqual([{ type: 'error', error: internal }]);
    // One throttled, one unreachable: not every failure was a rate limit.
    oaiFlaky.behavior = { ...oaiFlaky.behavior, mode: 'rate_limit', retryAfter: '3' };
    const mixed = await step({ routing_key: 'own-providers', messages: user('hello') });
    expect(mixed.events).toEqual([{ type: 'error', error: internal }]);
    // The stream drops after the first words: no fallback (the output already went out).
    oaiFlaky.behavior = { ...oaiFlaky.behavior, mode: 'cut', text: 'one two three four five six', chunkDelayMs: 20 };
    const cut = await step({ routing_key: 'own-providers', messages: user('hello') });
    expect(textOf(cut.events)).toBe('one two ');
    expect(cut.events.at(-1)).toEqual({ type: 'error', error: internal });
    expect(JSON.stringify([failed, mixed, cut])).not.toContain('platform_capacity_reached');
    oaiFlaky.behavior = { ...oaiFlaky.behavior, mode: 'text', chunkDelayMs: 0 };
  });

  it('an auth failure is not retried, and the echoed key is scrubbed', async () => {
    await profile('broken', [{ credential_key: 'bad-key', provider_model: 'local-model' }, { credential_key: 'local-anthropic', provider_model: 'claude-sonnet-4-5' }]);
    const r = await step({ routing_key: 'broken', messages: user('hello') });
    expect(r.events).toHaveLength(1);
    expect(r.events[0]).toMatchObject({ type: 'error', error: { type: 'model.no_eligible_model', retryable: false } });
    expect(JSON.stringify(r.events)).not.toContain('WRONGSECRET');
    expect(JSON.stringify(r.events)).toContain('[redacted]');
  });

  it('REST model-steps: a slow stream is delivered whole; a client that leaves cancels the provider request', async () => {
    oai.behavior = { ...oai.behavior, mode: 'text', text: 'one two three four five six seven eight', chunkDelayMs: 60 };
    const whole = await step({ routing_key: 'fast', messages: user('slow please') });
    expect(textOf(whole.events)).toBe('one two three four five six seven eight');
    const before = oai.aborted;
    const ctl = new AbortController();
    const res = await fetch(`${p.baseUrl}/v1/organizations/workspaces/${ws}/model-steps`, {
      method: 'POST', headers: c.headers({ accept: 'text/event-stream' }, true), body: JSON.stringify({ routing_key: 'fast', messages: user('slow please') }), signal: ctl.signal,
    });
    expect(res.status).toBe(200);
    const reader = res.body?.getReader();
    await reader?.read();
    ctl.abort();
    await expect.poll(() => oai.aborted, { timeout: 5000 }).toBe(before + 1);
    oai.behavior = { ...oai.behavior, chunkDelayMs: 0 };
  });

  it('422 model.no_eligible_model when nothing fits', async () => {
    await profile('constrained', [
      { credential_key: 'local-openai', provider_model: 'local-model', constraints: { tool_use: false } },
      { credential_key: 'local-anthropic', provider_model: 'claude-opus-4', constraints: { max_output_usd_per_mtok: 20 } },
      { credential_key: 'default', provider_model: 'scripted-1', constraints: { context_window_tokens: 10 } },
      { credential_key: 'no-such-credential', provider_model: 'x' },
    ]);
    const r = await step({ routing_key: 'constrained', messages: user('hello there, a long enough message'), tools: [{ name: 't', description: 'd', input_schema: {} }] });
    expect([r.status, errType(r)]).toEqual([422, 'model.no_eligible_model']);
    const msg = (r.body as { error: { message: string } }).error.message;
    expect(msg).toContain('no tool use');
    expect(msg).toContain('over the ceiling');
    expect(msg).toContain('context window');
    expect(msg).toContain('no active credential');
    const unknown = await step({ routing_key: 'nobody-home', messages: user('x') });
    expect([unknown.status, errType(unknown)]).toEqual([422, 'model.no_eligible_model']);
    const malformed = await step({ routing_key: 'default', messages: [] });
    expect(malformed.status).toBe(400);
  });

  it('routing profiles have immutable revisions', async () => {
    const prof = await profile('revised', [{ credential_key: 'default', provider_model: 'scripted-1' }]);
    const r2 = await req('POST', `/v1/model-routing-profiles/${prof.id}/revisions`, { expected_revision_number: 1, candidates: [{ credential_key: 'local-openai', provider_model: 'local-model' }] });
    expect(r2.status).toBe(201);
    expect(r2.body).toMatchObject({ latest_revision_number: 2, candidates: [{ credential_key: 'local-openai' }] });
    const stale = await req('POST', `/v1/model-routing-profiles/${prof.id}/revisions`, { expected_revision_number: 1, candidates: [{ credential_key: 'default', provider_model: 'scripted-1' }] });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);
    const rev1 = await req('GET', `/v1/model-routing-profiles/${prof.id}/revisions/1`);
    expect(rev1.body).toMatchObject({ revision_number: 1, candidates: [{ credential_key: 'default' }] });
    const byKey = await req('GET', `/v1/organizations/workspaces/${ws}/model-routing-profiles?key=revised`);
    expect((byKey.body as { data: { id: string }[] }).data.map((d) => d.id)).toEqual([prof.id]);
    const dup = await req('POST', `/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key: 'revised', candidates: [{ credential_key: 'default', provider_model: 'x' }] });
    expect(dup.status).toBe(409);
  });

  it('a revision document above the head is no revision: 404 until a publish takes its number', async () => {
    const prof = await profile('orphan-above', [{ credential_key: 'default', provider_model: 'scripted-1' }]);
    // What a publish that died between two separate writes left before they were one script.
    const redis = connectRedis(p.redisUrl(), { name: 'models-orphan-revision' });
    try {
      await redis.set(`ap:{w:${ws}}:mrp_rev:${prof.id}:2`, JSON.stringify({
        type: 'model_routing_profile_revision', model_routing_profile_id: prof.id, workspace_id: ws, revision_number: 2,
        candidates: [{ credential_key: 'default', provider_model: 'orphan' }], created_at: new Date().toISOString(),
      }));
    } finally {
      await redis.quit();
    }
    const above = await req('GET', `/v1/model-routing-profiles/${prof.id}/revisions/2`);
    expect([above.status, errType(above)]).toEqual([404, 'validation.not_found']);
    expect((await req('GET', `/v1/model-routing-profiles/${prof.id}`)).body).toMatchObject({ latest_revision_number: 1, candidates: [{ provider_model: 'scripted-1' }] });
    const published = await req('POST', `/v1/model-routing-profiles/${prof.id}/revisions`, { expected_revision_number: 1, candidates: [{ credential_key: 'default', provider_model: 'scripted-2' }] });
    expect(published.status).toBe(201);
    expect((await req('GET', `/v1/model-routing-profiles/${prof.id}/revisions/2`)).body).toMatchObject({ revision_number: 2, candidates: [{ provider_model: 'scripted-2' }] });
  });
});

describe('rotation and revocation', () => {
  it('rotate: a new generation becomes active and is used at once', async () => {
    const list = await req('GET', `/v1/organizations/workspaces/${ws}/model-credentials?key=local-openai`);
    const cred = (list.body as { data: { id: string; active_generation_number: number }[] }).data[0];
    if (!cred) throw new Error('missing');
    oai.behavior = { ...oai.behavior, apiKey: OPENAI_SECRET_2 };
    const rot = await req('POST', `/v1/model-credentials/${cred.id}/rotate`, { secret: OPENAI_SECRET_2, expected_generation_number: cred.active_generation_number });
    expect(rot.status).toBe(200);
    expect(rot.body).toMatchObject({ active_generation_number: 2, health_status: 'unknown' });
    const r = await step({ routing_key: 'fast', messages: user('after rotation') });
    expect(endOf(r.events).provider).toBe('openai');
    expect(oai.requests.at(-1)?.headers.authorization).toBe(`Bearer ${OPENAI_SECRET_2}`);
    const stale = await req('POST', `/v1/model-credentials/${cred.id}/rotate`, { secret: 'sk-another-secret', expected_generation_number: 1 });
    expect([stale.status, errType(stale)]).toEqual([409, 'validation.conflict']);
  });

  it('concurrent rotations: losers get 409 and a winning secret is the one used', async () => {
    const created = await credential('race', { provider_key: 'openai', base_url: oaiFlaky.url, secret: OPENAI_SECRET });
    await profile('race', [{ credential_key: 'race', provider_model: 'local-model' }]);
    const secrets = ['sk-race-AAAAAAAAAAAAAAAAAAAA', 'sk-race-BBBBBBBBBBBBBBBBBBBB', 'sk-race-CCCCCCCCCCCCCCCCCCCC'];
    SECRETS.push(...secrets);
    const results = await Promise.all(secrets.map((secret) => req('POST', `/v1/model-credentials/${created.id}/rotate`, { secret })));
    const won = results.flatMap((r, i) => (r.status === 200 ? [secrets[i]] : []));
    expect(won.length).toBeGreaterThanOrEqual(1);
    for (const r of results) expect([200, 409]).toContain(r.status);
    const head = (await req('GET', `/v1/model-credentials/${created.id}`)).body as { active_generation_number: number };
    expect(head.active_generation_number).toBe(1 + won.length);
    oaiFlaky.behavior = { ...oaiFlaky.behavior, mode: 'text', apiKey: null };
    const r = await step({ routing_key: 'race', messages: user('who won?') });
    expect(endOf(r.events).provider).toBe('openai');
    expect(secrets.map((x) => `Bearer ${x}`)).toContain(oaiFlaky.requests.at(-1)?.headers.authorization);
    oaiFlaky.behavior = { ...oaiFlaky.behavior, apiKey: OPENAI_SECRET };
  });

  it('revoke: the credential stops serving; the key can be reused', async () => {
    const cred = await credential('short-lived', { provider_key: 'openai', base_url: oai.url, secret: OPENAI_SECRET_2 });
    await profile('short', [{ credential_key: 'short-lived', provider_model: 'local-model' }]);
    const rv = await req('POST', `/v1/model-credentials/${cred.id}/revoke`, {});
    expect(rv.body).toMatchObject({ status: 'revoked', revoked_at: expect.any(String) });
    const again = await req('POST', `/v1/model-credentials/${cred.id}/revoke`, {});
    expect(again.status).toBe(200);
    const rotate = await req('POST', `/v1/model-credentials/${cred.id}/rotate`, { secret: 'sk-x-1234567890' });
    expect([rotate.status, errType(rotate)]).toEqual([409, 'runtime.invalid_transition']);
    const r = await step({ routing_key: 'short', messages: user('x') });
    expect([r.status, errType(r)]).toEqual([422, 'model.no_eligible_model']);
    await credential('short-lived', { provider_key: 'openai', base_url: oai.url, secret: OPENAI_SECRET_2 });
    const r2 = await step({ routing_key: 'short', messages: user('x') });
    expect(r2.status).toBe(200);
  });
});

describe('the gateway service (the entry point of the runner gateway), usage and budgets', () => {
  let redis: Redis;
  let models: ModelsModule;
  beforeAll(() => {
    redis = connectRedis(p.redisUrl(), { name: 'models-test' });
    const key = readFileSync(join(p.dataDir, 'master.key'), 'utf8').trim();
    models = createModelsModule({
      redis, docs: new DocumentStore(redis), secretBox: new SecretBox(Buffer.from(key, 'hex')), log: createLogger({ name: 'models-test', level: 'silent' }),
      config: { providerTimeoutMs: 1500, pricesFile },
    });
  });
  afterAll(async () => {
    await redis?.quit();
  });

  async function run(request: ModelRequest, context: Parameters<ModelsModule['gateway']['runModelStep']>[3], signal = new AbortController().signal) {
    const out: ModelStreamEvent[] = [];
    for await (const e of models.gateway.runModelStep(ws, request, signal, context)) out.push(e);
    seenBodies.push(JSON.stringify(out));
    return out;
  }

  it('usage sums match across Run, thread, Session and workspace', async () => {
    const session = newId('session');
    const thread = newId('thread');
    const [run1, run2] = [newId('run'), newId('run')];
    const before = (await req('GET', `/v1/organizations/workspaces/${ws}/usage`)).body as { total: { usage: TokenUsage; steps: number } };
    const usages: TokenUsage[] = [];
    for (const [i, runId] of [run1, run1, run2].entries()) {
      const events = await run({ routing_key: i === 1 ? 'fast' : 'default', messages: user(`step ${i}`), tools: [] }, { session_id: session, thread_id: thread, run_id: runId });
      usages.push(endOf(events).usage);
    }
    // A retried report of the same step counts once.
    const dupEvents = await run({ routing_key: 'default', messages: user('dup'), tools: [] }, { session_id: session, thread_id: thread, run_id: run2, step_id: 'step-fixed' });
    usages.push(endOf(dupEvents).usage);
    await run({ routing_key: 'default', messages: user('dup'), tools: [] }, { session_id: session, thread_id: thread, run_id: run2, step_id: 'step-fixed' });
    const sum = (list: TokenUsage[]) => list.reduce((a, u) => ({
      input_tokens: a.input_tokens + u.input_tokens, cached_input_tokens: a.cached_input_tokens + u.cached_input_tokens,
      cache_write_input_tokens: a.cache_write_input_tokens + u.cache_write_input_tokens, output_tokens: a.output_tokens + u.output_tokens,
      reasoning_output_tokens: a.reasoning_output_tokens + u.reasoning_output_tokens, total_tokens: a.total_tokens + u.total_tokens,
    }));
    const s = await req('GET', `/v1/sessions/${session}/usage`);
    expect(s.status).toBe(200);
    expect(s.body).toMatchObject({ type: 'session_model_usage', session_id: session, summary: { usage: sum(usages), steps: 4 } });
    const t = await req('GET', `/v1/sessions/${session}/usage?thread_id=${thread}`);
    expect((t.body as { summary: { usage: TokenUsage } }).summary.usage).toEqual(sum(usages));
    const r1 = await req('GET', `/v1/sessions/${session}/usage?run_id=${run1}`);
    expect((r1.body as { summary: { usage: TokenUsage; steps: number } }).summary).toMatchObject({ usage: sum(usages.slice(0, 2)), steps: 2 });
    const r2 = await req('GET', `/v1/sessions/${session}/usage?run_id=${run2}`);
    expect((r2.body as { summary: { usage: TokenUsage } }).summary.usage).toEqual(sum(usages.slice(2)));
    const after = (await req('GET', `/v1/organizations/workspaces/${ws}/usage`)).body as { total: { usage: TokenUsage; steps: number; list_cost: { amount: number } }; current_day: { summary: { steps: number } } };
    expect(after.total.steps - before.total.steps).toBe(4);
    expect(after.total.usage.total_tokens - before.total.usage.total_tokens).toBe(sum(usages).total_tokens);
    expect(after.total.usage.cached_input_tokens - before.total.usage.cached_input_tokens).toBe(sum(usages).cached_input_tokens);
    expect(after.current_day.summary.steps).toBe(after.total.steps);
    // local-model is priced by the platform's MODEL_PRICES_FILE: the OpenAI step has a list cost.
    expect(after.total.list_cost.amount).toBeGreaterThan(0);
    const otherWs = await p.root.request('GET', `/v1/sessions/${newId('session')}/usage`);
    expect(otherWs.status).toBe(404);
  });

  it('daily workspace usage: one entry per UTC day ending today, today holding the whole day counter', async () => {
    const today = new Date().toISOString().slice(0, 10);
    const current = (await req('GET', `/v1/organizations/workspaces/${ws}/usage`)).body as { current_day: { summary: { steps: number; usage: TokenUsage } } };
    const r = await req('GET', `/v1/organizations/workspaces/${ws}/usage/daily?days=3`);
    expect(r.status).toBe(200);
    const body = r.body as { type: string; days: { date: string; summary: { steps: number; usage: TokenUsage } }[] };
    expect(body.type).toBe('workspace_model_usage_daily');
    expect(body.days.map((d) => d.date)).toHaveLength(3);
    expect(body.days[2]?.date).toBe(today);
    expect(body.days[2]?.summary.steps).toBeGreaterThanOrEqual(current.current_day.summary.steps);
    expect(body.days[2]?.summary.steps).toBeGreaterThan(0);
    expect(body.days[0]!.date < body.days[1]!.date && body.days[1]!.date < today).toBe(true);
    expect(((await req('GET', `/v1/organizations/workspaces/${ws}/usage/daily`)).body as { days: unknown[] }).days).toHaveLength(30);
    for (const q of ['days=0', 'days=367', 'days=abc', 'window=3']) {
      const bad = await req('GET', `/v1/organizations/workspaces/${ws}/usage/daily?${q}`);
      expect(bad.status, q).toBe(400);
      expect((bad.body as { error: { type: string } }).error.type, q).toBe('validation.malformed');
    }
  });

  it('a Session budget breach stops the turn at its next step', async () => {
    await profile('priced', [{ credential_key: 'default', provider_model: 'scripted-priced' }]);
    const session = newId('session');
    const budget = { max_list_cost: { amount: 0.01 } };
    // scripted-priced costs 1000 USD per million tokens: the first step spends more than 0.01 USD.
    const first = await run({ routing_key: 'priced', messages: user('a fairly long message to spend the whole budget at once'), tools: [] }, { session_id: session, session_budget: budget });
    expect(endOf(first).stop_reason).toBe('end_turn');
    const second = await run({ routing_key: 'priced', messages: user('more'), tools: [] }, { session_id: session, session_budget: budget });
    expect(second).toEqual([{ type: 'error', error: { type: 'budget.exceeded', message: expect.stringContaining('Session budget'), retryable: false } }]);
    await expect(models.budgets.check({ workspace_id: ws, session_id: session, session_budget: budget })).rejects.toMatchObject({ type: 'budget.exceeded', status: 429 });
    await expect(models.budgets.check({ workspace_id: ws, session_id: session, session_budget: { max_list_cost: { amount: 100 } } })).resolves.toBeUndefined();
  });

  it('a real Session: its budget is read from the Session document, usage readable at once', async () => {
    const agent = await req('POST', '/v1/agents', { name: 'priced agent', model: 'priced' });
    expect(agent.status).toBe(201);
    const env = await req('POST', '/v1/environments', { name: 'env', image: 'debian:bookworm' });
    expect(env.status).toBe(201);
    const sess = await req('POST', '/v1/sessions', {
      agent: (agent.body as { id: string }).id, environment_id: (env.body as { id: string }).id, budget: { max_list_cost: { amount: 0.01 } },
    });
    expect(sess.status).toBe(201);
    const sessionId = (sess.body as { id: string }).id;
    const empty = await req('GET', `/v1/sessions/${sessionId}/usage`);
    expect(empty.status).toBe(200);
    expect(empty.body).toMatchObject({ summary: { steps: 0, usage: { total_tokens: 0 } } });
    const first = await run({ routing_key: 'priced', messages: user('a fairly long message to spend the whole budget at once'), tools: [] }, { session_id: sessionId });
    expect(endOf(first).stop_reason).toBe('end_turn');
    const second = await run({ routing_key: 'priced', messages: user('more'), tools: [] }, { session_id: sessionId });
    expect(second[0]).toMatchObject({ type: 'error', error: { type: 'budget.exceeded' } });
    // Another workspace's step cannot bill this Session.
    const foreign = await p.root.request('POST', `/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { body: { name: 'other' } });
    const out: ModelStreamEvent[] = [];
    for await (const e of models.gateway.runModelStep((foreign.body as { id: string }).id, { routing_key: 'default', messages: user('x'), tools: [] }, new AbortController().signal, { session_id: sessionId })) out.push(e);
    expect(out).toEqual([{ type: 'error', error: expect.objectContaining({ type: 'validation.not_found' }) }]);
    // A runner frame carries the request as untyped JSON: it is validated.
    const bad: ModelStreamEvent[] = [];
    for await (const e of models.gateway.runModelStep(ws, { routing_key: 'default', messages: 'nope' }, new AbortController().signal)) bad.push(e);
    expect(bad).toEqual([{ type: 'error', error: expect.objectContaining({ type: 'validation.malformed', retryable: false }) }]);
  });

  it('cancellation propagates from the service to the provider request', async () => {
    oai.behavior = { ...oai.behavior, mode: 'text', text: 'a b c d e f g h i j k l m n', chunkDelayMs: 100 };
    const before = oai.aborted;
    const ctl = new AbortController();
    const out: ModelStreamEvent[] = [];
    for await (const e of models.gateway.runModelStep(ws, { routing_key: 'fast', messages: user('x'), tools: [] }, ctl.signal)) {
      out.push(e);
      if (out.length === 2) ctl.abort();
    }
    expect(out.at(-1)).toMatchObject({ type: 'end', stop_reason: 'canceled' });
    await expect.poll(() => oai.aborted, { timeout: 3000 }).toBe(before + 1);
    oai.behavior = { ...oai.behavior, chunkDelayMs: 0 };
  });

  it('runner frames (ModelStreams): deltas then one model.end, cancel and close abort the provider, no secret in any frame', async () => {
    const frames: ModelFrame[] = [];
    const streams = new ModelStreams(models.gateway, (f) => { frames.push(f); }, createLogger({ name: 'x', level: 'silent' }), { maxStreams: 2 });
    oai.behavior = { ...oai.behavior, mode: 'tool', chunkDelayMs: 0 };
    await streams.open(ws, 'ms-1', { routing_key: 'fast', messages: user('weather'), tools: [{ name: 'get_weather', description: 'w', input_schema: {} }] }, { run_id: newId('run') });
    const mine = frames.filter((f) => f.stream_id === 'ms-1');
    expect(mine.at(-1)).toMatchObject({ type: 'model.end', event: { type: 'end', stop_reason: 'tool_use' } });
    expect(mine.slice(0, -1).every((f) => f.type === 'model.delta')).toBe(true);
    expect(mine.filter((f) => f.event.type === 'tool_use')).toHaveLength(2);

    oai.behavior = { ...oai.behavior, mode: 'text', text: 'a b c d e f g h i j', chunkDelayMs: 80 };
    const before = oai.aborted;
    const slow1 = streams.open(ws, 'ms-2', { routing_key: 'fast', messages: user('x') });
    const slow2 = streams.open(ws, 'ms-3', { routing_key: 'fast', messages: user('y') });
    await streams.open(ws, 'ms-4', { routing_key: 'fast', messages: user('z') });
    expect(frames.find((f) => f.stream_id === 'ms-4')).toMatchObject({ type: 'model.end', event: { type: 'error', error: { type: 'model.platform_capacity_reached' } } });
    await expect.poll(() => frames.some((f) => f.stream_id === 'ms-2' && f.event.type === 'text_delta'), { timeout: 3000 }).toBe(true);
    expect(streams.cancel('ms-2')).toBe(true);
    streams.closeAll();
    await Promise.all([slow1, slow2]);
    for (const id of ['ms-2', 'ms-3']) {
      expect(frames.filter((f) => f.stream_id === id && f.type === 'model.end')).toEqual([
        expect.objectContaining({ event: expect.objectContaining({ type: 'end', stop_reason: 'canceled' }) }),
      ]);
    }
    await expect.poll(() => oai.aborted, { timeout: 3000 }).toBe(before + 2);
    expect(streams.size).toBe(0);
    oai.behavior = { ...oai.behavior, chunkDelayMs: 0 };
    const text = JSON.stringify(frames);
    seenBodies.push(text);
    for (const secret of SECRETS) expect(text).not.toContain(secret);
  });

  it('workspace budget: 429 budget.exceeded, with Retry-After only for a periodic budget', async () => {
    const put = await req('PUT', `/v1/organizations/workspaces/${ws}/budget`, { max_list_cost: { amount: 0.000001 }, period: 'lifetime' });
    expect(put.status).toBe(200);
    const lifetime = await step({ routing_key: 'default', messages: user('x') });
    expect([lifetime.status, errType(lifetime), lifetime.retryAfter]).toEqual([429, 'budget.exceeded', null]);
    await req('PUT', `/v1/organizations/workspaces/${ws}/budget`, { max_list_cost: { amount: 0.000001 }, period: 'day' });
    const daily = await step({ routing_key: 'default', messages: user('x') });
    expect([daily.status, errType(daily)]).toEqual([429, 'budget.exceeded']);
    const secs = Number(daily.retryAfter);
    expect(Number.isInteger(secs) && secs >= 1 && secs <= 86_400).toBe(true);
    const usage = await req('GET', `/v1/organizations/workspaces/${ws}/usage`);
    expect(usage.body).toMatchObject({ budget: { period: 'day', max_list_cost: { amount: 0.000001, currency: 'USD' } } });
    const del = await req('DELETE', `/v1/organizations/workspaces/${ws}/budget`);
    expect(del.status).toBe(200);
    const ok = await step({ routing_key: 'default', messages: user('x') });
    expect(ok.status).toBe(200);
    const bad = await req('PUT', `/v1/organizations/workspaces/${ws}/budget`, { max_list_cost: { amount: -1 }, period: 'day' });
    expect(bad.status).toBe(400);
  });

  it('metrics count served steps, fallbacks and refusals', async () => {
    const text = await fetch(`${p.baseUrl}/metrics`).then((r) => r.text());
    expect(text).toMatch(/agentplane_model_steps_total\{provider="anthropic",outcome="served"\} \d+/);
    expect(text).toMatch(/agentplane_model_steps_total\{provider="openai",outcome="fallback"\} [1-9]/);
    expect(text).toMatch(/agentplane_model_steps_total\{provider="none",outcome="no_eligible_model"\} [1-9]/);
    expect(text).toMatch(/agentplane_model_time_to_first_event_seconds_bucket\{le="[0-9.]+",provider="scripted"\}/);
  });

  it('secrets appear in no response, no service event, no log line, and nowhere in Redis in the clear', async () => {
    const all = seenBodies.join('\n');
    const log = readFileSync(p.logFile, 'utf8');
    expect(log.length).toBeGreaterThan(0);
    for (const s of SECRETS) {
      expect(all).not.toContain(s);
      expect(log).not.toContain(s);
    }
    let cursor = '0';
    const values: string[] = [];
    do {
      const [next, batch] = await redis.scan(cursor, 'COUNT', 500);
      cursor = next;
      for (const k of batch) {
        const type = await redis.type(k);
        if (type === 'string') values.push((await redis.get(k)) ?? '');
        if (type === 'hash') values.push(JSON.stringify(await redis.hgetall(k)));
      }
    } while (cursor !== '0');
    const dump = values.join('\n');
    expect(dump).toContain('mcred_');
    for (const s of SECRETS) expect(dump).not.toContain(s);
  });
});
