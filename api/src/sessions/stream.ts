import type { ServerResponse } from 'node:http';
import { ApiError, backoffDelay } from '@agentplane/core';
import { LIVE_INLINE_MAX_BYTES, type DeltaMessage, type EventHub, type EventLog, type HubMessage, type LogEvent } from '@agentplane/store';
import type { StreamResult } from '../http/operation.js';

/** Default keep-alive comment period; proxies commonly cut idle streams after 30-60 s. */
export const KEEPALIVE_MS = 15_000;
/** Replay and backfill read the log in pages of this many events. */
const READ_PAGE = 500;
/** A viewer that stops reading is cut off past this much unsent data; it resumes with Last-Event-ID. */
const MAX_BUFFERED_BYTES = 8 * 1024 * 1024;
/** Replay and backfill stop reading the log while this much is waiting for the socket. */
const REPLAY_HIGH_WATER_BYTES = 1024 * 1024;
/**
 * A viewer that takes nothing off its socket for this long while data waits for it (replay or
 * backfill paused on the socket) is cut off; it resumes with Last-Event-ID. Twice the keep-alive
 * period: a slow reader progresses within it, a stopped one no longer holds the stream.
 */
export const STALL_MS = 30_000;
/** Previews (`event_deltas`) that arrive while the stream reads the log wait, up to this many; more are dropped. */
const MAX_LATE_DELTAS = 1024;
/**
 * A live stream's read of the log (a backfill, a resync) that fails is tried again this long
 * before the stream ends: a Redis failover or restart takes seconds, and the viewer's stream
 * outlives it (each read resumes from the last delivered event, so a retry repeats nothing).
 */
const READ_RETRY_MS = 20_000;
/**
 * A read of the log not answered this long (a command lost with its connection, never to be
 * answered) ends the stream: the viewer resumes with Last-Event-ID rather than wait for good.
 */
export const STUCK_READ_MS = 60_000;
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

/** The responses of the SSE streams open in this process. */
const open = new Set<ServerResponse>();
/** SSE streams currently open in this process (metrics). */
export const activeStreams = (): number => open.size;
/**
 * Bytes written to open streams and not yet taken by the kernel (metrics): what this process
 * holds for its viewers, bounded by `MAX_BUFFERED_BYTES` per viewer (a viewer past it is cut off).
 */
export function queuedStreamBytes(): number {
  let n = 0;
  for (const res of open) n += res.writableLength;
  return n;
}

/** Why a stream was cut off: too much due to its viewer, or nothing taken off its socket for `STALL_MS`. */
export type CutOffReason = 'behind' | 'stalled';
const cutOffs: Record<CutOffReason, number> = { behind: 0, stalled: 0 };
/** Streams this process cut off since it started, by reason (metrics). */
export const streamCutOffs = (): Readonly<Record<CutOffReason, number>> => cutOffs;

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
  /** How long a viewer may take nothing off its socket while data waits for it (`STALL_MS`). */
  stallMs?: number;
  /** How long one read of the log may go unanswered before the stream ends (`STUCK_READ_MS`). */
  stuckReadMs?: number;
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
 *  2. replay stored events after the cursor; live messages meanwhile are not kept, only the
 *     highest seq they announce (and previews, up to `MAX_LATE_DELTAS`);
 *  3. read the log on from the last delivered event up to that seq, then stay live: a live
 *     message with its events inline is written at once, one that jumps ahead (or a resync) has
 *     the log read again the same way, live messages meanwhile again only remembered;
 *  4. at every keep-alive, a live stream looks at the log's end: one past what it delivered with
 *     no live message to say so (a message lost between Redis and this process) is read then, so
 *     nothing waits for the next append; a read of the log unanswered for `STUCK_READ_MS` ends
 *     the stream (the viewer resumes with Last-Event-ID).
 * The log is the source of truth, so what a stream holds for a viewer is bounded (a page of the
 * log and what waits in its socket) whatever is appended while it reads or waits. A viewer that
 * stops reading is cut off once `MAX_BUFFERED_BYTES` are due to it (queued, or announced while
 * it waits), or after `STALL_MS` with nothing taken off its socket while data waits.
 * A discontinuity in what the log returns (retention, erasure) becomes a `gap` frame whose id
 * is the end of the unreadable range, so a reconnect resumes after it. An erased log always
 * ends the stream with a `gap` frame of reason `erased` (an empty range, `from_seq` past
 * `to_seq`, when nothing after the cursor was erased): a viewer learns the Session is gone.
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
      open.add(res);
      let last = spec.cursor;
      let ended = false;
      let finish: () => void = () => undefined;
      const done = new Promise<void>((resolve) => {
        finish = resolve;
      });
      const end = (cut = false) => {
        if (ended) return;
        ended = true;
        // A viewer cut off (too much due to it, or nothing read for `stallMs`) loses what waits in
        // its socket (an ended response would hold it until read): it resumes with Last-Event-ID.
        if (cut) res.destroy();
        else if (!res.writableEnded) res.end();
        for (const w of [...waiters]) w();
        finish();
      };
      const cutOff = (reason: CutOffReason) => {
        if (ended) return;
        cutOffs[reason]++;
        end(true);
      };
      const waiters = new Set<() => void>();
      const stallMs = spec.stallMs ?? STALL_MS;
      /** Until the socket drained; a viewer that takes nothing off it for `stallMs` is cut off. */
      const drained = () =>
        new Promise<void>((resolve) => {
          let queued = res.writableLength;
          const stall = setInterval(() => {
            const now = res.writableLength;
            if (now >= queued) cutOff('stalled');
            queued = now;
          }, stallMs);
          stall.unref();
          const done = () => {
            clearInterval(stall);
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
        if (res.writableLength > MAX_BUFFERED_BYTES) cutOff('behind');
      };
      const gap = (from: number, to: number, reason: string) => {
        if (to < from) return;
        write(`id: ${to}\nevent: gap\ndata: ${JSON.stringify({ type: 'gap', from_seq: from, to_seq: to, reason })}\n\n`);
        last = to;
      };
      /**
       * The log was erased through `through`: the closing frame, always one (an empty range when
       * the viewer had seen everything: its id stays the viewer's cursor), then the end.
       */
      const erased = (through: number) => {
        if (ended) return;
        const to = Math.max(last, through);
        write(`id: ${to}\nevent: gap\ndata: ${JSON.stringify({ type: 'gap', from_seq: last + 1, to_seq: to, reason: 'erased' })}\n\n`);
        last = to;
        end();
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
      const deliverOne = (e: LogEvent) => {
        if (e.seq <= last) return;
        if (e.seq > last + 1) gap(last + 1, e.seq - 1, 'retention');
        if (spec.filter(e)) write(frameOf(e));
        last = e.seq;
      };
      // A batch's frames leave in one write.
      const deliver = (events: readonly LogEvent[]) => (events.length > 1 ? inOneWrite(() => deliverEach(events)) : deliverEach(events));
      const deliverEach = (events: readonly LogEvent[]) => {
        for (const e of events) deliverOne(e);
      };
      const deltaFrame = (d: DeltaMessage) => `event: ${d.type}.delta\ndata: ${JSON.stringify(d)}\n\n`;

      // While the stream reads the log (replay, backfill) live messages are not kept: only the
      // highest seq they announce, whether a resync asked for the log's end, and a bounded list
      // of previews, each with the seq announced before it (it is written once that is).
      let reading = true;
      let wantTo = 0;
      let wantAll = false;
      /**
       * Bytes announced since the current read started or the socket last drained (a lower bound:
       * an announcement without inline events counts as `LIVE_INLINE_MAX_BYTES`), due to the
       * viewer and not written yet: with what waits in the socket, what the viewer is behind by.
       */
      let owed = 0;
      const late: Array<{ after: number; frame: string }> = [];
      const flushLate = (all: boolean) => {
        let n = 0;
        while (n < late.length && (all || late[n]!.after <= last)) write(late[n++]!.frame);
        if (n > 0) late.splice(0, n);
      };
      /** Write a page, pausing (and re-checking the cut-off) whenever the socket holds too much. */
      const deliverPaced = async (batch: readonly LogEvent[]) => {
        let i = 0;
        while (i < batch.length && !ended) {
          inOneWrite(() => {
            while (i < batch.length && !ended) {
              deliverOne(batch[i++]!);
              if (res.writableLength > REPLAY_HIGH_WATER_BYTES) break;
            }
          });
          flushLate(false);
          if (res.writableLength > REPLAY_HIGH_WATER_BYTES) {
            await drained();
            // The viewer took everything off its socket: it reads, whatever was announced meanwhile.
            owed = 0;
          }
        }
      };
      /** When the read of the log under way was sent (0: none under way). */
      let readSentAt = 0;
      const range = async (to?: number): Promise<LogEvent[]> => {
        readSentAt = Date.now();
        try {
          return await spec.log.range(spec.sessionId, last, READ_PAGE, to);
        } finally {
          readSentAt = 0;
        }
      };
      /** Read the log from `last` until `to` (or its end). */
      const backfill = async (to?: number) => {
        for (;;) {
          if (ended || (to !== undefined && last >= to)) return;
          const batch = await range(to);
          if (ended) return;
          if (batch.length === 0) {
            if (to !== undefined && last < to) gap(last + 1, to, 'retention');
            return;
          }
          // Reads pace themselves to the client: a page waits for the socket to drain.
          await deliverPaced(batch);
          if (batch.length < READ_PAGE && to === undefined) return;
        }
      };
      /** A failing read is tried again for `READ_RETRY_MS` (each retry resumes from `last`). */
      const retrying = async (read: () => Promise<void>) => {
        const giveUpAt = Date.now() + (spec.readRetryMs ?? READ_RETRY_MS);
        for (let attempt = 0; ; attempt++) {
          try {
            return await read();
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
      /** Read the log up to what live messages announced meanwhile, then go live. */
      const catchUp = async () => {
        try {
          while (!ended) {
            if (wantAll) {
              wantAll = false;
              owed = 0;
              await retrying(() => backfill());
            } else if (wantTo > last) {
              const to = wantTo;
              owed = 0;
              await retrying(() => backfill(to));
            } else break;
          }
        } catch {
          end();
        }
        flushLate(true);
        late.length = 0;
        reading = false;
      };
      const held = (m: HubMessage) => {
        switch (m.kind) {
          case 'events':
            if (m.to <= last) return;
            if (m.to > wantTo) wantTo = m.to;
            if (m.events) {
              for (const e of m.events) if (spec.filter(e)) owed += frameOf(e).length;
            } else owed += LIVE_INLINE_MAX_BYTES;
            if (res.writableLength + owed > MAX_BUFFERED_BYTES) cutOff('behind');
            return;
          case 'erased':
            erased(m.through);
            return;
          case 'delta':
            if (late.length < MAX_LATE_DELTAS && spec.deltas?.(m.delta)) late.push({ after: wantTo, frame: deltaFrame(m.delta) });
            return;
          case 'resync':
            wantAll = true;
            return;
        }
      };
      const onMessage = (m: HubMessage) => {
        if (ended) return;
        if (reading) return held(m);
        switch (m.kind) {
          case 'events':
            if (m.to <= last) return;
            if (m.events && m.from <= last + 1) return deliver(m.events);
            reading = true;
            wantTo = m.to;
            void catchUp();
            return;
          case 'erased':
            erased(m.through);
            return;
          case 'delta':
            if (spec.deltas?.(m.delta)) write(deltaFrame(m.delta));
            return;
          case 'resync':
            reading = true;
            wantAll = true;
            void catchUp();
            return;
        }
      };

      const onAbort = () => end();
      res.on('error', onAbort);
      signal.addEventListener('abort', onAbort);
      const forgetShutdown = whenShutDown(spec.shutdown, onAbort);
      const allowed = spec.stillAllowed;
      let looking = false;
      /** Step 4: a read that never answers ends the stream; a log past what was delivered is read. */
      const lookAtTheLog = () => {
        if (ended) return;
        if (readSentAt !== 0 && Date.now() - readSentAt > (spec.stuckReadMs ?? STUCK_READ_MS)) return end();
        if (reading || looking) return;
        looking = true;
        spec.log.state(spec.sessionId).then((st) => {
          if (ended || reading || st.erased || st.seq <= last) return;
          reading = true;
          if (st.seq > wantTo) wantTo = st.seq;
          void catchUp();
        }, () => undefined).finally(() => {
          looking = false;
        });
      };
      const keepalive = setInterval(() => {
        lookAtTheLog();
        if (!allowed) return write(': keep-alive\n\n');
        void allowed().then((ok) => (ok ? write(': keep-alive\n\n') : end()), () => write(': keep-alive\n\n'));
      }, spec.keepaliveMs ?? KEEPALIVE_MS);
      keepalive.unref();

      let watch: { close(): void } | null = null;
      try {
        if (spec.erased) {
          const st = await spec.log.state(spec.sessionId);
          erased(st.seq);
        } else if (!signal.aborted && !spec.shutdown.aborted) {
          watch = await spec.hub.watch(spec.sessionId, onMessage, { deltas: spec.deltas !== null });
          // The log's state and the replay's first page in one round trip (both read after the
          // subscription is confirmed; a page that misses what retention trimmed meanwhile is a gap).
          const [st, first] = await Promise.all([spec.log.state(spec.sessionId), range()]);
          if (st.erased) {
            erased(st.seq);
          } else if (!ended) {
            if (last + 1 < st.low) gap(last + 1, st.low - 1, 'retention');
            // The headers and the replayed frames leave in one write (up to the high-water mark:
            // a page of large events is paced like any read, never cut off whole).
            await deliverPaced(first);
            if (!started && !ended) res.flushHeaders();
            if (first.length === READ_PAGE) await backfill();
            void catchUp();
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
        open.delete(res);
        end();
      }
    },
  };
}
