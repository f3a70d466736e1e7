import { readFileSync } from 'node:fs';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { createLogger, SecretBox } from '@agentplane/core';
import { connectRedis, DocumentStore, type Redis } from '@agentplane/store';
import type { ModelStreamEvent } from '@agentplane/protocol';
import { createModelsModule } from '@agentplane/api';
import { startPlatform, type Platform } from './harness/platform.js';
import { postModelStep, stepEvents } from './harness/model-steps.js';

/**
 * Limits of a model step's stream: keep-alives do not keep a silent provider alive, a step has
 * an overall deadline, the REST stream follows its reader's pace, and a provider's error body is
 * read only so far.
 */
let p: Platform;
let ws: string;
let c: HttpClient;
const servers: Server[] = [];
const user = (text: string) => [{ role: 'user', content: [{ type: 'text', text }] }];

function serve(handle: (res: ServerResponse) => void): Promise<string> {
  const s = createServer((req, res) => {
    req.resume();
    req.on('end', () => handle(res));
  });
  servers.push(s);
  return new Promise((r) => s.listen(0, '127.0.0.1', () => r(`http://127.0.0.1:${(s.address() as AddressInfo).port}`)));
}

/** Streams `write` every 100 ms until the client goes. */
function every100ms(res: ServerResponse, first: string[], write: () => string): void {
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  for (const f of first) res.write(f);
  const t = setInterval(() => res.write(write()), 100);
  res.on('close', () => clearInterval(t));
}

const antEvent = (type: string, o: Record<string, unknown> = {}) => `event: ${type}\ndata: ${JSON.stringify({ type, ...o })}\n\n`;
const oaiData = (o: unknown) => `data: ${JSON.stringify(o)}\n\n`;
const ANT_START = [
  antEvent('message_start', { message: { model: 'claude-x', usage: { input_tokens: 10, output_tokens: 1 } } }),
  antEvent('content_block_start', { index: 0, content_block: { type: 'text', text: '' } }),
  antEvent('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'thinking...' } }),
];

/** The bulk provider's progress: bytes written, and whether it finished or stalled (blocked on a full socket for a second). */
const bulk = { written: 0, outcome: null as Promise<'finished' | 'stalled'> | null };

async function setup(key: string, provider: string, base_url: string, model: string) {
  const cr = await c.request('POST', `/v1/organizations/workspaces/${ws}/model-credentials`, { body: { key, provider_key: provider, base_url, secret: 'sk-local-0123456789abcdef' } });
  expect(cr.status).toBe(201);
  const pr = await c.request('POST', `/v1/organizations/workspaces/${ws}/model-routing-profiles`, { body: { key, candidates: [{ credential_key: key, provider_model: model }] } });
  expect(pr.status).toBe(201);
}

async function step(key: string, signal?: AbortSignal): Promise<{ events: ModelStreamEvent[]; ms: number }> {
  const started = performance.now();
  const r = await postModelStep(p.baseUrl, c, ws, { routing_key: key, messages: user('hi') }, signal);
  expect(r.status).toBe(200);
  return { events: stepEvents(r.text), ms: performance.now() - started };
}

beforeAll(async () => {
  p = await startPlatform({ env: { MODEL_PROVIDER_TIMEOUT_MS: '1500' } });
  const w = await p.root.request('POST', `/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { body: { name: 'model-stream-limits' } });
  ws = (w.body as { id: string }).id;
  c = p.root.with({ workspaceId: ws });
  // Anthropic: some output, then `ping` forever.
  await setup('pinger', 'anthropic', await serve((res) => every100ms(res, ANT_START, () => antEvent('ping'))), 'claude-x');
  // Anthropic: some output, then events of no type, or of a type not read, forever.
  await setup('typeless', 'anthropic', await serve((res) => every100ms(res, ANT_START, () => `data: {}\n\nevent: future_kind\ndata: {"type":"future_kind"}\n\n`)), 'claude-x');
  // OpenAI-compatible: some output, then chunks whose choices are not a list, forever.
  await setup('oddchoices', 'openai', `${await serve((res) => every100ms(res, [oaiData({ model: 'm', choices: [{ delta: { content: 'thinking...' } }] })], () => oaiData({ model: 'm', choices: { delta: { content: 'x' } } })))}/v1`, 'm');
  // OpenAI-compatible: some output, then chunks with no choices forever.
  await setup('emptychunks', 'openai', `${await serve((res) => every100ms(res, [oaiData({ model: 'm', choices: [{ delta: { content: 'thinking...' } }] })], () => oaiData({ model: 'm', choices: [] })))}/v1`, 'm');
  // Anthropic: real output forever (only a deadline ends it).
  await setup('endless', 'anthropic', await serve((res) => every100ms(res, ANT_START, () => antEvent('content_block_delta', { index: 0, delta: { type: 'text_delta', text: 'more ' } }))), 'claude-x');
  // OpenAI-compatible: 96 MB as fast as the socket takes it.
  await setup('bulk', 'openai', `${await serve((res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    bulk.written = 0;
    bulk.outcome = (async () => {
      const piece = oaiData({ model: 'm', choices: [{ delta: { content: 'x'.repeat(16_000) } }] });
      for (let i = 0; i < 6000 && !res.destroyed; i++) {
        bulk.written += piece.length;
        if (!res.write(piece)) {
          const drained = await new Promise<boolean>((r) => {
            const t = setTimeout(() => r(false), 1000);
            res.once('drain', () => { clearTimeout(t); r(true); });
            res.once('close', () => { clearTimeout(t); r(true); });
          });
          if (!drained) return 'stalled';
        }
      }
      res.end(oaiData({ choices: [{ delta: {}, finish_reason: 'stop' }] }));
      return 'finished';
    })();
  })}/v1`, 'm');
  // A 400 whose body is 4 MB and never ends.
  await setup('hugeerror', 'openai', `${await serve((res) => {
    res.writeHead(400, { 'content-type': 'application/json' });
    res.write(`{"error":{"message":"MARKER the request is bad"},"padding":"`);
    res.write('x'.repeat(4 * 1024 * 1024));
  })}/v1`, 'm');
}, 120_000);
afterAll(async () => {
  await p?.stop();
  for (const s of servers) {
    s.closeAllConnections();
    s.close();
  }
});

describe('keep-alives and the step deadline', () => {
  it('a provider that only sends `ping` after its output times out (idle timeout 1.5 s)', async () => {
    const r = await step('pinger');
    expect(r.events[0]).toMatchObject({ type: 'text_delta', text: 'thinking...' });
    expect(r.events.at(-1)).toMatchObject({ type: 'error', error: { type: 'runtime.internal', retryable: true } });
  }, 30_000);

  it('events of no type, or of a type the adapter does not read, are no progress: the step times out', async () => {
    const r = await step('typeless');
    expect(r.events[0]).toMatchObject({ type: 'text_delta', text: 'thinking...' });
    expect(r.events.at(-1)).toMatchObject({ type: 'error', error: { type: 'runtime.internal', retryable: true } });
    expect(r.events.filter((e) => e.type === 'text_delta')).toHaveLength(1);
  }, 30_000);

  it('OpenAI-compatible chunks whose choices are not a list are no progress either (and nothing throws)', async () => {
    const r = await step('oddchoices');
    expect(r.events[0]).toMatchObject({ type: 'text_delta', text: 'thinking...' });
    expect(r.events.at(-1)).toMatchObject({ type: 'error', error: { type: 'runtime.internal', retryable: true } });
    // Ended by the idle timeout (a lower bound: the chunks were read, not thrown on at once).
    expect(r.ms).toBeGreaterThanOrEqual(1400);
  }, 30_000);

  it('an OpenAI-compatible provider sending chunks with no choices times out too', async () => {
    const r = await step('emptychunks');
    expect(r.events.at(-1)).toMatchObject({ type: 'error', error: { type: 'runtime.internal', retryable: true } });
  }, 30_000);

  it('a provider that streams output forever is ended at the step deadline (in-process, deadline 2 s)', async () => {
    const redis: Redis = connectRedis(p.redisUrl(), { name: 'stream-limits-test' });
    try {
      const key = readFileSync(join(p.dataDir, 'master.key'), 'utf8').trim();
      const models = createModelsModule({
        redis, docs: new DocumentStore(redis), secretBox: new SecretBox(Buffer.from(key, 'hex')), log: createLogger({ name: 'stream-limits-test', level: 'silent' }),
        config: { providerTimeoutMs: 1500, stepDeadlineMs: 2000 },
      });
      const events: ModelStreamEvent[] = [];
      for await (const e of models.gateway.runModelStep(ws, { routing_key: 'endless', messages: user('hi'), tools: [] }, new AbortController().signal)) events.push(e);
      expect(events.filter((e) => e.type === 'text_delta').length).toBeGreaterThan(5);
      expect(events.at(-1)).toMatchObject({ type: 'error', error: { type: 'runtime.internal', retryable: true } });
    } finally {
      await redis.quit();
    }
  }, 30_000);
});

describe('REST model-steps backpressure and provider error bodies', () => {
  it('a client that does not read holds the provider back instead of the api buffering the stream', async () => {
    const ctl = new AbortController();
    const res = await fetch(`${p.baseUrl}/v1/organizations/workspaces/${ws}/model-steps`, {
      method: 'POST', headers: c.headers({ accept: 'text/event-stream' }, true), body: JSON.stringify({ routing_key: 'bulk', messages: user('hi') }), signal: ctl.signal,
    });
    expect(res.status).toBe(200);
    // The body is never read.
    const outcome = await (async () => {
      while (!bulk.outcome) await new Promise((r) => setImmediate(r));
      return bulk.outcome;
    })();
    ctl.abort();
    expect(outcome).toBe('stalled');
    expect(bulk.written).toBeLessThan(32 * 1024 * 1024);
  }, 60_000);

  it("a provider's error body is read only so far (64 KiB): the step ends at once with its message", async () => {
    const r = await step('hugeerror');
    expect(r.events.at(-1)).toMatchObject({ type: 'error', error: { type: 'model.no_eligible_model' } });
    expect(JSON.stringify(r.events.at(-1))).toContain('MARKER the request is bad');
  }, 30_000);
});
