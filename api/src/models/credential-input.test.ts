import { randomBytes } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { ApiError, check, createLogger, SecretBox } from '@agentplane/core';
import { DocumentStore } from '@agentplane/store';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { createModelsModule, type ModelsModule } from './module.js';
import { CreateModelCredentialBody, RotateModelCredentialBody } from './schemas.js';

/**
 * Credential input that could never work is refused where it is written (400), not found out
 * at every later model step as an "unreachable" provider.
 */
const testRedis = useEmbeddedRedis('credential-input');
const ws = `wrkspc_${'c'.repeat(32)}`;
let models: ModelsModule;
beforeAll(() => {
  const redis = testRedis();
  models = createModelsModule({
    redis, docs: new DocumentStore(redis), secretBox: new SecretBox(randomBytes(32)), log: createLogger({ name: 'credential-input', level: 'silent' }),
    config: { providerTimeoutMs: 30_000 },
  });
});

const malformed = (fn: () => unknown): string => {
  try {
    fn();
  } catch (err) {
    if (err instanceof ApiError) return `${err.status} ${err.type}`;
    throw err;
  }
  return 'accepted';
};

describe('model credential input', () => {
  it('a base_url with a query or a fragment is refused (request paths are appended to it)', async () => {
    for (const base_url of ['http://127.0.0.1:8000/v1?api-version=1', 'http://127.0.0.1:8000/v1#x', 'http://127.0.0.1:8000/v1?']) {
      const err = await models.credentials.create(ws, { key: 'q', provider_key: 'openai', base_url }).then(() => null, (e: unknown) => e);
      expect(err, base_url).toBeInstanceOf(ApiError);
      expect([(err as ApiError).status, (err as ApiError).type]).toEqual([400, 'validation.malformed']);
    }
    const ok = await models.credentials.create(ws, { key: 'plain', provider_key: 'openai', base_url: 'http://127.0.0.1:8000/v1' });
    expect(ok.base_url).toBe('http://127.0.0.1:8000/v1');
  });

  it('a secret that cannot travel in an HTTP header (line breaks, non-ASCII, edge spaces) is refused on create and rotate', () => {
    for (const secret of ['sk-abc\ndef', 'sk-abc\r\n', 'sk-€uro', ' sk-lead', 'sk-trail ', 'sk-\u0000']) {
      expect(malformed(() => check(CreateModelCredentialBody, { key: 'k', provider_key: 'openai', secret }, 'body')), JSON.stringify(secret)).toBe('400 validation.malformed');
      expect(malformed(() => check(RotateModelCredentialBody, { secret }, 'body')), JSON.stringify(secret)).toBe('400 validation.malformed');
    }
    expect(malformed(() => check(CreateModelCredentialBody, { key: 'k', provider_key: 'openai', secret: 'sk-proj-AbC_123-xyz.~' }, 'body'))).toBe('accepted');
    expect(malformed(() => check(RotateModelCredentialBody, { secret: 'Bearer-ish with inner spaces' }, 'body'))).toBe('accepted');
  });
});
