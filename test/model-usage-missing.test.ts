import { mkdtempSync, writeFileSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import type { ModelStreamEvent } from '@agentplane/protocol';
import { startPlatform, type Platform } from './harness/platform.js';
import { postModelStep, stepEvents } from './harness/model-steps.js';

/**
 * A provider that serves a step without reporting its usage (an OpenAI-compatible server that
 * ignores `stream_options.include_usage`, an Anthropic-compatible proxy that leaves `usage` out)
 * does not make the step free: it is charged the estimate, as a step cut before its `end` is.
 */
let p: Platform;
let ws: string;
let c: HttpClient;
const servers: Server[] = [];

/** A provider that answers every request with `frames` (SSE text) and ends the response. */
function serves(frames: string[]): Promise<string> {
  const s = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      for (const f of frames) res.write(f);
      res.end();
    });
  });
  servers.push(s);
  return new Promise((r) => s.listen(0, '127.0.0.1', () => r(`http://127.0.0.1:${(s.address() as AddressInfo).port}`)));
}

const user = (text: string) => [{ role: 'user', content: [{ type: 'text', text }] }];
const WORDS = ['one ', 'two ', 'three ', 'four'];

async function step(body: unknown): Promise<ModelStreamEvent[]> {
  const r = await postModelStep(p.baseUrl, c, ws, body);
  expect(r.status).toBe(200);
  return stepEvents(r.text);
}

type Totals = { steps: number; unpriced_steps: number; list_cost: { amount: number }; usage: { input_tokens: number; output_tokens: number; total_tokens: number } };
async function usage(): Promise<Totals> {
  const r = await c.request('GET', `/v1/organizations/workspaces/${ws}/usage`);
  return (r.body as { total: Totals }).total;
}

beforeAll(async () => {
  const oaiData = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
  const oai = await serves([
    ...WORDS.map((w) => oaiData({ model: 'local-model', choices: [{ index: 0, delta: { content: w }, finish_reason: null }] })),
    oaiData({ model: 'local-model', choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] }),
    'data: [DONE]\n\n',
  ]);
  const antEvent = (type: string, o: Record<string, unknown>) => `event: ${type}\ndata: ${JSON.stringify({ type, ...o })}\n\n`;
  const ant = await serves([
    antEvent('message_start', { message: { model: 'claude-local' } }),
    antEvent('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
    ...WORDS.map((text) => antEvent('content_block_delta', { index: 0, delta: { type: 'text_delta', text } })),
    antEvent('content_block_stop', { index: 0 }),
    antEvent('message_delta', { delta: { stop_reason: 'end_turn' } }),
    antEvent('message_stop', {}),
  ]);
  // Cut mid-stream, after output, having reported no usage at all.
  const antCut = await serves([
    antEvent('message_start', { message: { model: 'claude-local' } }),
    antEvent('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
    ...WORDS.map((text) => antEvent('content_block_delta', { index: 0, delta: { type: 'text_delta', text } })),
    antEvent('error', { error: { type: 'overloaded_error', message: 'Overloaded' } }),
  ]);
  const pricesFile = join(mkdtempSync(join(tmpdir(), 'agentplane-usage-missing-')), 'prices.json');
  writeFileSync(pricesFile, JSON.stringify({ openai: { 'local-model': { input: 1000, output: 1000 } }, anthropic: { 'claude-local': { input: 1000, output: 1000 } } }));
  p = await startPlatform({ env: { MODEL_PRICES_FILE: pricesFile, MODEL_PROVIDER_TIMEOUT_MS: '1500' } });
  const w = await p.root.request('POST', `/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { body: { name: 'usage-missing' } });
  ws = (w.body as { id: string }).id;
  c = p.root.with({ workspaceId: ws });
  const post = async (path: string, body: unknown) => expect((await c.request('POST', `/v1/organizations/workspaces/${ws}/${path}`, { body })).status).toBe(201);
  await post('model-credentials', { key: 'oai', provider_key: 'openai', base_url: `${oai}/v1` });
  await post('model-routing-profiles', { key: 'oai', candidates: [{ credential_key: 'oai', provider_model: 'local-model' }] });
  await post('model-credentials', { key: 'ant', provider_key: 'anthropic', base_url: ant, secret: 'sk-ant-local-0123456789abcdef' });
  await post('model-routing-profiles', { key: 'ant', candidates: [{ credential_key: 'ant', provider_model: 'claude-local' }] });
  await post('model-credentials', { key: 'antcut', provider_key: 'anthropic', base_url: antCut, secret: 'sk-ant-local-0123456789abcdef' });
  await post('model-routing-profiles', { key: 'antcut', candidates: [{ credential_key: 'antcut', provider_model: 'claude-local' }] });
}, 120_000);
afterAll(async () => {
  await p?.stop();
  for (const s of servers) {
    s.closeAllConnections();
    s.close();
  }
});

describe('a served step whose provider reported no usage is charged the estimate', () => {
  for (const key of ['oai', 'ant']) {
    it(`${key === 'oai' ? 'OpenAI-compatible, no usage chunk' : 'Anthropic, no usage in message_start or message_delta'}: input estimated, output the emitted characters / 4, priced`, async () => {
      const before = await usage();
      const events = await step({ routing_key: key, messages: user('hi there, how are you today?') });
      expect(events.filter((e) => e.type === 'text_delta')).toHaveLength(4);
      const end = events.at(-1);
      expect(end).toMatchObject({ type: 'end', stop_reason: 'end_turn' });
      const after = await usage();
      expect(after.steps).toBe(before.steps + 1);
      expect(after.unpriced_steps).toBe(before.unpriced_steps);
      const input = after.usage.input_tokens - before.usage.input_tokens;
      const output = after.usage.output_tokens - before.usage.output_tokens;
      expect(input).toBeGreaterThan(0);
      // 'one two three four': 18 characters, 5 tokens estimated.
      expect(output).toBe(5);
      expect(after.usage.total_tokens - before.usage.total_tokens).toBe(input + output);
      expect(after.list_cost.amount).toBeGreaterThan(before.list_cost.amount);
      // The end event tells the caller what the step was charged.
      expect(end).toMatchObject({ usage: { input_tokens: input, output_tokens: output, total_tokens: input + output } });
    }, 30_000);
  }

  it('Anthropic, cut after output with no usage reported: the input is estimated, not charged as zero', async () => {
    const before = await usage();
    const events = await step({ routing_key: 'antcut', messages: user('hi there, how are you today?') });
    expect(events.filter((e) => e.type === 'text_delta')).toHaveLength(4);
    expect(events.at(-1)?.type).toBe('error');
    const after = await usage();
    expect(after.steps).toBe(before.steps + 1);
    expect(after.usage.input_tokens - before.usage.input_tokens).toBeGreaterThan(0);
    expect(after.usage.output_tokens - before.usage.output_tokens).toBe(5);
    expect(after.list_cost.amount).toBeGreaterThan(before.list_cost.amount);
  }, 30_000);
});
