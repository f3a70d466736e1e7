import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { startEmbeddedRedis, type EmbeddedRedis } from './embedded-redis.js';
import { EventLog, eventLogKeys, type LiveMessage } from './event-log.js';
import { EventHub, type HubMessage } from './event-hub.js';

let server: EmbeddedRedis;
let dir: string;
let redis: Redis;
let log: EventLog;
const sess = () => `sess_${Math.random().toString(16).slice(2).padEnd(32, '0').slice(0, 32)}`;

beforeAll(async () => {
  dir = mkdtempSync(join(tmpdir(), 'evlog-'));
  server = await startEmbeddedRedis({ dir });
  redis = new Redis(server.url);
  log = new EventLog(redis);
});
afterAll(async () => {
  redis?.disconnect();
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

describe('event log', () => {
  it('assigns 1,2,3… as stream ids and stamps ids and times', async () => {
    const s = sess();
    const r = await log.append(s, [{ type: 'a', payload: { x: [] } }, { type: 'b', payload: {}, session_thread_id: 'sthr_1' }]);
    expect(r.ok).toBe(true);
    if (!r.ok) return;
    expect(r.events.map((e) => e.seq)).toEqual([1, 2]);
    expect(r.events[0]?.id).toMatch(/^evt_[0-9a-f]{32}$/);
    expect(Date.parse(r.events[0]?.created_at ?? '')).toBeGreaterThan(Date.now() - 60_000);
    expect(new Date(r.events[0]?.created_at ?? '').toISOString()).toBe(r.events[0]?.created_at);
    expect(r.events[0]?.payload).toEqual({ x: [] }); // empty arrays survive (never re-encoded in Lua)
    const ids = (await redis.xrange(eventLogKeys.stream(s), '-', '+')).map(([id]) => id);
    expect(ids).toEqual(['1-0', '2-0']);
    const again = await log.append(s, [{ type: 'c', payload: {} }]);
    expect(again.ok && again.events[0]?.seq).toBe(3);
    expect((await log.range(s, 1, 10)).map((e) => e.seq)).toEqual([2, 3]);
    expect((await log.rangeBackward(s, null, 2)).map((e) => e.seq)).toEqual([3, 2]);
  });

  it('is idempotent by producer key, per event and per batch', async () => {
    const s = sess();
    const first = await log.append(s, [{ type: 'a', payload: { n: 1 } }, { type: 'b', payload: { n: 2 } }], { producerKey: 'batch-1' });
    const retry = await log.append(s, [{ type: 'a', payload: { n: 1 } }, { type: 'b', payload: { n: 2 } }], { producerKey: 'batch-1' });
    expect(first.ok && retry.ok).toBe(true);
    if (!first.ok || !retry.ok) return;
    expect(retry.events).toEqual(first.events);
    expect(retry.duplicate).toEqual([true, true]);
    // A partially overlapping retry (runner reconnect) adds only the new event.
    const mixed = await log.append(s, [
      { type: 'a', payload: {}, producer_key: 'p-1' },
      { type: 'a', payload: {}, producer_key: 'p-1' },
      { type: 'c', payload: {}, producer_key: 'p-2' },
    ]);
    expect(mixed.ok && mixed.events.map((e) => e.seq)).toEqual([3, 3, 4]);
    expect(mixed.ok && mixed.duplicate).toEqual([false, true, false]);
    expect((await log.state(s)).seq).toBe(4);
    const counters = await log.counters(s);
    expect(counters['s.events']).toBe('4');
  });

  it('checks the lease fence against the Redis clock', async () => {
    const s = sess();
    expect(await log.append(s, [{ type: 'a', payload: {} }], { fence: 'tok' })).toEqual({ ok: false, reason: 'fenced', detail: 'mismatch' });
    await log.setLease(s, 'tok', Date.now() + 60_000);
    expect((await log.append(s, [{ type: 'a', payload: {} }], { fence: 'tok' })).ok).toBe(true);
    expect(await log.append(s, [{ type: 'a', payload: {} }], { fence: 'old' })).toMatchObject({ ok: false, detail: 'mismatch' });
    await log.setLease(s, 'tok', Date.now() - 1);
    expect(await log.append(s, [{ type: 'a', payload: {} }], { fence: 'tok' })).toMatchObject({ ok: false, detail: 'expired' });
    expect((await log.state(s)).seq).toBe(1);
  });

  it('keeps usage counters current in the same script', async () => {
    const s = sess();
    await log.append(s, [{ type: 'agent.message', payload: {}, session_thread_id: 'sthr_a', counters: { 'usage.output_tokens': 7 } }]);
    await log.append(s, [{ type: 'agent.message', payload: {}, session_thread_id: 'sthr_a', counters: { 'usage.output_tokens': 5 } }]);
    const c = await log.counters(s);
    expect(c['s.usage.output_tokens']).toBe('12');
    expect(c['t.sthr_a.events.agent.message']).toBe('2');
  });

  it('erase drops content, keeps the marker, refuses appends', async () => {
    const s = sess();
    await log.append(s, [{ type: 'a', payload: { secret: 'x' } }, { type: 'a', payload: {} }]);
    expect(await log.erase(s)).toBe(2);
    expect(await redis.exists(eventLogKeys.stream(s))).toBe(0);
    expect(await log.state(s)).toEqual({ seq: 2, low: 3, erased: true });
    expect(await log.append(s, [{ type: 'a', payload: {} }])).toEqual({ ok: false, reason: 'erased' });
    expect(await log.range(s, 0, 10)).toEqual([]);
  });

  it('retention trims explicitly and moves the low mark', async () => {
    const s = sess();
    await log.append(s, Array.from({ length: 5 }, () => ({ type: 'a', payload: {} })));
    expect(await log.trimThrough(s, 3)).toBe(4);
    expect(await log.state(s)).toMatchObject({ seq: 5, low: 4 });
    expect((await log.range(s, 0, 10)).map((e) => e.seq)).toEqual([4, 5]);
  });

  it('hub: one connection fans out, ref-counted subscriptions, inline events', async () => {
    const hub = new EventHub(new Redis(server.url));
    const s1 = sess();
    const s2 = sess();
    const got: HubMessage[][] = [[], [], []];
    const w0 = await hub.watch(s1, (m) => got[0]?.push(m));
    const w1 = await hub.watch(s1, (m) => got[1]?.push(m), { deltas: true });
    const w2 = await hub.watch(s2, (m) => got[2]?.push(m));
    expect(hub.channelCount).toBe(3);
    await log.append(s1, [{ type: 'a', payload: {} }]);
    await log.publishDelta(s1, { session_thread_id: null, type: 'agent.message', message_id: 'm1', index: 0, text: 'he' });
    await log.append(s2, [{ type: 'b', payload: {} }]);
    await new Promise((r) => setTimeout(r, 100));
    expect(got[0]?.map((m) => m.kind)).toEqual(['events']);
    expect(got[1]?.map((m) => m.kind)).toEqual(['events', 'delta']);
    expect((got[2]?.[0] as Extract<LiveMessage, { kind: 'events' }>).events?.[0]?.type).toBe('b');
    w0.close();
    w1.close();
    expect(hub.channelCount).toBe(1);
    w2.close();
    expect(hub.channelCount).toBe(0);
    await hub.close();
  });

  it('hub: after the subscriber reconnects, viewers are told to resync and stay subscribed', async () => {
    const subConn = new Redis(server.url);
    const hub = new EventHub(subConn);
    const s = sess();
    const got: HubMessage[] = [];
    const w = await hub.watch(s, (m) => got.push(m));
    await new Promise((r) => setTimeout(r, 50));
    subConn.disconnect(true); // drop the connection; the client reconnects
    const deadline = Date.now() + 5000;
    while (!got.some((m) => m.kind === 'resync') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(got.map((m) => m.kind)).toContain('resync');
    await log.append(s, [{ type: 'after', payload: {} }]);
    while (!got.some((m) => m.kind === 'events') && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
    expect(got.some((m) => m.kind === 'events')).toBe(true);
    w.close();
    await hub.close();
  });
});
