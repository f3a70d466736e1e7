import { randomBytes } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { newId, nowIso, SecretBox } from '@agentplane/core';
import { DocumentStore, type Redis } from '@agentplane/store';
import { AutomationStore, automationKeys } from './store.js';
import type { AutomationDoc } from './model.js';
import { WebhookStore, webhookKeys } from '../webhooks/store.js';
import type { EndpointDoc } from '../webhooks/model.js';

/**
 * Two rotations of one signing secret at the same expected version: the interleaving is made
 * deterministic by running the second rotation, whole, inside the first one's read of the secret
 * record. One rotation answers, the other is a 409 having changed nothing, and the secret the
 * answer carries is the one in force.
 */
const testRedis = useEmbeddedRedis('signing-secrets');
const box = new SecretBox(randomBytes(32));
let redis: Redis;

beforeAll(() => {
  redis = testRedis();
});

/** A connection whose first read of `key` first runs `before`. */
function racing(key: string, before: () => Promise<unknown>): Redis {
  const conn = testRedis.connect(`racing-${newId('event')}`);
  const get = conn.get.bind(conn) as (k: string) => Promise<string | null>;
  let done = false;
  (conn as unknown as { get: (k: string) => Promise<string | null> }).get = async (k: string) => {
    if (!done && k === key) {
      done = true;
      await before().catch(() => undefined);
    }
    return get(k);
  };
  return conn;
}

async function settle<T>(p: Promise<T>): Promise<{ ok: true; value: T } | { ok: false; type: string }> {
  try {
    return { ok: true, value: await p };
  } catch (err) {
    return { ok: false, type: String((err as { type?: string }).type) };
  }
}

describe('rotating an Automation\'s signing secret', () => {
  it('two rotations at one version: one answers, with the secret that verifies; the other is a conflict', async () => {
    const plain = new AutomationStore(redis, new DocumentStore(redis), box);
    const now = nowIso();
    const id = newId('automation');
    const ws = newId('workspace');
    const a: AutomationDoc = {
      id, type: 'automation', workspace_id: ws, name: 'hooked', status: 'active', principal_id: newId('principal'), agent: { id: newId('agent'), version: null },
      environment_id: newId('environment'), prompt: 'p', budget: null, max_concurrent_firings: 1, trigger: { type: 'webhook' },
      webhook: { ingest_path: `/v1/ingest/automations/${id}`, secret_generation: 1, previous_secret_expires_at: null }, version: 1, created_at: now, updated_at: now,
    };
    await plain.create(a, 'whsec_' + randomBytes(32).toString('base64'));
    let second: Awaited<ReturnType<typeof settle<{ doc: AutomationDoc; secret: string }>>> | undefined;
    const conn = racing(automationKeys.secret(ws, id), async () => {
      second = await settle(plain.rotateSecret(ws, id, 1, 0));
    });
    const first = await settle(new AutomationStore(conn, new DocumentStore(conn), box).rotateSecret(ws, id, 1, 0));
    const results = [first, second!];
    const answered = results.flatMap((r) => (r.ok ? [r.value] : []));
    expect(answered).toHaveLength(1);
    expect(results.filter((r) => !r.ok).map((r) => (r.ok ? '' : r.type))).toEqual(['validation.conflict']);
    const won = answered[0]!;
    // The answered secret is the one deliveries are verified with, and the document says its generation.
    expect(await plain.verificationSecrets(ws, id)).toEqual([won.secret]);
    const stored = await plain.get(ws, id);
    expect(stored.webhook?.secret_generation).toBe(2);
    expect(stored.version).toBe(2);
    expect(won.doc.version).toBe(2);
  });
});

/** A new enabled endpoint document, at version 1 and secret generation 1. */
function endpoint(): EndpointDoc {
  const now = nowIso();
  return {
    id: newId('webhookEndpoint'), type: 'webhook_endpoint', workspace_id: newId('workspace'), url: 'https://hooks.example.com/x', description: null,
    event_types: [], status: 'enabled', disabled_reason: null, disabled_at: null, secret_generation: 1, previous_secret_expires_at: null,
    version: 1, created_at: now, updated_at: now,
  };
}

describe('rotating a webhook endpoint\'s signing secret', () => {
  it('two rotations at one version: one answers, with the secret deliveries are signed with; the other is a conflict', async () => {
    const plain = new WebhookStore(redis, new DocumentStore(redis), box);
    const e = endpoint();
    await plain.create(e);
    let second: Awaited<ReturnType<typeof settle<{ doc: EndpointDoc; secret: string }>>> | undefined;
    const conn = racing(webhookKeys.secret(e.workspace_id, e.id), async () => {
      second = await settle(plain.rotateSecret(e.workspace_id, e.id, 1, 0));
    });
    const first = await settle(new WebhookStore(conn, new DocumentStore(conn), box).rotateSecret(e.workspace_id, e.id, 1, 0));
    const results = [first, second!];
    const answered = results.flatMap((r) => (r.ok ? [r.value] : []));
    expect(answered).toHaveLength(1);
    expect(results.filter((r) => !r.ok).map((r) => (r.ok ? '' : r.type))).toEqual(['validation.conflict']);
    expect(await plain.signingSecrets(e.workspace_id, e.id)).toEqual([answered[0]!.secret]);
    expect((await plain.get(e.workspace_id, e.id)).secret_generation).toBe(2);
  });

  it('a stale version changes nothing', async () => {
    const plain = new WebhookStore(redis, new DocumentStore(redis), box);
    const e = endpoint();
    const secret = await plain.create(e);
    const r = await settle(plain.rotateSecret(e.workspace_id, e.id, 7, 3600_000));
    expect(r).toEqual({ ok: false, type: 'validation.conflict' });
    expect(await plain.signingSecrets(e.workspace_id, e.id)).toEqual([secret]);
  });
});
