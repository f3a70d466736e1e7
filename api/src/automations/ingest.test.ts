import { createHmac, randomBytes } from 'node:crypto';
import type { IncomingMessage } from 'node:http';
import { PassThrough } from 'node:stream';
import { beforeAll, describe, expect, it } from 'vitest';
import { Webhook } from 'standardwebhooks';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { ApiError, newId, nowIso, SecretBox } from '@agentplane/core';
import { DocumentStore, tags, type Redis } from '@agentplane/store';
import { acceptDelivery, deliveryBody, deliveryFiringId, deliveryText, verifyDelivery } from './ingest.js';
import { parseLimitedJson } from './json-limits.js';
import { AutomationStore } from './store.js';
import { firingsOf, type FiringDoc } from './model.js';

const secret = `whsec_${randomBytes(32).toString('base64')}`;

function headersFor(id: string, at: Date, signature: string): Record<string, string> {
  return { 'webhook-id': id, 'webhook-timestamp': String(Math.floor(at.getTime() / 1000)), 'webhook-signature': signature };
}

/** What the ingest route reads from a request carrying `bytes`. */
async function received(bytes: Buffer): Promise<Buffer> {
  const stream = new PassThrough() as PassThrough & { headers: Record<string, string> };
  stream.headers = { 'content-length': String(bytes.length) };
  stream.end(bytes);
  const body = await deliveryBody.receive(stream as unknown as IncomingMessage, {} as never);
  return body.raw as Buffer;
}

describe('signed deliveries are verified over their exact bytes', () => {
  it('a body that starts with a byte order mark verifies, and its JSON is read without the mark', async () => {
    const text = '\uFEFF{"alert":"disk full"}';
    const at = new Date();
    // The sender signs its body's bytes (the mark's EF BB BF included).
    const headers = headersFor('msg_bom', at, new Webhook(secret).sign('msg_bom', at, text));
    const raw = await received(Buffer.from(text, 'utf8'));
    expect(() => verifyDelivery(raw, headers, [secret])).not.toThrow();
    expect(raw).toEqual(Buffer.from(text, 'utf8'));
    expect(parseLimitedJson(deliveryText(raw))).toEqual({ alert: 'disk full' });
  });

  it('bytes that are not UTF-8 verify (the signature is over bytes) and are then refused as not JSON', async () => {
    const bytes = Buffer.concat([Buffer.from('{"a":"'), Buffer.from([0xff, 0xfe]), Buffer.from('"}')]);
    const at = new Date();
    const ts = String(Math.floor(at.getTime() / 1000));
    const key = Buffer.from(secret.slice('whsec_'.length), 'base64');
    const sig = createHmac('sha256', key).update(`msg_bin.${ts}.`).update(bytes).digest('base64');
    const raw = await received(bytes);
    expect(raw).toEqual(bytes);
    expect(() => verifyDelivery(raw, { 'webhook-id': 'msg_bin', 'webhook-timestamp': ts, 'webhook-signature': `v1,${sig}` }, [secret])).not.toThrow();
    expect(() => deliveryText(raw)).toThrow(expect.objectContaining({ type: 'validation.malformed' }));
  });

  it('refuses another body, another secret, a stale timestamp and missing headers with 401', () => {
    const body = Buffer.from('{"n":1}');
    const at = new Date();
    const good = headersFor('msg_1', at, new Webhook(secret).sign('msg_1', at, body.toString()));
    const refused = (f: () => void) => expect(f).toThrow(expect.objectContaining({ type: 'auth.invalid_key' }));
    expect(() => verifyDelivery(body, good, [`whsec_${randomBytes(32).toString('base64')}`, secret])).not.toThrow();
    refused(() => verifyDelivery(Buffer.from('{"n":2}'), good, [secret]));
    refused(() => verifyDelivery(body, good, [`whsec_${randomBytes(32).toString('base64')}`]));
    refused(() => verifyDelivery(body, good, []));
    const old = new Date(Date.now() - 6 * 60_000);
    refused(() => verifyDelivery(body, headersFor('msg_1', old, new Webhook(secret).sign('msg_1', old, body.toString())), [secret]));
    refused(() => verifyDelivery(body, { 'webhook-id': 'msg_1' }, [secret]));
    refused(() => verifyDelivery(body, { ...good, 'webhook-timestamp': 'soon' }, [secret]));
  });
});

describe('deliveries are deduplicated on their webhook-id', () => {
  const testRedis = useEmbeddedRedis('ingest-deliveries');
  let redis: Redis;
  let store: AutomationStore;
  beforeAll(() => {
    redis = testRedis();
    store = new AutomationStore(redis, new DocumentStore(redis), new SecretBox(randomBytes(32)));
  });

  const receipt = (ws: string, automationId: string, id: string, deliveryId: string): FiringDoc => {
    const now = nowIso();
    return {
      id, type: 'automation_firing', workspace_id: ws, automation_id: automationId, source: { kind: 'webhook', delivery_id: deliveryId }, status: 'pending',
      attempt_count: 0, outcome: null, session_id: null, run_id: null, error: null, admission: { disposition: 'pending', check_configured: false },
      started_at: null, ended_at: null, through_sequence: 0, stop_reason: null, _prompt: 'p', _attempts: [], version: 1, created_at: now, updated_at: now,
    };
  };

  it('keeps the webhook-id: a retry answers that receipt instead of firing again', async () => {
    const ws = newId('workspace');
    const automationId = newId('automation');
    const fire = async (firingId: string): Promise<FiringDoc> => {
      await store.createFiring(receipt(ws, automationId, firingId, 'msg_retry'));
      throw new Error('the queue is unreachable');
    };
    await expect(acceptDelivery(store, ws, automationId, 'msg_retry', fire)).rejects.toThrow('the queue is unreachable');
    const retry = await acceptDelivery(store, ws, automationId, 'msg_retry', async (firingId) => {
      const f = receipt(ws, automationId, firingId, 'msg_retry');
      await store.createFiring(f);
      return f;
    });
    expect(retry.duplicate).toBe(true);
    const listed = await store.docs.list<FiringDoc>(tags.workspace(ws), firingsOf(automationId), { limit: 10, order: 'asc' });
    expect(listed.data.map((f) => f.id)).toEqual([retry.firing.id]);
  });

  it('releases the webhook-id when no receipt was written (a paused Automation, a prompt too long)', async () => {
    const ws = newId('workspace');
    const automationId = newId('automation');
    await expect(acceptDelivery(store, ws, automationId, 'msg_paused', async () => {
      throw new ApiError('runtime.invalid_transition', 'the automation is paused');
    })).rejects.toMatchObject({ type: 'runtime.invalid_transition' });
    const later = await acceptDelivery(store, ws, automationId, 'msg_paused', async (firingId) => {
      const f = receipt(ws, automationId, firingId, 'msg_paused');
      await store.createFiring(f);
      return f;
    });
    expect(later.duplicate).toBe(false);
  });

  /** What the service's `fire` does with a named receipt id: writes the receipt unless it exists, else answers that one. */
  const firer = (ws: string, automationId: string, deliveryId: string, fired: string[], gate?: Promise<void>) => async (firingId: string): Promise<FiringDoc> => {
    fired.push(firingId);
    await gate;
    const f = receipt(ws, automationId, firingId, deliveryId);
    if (await store.createFiring(f)) return f;
    return (await store.docs.get<FiringDoc>(tags.workspace(ws), firingId)) ?? f;
  };
  const receipts = async (ws: string, automationId: string) => (await store.docs.list<FiringDoc>(tags.workspace(ws), firingsOf(automationId), { limit: 10, order: 'asc' })).data.map((f) => f.id);

  it('completes a claim whose claimant died before its receipt: the retry fires at once, under the claimed id, once', async () => {
    const ws = newId('workspace');
    const automationId = newId('automation');
    // The claim a request made before its process died.
    expect(await store.claimDelivery(ws, automationId, 'msg_dead', deliveryFiringId(automationId, 'msg_dead'))).toBeNull();
    const fired: string[] = [];
    const retry = await acceptDelivery(store, ws, automationId, 'msg_dead', firer(ws, automationId, 'msg_dead', fired));
    expect([retry.duplicate, retry.firing.id]).toEqual([false, deliveryFiringId(automationId, 'msg_dead')]);
    const again = await acceptDelivery(store, ws, automationId, 'msg_dead', firer(ws, automationId, 'msg_dead', fired));
    expect([again.duplicate, again.firing.id]).toEqual([true, retry.firing.id]);
    expect(fired).toEqual([retry.firing.id]);
    expect(await receipts(ws, automationId)).toEqual([retry.firing.id]);
  });

  it('completes a claim that names a random receipt id under that id', async () => {
    const ws = newId('workspace');
    const automationId = newId('automation');
    const named = newId('automationFiring');
    await store.claimDelivery(ws, automationId, 'msg_named', named);
    const retry = await acceptDelivery(store, ws, automationId, 'msg_named', firer(ws, automationId, 'msg_named', []));
    expect([retry.duplicate, retry.firing.id]).toEqual([false, named]);
    expect(await receipts(ws, automationId)).toEqual([named]);
  });

  it('two requests with one webhook-id at once write one receipt, and both answer it', async () => {
    const ws = newId('workspace');
    const automationId = newId('automation');
    let open!: () => void;
    const gate = new Promise<void>((r) => { open = r; });
    let entered!: () => void;
    const firing = new Promise<void>((r) => { entered = r; });
    const fired: string[] = [];
    // The first has claimed the id and is firing (held at the gate) when the second arrives.
    const first = acceptDelivery(store, ws, automationId, 'msg_twice', async (id) => {
      entered();
      return firer(ws, automationId, 'msg_twice', fired, gate)(id);
    });
    await firing;
    const second = await acceptDelivery(store, ws, automationId, 'msg_twice', firer(ws, automationId, 'msg_twice', fired)).finally(open);
    const one = await first;
    expect(second.firing.id).toBe(one.firing.id);
    expect(await receipts(ws, automationId)).toEqual([one.firing.id]);
  });
});
