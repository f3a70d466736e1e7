import { connect, createServer, type AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { useEmbeddedRedis } from './testing.js';
import { Redis } from 'ioredis';
import { connectRedis } from './redis.js';
import { EventLog, eventLogKeys, ISO_LUA, newEventId, QUEUE_HEAD, SEQ_PLACEHOLDER, type LiveMessage } from './event-log.js';
import { DocumentStore } from './documents.js';
import { keys, tags } from './keys.js';
import { EventHub, type HubMessage } from './event-hub.js';

let redis: Redis;
let log: EventLog;
const sess = () => `sess_${Math.random().toString(16).slice(2).padEnd(32, '0').slice(0, 32)}`;

const testRedis = useEmbeddedRedis('evlog');
beforeAll(async () => {
  redis = new Redis(testRedis.server().url);
  log = new EventLog(redis);
});
afterAll(() => redis?.disconnect());

/** A new Session whose thread `sthr_1` is running: its input queue and its document's keys. */
async function busyThread(): Promise<{ s: string; tag: ReturnType<typeof tags.session>; list: string; peek: string }> {
  const s = sess();
  const tag = tags.session(s);
  const peek = keys.doc(tag, 'sthr_1');
  await redis.set(peek, JSON.stringify({ id: 'sthr_1', version: 1, status: 'running' }));
  return { s, tag, list: keys.scoped(tag, 'inputs:sthr_1'), peek };
}

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

  it('the Lua timestamp formatter agrees with Date#toISOString (epoch, leap days, year ends)', async () => {
    const samples = [0, 951_782_400_000, 951_868_799_999, 1_709_164_800_123, 4_107_542_399_999, 1_798_761_599_999, 1_798_761_600_000, Date.now()];
    for (const ms of samples) {
      const got = await redis.eval(`${ISO_LUA}\nreturn iso(tonumber(ARGV[1]))`, 0, String(ms));
      expect(got, String(ms)).toBe(new Date(ms).toISOString());
    }
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

  it('an append its client sends again after a dropped connection is appended once, with or without a producer key', async () => {
    // A proxy that passes everything but, once armed, drops both sides right after the next
    // script reached Redis and before its answer: the client reconnects and sends it again.
    let armed = false;
    const proxy = createServer((client) => {
      const up = connect(testRedis.server().port, '127.0.0.1');
      let dropAnswer = false;
      client.on('data', (d) => {
        if (armed && /evalsha/i.test(d.toString('latin1'))) {
          armed = false;
          dropAnswer = true;
        }
        up.write(d);
      });
      up.on('data', (d) => {
        if (!dropAnswer) return void client.write(d);
        client.destroy();
        up.destroy();
      });
      for (const sock of [client, up]) sock.on('error', () => undefined);
      client.on('close', () => up.destroy());
      up.on('close', () => client.destroy());
    });
    await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
    const { password } = new URL(testRedis.server().url);
    const client = connectRedis(`redis://:${password}@127.0.0.1:${(proxy.address() as AddressInfo).port}`, { name: 'resend-test' });
    client.on('error', () => undefined);
    try {
      const viaProxy = new EventLog(client);
      for (const ev of [{ type: 'user.message', payload: { n: 1 } }, { type: 'user.message', payload: { n: 2 }, producer_key: 'drive:x' }]) {
        const s = sess();
        await viaProxy.append(s, [{ type: 'warm', payload: {} }]); // connected, scripts loaded
        armed = true;
        // Answered once, on the new connection, after the script ran on Redis twice.
        const r = await viaProxy.append(s, [ev]);
        expect(armed).toBe(false);
        expect(r.ok && r.events.map((e) => e.seq)).toEqual([2]);
        expect((await log.range(s, 0, 10)).map((e) => e.type)).toEqual(['warm', 'user.message']);
      }
    } finally {
      client.disconnect();
      proxy.close();
    }
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
    expect(c['t.sthr_a.usage.output_tokens']).toBe('12');
    expect(c['s.events.agent.message']).toBe('2');
  });

  it('a type holding the counters\' separators counts only as an event, and the log goes on', async () => {
    const s = sess();
    await log.append(s, [{ type: 'agent.message', payload: {} }]);
    // `x;last_event_at` once became a counter named `last_event_at` (a time, not a number): the
    // script failed after its XADD, and every later append of the Session failed with it.
    const odd = await log.append(s, [{ type: 'x;last_event_at', payload: {} }, { type: 'y=1', payload: {} }]);
    expect(odd.ok && odd.events.map((e) => e.seq)).toEqual([2, 3]);
    const next = await log.append(s, [{ type: 'agent.message', payload: {} }]);
    expect(next.ok && next.events.map((e) => e.seq)).toEqual([4]);
    const c = await log.counters(s);
    expect(c['s.events']).toBe('4');
    expect(Object.keys(c).filter((k) => k.includes(';') || k.includes('='))).toEqual([]);
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

  it('commit: documents and events together, all or nothing', async () => {
    const s = sess();
    const tag = tags.session(s);
    const docs = new DocumentStore(redis);
    const now = new Date().toISOString();
    await docs.create(tag, { id: 'sthr_1', version: 3, created_at: now, updated_at: now });
    const threadKey = keys.doc(tag, 'sthr_1');
    const runKey = keys.doc(tag, 'run_1');
    const runs = keys.index(tag, 'runs');
    const write = (expected: number) => log.commit(s, [
      { key: threadKey, body: JSON.stringify({ id: 'sthr_1', version: expected + 1, list: [] }), expectedVersion: expected },
      { key: runKey, body: JSON.stringify({ id: 'run_1', version: 1 }), expectedVersion: null, index: { key: runs, score: 5, member: 'run_1' } },
    ], [{ type: 'session.status_running', payload: { run_id: 'run_1' }, session_thread_id: 'sthr_1', producer_key: 'status:run_1:running' }]);

    // A stale version writes nothing and returns the stored document.
    const stale = await write(2);
    expect(stale).toMatchObject({ ok: false, reason: 'stale', index: 0 });
    expect(stale.ok === false && stale.reason === 'stale' && (JSON.parse(stale.current) as { version: number }).version).toBe(3);
    expect(await redis.exists(runKey)).toBe(0);
    expect((await log.state(s)).seq).toBe(0);

    const ok = await write(3);
    expect(ok.ok && ok.events.map((e) => [e.seq, e.type])).toEqual([[1, 'session.status_running']]);
    expect(await redis.get(threadKey)).toBe(JSON.stringify({ id: 'sthr_1', version: 4, list: [] })); // never re-encoded
    expect(await redis.zscore(runs, 'run_1')).toBe('5');
    expect((await log.counters(s))['s.events.session.status_running']).toBe('1');

    // The new document exists now: refused before anything is written.
    expect(await write(4)).toEqual({ ok: false, reason: 'exists', index: 1 });
    expect(await redis.get(threadKey)).toBe(JSON.stringify({ id: 'sthr_1', version: 4, list: [] }));
    expect((await log.state(s)).seq).toBe(1);
    expect(await log.commit(s, [{ key: keys.doc(tag, 'gone'), body: '{}', expectedVersion: 1 }], [{ type: 'a', payload: {} }]))
      .toEqual({ ok: false, reason: 'missing', index: 0 });

    await log.erase(s);
    expect(await write(4)).toEqual({ ok: false, reason: 'erased' });
    expect(await redis.get(threadKey)).toBe(JSON.stringify({ id: 'sthr_1', version: 4, list: [] }));
  });

  it('commit with seqInto: the event\'s seq is written into the document in place of its placeholder, with a claim beside it', async () => {
    const s = sess();
    const doc = keys.doc(tags.session(s), 'sthr_1');
    await log.append(s, [{ type: 'a', payload: {} }, { type: 'b', payload: {} }]);
    const body = (version: number) => JSON.stringify({ id: 'sthr_1', version, _waits: { toolu_1: { answered_seq: SEQ_PLACEHOLDER } } });
    const r = await log.commit(s, [{ key: doc, body: body(1), expectedVersion: null }], [{ type: 'answer', payload: {}, producer_key: 'answer:1' }],
      { fresh: true, seqInto: { doc: 0, field: 'answered_seq' }, claim: { key: keys.doc(tags.session(s), 'claims'), field: 'f', value: 'v' } });
    expect(r).toMatchObject({ ok: true, last_seq: 3 });
    expect(JSON.parse((await redis.get(doc)) ?? '{}')).toEqual({ id: 'sthr_1', version: 1, _waits: { toolu_1: { answered_seq: 3 } } });
    // The same producer key again: nothing is written (fresh), the document as it was.
    expect(await log.commit(s, [{ key: doc, body: body(2), expectedVersion: 1 }], [{ type: 'answer', payload: {}, producer_key: 'answer:1' }], { fresh: true, seqInto: { doc: 0, field: 'answered_seq' } }))
      .toEqual({ ok: false, reason: 'replay' });
    expect(JSON.parse((await redis.get(doc)) ?? '{}')).toMatchObject({ version: 1, _waits: { toolu_1: { answered_seq: 3 } } });
    // A document without the placeholder is a mistake of the caller's: refused, nothing written.
    await expect(log.commit(s, [{ key: doc, body: JSON.stringify({ id: 'sthr_1', version: 2 }), expectedVersion: 1 }], [{ type: 'answer', payload: {} }], { fresh: true, seqInto: { doc: 0, field: 'answered_seq' } }))
      .rejects.toThrow(/no placeholder/);
    expect((await log.state(s)).seq).toBe(3);
    await expect(log.commit(s, [{ key: doc, body: body(2), expectedVersion: 1 }], [{ type: 'answer', payload: {} }], { seqInto: { doc: 0, field: 'answered_seq' } })).rejects.toThrow(RangeError);
  });

  it('commit with something sent behind it: it runs after the commit; a script the server lost is refused, not resent after it', async () => {
    const s = sess();
    const doc = keys.doc(tags.session(s), 'sthr_1');
    let behind: Promise<number> | undefined;
    const write = (version: number) => log.commit(s, [{ key: doc, body: JSON.stringify({ id: 'sthr_1', version }), expectedVersion: version === 1 ? null : version - 1 }],
      [{ type: 'a', payload: {} }], { behind: () => void (behind = redis.exists(doc)) });
    expect(await write(1)).toMatchObject({ ok: true });
    expect(await behind).toBe(1); // sent before the answer, run after the commit
    // The server lost its scripts (a restart, SCRIPT FLUSH): what went behind ran first, so the
    // commit is not sent again in full: refused, nothing written.
    await redis.script('FLUSH');
    expect(await write(2)).toEqual({ ok: false, reason: 'unloaded' });
    expect(await behind).toBe(1);
    expect(JSON.parse((await redis.get(doc)) ?? '{}')).toMatchObject({ version: 1 });
    expect((await log.state(s)).seq).toBe(1);
    // Without anything behind it, the same commit loads the script again and is written.
    await redis.script('FLUSH');
    expect(await log.commit(s, [{ key: doc, body: JSON.stringify({ id: 'sthr_1', version: 2 }), expectedVersion: 1 }], [{ type: 'a', payload: {} }])).toMatchObject({ ok: true });
    expect((await log.state(s)).seq).toBe(2);
  });

  it('commit with a lease fence: a stale or expired token refuses the documents as well as the events', async () => {
    const s = sess();
    const tag = tags.session(s);
    const docs = new DocumentStore(redis);
    const now = new Date().toISOString();
    await docs.create(tag, { id: 'run_1', version: 2, created_at: now, updated_at: now });
    const runKey = keys.doc(tag, 'run_1');
    const stored = await redis.get(runKey);
    const write = (fence: string, producer: string) => log.commit(s, [{ key: runKey, body: JSON.stringify({ id: 'run_1', version: 3 }), expectedVersion: 2 }],
      [{ type: 'agent.message', payload: {}, producer_key: producer }], { fence });
    expect(await write('tok', 'p1')).toEqual({ ok: false, reason: 'fenced', detail: 'mismatch' });
    await log.setLease(s, 'tok', Date.now() - 1_000);
    expect(await write('tok', 'p1')).toEqual({ ok: false, reason: 'fenced', detail: 'expired' });
    expect(await redis.get(runKey)).toBe(stored);
    expect((await log.state(s)).seq).toBe(0);
    await log.setLease(s, 'tok', Date.now() + 60_000);
    const ok = await write('tok', 'p1');
    expect(ok.ok && ok.events.map((e) => [e.seq, e.type])).toEqual([[1, 'agent.message']]);
    expect(await redis.get(runKey)).toBe(JSON.stringify({ id: 'run_1', version: 3 }));
  });

  it('commit with peekList: the list as the script left it comes back (its ids while short); a refused commit returns none', async () => {
    const s = sess();
    const tag = tags.session(s);
    const list = keys.scoped(tag, 'inputs:sthr_1');
    const doc = keys.doc(tag, 'sthr_1');
    await redis.set(doc, JSON.stringify({ id: 'sthr_1', version: 1 }));
    await redis.rpush(list, 'evt_a', 'evt_b');
    const end = (expected: number, producer: string) => log.commit(s, [{ key: doc, body: JSON.stringify({ id: 'sthr_1', version: expected + 1 }), expectedVersion: expected }],
      [{ type: 'session.status_idle', payload: {}, producer_key: producer }], { peekList: list });
    const r = await end(1, 'idle:1');
    expect(r.ok && r.queued).toEqual(['evt_a', 'evt_b']);
    expect(r.ok && r.events.map((e) => e.type)).toEqual(['session.status_idle']);
    expect(await end(1, 'idle:2')).toMatchObject({ ok: false, reason: 'stale' });
    // A queue longer than QUEUE_HEAD is left to the caller to read.
    await redis.rpush(list, ...Array.from({ length: QUEUE_HEAD }, (_, i) => `evt_${i}`));
    const long = await end(2, 'idle:3');
    expect(long.ok && long.queued).toBeUndefined();
    // Without peekList, no queue comes back.
    const plain = await log.commit(s, [{ key: doc, body: JSON.stringify({ id: 'sthr_1', version: 4 }), expectedVersion: 3 }], [{ type: 'a', payload: {} }]);
    expect(plain.ok && 'queued' in plain).toBe(false);
  });

  it('commit with reads: values read after the write come back in order, absent ones as null, beside peekList and a dequeue', async () => {
    const s = sess();
    const tag = tags.session(s);
    const doc = keys.doc(tag, 'sthr_1');
    const hash = keys.scoped(tag, 'outcomes:active');
    const str = keys.scoped(tag, 'note');
    const list = keys.scoped(tag, 'inputs:sthr_1');
    await redis.set(doc, JSON.stringify({ id: 'sthr_1', version: 1 }));
    await redis.hset(hash, 'sthr_1', 'outc_1');
    await redis.set(str, 'before');
    await redis.rpush(list, 'evt_a', 'evt_b');
    const reads = [{ key: hash, field: 'sthr_1' }, { key: hash, field: 'sthr_2' }, { key: str }, { key: keys.scoped(tag, 'none') }];
    // The read is made after the commit's own writes: a document the commit writes reads as written.
    const r = await log.commit(s, [{ key: str, body: 'after', expectedVersion: null }, { key: doc, body: JSON.stringify({ id: 'sthr_1', version: 2 }), expectedVersion: 1 }],
      [{ type: 'session.status_idle', payload: {} }], { reads, peekList: list });
    // `str` exists already: the commit refuses it as a new document, and reads nothing.
    expect(r).toMatchObject({ ok: false, reason: 'exists', index: 0 });
    await redis.del(str);
    const ok = await log.commit(s, [{ key: str, body: 'after', expectedVersion: null }, { key: doc, body: JSON.stringify({ id: 'sthr_1', version: 2 }), expectedVersion: 1 }],
      [{ type: 'e1', payload: {} }, { type: 'e2', payload: {} }], { reads, peekList: list, dequeue: { list, ids: ['evt_a'] } });
    expect(ok.ok && ok.read).toEqual(['outc_1', null, 'after', null]);
    expect(ok.ok && ok.queued).toEqual(['evt_b']);
    expect(ok.ok && ok.events.map((e) => e.type)).toEqual(['e1', 'e2']);
    // Without reads, none come back.
    const plain = await log.commit(s, [{ key: doc, body: JSON.stringify({ id: 'sthr_1', version: 3 }), expectedVersion: 2 }], [{ type: 'a', payload: {} }]);
    expect(plain.ok && 'read' in plain).toBe(false);
  });

  it('append with enqueue: new events are queued once and the peeked document comes back; commit dequeues only the expected head', async () => {
    const s = sess();
    const tag = tags.session(s);
    const list = keys.scoped(tag, 'inputs:sthr_1');
    const peek = keys.doc(tag, 'sthr_1');
    await redis.set(peek, JSON.stringify({ id: 'sthr_1', version: 1 }));
    const a = await log.append(s, [{ type: 'user.message', payload: {}, producer_key: 'm1' }], { enqueue: { list, peek } });
    const b = await log.append(s, [{ type: 'user.message', payload: {}, producer_key: 'm2' }], { enqueue: { list, peek } });
    const replay = await log.append(s, [{ type: 'user.message', payload: {}, producer_key: 'm1' }], { enqueue: { list, peek } });
    if (!a.ok || !b.ok || !replay.ok) throw new Error('append failed');
    expect(a.peeked).toBe(JSON.stringify({ id: 'sthr_1', version: 1 }));
    expect(replay.duplicate).toEqual([true]);
    expect(replay.events[0]?.id).toBe(a.events[0]?.id);
    const [ida, idb] = [a.events[0]?.id ?? '', b.events[0]?.id ?? ''];
    expect(await redis.lrange(list, 0, -1)).toEqual([ida, idb]);
    // The queue comes back as the script left it (a replay pushes nothing).
    expect([a.queued, b.queued, replay.queued]).toEqual([[ida], [ida, idb], [ida, idb]]);
    // Without a peeked document: null, and the plain append result is unchanged.
    const none = await log.append(s, [{ type: 'x', payload: {} }], { enqueue: { list: keys.scoped(tag, 'inputs:sthr_2'), peek: keys.doc(tag, 'sthr_2') } });
    expect(none.ok && none.peeked).toBeNull();

    const start = (ids: string[]) => log.commit(s, [{ key: peek, body: JSON.stringify({ id: 'sthr_1', version: 2 }), expectedVersion: 1 }],
      [{ type: 'session.status_running', payload: {} }], { dequeue: { list, ids } });
    // The head is not what the caller read: nothing written.
    expect(await start([idb])).toEqual({ ok: false, reason: 'queue' });
    expect(await start([ida, idb, 'evt_more'])).toEqual({ ok: false, reason: 'queue' });
    expect(await redis.get(peek)).toBe(JSON.stringify({ id: 'sthr_1', version: 1 }));
    const ok = await start([ida]);
    expect(ok.ok).toBe(true);
    expect(await redis.lrange(list, 0, -1)).toEqual([idb]);

    // A queue longer than QUEUE_HEAD is not returned (the caller reads it): no reply grows with it.
    await redis.rpush(list, ...Array.from({ length: QUEUE_HEAD - 2 }, (_, i) => `evt_q${i}`));
    const full = await log.append(s, [{ type: 'user.message', payload: {} }], { enqueue: { list, peek } });
    const over = await log.append(s, [{ type: 'user.message', payload: {} }], { enqueue: { list, peek } });
    if (!full.ok || !over.ok) throw new Error('append failed');
    expect(full.queued).toHaveLength(QUEUE_HEAD);
    expect(full.queued?.at(-1)).toBe(full.events[0]?.id);
    expect(over.queued).toBeUndefined();
    expect(over.peeked).toBe(JSON.stringify({ id: 'sthr_1', version: 2 }));
  });

  it('append with enqueue and refuseStatus: an absent or refused document appends and queues nothing', async () => {
    const s = sess();
    const tag = tags.session(s);
    const list = keys.scoped(tag, 'inputs:sthr_1');
    const peek = keys.doc(tag, 'sthr_1');
    const guarded = { enqueue: { list, peek, refuseStatus: 'terminated' } };
    const send = () => log.append(s, [{ type: 'user.message', payload: {} }], guarded);
    expect(await send()).toEqual({ ok: false, reason: 'refused', detail: 'absent' });
    await redis.set(peek, JSON.stringify({ id: 'sthr_1', version: 1, status: 'terminated', nested: { status: 'idle' } }));
    expect(await send()).toEqual({ ok: false, reason: 'refused', detail: 'status' });
    expect((await log.state(s)).seq).toBe(0);
    expect(await redis.llen(list)).toBe(0);
    // Only the document's own status counts (not a nested one), and any other status appends.
    await redis.set(peek, JSON.stringify({ id: 'sthr_1', version: 2, status: 'idle', nested: { status: 'terminated' } }));
    const ok = await send();
    expect(ok.ok && ok.queued?.length).toBe(1);
    expect((await log.state(s)).seq).toBe(1);
    // An erased log is reported as such, before the document is looked at.
    await log.erase(s);
    expect(await send()).toEqual({ ok: false, reason: 'erased' });
  });

  it('appends with enqueue into one list in one tick go in one script: each caller its own events, in call order', async () => {
    const { s, tag, list, peek } = await busyThread();
    const guarded = { enqueue: { list, peek, refuseStatus: 'terminated' } };
    const calls = async () => Number(/cmdstat_evalsha:calls=(\d+)/.exec(await redis.info('commandstats'))?.[1] ?? 0);
    const live: LiveMessage[] = [];
    const sub = redis.duplicate();
    await sub.subscribe(eventLogKeys.liveChannel(s));
    sub.on('message', (_c: string, m: string) => live.push(JSON.parse(m) as LiveMessage));
    const before = await calls();
    // Five messages sent together (one a replay of another's producer key, one a pair), and an
    // append into another list of the same Session, which is not joined to them.
    const [a, b, pair, replay, c, other] = await Promise.all([
      log.append(s, [{ type: 'user.message', payload: { n: 'a' }, producer_key: 'a' }], guarded),
      log.append(s, [{ type: 'user.message', payload: { n: 'b' } }], guarded),
      log.append(s, [{ type: 'user.message', payload: { n: 'p1' } }, { type: 'user.message', payload: { n: 'p2' } }], guarded),
      log.append(s, [{ type: 'user.message', payload: { n: 'a again' }, producer_key: 'a' }], guarded),
      log.append(s, [{ type: 'user.message', payload: { n: 'c' } }], guarded),
      log.append(s, [{ type: 'x', payload: {} }], { enqueue: { list: keys.scoped(tag, 'inputs:sthr_2'), peek: keys.doc(tag, 'sthr_2') } }),
    ]);
    expect((await calls()) - before).toBe(2);
    for (const r of [a, b, pair, replay, c, other]) if (!r.ok) throw new Error('append failed');
    const names = (r: typeof a) => (r.ok ? r.events.map((e) => (e.payload as { n?: string }).n) : []);
    expect([a, b, pair, replay, c].map(names)).toEqual([['a'], ['b'], ['p1', 'p2'], ['a'], ['c']]);
    expect([a, b, pair, replay, c].map((r) => r.ok && r.duplicate)).toEqual([[false], [false], [false, false], [true], [false]]);
    expect([a, b, pair, c].map((r) => r.ok && r.events.map((e) => e.seq))).toEqual([[1], [2], [3, 4], [5]]);
    // Each caller sees the queue and the document as the whole batch left them.
    const ids = [a, b, pair, c].flatMap((r) => (r.ok ? r.events.map((e) => e.id) : []));
    expect(await redis.lrange(list, 0, -1)).toEqual(ids);
    for (const r of [a, b, pair, replay, c]) expect(r.ok && [r.queued, r.peeked]).toEqual([ids, JSON.stringify({ id: 'sthr_1', version: 1, status: 'running' })]);
    expect(other.ok && other.peeked).toBeNull();
    // One live message for the five appended events (the other list's append has its own).
    await vi.waitFor(() => expect(live).toHaveLength(2));
    expect(live.map((m) => (m.kind === 'events' ? [m.from, m.to] : m.kind))).toEqual([[1, 5], [6, 6]]);
    sub.disconnect();

    // A refusal refuses every caller of the batch, and nothing is written.
    await redis.set(peek, JSON.stringify({ id: 'sthr_1', version: 2, status: 'terminated' }));
    const refused = await Promise.all([1, 2, 3].map(() => log.append(s, [{ type: 'user.message', payload: {} }], guarded)));
    expect(refused).toEqual(Array.from({ length: 3 }, () => ({ ok: false, reason: 'refused', detail: 'status' })));
    expect((await log.state(s)).seq).toBe(6);
  });

  it('a joined append whose event cannot be encoded fails alone; the others of its tick are appended', async () => {
    const { s, list, peek } = await busyThread();
    const circular: Record<string, unknown> = {};
    circular.self = circular;
    const [a, bad, c] = await Promise.allSettled([
      log.append(s, [{ type: 'user.message', payload: { n: 'a' } }], { enqueue: { list, peek } }),
      log.append(s, [{ type: 'user.message', payload: circular }], { enqueue: { list, peek } }),
      log.append(s, [{ type: 'user.message', payload: { n: 'c' } }], { enqueue: { list, peek } }),
    ]);
    expect(bad.status).toBe('rejected');
    const names = [a, c].map((r) => (r.status === 'fulfilled' && r.value.ok ? r.value.events.map((e) => (e.payload as { n?: string }).n) : r.status));
    expect(names).toEqual([['a'], ['c']]);
    expect(await redis.llen(list)).toBe(2);
  });

  it('commit with claim: of two commits claiming one hash field, one is written; a held field refuses the commit whole', async () => {
    const s = sess();
    const tag = tags.session(s);
    const hash = keys.scoped(tag, 'outcomes:active');
    const list = keys.scoped(tag, 'inputs:sthr_1');
    const define = (n: string, replaces?: string | null) => log.commit(s, [{ key: keys.doc(tag, n), body: JSON.stringify({ id: n, version: 1 }), expectedVersion: null, index: { key: keys.index(tag, 'outcomes'), score: 1, member: n } }],
      [{ type: 'user.define_outcome', payload: { n } }], { claim: { key: hash, field: 'sthr_1', value: n, replaces }, reads: [{ key: hash, field: 'sthr_1' }], peekList: list });
    const [a, b] = await Promise.all([define('outc_a'), define('outc_b')]);
    expect([a, b].filter((r) => r.ok)).toHaveLength(1);
    const winner = a.ok ? 'outc_a' : 'outc_b';
    expect([a, b].find((r) => !r.ok)).toEqual({ ok: false, reason: 'claimed', holder: winner });
    expect((a.ok ? a : b.ok ? b : null)?.read).toEqual([winner]);
    expect(await redis.hgetall(hash)).toEqual({ sthr_1: winner });
    expect(await redis.zrange(keys.index(tag, 'outcomes'), 0, -1)).toEqual([winner]);
    expect(await redis.exists(keys.doc(tag, a.ok ? 'outc_b' : 'outc_a'))).toBe(0);
    expect((await log.range(s, 0, 10)).map((e) => e.payload)).toEqual([{ n: winner }]);
    // The holder it names may be replaced (one known to be over); another may not.
    expect(await define('outc_c', 'outc_other')).toEqual({ ok: false, reason: 'claimed', holder: winner });
    const replaced = await define('outc_c', winner);
    expect(replaced.ok).toBe(true);
    expect(await redis.hget(hash, 'sthr_1')).toBe('outc_c');
    // A free field is taken whatever it names; a commit without a claim leaves the hash alone.
    await redis.hdel(hash, 'sthr_1');
    expect((await define('outc_d', 'outc_gone')).ok).toBe(true);
    expect((await log.commit(s, [], [{ type: 'x', payload: {} }])).ok).toBe(true);
    expect(await redis.hgetall(hash)).toEqual({ sthr_1: 'outc_d' });
  });

  it('commit with emptyList and fresh: a queued message or a replayed producer key writes nothing; an event keeps the id it was given', async () => {
    const s = sess();
    const tag = tags.session(s);
    const list = keys.scoped(tag, 'inputs:sthr_1');
    const doc = keys.doc(tag, 'run_1');
    const id = newEventId();
    const start = () => log.commit(s, [{ key: doc, body: JSON.stringify({ id: 'run_1', version: 1, input: id }), expectedVersion: null }],
      [{ type: 'user.message', payload: {}, producer_key: 'drive:k', id }, { type: 'session.status_running', payload: {} }], { emptyList: list, fresh: true });
    await redis.rpush(list, 'evt_waiting');
    expect(await start()).toEqual({ ok: false, reason: 'queue' });
    await redis.del(list);
    const replayed = await log.append(s, [{ type: 'user.message', payload: {}, producer_key: 'drive:k' }]);
    expect(await start()).toEqual({ ok: false, reason: 'replay' });
    expect(await redis.exists(doc)).toBe(0);
    expect((await log.state(s)).seq).toBe(replayed.ok ? replayed.last_seq : -1);
    // A fresh producer key: written whole, the message under the id named ahead.
    const other = await log.commit(s, [{ key: doc, body: '{"id":"run_1","version":1}', expectedVersion: null }],
      [{ type: 'user.message', payload: {}, producer_key: 'drive:other', id }, { type: 'session.status_running', payload: {} }], { emptyList: list, fresh: true });
    if (!other.ok) throw new Error(`commit refused: ${other.reason}`);
    expect(other.events.map((e) => e.type)).toEqual(['user.message', 'session.status_running']);
    expect(other.events[0]?.id).toBe(id);
    expect(await redis.exists(doc)).toBe(1);
  });

  it('swapWith: the second document rides on the first one\'s write only at its expected version, and never stops it', async () => {
    const docs = new DocumentStore(redis);
    const tag = tags.session(sess());
    const now = new Date().toISOString();
    const doc = (id: string, version: number, n: number) => ({ id, version, created_at: now, updated_at: now, n });
    await docs.create(tag, doc('a', 1, 0));
    await docs.create(tag, doc('b', 1, 0));
    const read = async (id: string) => JSON.parse((await redis.get(keys.doc(tag, id))) ?? 'null') as { version: number; n: number } | null;
    expect(await docs.swapWith(tag, 'a', doc('a', 2, 1), 1, { id: 'b', next: doc('b', 2, 1), expected: 1 })).toEqual({ outcome: { kind: 'written' }, alsoWritten: true });
    expect(await read('b')).toMatchObject({ version: 2, n: 1 });
    // The second is stale: the first is written alone.
    expect(await docs.swapWith(tag, 'a', doc('a', 3, 2), 2, { id: 'b', next: doc('b', 2, 9), expected: 1 })).toEqual({ outcome: { kind: 'written' }, alsoWritten: false });
    expect(await read('a')).toMatchObject({ version: 3, n: 2 });
    expect(await read('b')).toMatchObject({ version: 2, n: 1 });
    // The first is stale (its current document comes back) or missing: nothing is written.
    const stale = await docs.swapWith(tag, 'a', doc('a', 3, 7), 2, { id: 'b', next: doc('b', 3, 7), expected: 2 });
    expect(stale.alsoWritten).toBe(false);
    expect(stale.outcome.kind === 'stale' && (JSON.parse(stale.outcome.current) as { n: number }).n).toBe(2);
    expect(await docs.swapWith(tag, 'zz', doc('zz', 2, 1), 1, { id: 'b', next: doc('b', 3, 7), expected: 2 })).toEqual({ outcome: { kind: 'missing' }, alsoWritten: false });
    expect(await read('b')).toMatchObject({ version: 2, n: 1 });
  });

  it('update: a guessed current document saves the read and is always checked', async () => {
    const conn = new Redis(testRedis.server().url);
    const docs = new DocumentStore(conn);
    const tag = tags.session(sess());
    const now = new Date().toISOString();
    type Doc = { id: string; version: number; created_at: string; updated_at: string; n: number };
    const base: Doc = { id: 'd1', version: 1, created_at: now, updated_at: now, n: 0 };
    await docs.create(tag, base);
    const get = vi.spyOn(conn, 'get');
    const reads = () => get.mock.calls.length;
    let before = reads();
    const v2 = await docs.update<Doc>(tag, 'd1', (d) => ({ ...d, n: d.n + 1 }), { current: base });
    expect(v2).toMatchObject({ version: 2, n: 1 });
    expect(reads()).toBe(before); // no GET: the guess was current
    // A stale guess: the CAS returns the stored document and the change is made on that.
    before = reads();
    const v3 = await docs.update<Doc>(tag, 'd1', (d) => ({ ...d, n: d.n + 1 }), { current: base });
    expect(v3).toMatchObject({ version: 3, n: 2 });
    expect(reads()).toBe(before);
    // A guess that mutate refuses (or leaves alone) is confirmed by a read first.
    const refused = docs.update<Doc>(tag, 'd1', (d) => { if (d.n === 0) throw new Error('stale refusal'); return null; }, { current: base });
    await expect(refused).resolves.toMatchObject({ version: 3, n: 2 });
    // expectedVersion compares the stored version, not the guess.
    await expect(docs.update<Doc>(tag, 'd1', (d) => d, { current: { ...base, version: 3 }, expectedVersion: 1 })).rejects.toMatchObject({ type: 'validation.conflict' });
    await expect(docs.update<Doc>(tag, 'd1', (d) => ({ ...d, n: 9 }), { current: v2, expectedVersion: 2 })).rejects.toMatchObject({ type: 'validation.conflict' });
    expect(JSON.parse((await redis.get(keys.doc(tag, 'd1'))) ?? '{}')).toMatchObject({ version: 3, n: 2 });
    conn.disconnect();
  });

  it('hub: one connection fans out, ref-counted subscriptions, inline events', async () => {
    const hub = new EventHub(new Redis(testRedis.server().url));
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

  it('hub: live channels need no subscription of their own; every append reaches the firehose once', async () => {
    const hub = new EventHub(new Redis(testRedis.server().url));
    const heard: string[] = [];
    hub.onEveryLive((channel) => heard.push(channel));
    const [s1, s2] = [sess(), sess()];
    const got: HubMessage[] = [];
    const w = await hub.watch(s1, (m) => got.push(m));
    // One pattern subscription serves every Session: no channel is subscribed for the viewer.
    expect(await redis.pubsub('CHANNELS', '*')).toEqual([]);
    expect(await redis.pubsub('NUMPAT')).toBe(1);
    await log.append(s1, [{ type: 'watched', payload: {} }]);
    await log.append(s2, [{ type: 'unwatched', payload: {} }]);
    await vi.waitFor(() => expect(heard).toEqual([eventLogKeys.liveChannel(s1), eventLogKeys.liveChannel(s2)]), { timeout: 5000, interval: 20 });
    // The viewer got its own Session's append, once; the other Session's went to the firehose only.
    expect(got.map((m) => (m.kind === 'events' ? m.events?.[0]?.type : m.kind))).toEqual(['watched']);
    w.close();
    expect(hub.channelCount).toBe(0);
    await log.append(s1, [{ type: 'after', payload: {} }]);
    await vi.waitFor(() => expect(heard).toHaveLength(3), { timeout: 5000, interval: 20 });
    expect(got).toHaveLength(1);
    await hub.close();
  });

  it('hub: previews channels left by their last viewer are unsubscribed together; a viewer back in time keeps its channel', async () => {
    const hub = new EventHub(new Redis(testRedis.server().url));
    const [s1, s2, s3] = [sess(), sess(), sess()];
    const subscribed = async () => new Set((await redis.pubsub('CHANNELS', '*')) as string[]);
    const watches = await Promise.all([s1, s2, s3].map((s) => hub.watch(s, () => undefined, { deltas: true })));
    expect(await subscribed()).toEqual(new Set([s1, s2, s3].map((s) => eventLogKeys.deltaChannel(s))));
    for (const w of watches) w.close();
    expect(hub.channelCount).toBe(0);
    // Back before the batch: the channel is still subscribed and its previews arrive.
    const got: HubMessage[] = [];
    const again = await hub.watch(s2, (m) => got.push(m), { deltas: true });
    expect(hub.channelCount).toBe(2);
    await vi.waitFor(async () => expect(await subscribed()).toEqual(new Set([eventLogKeys.deltaChannel(s2)])), { timeout: 5000, interval: 20 });
    await log.publishDelta(s2, { session_thread_id: null, type: 'agent.message', message_id: 'm1', index: 0, text: 'kept' });
    await vi.waitFor(() => expect(got.map((m) => m.kind)).toEqual(['delta']), { timeout: 5000, interval: 20 });
    again.close();
    await vi.waitFor(async () => expect((await subscribed()).size).toBe(0), { timeout: 5000, interval: 20 });
    await hub.close();
  });

  it('hub: after the subscriber reconnects, viewers are told to resync and stay subscribed', async () => {
    const subConn = new Redis(testRedis.server().url);
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
