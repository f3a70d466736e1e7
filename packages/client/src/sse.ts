import { createParser, type EventSourceMessage } from 'eventsource-parser';
import type { HttpClient } from './http.js';

export interface SseFrame {
  /** `id:` of the frame (the event's sequence number), absent on uncursored frames. */
  id: string | undefined;
  event: string | undefined;
  data: string;
}

export interface StreamOptions {
  lastEventId?: string;
  query?: Record<string, string | number | boolean | undefined>;
  signal?: AbortSignal;
  /**
   * Called once the stream answered 200. The platform sends a stream's headers only after it
   * subscribed to the Session's live events and read the log's first page: from then on, nothing
   * appended is missed.
   */
  onOpen?: () => void;
}

/**
 * Open an SSE stream and yield its frames. Comments (keep-alives) are skipped.
 * Throws on a non-200 answer with the error body.
 */
export async function* streamEvents(client: HttpClient, path: string, options: StreamOptions = {}): AsyncGenerator<SseFrame> {
  const headers = client.headers({ accept: 'text/event-stream', ...(options.lastEventId ? { 'last-event-id': options.lastEventId } : {}) });
  const res = await fetch(client.url(path, options.query), { headers, signal: options.signal ?? null });
  if (res.status !== 200 || !res.body) {
    const text = await res.text();
    throw new Error(`stream ${path} answered ${res.status}: ${text}`);
  }
  options.onOpen?.();
  const queue: SseFrame[] = [];
  const parser = createParser({
    onEvent: (m: EventSourceMessage) => queue.push({ id: m.id, event: m.event, data: m.data }),
  });
  const decoder = new TextDecoder();
  const reader = res.body.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      parser.feed(decoder.decode(value, { stream: true }));
      while (queue.length > 0) yield queue.shift() as SseFrame;
    }
  } finally {
    await reader.cancel().catch(() => undefined);
  }
}
