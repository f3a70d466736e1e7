import { createParser, type EventSourceMessage } from 'eventsource-parser';

/**
 * Server-sent events of a streaming HTTP response body, as they arrive. Ends when the body
 * ends; the caller's abort closes the body (fetch wires its signal to the stream).
 */
export async function* sseMessages(body: ReadableStream<Uint8Array>): AsyncGenerator<EventSourceMessage> {
  const queue: EventSourceMessage[] = [];
  const parser = createParser({ onEvent: (m) => queue.push(m) });
  const decoder = new TextDecoder();
  const reader = body.getReader();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      parser.feed(decoder.decode(value, { stream: true }));
      while (queue.length > 0) yield queue.shift() as EventSourceMessage;
    }
    parser.feed(decoder.decode());
    while (queue.length > 0) yield queue.shift() as EventSourceMessage;
  } finally {
    reader.releaseLock();
    await body.cancel().catch(() => undefined);
  }
}
