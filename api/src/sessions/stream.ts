import type { ServerResponse } from 'node:http';
import { ApiError, backoffDelay } from '@agentplane/core';
import type { DeltaMessage, EventHub, EventLog, HubMessage, LogEvent } from '@agentplane/store';
import type { StreamResult } from '../http/operation.js';

/** Default keep-alive comment period; proxies commonly cut idle streams after 30-60 s. */
export const KEEPALIVE_MS = 15_000;
/** Replay and backfill read the log in pages of this many events. */
const READ_PAGE = 500;
/** A viewer that stops reading is cut off past this much unsent data; it resumes with Last-Event-ID. */
const MAX_BUFFERED_BYTES = 8 * 1024 * 1024;
/** Replay stops reading the log while this much is waiting for the socket. */
const REPLAY_HIGH_WATER_BYTES = 1024 * 1024;
/**
 * A live stream's read of the log (a backfill, a resync) that fails is tried again this long
 * before the stream ends: a Redis failover or restart takes seconds, and the viewer's stream
 * outlives it (each read resumes from the last delivered event, so a retry repeats nothing).
 */
const READ_RETRY_MS = 20_000;
const READ_RETRY_BASE_MS = 100;
const READ_RETRY_CAP_MS = 2_000;

/**
 * What to run when a shutdown signal aborts, per signal: one listener on the signal for every
 * open stream. An EventTarget checks a new listener against each one it holds (and removal
 * walks them too), so a listener per stream made every stream's open and close cost a step per
 * stream open in the process.
 */
const onShutdown = new WeakMap<AbortSignal, Set<() => void>>();
function shutdownSet(signal: AbortSignal): Set<() => void> {
  let fns = onShutdown.get(signal);
  if (!fns) {
    const all = new Set<() => void>();
    signal.addEventListener('abort', () => {
      for (const f of [...all]) f();
    }, { once: true });
    onShutdown.set(signal, (fns = all));
  }
  return fns;
}
function whenShutDown(signal: AbortSignal, fn: () => void): () => void {
  const fns = shutdownSet(signal);
  fns.add(fn);
  return () => void fns.delete(fn);
}

let openStreams = 0;
/** SSE streams currently open in this process (metrics). */
export const activeStreams = (): number => openStreams;

/** One serialised frame per event, shared by every viewer of the process (fan-out writes one string). */
const frames = new WeakMap<LogEvent, string>();
function frameOf(e: LogEvent): string {
  let f = frames.get(e);
  if (f === undefined) {
    f = `id: ${e.seq}\nevent: ${e.type}\ndata: ${JSON.stringify(e)}\n\n`;
    frames.set(e, f);
  }
  return f;
}

export interface StreamSpec {
  sessionId: string;
  /** Deliver events with seq > cursor. */
  cursor: number;
  /** Which events this stream shows (a thread's view); hidden events still advance the cursor. */
  filter: (e: LogEvent) => boolean;
  /** Which preview fragments this stream shows (`event_deltas`), or null for none. */
  deltas: ((d: DeltaMessage) => boolean) | null;
  /** The Session was erased: report the gap and end. */
  erased: boolean;
  log: EventLog;
  hub: EventHub;
  shutdown: AbortSignal;
  keepaliveMs?: number;
  /** How long a failing live read is tried again before the stream ends (`READ_RETRY_MS`). */
  readRetryMs?: number;
  /**
   * Whether the caller may still watch, asked at every keep-alive: a stream whose credential was
   * revoked (or whose Principal was suspended) since it opened ends there.
   */
  stillAllowed?: () => Promise<boolean>;
}

/** Parse `Last-Event-ID` (header) or `last_event_id` (query): a non-negative sequence number. */
export async function checkedCursor(log: EventLog, sessionId: string, header: string | undefined, query: number | undefined): Promise<number> {
  const cursor = resumeCursor(header, query);
  // No cursor (or 0): nothing to check, and no read.
  if (cursor === 0) return cursor;
  const st = await log.state(sessionId);
  if (cursor > st.seq) throw new ApiError('validation.malformed', `Last-Event-ID ${cursor} is beyond the end of this log (${st.seq})`);
  return cursor;
}

export function resumeCursor(header: string | undefined, query: number | undefined): number {
  if (header !== undefined && header.trim() !== '') {
    const v = header.trim();
    if (!/^\d{1,15}$/.test(v)) throw new ApiError('validation.malformed', 'Last-Event-ID must be a sequence number issued by this stream');
    if (query !== undefined && query !== Number(v)) throw new ApiError('validation.malformed', 'Last-Event-ID and last_event_id disagree');
    return Number(v);
  }
  return query ?? 0;
}

/**
 * Replay-then-live SSE with no gap and no duplicate at the switch:
 *  1. register with the process hub (subscription confirmed) BEFORE reading the log;
 *  2. replay stored events after the cursor, buffering live messages meanwhile;
 *  3. drain the buffer, dropping what replay already delivered (seq <= last), backfilling
 *     with XRANGE when a live message jumps ahead; then stay live.
 * A discontinuity in what the log returns (retention, erasure) becomes a `gap` frame whose id
 * is the end of the unreadable range, so a reconnect resumes after it.
 */
export function sseStream(spec: StreamSpec): StreamResult {
  return {
    kind: 'stream',
    async write(res: ServerResponse, signal: AbortSignal): Promise<void> {
      res.writeHead(200, {
        'content-type': 'text/event-stream; charset=utf-8',
        'cache-control': 'no-cache, no-transform',
        connection: 'keep-alive',
        'x-accel-buffering': 'no',
      });
      // HEAD: the stream's status and headers, and no stream (one that never ends would hang the caller).
      if (res.req.method === 'HEAD') {
        res.end();
        return;
      }
      // The headers leave with the replay's first frames, in one write, once the subscription is
      // confirmed and the first page read (at the latest when the stream goes live): a client that
      // has the headers knows the stream is subscribed.
      openStreams++;
      let last = spec.cursor;
      let ended = false;
      let finish: () => void = () => undefined;
      const done = new Promise<void>((resolve) => {
        finish = resolve;
      });
      const end = () => {
        if (ended) return;
        ended = true;
        if (!res.writableEnded) res.end();
        for (const w of [...waiters]) w();
        finish();
      };
      const waiters = new Set<() => void>();
      const drained = () =>
        new Promise<void>((resolve) => {
          const done = () => {
            res.off('drain', done);
            res.off('close', done);
            waiters.delete(done);
            resolve();
          };
          res.on('drain', done);
          res.on('close', done);
          waiters.add(done);
          if (ended) done();
        });
      // Whether anything was written yet (the headers leave with the first write).
      let started = false;
      const write = (chunk: string) => {
        if (ended) return;
        started = true;
        res.write(chunk);
        if (res.writableLength > MAX_BUFFERED_BYTES) end();
      };
      const gap = (from: number, to: number, reason: string) => {
        if (to < from) return;
        write(`id: ${to}\nevent: gap\ndata: ${JSON.stringify({ type: 'gap', from_seq: from, to_seq: to, reason })}\n\n`);
        last = to;
      };
      /** What `fn` writes leaves in one socket write. */
      const inOneWrite = (fn: () => void) => {
        res.socket?.cork();
        try {
          fn();
        } finally {
          res.socket?.uncork();
        }
      };
      // A batch's frames leave in one write.
      const deliver = (events: readonly LogEvent[]) => (events.length > 1 ? inOneWrite(() => deliverEach(events)) : deliverEach(events));
      const deliverEach = (events: readonly LogEvent[]) => {
        for (const e of events) {
          if (e.seq <= last) continue;
          if (e.seq > last + 1) gap(last + 1, e.seq - 1, 'retention');
          if (spec.filter(e)) write(frameOf(e));
          last = e.seq;
        }
      };
      /** Read the log from `last` until `to` (or its end). */
      const backfill = async (to?: number) => {
        for (;;) {
          if (ended || (to !== undefined && last >= to)) return;
          const batch = await spec.log.range(spec.sessionId, last, READ_PAGE, to);
          if (batch.length === 0) {
            if (to !== undefined && last < to) gap(last + 1, to, 'retention');
            return;
          }
          deliver(batch);
          // Replay paces itself to the client: wait for the socket to drain before reading more.
          if (res.writableLength > REPLAY_HIGH_WATER_BYTES) await drained();
          if (batch.length < READ_PAGE && to === undefined) return;
        }
      };
      const handle = async (m: HubMessage) => {
        if (ended) return;
        switch (m.kind) {
          case 'events':
            if (m.to <= last) return;
            if (m.events && m.from <= last + 1) deliver(m.events);
            else await backfill(m.to);
            return;
          case 'erased':
            gap(last + 1, m.through, 'erased');
            end();
            return;
          case 'delta':
            if (spec.deltas?.(m.delta)) write(`event: ${m.delta.type}.delta\ndata: ${JSON.stringify(m.delta)}\n\n`);
            return;
          case 'resync':
            await backfill();
            return;
        }
      };

      const onAbort = () => end();
      res.on('error', onAbort);
      signal.addEventListener('abort', onAbort);
      const forgetShutdown = whenShutDown(spec.shutdown, onAbort);
      const allowed = spec.stillAllowed;
      const keepalive = setInterval(() => {
        if (!allowed) return write(': keep-alive\n\n');
        void allowed().then((ok) => (ok ? write(': keep-alive\n\n') : end()), () => write(': keep-alive\n\n'));
      }, spec.keepaliveMs ?? KEEPALIVE_MS);
      keepalive.unref();

      let live = false;
      const buffered: HubMessage[] = [];
      let chain: Promise<void> = Promise.resolve();
      const handleRetrying = async (m: HubMessage) => {
        const giveUpAt = Date.now() + (spec.readRetryMs ?? READ_RETRY_MS);
        for (let attempt = 0; ; attempt++) {
          try {
            return await handle(m);
          } catch (err) {
            if (ended || Date.now() >= giveUpAt) throw err;
          }
          // An ending stream (client gone, shutdown) wakes the wait.
          await new Promise<void>((resolve) => {
            const wake = () => {
              clearTimeout(t);
              waiters.delete(wake);
              resolve();
            };
            const t = setTimeout(wake, Math.max(1, backoffDelay(attempt, READ_RETRY_BASE_MS, READ_RETRY_CAP_MS)));
            waiters.add(wake);
          });
        }
      };
      const enqueue = (m: HubMessage) => {
        chain = chain.then(() => handleRetrying(m)).catch(() => end());
      };
      let watch: { close(): void } | null = null;
      try {
        if (spec.erased) {
          const st = await spec.log.state(spec.sessionId);
          gap(last + 1, st.seq, 'erased');
          end();
        } else if (!signal.aborted && !spec.shutdown.aborted) {
          watch = await spec.hub.watch(spec.sessionId, (m) => (live ? enqueue(m) : buffered.push(m)), { deltas: spec.deltas !== null });
          // The log's state and the replay's first page in one round trip (both read after the
          // subscription is confirmed; a page that misses what retention trimmed meanwhile is a gap).
          const [st, first] = await Promise.all([spec.log.state(spec.sessionId), spec.log.range(spec.sessionId, last, READ_PAGE)]);
          if (st.erased) {
            gap(last + 1, st.seq, 'erased');
            end();
          } else {
            if (last + 1 < st.low) gap(last + 1, st.low - 1, 'retention');
            // The headers and the replayed frames leave in one write.
            inOneWrite(() => {
              deliverEach(first);
              if (!started) res.flushHeaders();
            });
            if (first.length === READ_PAGE) {
              if (res.writableLength > REPLAY_HIGH_WATER_BYTES) await drained();
              await backfill();
            }
            live = true;
            for (const m of buffered.splice(0)) enqueue(m);
          }
        } else {
          end();
        }
        if (signal.aborted || spec.shutdown.aborted) end();
        await done;
      } finally {
        clearInterval(keepalive);
        watch?.close();
        signal.removeEventListener('abort', onAbort);
        forgetShutdown();
        openStreams--;
        end();
      }
    },
  };
}
