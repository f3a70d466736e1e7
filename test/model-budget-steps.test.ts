import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import type { ModelStreamEvent } from '@agentplane/protocol';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { postModelStep, stepEvents } from './harness/model-steps.js';
import { startAnthropicServer, startOpenAiServer, type ProviderServer } from './fixtures/provider-servers.js';

/**
 * Budgets hold against steps running at once (each step reserves its estimate), and a step that
 * ends before its `end` (the caller left, the provider failed mid-stream) is still charged.
 */
let p: Platform;
let ws: string;
let c: HttpClient;
let oai: ProviderServer;
let ant: ProviderServer;
const servers: Server[] = [];

/** A provider that streams `chunks` (SSE lines), then an in-stream error. */
function failsAfterOutput(chunks: string[], error: string): Promise<string> {
  const s = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (const c of chunks) res.write(c);
      res.end(error);
    });
  });
  servers.push(s);
  return new Promise((r) => s.listen(0, '127.0.0.1', () => r(`http://127.0.0.1:${(s.address() as AddressInfo).port}`)));
}

const user = (text: string) => [{ role: 'user', content: [{ type: 'text', text }] }];
const script = (rules: unknown) => '```scripted\n' + JSON.stringify({ rules }) + '\n```';

async function step(body: unknown): Promise<{ status: number; events: ModelStreamEvent[] }> {
  const r = await postModelStep(p.baseUrl, c, ws, body);
  if (r.status !== 200) return { status: r.status, events: [] };
  return { status: 200, events: stepEvents(r.text) };
}

type Totals = { steps: number; list_cost: { amount: number }; usage: { input_tokens: number; output_tokens: number } };
async function usage(): Promise<Totals> {
  const r = await c.request('GET', `/v1/organizations/workspaces/${ws}/usage`);
  return (r.body as { total: Totals }).total;
}

beforeAll(async () => {
  [oai, ant] = await Promise.all([startOpenAiServer({}), startAnthropicServer({})]);
  const pricesFile = join(mkdtempSync(join(tmpdir(), 'agentplane-budget-steps-')), 'prices.json');
  writeFileSync(pricesFile, JSON.stringify({ scripted: { 'scripted-priced': { input: 1000, output: 1000 } }, openai: { 'local-model': { input: 1000, output: 1000 } } }));
  p = await startPlatform({ env: { MODEL_PRICES_FILE: pricesFile, MODEL_PROVIDER_TIMEOUT_MS: '1500' } });
  const w = await p.root.request('POST', `/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { body: { name: 'budget-steps' } });
  ws = (w.body as { id: string }).id;
  c = p.root.with({ workspaceId: ws });
  const post = async (path: string, body: unknown) => expect((await c.request('POST', `/v1/organizations/workspaces/${ws}/${path}`, { body })).status).toBe(201);
  await post('model-routing-profiles', { key: 'priced', candidates: [{ credential_key: 'default', provider_model: 'scripted-priced' }] });
  await post('model-credentials', { key: 'loc', provider_key: 'openai', base_url: oai.url });
  await post('model-routing-profiles', { key: 'oai', candidates: [{ credential_key: 'loc', provider_model: 'local-model' }] });
  const oaiData = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
  const oaiFails = await failsAfterOutput(['one ', 'two ', 'three ', 'four'].map((w) => oaiData({ model: 'local-model', choices: [{ delta: { content: w } }] })), oaiData({ error: { message: 'internal error' } }));
  await post('model-credentials', { key: 'oaifail', provider_key: 'openai', base_url: `${oaiFails}/v1` });
  await post('model-routing-profiles', { key: 'oaifail', candidates: [{ credential_key: 'oaifail', provider_model: 'local-model' }] });
  const antEvent = (type: string, o: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...o })}\n\n`;
  const antFails = await failsAfterOutput([
    antEvent('message_start', { message: { model: 'claude-local', usage: { input_tokens: 20, cache_creation_input_tokens: 3, cache_read_input_tokens: 10, output_tokens: 1 } } }),
    antEvent('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
    ...['one ', 'two ', 'three ', 'four'].map((text) => antEvent('content_block_delta', { index: 0, delta: { type: 'text_delta', text } })),
  ], antEvent('error', { error: { type: 'overloaded_error', message: 'Overloaded' } }));
  await post('model-credentials', { key: 'antfail', provider_key: 'anthropic', base_url: antFails, secret: 'sk-ant-local-0123456789abcdef' });
  await post('model-routing-profiles', { key: 'antfail', candidates: [{ credential_key: 'antfail', provider_model: 'claude-local' }] });
  await post('model-credentials', { key: 'ant', provider_key: 'anthropic', base_url: ant.url, secret: 'sk-ant-local-0123456789abcdef' });
  await post('model-routing-profiles', { key: 'ant', candidates: [{ credential_key: 'ant', provider_model: 'claude-local' }] });
}, 120_000);
afterAll(async () => {
  await p?.stop();
  await Promise.all([oai?.close(), ant?.close()]);
  for (const s of servers) {
    s.closeAllConnections();
    s.close();
  }
});

describe('budgets hold against concurrent steps', () => {
  it('steps running at once cannot all pass a budget: the limit is overshot by one step at most, and the reservations go when the steps end', async () => {
    const system = script([{ then: [{ sleep_ms: 500 }, { reply: 'ok done' }] }]);
    const before = await usage();
    expect((await step({ routing_key: 'priced', system, messages: user('hi'), max_output_tokens: 10 })).status).toBe(200);
    const spent = (await usage()).list_cost.amount;
    const oneCost = spent - before.list_cost.amount;
    const limit = spent + oneCost * 1.5;
    expect((await c.request('PUT', `/v1/organizations/workspaces/${ws}/budget`, { body: { max_list_cost: { amount: limit }, period: 'lifetime' } })).status).toBe(200);
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => step({ routing_key: 'priced', system, messages: user(`go ${i}`), max_output_tokens: 10 })));
    const served = results.filter((r) => r.status === 200 && r.events.at(-1)?.type === 'end').length;
    expect(served).toBeGreaterThanOrEqual(1);
    expect(served).toBeLessThanOrEqual(2);
    expect(results.filter((r) => r.status === 429)).toHaveLength(20 - served);
    const after = await usage();
    expect(after.list_cost.amount - limit).toBeLessThanOrEqual(oneCost * 1.01);
    // Every step ended: nothing is held any more, so a budget raised by one step admits one.
    expect((await c.request('PUT', `/v1/organizations/workspaces/${ws}/budget`, { body: { max_list_cost: { amount: after.list_cost.amount + oneCost * 0.5 }, period: 'lifetime' } })).status).toBe(200);
    expect((await step({ routing_key: 'priced', system, messages: user('again'), max_output_tokens: 10 })).status).toBe(200);
    expect((await step({ routing_key: 'priced', system, messages: user('over'), max_output_tokens: 10 })).status).toBe(429);
    await c.request('DELETE', `/v1/organizations/workspaces/${ws}/budget`);
  }, 60_000);
});

describe('a step that ends before its end event is charged', () => {
  it('the client leaves after the output and before `end`: the output is recorded (estimated)', async () => {
    const reply = 'word '.repeat(200).trim();
    const before = await usage();
    const ctl = new AbortController();
    const res = await fetch(`${p.baseUrl}/v1/organizations/workspaces/${ws}/model-steps`, {
      method: 'POST', headers: c.headers({ accept: 'text/event-stream' }, true), signal: ctl.signal,
      body: JSON.stringify({ routing_key: 'priced', system: script([{ then: [{ reply }, { sleep_ms: 30_000 }] }]), messages: user('hi') }),
    });
    expect(res.status).toBe(200);
    const reader = (res.body as ReadableStream<Uint8Array>).getReader();
    const dec = new TextDecoder();
    let text = '';
    while ((text.match(/event: text_delta/g) ?? []).length < 200) {
      const { value, done } = await reader.read();
      if (done) break;
      text += dec.decode(value);
    }
    ctl.abort();
    const after = await waitFor('the step recorded', async () => {
      const u = await usage();
      return u.steps > before.steps ? u : undefined;
    }, 10_000);
    expect(after.steps).toBe(before.steps + 1);
    // About the emitted characters / 4.
    expect(after.usage.output_tokens - before.usage.output_tokens).toBeGreaterThanOrEqual(Math.ceil(reply.length / 4));
    expect(after.list_cost.amount).toBeGreaterThan(before.list_cost.amount);
  }, 30_000);

  it('the provider fails after output (OpenAI-compatible, no usage yet): the estimate is recorded', async () => {
    const before = await usage();
    const r = await step({ routing_key: 'oaifail', messages: user('hi there') });
    expect(r.events.filter((e) => e.type === 'text_delta')).toHaveLength(4);
    expect(r.events.at(-1)).toMatchObject({ type: 'error', error: { type: 'runtime.internal', retryable: true } });
    const after = await usage();
    expect(after.steps).toBe(before.steps + 1);
    expect(after.usage.input_tokens).toBeGreaterThan(before.usage.input_tokens);
    // 'one two three four': 18 characters, 5 tokens estimated.
    expect(after.usage.output_tokens - before.usage.output_tokens).toBe(5);
    expect(after.list_cost.amount).toBeGreaterThan(before.list_cost.amount);
  }, 30_000);

  it('the provider fails after output (Anthropic): its message_start usage is what is recorded for the input', async () => {
    const before = await usage();
    const r = await step({ routing_key: 'antfail', messages: user('hi there') });
    expect(r.events.filter((e) => e.type === 'text_delta')).toHaveLength(4);
    expect(r.events.at(-1)?.type).toBe('error');
    const after = await usage();
    expect(after.steps).toBe(before.steps + 1);
    // message_start: 20 input + 3 cache writes + 10 cache reads; the output at least the emitted characters / 4.
    expect(after.usage.input_tokens - before.usage.input_tokens).toBe(33);
    expect(after.usage.output_tokens - before.usage.output_tokens).toBe(5);
  }, 30_000);
});
