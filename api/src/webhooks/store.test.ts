import { randomBytes } from 'node:crypto';
import { beforeAll, describe, expect, it } from 'vitest';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { newId, SecretBox } from '@agentplane/core';
import { DocumentStore, type Redis } from '@agentplane/store';
import { parseDeliveryCursor, WebhookStore, webhookKeys } from './store.js';
import type { EndpointDoc } from './model.js';

/** The delivery log's cursors against a real stream: issued ones page it, forged ones are a 400, never a Redis error. */
const testRedis = useEmbeddedRedis('webhook-store');
let redis: Redis;
let store: WebhookStore;

beforeAll(() => {
  redis = testRedis();
  store = new WebhookStore(redis, new DocumentStore(redis), new SecretBox(randomBytes(32)));
});

/** A stored endpoint of a new Workspace: its Workspace and id. */
async function endpoint(): Promise<{ ws: string; id: string }> {
  const ws = newId('workspace');
  const id = newId('webhookEndpoint');
  const now = new Date().toISOString();
  const e: EndpointDoc = {
    id, type: 'webhook_endpoint', workspace_id: ws, url: 'https://hooks.example.com/x', description: null, event_types: [], status: 'enabled',
    disabled_reason: null, disabled_at: null, secret_generation: 1, previous_secret_expires_at: null, version: 1, created_at: now, updated_at: now,
  };
  await store.create(e);
  return { ws, id };
}

const record = (seq: number) => ({
  message_id: `evt_${seq}`, event_type: 'user.message', session_id: null, seq, attempt: 1, status_code: 200, latency_ms: 1, outcome: 'succeeded' as const, error: null, retry_after_ms: null, test: false,
});

describe('the delivery log\'s cursor', () => {
  it('pages newest first with the cursors it issues', async () => {
    const { ws, id } = await endpoint();
    for (let i = 1; i <= 5; i++) await store.record(ws, id, record(i));
    const first = await store.deliveries(ws, id, 2);
    expect(first.data.map((r) => r.seq)).toEqual([5, 4]);
    const second = await store.deliveries(ws, id, 2, String(first.next_page));
    expect(second.data.map((r) => r.seq)).toEqual([3, 2]);
    const third = await store.deliveries(ws, id, 2, String(second.next_page));
    expect(third).toMatchObject({ data: [{ seq: 1 }], next_page: null });
  });

  it('refuses forged cursors with 400 validation.malformed; the first possible id ends the list', async () => {
    const { ws, id } = await endpoint();
    await store.record(ws, id, record(1));
    for (const page of ['c1_99999999999999999999999s0', 'c1_1s99999999999999999999999', 'c1_9007199254740992s0', 'c1_1s9007199254740992', 'c1_1-2', 'c1_s1', 'x', 'c1_1s2 ']) {
      await expect(store.deliveries(ws, id, 10, page), page).rejects.toMatchObject({ type: 'validation.malformed', status: 400 });
    }
    expect(await store.deliveries(ws, id, 10, 'c1_0s0')).toEqual({ data: [], next_page: null });
    expect((await store.deliveries(ws, id, 10, 'c1_0s1')).data).toEqual([]);
    expect((await store.deliveries(ws, id, 10, `c1_${Date.now() + 60_000}s0`)).data).toHaveLength(1);
    expect((await store.deliveries(ws, id, 10, 'c1_9007199254740991s9007199254740991')).data).toHaveLength(1);
  });

  it('parses a cursor into the stream id it names', () => {
    expect(parseDeliveryCursor('c1_1700000000000s3')).toBe('1700000000000-3');
    expect(parseDeliveryCursor('c1_0s0')).toBe('start');
  });
});

describe('a deleted endpoint', () => {
  it('keeps no delivery log and starts no lane when a delivery or an append outlives the delete', async () => {
    const { ws, id } = await endpoint();
    expect(await store.initCursor(ws, id, 'sess_a', 4)).toBe(4);
    await store.record(ws, id, record(5));
    await store.remove(ws, id);
    // A step that was sending when the endpoint was deleted records its attempt; the tap that
    // read the endpoint list before the delete starts a lane of another Session.
    await store.record(ws, id, record(5));
    expect(await store.initCursor(ws, id, 'sess_b', 7)).toBeNull();
    expect(await redis.exists(webhookKeys.log(ws, id), webhookKeys.cursors(ws, id), webhookKeys.secret(ws, id))).toBe(0);
  });

  it('is deleted once: a second delete is 404, a delete at a stale version 409 changing nothing', async () => {
    const { ws, id } = await endpoint();
    await store.update(ws, id, (e) => ({ ...e, description: 'changed' }), 1);
    await expect(store.remove(ws, id, 1)).rejects.toMatchObject({ type: 'validation.conflict', status: 409 });
    expect((await store.get(ws, id)).description).toBe('changed');
    await store.remove(ws, id, 2);
    await expect(store.remove(ws, id)).rejects.toMatchObject({ type: 'validation.not_found', status: 404 });
  });
});

describe('the enabled endpoints of a Workspace', () => {
  it('are every one, past the first 1,000, and only the enabled', async () => {
    const ws = newId('workspace');
    const now = new Date().toISOString();
    const made: string[] = [];
    for (let i = 0; i < 1005; i += 67) {
      await Promise.all(Array.from({ length: Math.min(67, 1005 - i) }, async (_, k) => {
        const id = newId('webhookEndpoint');
        const status = (i + k) % 2 === 0 ? 'enabled' : 'disabled';
        await store.create({
          id, type: 'webhook_endpoint', workspace_id: ws, url: 'https://hooks.example.com/x', description: null, event_types: [], status,
          disabled_reason: null, disabled_at: null, secret_generation: 1, previous_secret_expires_at: null, version: 1, created_at: now, updated_at: now,
        });
        if (status === 'enabled') made.push(id);
      }));
    }
    const enabled = await store.enabled(ws);
    expect(enabled.map((e) => e.id).sort()).toEqual(made.sort());
  });
});
