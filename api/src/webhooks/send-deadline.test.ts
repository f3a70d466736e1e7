import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { createLogger, createMetrics, newId, SecretBox } from '@agentplane/core';
import { DocumentStore, EventLog } from '@agentplane/store';
import type { SessionEventTap } from '../events/tap.js';
import { WebhookDispatcher } from './delivery.js';
import { WebhookStore } from './store.js';
import type { EndpointDoc } from './model.js';

/** A name server that never answers: every lookup of a host name hangs. */
vi.mock('node:dns/promises', () => ({ lookup: () => new Promise<never>(() => undefined) }));

const testRedis = useEmbeddedRedis('webhook-send-deadline');
const TIMEOUT_MS = 300;
let store: WebhookStore;
let dispatcher: WebhookDispatcher;

beforeAll(() => {
  const redis = testRedis();
  store = new WebhookStore(redis, new DocumentStore(redis), new SecretBox(randomBytes(32)));
  dispatcher = new WebhookDispatcher({
    redisUrl: testRedis.server().url, redis, store, log: new EventLog(redis), tap: {} as SessionEventTap,
    logger: createLogger({ name: 'test', level: 'silent' }), metrics: createMetrics(),
    settings: { maxAttempts: 1, retryBaseMs: 100, retryMaxMs: 100, timeoutMs: TIMEOUT_MS, sweepIntervalMs: 60_000, egress: { development: false, allowPrivate: false } },
  });
});
afterAll(() => dispatcher?.close());

describe('a delivery whose host name never resolves', () => {
  it('ends at the one deadline of the exchange, as a timeout', async () => {
    const now = new Date().toISOString();
    const e: EndpointDoc = {
      id: newId('webhookEndpoint'), type: 'webhook_endpoint', workspace_id: newId('workspace'), url: 'https://hooks.example.com/hook', description: null,
      event_types: [], status: 'enabled', disabled_reason: null, disabled_at: null, secret_generation: 1, previous_secret_expires_at: null,
      version: 1, created_at: now, updated_at: now,
    };
    await store.create(e);
    const started = Date.now();
    const r = await Promise.race([
      dispatcher.send(e, 'evt_1', '{}'),
      new Promise<'hung'>((resolve) => setTimeout(() => resolve('hung'), TIMEOUT_MS + 2000)),
    ]);
    expect(r).toMatchObject({ status_code: 0, error: 'timeout' });
    expect(Date.now() - started).toBeLessThan(TIMEOUT_MS + 1000);
  });
});
