import { createServer, type Server } from 'node:http';
import { connect, type AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import type { EventHub, EventLog, HubListener, LogEvent } from '@agentplane/store';
import { activeStreams, sseStream, type StreamSpec } from './stream.js';

const event = (seq: number): LogEvent => ({
  id: `evt_${seq}`, seq, created_at: new Date(0).toISOString(), session_id: 'sess_x', session_thread_id: null, type: 'agent.message', payload: { n: seq },
});

/** A log of `events` whose range reads fail while `failing` > 0 (each failed read counts it down). */
function flakyLog(events: LogEvent[], state: { failing: number; reads: number }): EventLog {
  return {
    state: async () => ({ seq: events.length, low: 1, erased: false }),
    range: async (_s: string, after: number, limit: number, to?: number) => {
      state.reads++;
      if (state.failing > 0) {
        state.failing--;
        throw new Error('CLUSTERDOWN The cluster is down');
      }
      return events.filter((e) => e.seq > after && (to === undefined || e.seq <= to)).slice(0, limit);
    },
  } as unknown as EventLog;
}

/** A hub that hands the test its listener. */
function manualHub(): { hub: EventHub; send: (m: Parameters<HubListener>[0]) => void } {
  let listener: HubListener | undefined;
  return {
    hub: { watch: async (_s: string, l: HubListener) => ((listener = l), { close: () => undefined }) } as unknown as EventHub,
    send: (m) => listener?.(m),
  };
}

let server: Server | undefined;
afterEach(() => server?.close());

async function open(log: EventLog, hub: EventHub, readRetryMs?: number, extra: Partial<StreamSpec> = {}): Promise<{ ids: () => number[]; reader: ReadableStreamDefaultReader<Uint8Array>; ended: Promise<void> }> {
  const shutdown = new AbortController();
  server = createServer((req, res) => {
    const ac = new AbortController();
    req.on('close', () => ac.abort());
    void sseStream({ sessionId: 'sess_x', cursor: 0, filter: () => true, deltas: null, erased: false, log, hub, shutdown: shutdown.signal, ...(readRetryMs !== undefined ? { readRetryMs } : {}), ...extra }).write(res, ac.signal);
  });
  await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
  const res = await fetch(`http://127.0.0.1:${(server.address() as AddressInfo).port}/`);
  const reader = res.body!.getReader();
  const seen: number[] = [];
  const decoder = new TextDecoder();
  const ended = (async () => {
    for (;;) {
      const { value, done } = await reader.read().catch(() => ({ value: undefined, done: true }));
      if (done) return;
      for (const m of decoder.decode(value).matchAll(/^id: (\d+)$/gm)) seen.push(Number(m[1]));
    }
  })();
  return { ids: () => seen, reader, ended };
}

const until = async (what: string, ok: () => boolean): Promise<void> => {
  const deadline = Date.now() + 10_000;
  while (!ok()) {
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
};

describe('SSE stream reads that fail', () => {
  it('a live backfill that fails (a failing-over master) is tried again: the stream stays open and delivers, once each', async () => {
    const events = [event(1)];
    const st = { failing: 0, reads: 0 };
    const { hub, send } = manualHub();
    const s = await open(flakyLog(events, st), hub);
    await until('the replay', () => s.ids().length === 1);
    // Two events the hub only announces (no inline events): the stream must read the log, which
    // fails three times first.
    events.push(event(2), event(3));
    st.failing = 3;
    send({ kind: 'events', from: 2, to: 3 });
    await until('the backfilled events', () => s.ids().length === 3);
    expect(s.ids()).toEqual([1, 2, 3]);
    expect(st.failing).toBe(0);
    // Still live: a resync finds the next event.
    events.push(event(4));
    send({ kind: 'resync' });
    await until('the event after the resync', () => s.ids().length === 4);
    expect(s.ids()).toEqual([1, 2, 3, 4]);
    await s.reader.cancel();
  });

  it('a read that keeps failing ends the stream (the client resumes with Last-Event-ID); nothing is delivered twice', async () => {
    const events = [event(1)];
    const st = { failing: 0, reads: 0 };
    const { hub, send } = manualHub();
    const s = await open(flakyLog(events, st), hub, 300);
    await until('the replay', () => s.ids().length === 1);
    events.push(event(2));
    st.failing = Number.MAX_SAFE_INTEGER;
    send({ kind: 'events', from: 2, to: 2 });
    await s.ended;
    expect(s.ids()).toEqual([1]);
    expect(st.reads).toBeGreaterThan(2);
  });
});

describe('SSE stream whose live messages or reads go missing', () => {
  it('a live message that never came: the log is read at the next keep-alive, each event once', async () => {
    const events = [event(1)];
    const st = { failing: 0, reads: 0 };
    const { hub } = manualHub(); // announces nothing
    const s = await open(flakyLog(events, st), hub, undefined, { keepaliveMs: 100 });
    await until('the replay', () => s.ids().length === 1);
    events.push(event(2), event(3));
    await until('the events no live message announced', () => s.ids().length === 3);
    expect(s.ids()).toEqual([1, 2, 3]);
    await s.reader.cancel();
  });

  it('a read of the log never answered ends the stream (the viewer resumes with Last-Event-ID)', async () => {
    const events = [event(1)];
    let hang = false;
    const log = {
      state: async () => ({ seq: events.length, low: 1, erased: false }),
      range: (_s: string, after: number, limit: number) => (hang ? new Promise<never>(() => undefined) : Promise.resolve(events.filter((e) => e.seq > after).slice(0, limit))),
    } as unknown as EventLog;
    const { hub, send } = manualHub();
    const s = await open(log, hub, undefined, { keepaliveMs: 50, stuckReadMs: 300 });
    await until('the replay', () => s.ids().length === 1);
    hang = true;
    events.push(event(2));
    send({ kind: 'events', from: 2, to: 2 });
    await s.ended;
    expect(s.ids()).toEqual([1]);
  });
});

describe('SSE viewer that stops reading', () => {
  it('is cut off once it took nothing off its socket for the stall period while a backfill waits on it', async () => {
    const big = (seq: number): LogEvent => ({ ...event(seq), payload: { text: 'x'.repeat(10_000) } });
    const events: LogEvent[] = [];
    const { hub, send } = manualHub();
    const shutdown = new AbortController();
    const before = activeStreams();
    server = createServer((req, res) => {
      const ac = new AbortController();
      req.on('close', () => ac.abort());
      void sseStream({ sessionId: 'sess_x', cursor: 0, filter: () => true, deltas: null, erased: false, log: flakyLog(events, { failing: 0, reads: 0 }), hub, shutdown: shutdown.signal, stallMs: 300 }).write(res, ac.signal);
    });
    await new Promise<void>((r) => server!.listen(0, '127.0.0.1', r));
    // A raw viewer that reads the headers, then nothing more.
    const sock = connect((server.address() as AddressInfo).port, '127.0.0.1');
    await new Promise<void>((resolve) => {
      let got = '';
      const onData = (b: Buffer) => {
        got += b.toString('latin1');
        if (!got.includes('\r\n\r\n')) return;
        sock.off('data', onData);
        sock.pause();
        resolve();
      };
      sock.on('data', onData);
      sock.on('connect', () => sock.write('GET / HTTP/1.1\r\nHost: x\r\n\r\n'));
    });
    try {
      expect(activeStreams()).toBe(before + 1);
      // 30 MB announced without inline events (pages of 5 MB, each under the 8 MiB cut-off): the
      // backfill fills the socket, then waits on it.
      for (let i = 1; i <= 3000; i++) events.push(big(i));
      send({ kind: 'events', from: 1, to: 3000 });
      await until('the stalled viewer cut off', () => activeStreams() === before);
    } finally {
      sock.destroy();
    }
  });
});
