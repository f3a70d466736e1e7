import { createParser, type EventSourceMessage } from 'eventsource-parser';
import { ProviderError } from './errors.js';

/**
 * The most characters one server-sent event may take, from the end of the previous event to
 * the blank line that ends it (its `data` lines included). A provider that sends more without
 * ending the event is cut off instead of being buffered in memory.
 */
export const SSE_MESSAGE_MAX_CHARS = 1024 * 1024;

/** Where the last blank line (the end of an event) in `text` ends, or -1. */
function lastEventEnd(text: string): number {
  let end = -1;
  for (const sep of ['\n\n', '\r\r', '\r\n\r\n']) {
    const at = text.lastIndexOf(sep);
    if (at >= 0) end = Math.max(end, at + sep.length);
  }
  return end;
}

/**
 * Server-sent events of a streaming HTTP response body, as they arrive. Ends when the body
 * ends; the caller's abort closes the body (fetch wires its signal to the stream). An event
 * larger than `maxMessageChars` (still arriving, or complete) fails the stream as `bad_request`.
 */
export async function* sseMessages(body: ReadableStream<Uint8Array>, maxMessageChars = SSE_MESSAGE_MAX_CHARS): AsyncGenerator<EventSourceMessage> {
  const queue: EventSourceMessage[] = [];
  const parser = createParser({ onEvent: (m) => queue.push(m) });
  const decoder = new TextDecoder();
  const reader = body.getReader();
  // Characters fed since the end of the last complete event (an upper bound of what the parser holds).
  let pending = 0;
  const feed = (text: string): void => {
    const before = queue.length;
    parser.feed(text);
    // A blank line ends an event (dispatched, or dropped when it had no data): the parser keeps
    // only what follows it.
    const end = lastEventEnd(text);
    if (end >= 0) pending = text.length - end;
    else if (queue.length > before) pending = text.length;
    else pending += text.length;
    for (let i = before; i < queue.length; i++) {
      if ((queue[i] as EventSourceMessage).data.length > maxMessageChars) pending = Infinity;
    }
    if (pending > maxMessageChars) throw new ProviderError('bad_request', `the provider sent a stream event larger than ${maxMessageChars} characters`);
  };
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      feed(decoder.decode(value, { stream: true }));
      while (queue.length > 0) yield queue.shift() as EventSourceMessage;
    }
    feed(decoder.decode());
    while (queue.length > 0) yield queue.shift() as EventSourceMessage;
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => undefined);
  }
}
