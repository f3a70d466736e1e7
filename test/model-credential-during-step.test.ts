import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { Redis } from 'ioredis';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import type { ModelStreamEvent } from '@agentplane/protocol';
import { startPlatform, type Platform } from './harness/platform.js';
import { postModelStep, stepEvents } from './harness/model-steps.js';
import { startOpenAiServer, type ProviderServer } from './fixtures/provider-servers.js';

/**
 * A credential revoked while a step runs is refused from that moment: a later provider call of
 * the step (a throttle retry, a fallback to the next candidate) does not use it, whether or not
 * the credential has a secret, and a step whose other candidates are still eligible goes on to
 * them instead of failing. A credential rotated while a step runs is judged by its new secret:
 * the old one failing the step's call does not mark it unhealthy.
 */
let p: Platform;
let ws: string;
let c: HttpClient;
let healthy: ProviderServer;
const servers: Server[] = [];

/** A provider that holds each request until the test answers it with `answer`. */
interface HeldProvider {
  url: string;
  requests: number;
  /** Resolves with the next request's responder once it arrived. */
  next(): Promise<(status: number, headers: Record<string, string>, body: string) => void>;
}

function heldProvider(): Promise<HeldProvider> {
  const waiting: ((r: (status: number, headers: Record<string, string>, body: string) => void) => void)[] = [];
  const arrived: ((status: number, headers: Record<string, string>, body: string) => void)[] = [];
  const state: HeldProvider = {
    url: '',
    requests: 0,
    next: () => new Promise((resolve) => {
      const ready = arrived.shift();
      if (ready) resolve(ready);
      else waiting.push(resolve);
    }),
  };
  const s = createServer((req: IncomingMessage, res: ServerResponse) => {
    req.resume();
    req.on('end', () => {
      state.requests += 1;
      const respond = (status: number, headers: Record<string, string>, body: string) => {
        res.writeHead(status, { 'content-type': 'application/json', ...headers });
        res.end(body);
      };
      const w = waiting.shift();
      if (w) w(respond);
      else arrived.push(respond);
    });
  });
  servers.push(s);
  return new Promise((r) => s.listen(0, '127.0.0.1', () => {
    state.url = `http://127.0.0.1:${(s.address() as AddressInfo).port}/v1`;
    r(state);
  }));
}

const user = (text: string) => [{ role: 'user', content: [{ type: 'text', text }] }];

async function step(body: unknown): Promise<ModelStreamEvent[]> {
  const r = await postModelStep(p.baseUrl, c, ws, body);
  expect(r.status).toBe(200);
  return stepEvents(r.text);
}

async function credential(body: Record<string, unknown>): Promise<string> {
  const r = await c.request('POST', `/v1/organizations/workspaces/${ws}/model-credentials`, { body });
  expect(r.status).toBe(201);
  return (r.body as { id: string }).id;
}

async function profile(key: string, candidates: unknown[]): Promise<void> {
  expect((await c.request('POST', `/v1/organizations/workspaces/${ws}/model-routing-profiles`, { body: { key, candidates } })).status).toBe(201);
}

async function revoke(id: string): Promise<void> {
  expect((await c.request('POST', `/v1/model-credentials/${id}/revoke`, { body: {} })).status).toBe(200);
}

beforeAll(async () => {
  healthy = await startOpenAiServer({});
  p = await startPlatform({ env: { MODEL_PROVIDER_TIMEOUT_MS: '5000' } });
  const w = await p.root.request('POST', `/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { body: { name: 'revoked-step' } });
  ws = (w.body as { id: string }).id;
  c = p.root.with({ workspaceId: ws });
}, 120_000);
afterAll(async () => {
  await p?.stop();
  await healthy?.close();
  for (const s of servers) {
    s.closeAllConnections();
    s.close();
  }
});

describe('a credential revoked during a step', () => {
  it('a keyless credential revoked while its provider throttles is not called again by the retry', async () => {
    const held = await heldProvider();
    const id = await credential({ key: 'keyless-throttled', provider_key: 'openai', base_url: held.url });
    await profile('keyless-throttled', [{ credential_key: 'keyless-throttled', provider_model: 'local-model' }]);
    const done = step({ routing_key: 'keyless-throttled', messages: user('hi') });
    const first = await held.next();
    await revoke(id);
    first(429, { 'retry-after': '0' }, JSON.stringify({ error: { message: 'slow down' } }));
    const events = await done;
    expect(held.requests).toBe(1);
    expect(events.at(-1)).toMatchObject({ type: 'error', error: { type: 'model.no_eligible_model', retryable: false } });
  }, 30_000);

  it('a candidate whose credential was revoked after the plan is skipped: the next eligible candidate serves the step', async () => {
    const held = await heldProvider();
    await credential({ key: 'first', provider_key: 'openai', base_url: held.url });
    const revoked = await credential({ key: 'second', provider_key: 'openai', base_url: healthy.url, secret: 'sk-local-0123456789abcdef' });
    await credential({ key: 'third', provider_key: 'openai', base_url: healthy.url });
    await profile('fallback-revoked', [
      { credential_key: 'first', provider_model: 'local-model' },
      { credential_key: 'second', provider_model: 'second-model' },
      { credential_key: 'third', provider_model: 'third-model' },
    ]);
    const before = healthy.requests.length;
    const done = step({ routing_key: 'fallback-revoked', messages: user('hi') });
    const first = await held.next();
    await revoke(revoked);
    first(503, {}, JSON.stringify({ error: { message: 'unavailable' } }));
    const events = await done;
    expect(events.at(-1)).toMatchObject({ type: 'end', stop_reason: 'end_turn', model: 'third-model' });
    const calls = healthy.requests.slice(before);
    expect(calls).toHaveLength(1);
    expect(calls[0]?.body.model).toBe('third-model');
  }, 30_000);

  it('every candidate revoked after the plan: the step ends model.no_eligible_model, never budget.exceeded', async () => {
    const held = await heldProvider();
    const id = await credential({ key: 'only', provider_key: 'openai', base_url: held.url, secret: 'sk-local-0123456789abcdef' });
    await profile('only-revoked', [{ credential_key: 'only', provider_model: 'local-model' }]);
    const done = step({ routing_key: 'only-revoked', messages: user('hi') });
    const first = await held.next();
    await revoke(id);
    first(429, { 'retry-after': '0' }, JSON.stringify({ error: { message: 'slow down' } }));
    const events = await done;
    expect(held.requests).toBe(1);
    expect(events.at(-1)).toMatchObject({ type: 'error', error: { type: 'model.no_eligible_model', retryable: false } });
  }, 30_000);
});

describe('a credential rotated during a step', () => {
  type Head = { health_status: string; active_generation_number: number };

  it("the rotated-out secret failing the step's call (401) does not mark the new generation unhealthy", async () => {
    const held = await heldProvider();
    const id = await credential({ key: 'rotated', provider_key: 'openai', base_url: held.url, secret: 'sk-old-0123456789abcdef' });
    await profile('rotated', [{ credential_key: 'rotated', provider_model: 'local-model' }]);
    const done = step({ routing_key: 'rotated', messages: user('hi') });
    const first = await held.next();
    const rotated = await c.request<Head>('POST', `/v1/model-credentials/${id}/rotate`, { body: { secret: 'sk-new-0123456789abcdef' } });
    expect(rotated.body).toMatchObject({ active_generation_number: 2, health_status: 'unknown' });
    first(401, {}, JSON.stringify({ error: { message: 'invalid api key' } }));
    expect((await done).at(-1)).toMatchObject({ type: 'error', error: { type: 'model.no_eligible_model' } });
    expect((await c.request<Head>('GET', `/v1/model-credentials/${id}`)).body).toMatchObject({ active_generation_number: 2, health_status: 'unknown' });
  }, 30_000);

  it('the secret in use failing with 401 does mark it unhealthy', async () => {
    const held = await heldProvider();
    const id = await credential({ key: 'bad-key', provider_key: 'openai', base_url: held.url, secret: 'sk-bad-0123456789abcdef' });
    await profile('bad-key', [{ credential_key: 'bad-key', provider_model: 'local-model' }]);
    const done = step({ routing_key: 'bad-key', messages: user('hi') });
    (await held.next())(401, {}, JSON.stringify({ error: { message: 'invalid api key' } }));
    expect((await done).at(-1)).toMatchObject({ type: 'error', error: { type: 'model.no_eligible_model' } });
    expect((await c.request<Head>('GET', `/v1/model-credentials/${id}`)).body).toMatchObject({ health_status: 'unhealthy' });
  }, 30_000);
});

describe('concurrent rotations', () => {
  it('of rotations racing from one generation one wins, the others are 409, and only the winner\'s secret is stored', async () => {
    const id = await credential({ key: 'racing', provider_key: 'openai', base_url: 'http://127.0.0.1:9/v1', secret: 'sk-zero-0123456789abcdef' });
    const results = await Promise.all(Array.from({ length: 6 }, (_, i) =>
      c.request<{ active_generation_number: number }>('POST', `/v1/model-credentials/${id}/rotate`, { body: { secret: `sk-race-${i}-0123456789abcdef`, expected_generation_number: 1 } })));
    const won = results.filter((r) => r.status === 200);
    expect(won).toHaveLength(1);
    expect(results.filter((r) => r.status === 409)).toHaveLength(5);
    const redis = new Redis(p.redisUrl());
    try {
      const stored = await redis.keys(`ap:{w:${ws}}:mcred_secret:${id}:*`);
      expect(stored).toEqual([`ap:{w:${ws}}:mcred_secret:${id}:2`]);
    } finally {
      await redis.quit();
    }
    expect(won[0]?.body.active_generation_number).toBe(2);
  }, 30_000);
});
