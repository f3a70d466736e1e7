import { randomBytes } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { createLogger, SecretBox } from '@agentplane/core';
import type { ModelStreamEvent } from '@agentplane/protocol';
import { DocumentStore } from '@agentplane/store';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { createModelsModule, type ModelsModule } from './module.js';

/**
 * A candidate whose credential's secret cannot be read at the call (its sealed secret is missing
 * while the credential names it) fails as an unreachable provider does: the next candidate serves
 * the step, and with none left the step ends with a retryable `runtime.internal`, not a 409 type.
 */
const testRedis = useEmbeddedRedis('unreadable-secret');
let models: ModelsModule;

beforeAll(() => {
  const redis = testRedis();
  models = createModelsModule({
    redis, docs: new DocumentStore(redis), secretBox: new SecretBox(randomBytes(32)), log: createLogger({ name: 'unreadable-secret', level: 'silent' }),
    config: { providerTimeoutMs: 5_000 },
  });
});

async function run(ws: string, routingKey: string): Promise<ModelStreamEvent[]> {
  const events: ModelStreamEvent[] = [];
  const request = { routing_key: routingKey, messages: [{ role: 'user' as const, content: [{ type: 'text' as const, text: 'hi' }] }], tools: [] };
  for await (const e of models.gateway.runModelStep(ws, request, new AbortController().signal)) events.push(e);
  return events;
}

describe('a credential whose secret cannot be read at the call', () => {
  it('is skipped for the next candidate; alone, the step ends runtime.internal (retryable)', async () => {
    const ws = `wrkspc_${'9'.repeat(32)}`;
    await models.profiles.ensureDefaults(ws);
    const cred = await models.credentials.create(ws, { key: 'lost', provider_key: 'openai', base_url: 'http://127.0.0.1:9/v1', secret: 'sk-local-0123456789abcdef' });
    await models.profiles.create(ws, { key: 'alone', candidates: [{ credential_key: 'lost', provider_model: 'gpt-4o' }] });
    await models.profiles.create(ws, { key: 'fallback', candidates: [{ credential_key: 'lost', provider_model: 'gpt-4o' }, { credential_key: 'default', provider_model: 'scripted-1' }] });
    expect(await testRedis().del(`ap:{w:${ws}}:mcred_secret:${cred.id}:1`)).toBe(1);

    expect((await run(ws, 'fallback')).at(-1)).toMatchObject({ type: 'end', provider: 'scripted' });
    const alone = (await run(ws, 'alone')).at(-1);
    expect(alone).toMatchObject({ type: 'error', error: { type: 'runtime.internal', retryable: true } });
    expect(JSON.stringify(alone)).not.toContain('sk-local');
  });
});
