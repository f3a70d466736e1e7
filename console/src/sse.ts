/**
 * Session event stream over fetch (EventSource cannot send an Authorization header): replay from
 * the start, then live; after a dropped connection it reconnects with `Last-Event-ID` set to the
 * last sequence number seen and drops anything at or below it, so no event is shown twice.
 */
import { createParser, type EventSourceMessage } from 'eventsource-parser';
import { authHeaders, type Auth } from './api';

export interface StreamEvent {
  id: string;
  seq: number;
  type: string;
  payload: Record<string, unknown>;
  session_thread_id: string | null;
  created_at?: string;
}

/** `deleted`: the Session was deleted (its log erased); the stream stops there. */
export type StreamState = 'connecting' | 'live' | 'reconnecting' | 'failed' | 'deleted' | 'closed';

export interface StreamHandlers {
  /** A batch of new events (one per network chunk), in sequence order, never repeated. */
  onEvents(events: StreamEvent[]): void;
  onState(state: StreamState, detail: { reconnects: number; lastSeq: number; message?: string }): void;
}

export function openSessionStream(auth: Auth, path: string, handlers: StreamHandlers): () => void {
  const ac = new AbortController();
  let lastSeq = 0;
  let reconnects = 0;

  const state = (s: StreamState, message?: string) => handlers.onState(s, { reconnects, lastSeq, ...(message ? { message } : {}) });

  /** `progress`: the stream delivered something before it ended (the next attempt starts over from the shortest delay). */
  async function once(): Promise<'retry' | 'progress' | 'stop'> {
    const headers: Record<string, string> = { ...authHeaders(auth), accept: 'text/event-stream' };
    if (lastSeq > 0) headers['last-event-id'] = String(lastSeq);
    const res = await fetch(path, { headers, signal: ac.signal, cache: 'no-store' });
    if (res.status !== 200 || !res.body) {
      let message = `HTTP ${res.status}`;
      try {
        const body = (await res.json()) as { error?: { type?: string; message?: string } };
        if (body.error) message = `${body.error.type ?? 'error'}: ${body.error.message ?? ''}`;
      } catch {
        /* not JSON */
      }
      // Client mistakes (bad credential, unknown Session) do not heal by retrying.
      if (res.status >= 400 && res.status < 500 && res.status !== 429) {
        state('failed', message);
        return 'stop';
      }
      return 'retry';
    }
    state('live');
    let batch: StreamEvent[] = [];
    let delivered = false;
    // A gap of reason `erased` closes the stream for good: the Session was deleted (its range may
    // be empty, its id then the cursor already held).
    let erased = false;
    const parser = createParser({
      onEvent: (m: EventSourceMessage) => {
        if (!m.id) return; // uncursored delta frames are previews only
        const seq = Number(m.id);
        if (!Number.isFinite(seq)) return;
        const gap = m.event === 'gap' ? (JSON.parse(m.data) as Record<string, unknown>) : null;
        if (gap?.reason === 'erased') erased = true;
        if (seq <= lastSeq) return;
        lastSeq = seq;
        delivered = true;
        if (gap) {
          batch.push({ id: `gap-${seq}`, seq, type: 'gap', payload: gap, session_thread_id: null });
          return;
        }
        batch.push(JSON.parse(m.data) as StreamEvent);
      },
    });
    const reader = res.body.getReader();
    const decoder = new TextDecoder();
    try {
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        parser.feed(decoder.decode(value, { stream: true }));
        if (batch.length > 0) {
          const out = batch;
          batch = [];
          handlers.onEvents(out);
        }
        if (erased) break;
      }
    } finally {
      await reader.cancel().catch(() => undefined);
    }
    if (erased) {
      state('deleted', 'validation.not_found: this Session was deleted');
      return 'stop';
    }
    return delivered ? 'progress' : 'retry';
  }

  void (async () => {
    let delay = 250;
    state('connecting');
    while (!ac.signal.aborted) {
      let outcome: 'retry' | 'progress' | 'stop' = 'retry';
      try {
        outcome = await once();
        // Only a stream that delivered something resets the backoff: one that answers and ends
        // at once (nothing new) is retried ever more slowly, as a failure is.
        if (outcome === 'progress') delay = 250;
      } catch {
        if (ac.signal.aborted) break;
      }
      if (outcome === 'stop' || ac.signal.aborted) break;
      reconnects += 1;
      state('reconnecting');
      await new Promise<void>((resolve) => {
        const t = setTimeout(resolve, delay);
        ac.signal.addEventListener('abort', () => { clearTimeout(t); resolve(); }, { once: true });
      });
      delay = Math.min(delay * 2, 5000);
    }
    if (ac.signal.aborted) state('closed');
  })();

  return () => ac.abort();
}
