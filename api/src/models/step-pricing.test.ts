import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, SecretBox } from '@agentplane/core';
import type { ModelStreamEvent } from '@agentplane/protocol';
import { DocumentStore } from '@agentplane/store';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { createModelsModule, type ModelsModule } from './module.js';
import { startReportingServer } from '../../../test/fixtures/provider-servers.js';

/**
 * A step is priced by its routing candidate's model: the model name a provider reports (an
 * OpenAI-compatible server may name it as it likes) cannot make a priced step free, and so
 * cannot slip it past a budget.
 */
const testRedis = useEmbeddedRedis('step-pricing');
const ws = `wrkspc_${'b'.repeat(32)}`;
let models: ModelsModule;
let server: { url: string; close(): void };
let baseUrl: string;

beforeAll(async () => {
  const redis = testRedis();
  models = createModelsModule({
    redis, docs: new DocumentStore(redis), secretBox: new SecretBox(randomBytes(32)), log: createLogger({ name: 'step-pricing', level: 'silent' }),
    config: { providerTimeoutMs: 30_000 },
  });
  // An OpenAI-compatible server that reports a model name of its own, with a million tokens each way.
  server = await startReportingServer('served-under-another-name', { prompt_tokens: 1_000_000, completion_tokens: 1_000_000 });
  baseUrl = server.url;
});
afterAll(() => server?.close());

describe('model step pricing', () => {
  it("is the candidate's model's list price, whatever model name the provider reports", async () => {
    await models.credentials.create(ws, { key: 'compat', provider_key: 'openai', base_url: baseUrl });
    await models.profiles.create(ws, { key: 'priced', candidates: [{ credential_key: 'compat', provider_model: 'gpt-4o' }] });
    const events: ModelStreamEvent[] = [];
    const request = { routing_key: 'priced', messages: [{ role: 'user' as const, content: [{ type: 'text' as const, text: 'hi' }] }], tools: [] };
    for await (const e of models.gateway.runModelStep(ws, request, new AbortController().signal)) events.push(e);
    expect(events.at(-1)).toMatchObject({ type: 'end', stop_reason: 'end_turn', model: 'served-under-another-name' });
    const total = await models.usage.read({ kind: 'workspace', workspace_id: ws });
    expect(total.steps).toBe(1);
    expect(total.unpriced_steps).toBe(0);
    const price = models.prices.openai?.['gpt-4o'];
    expect(price).toBeDefined();
    expect(total.list_cost.amount).toBeCloseTo((price?.input ?? 0) + (price?.output ?? 0), 6);
  });
});
