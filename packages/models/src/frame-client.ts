import { randomBytes } from 'node:crypto';
import type { ModelClient, ModelRequest, ModelStreamEvent } from '@agentplane/protocol';

/** The lease a runner's model steps work for (sent with every `model.request`). */
export interface FrameLease {
  lease_id: string;
  attempt: number;
}

/** Sends one runner→gateway frame; false when the socket is down. */
export type ModelFrameSender = {
  (type: 'model.request', payload: FrameLease & { stream_id: string; request: ModelRequest }): boolean;
  (type: 'model.cancel', payload: { stream_id: string }): boolean;
};

interface OpenStream {
  push(event: ModelStreamEvent, last: boolean): void;
}

/**
 * The runner side of model-gateway-v1 over the runner WebSocket: a `ModelClient` for the
 * harness loop. `stream()` sends `model.request` and yields the events of the matching
 * `model.delta` / `model.end` frames, which the daemon feeds in with `deliver()`. Aborting the
 * signal sends `model.cancel`; a dropped socket (`disconnect()`) ends every open step with a
 * retryable error so the harness can retry the step after reconnecting.
 */
export class FrameModelClient implements ModelClient {
  private readonly streams = new Map<string, OpenStream>();
  private readonly prefix = randomBytes(4).toString('hex');
  private seq = 0;

  constructor(private readonly send: ModelFrameSender, private readonly lease: FrameLease) {}

  /** Feed a `model.delta` or `model.end` frame from the socket; other frames are ignored. */
  deliver(type: string, payload: { stream_id: string; event: unknown }): void {
    if (type !== 'model.delta' && type !== 'model.end') return;
    this.streams.get(payload.stream_id)?.push(payload.event as ModelStreamEvent, type === 'model.end');
  }

  /** The socket dropped: every open step ends with a retryable error. */
  disconnect(reason = 'the connection to the control plane was lost'): void {
    for (const s of this.streams.values()) s.push({ type: 'error', error: { type: 'runtime.internal', message: reason, retryable: true } }, true);
  }

  async *stream(request: ModelRequest, signal: AbortSignal): AsyncGenerator<ModelStreamEvent> {
    const streamId = `ms-${this.prefix}-${++this.seq}`;
    const queue: { event: ModelStreamEvent; last: boolean }[] = [];
    let wake: (() => void) | null = null;
    this.streams.set(streamId, {
      push: (event, last) => {
        queue.push({ event, last });
        wake?.();
      },
    });
    let open = false;
    const onAbort = () => this.send('model.cancel', { stream_id: streamId });
    try {
      if (signal.aborted) {
        yield { type: 'end', stop_reason: 'canceled', usage: zero(), provider: '', model: '' };
        return;
      }
      if (!this.send('model.request', { ...this.lease, stream_id: streamId, request })) {
        yield { type: 'error', error: { type: 'runtime.internal', message: 'not connected to the control plane', retryable: true } };
        return;
      }
      open = true;
      signal.addEventListener('abort', onAbort, { once: true });
      for (;;) {
        const next = queue.shift();
        if (!next) {
          await new Promise<void>((r) => {
            wake = r;
          });
          wake = null;
          continue;
        }
        if (next.last) open = false;
        yield next.event;
        if (next.last) return;
      }
    } finally {
      signal.removeEventListener('abort', onAbort);
      this.streams.delete(streamId);
      // The consumer stopped reading before the end: the provider request is not needed any more.
      if (open && !signal.aborted) this.send('model.cancel', { stream_id: streamId });
    }
  }
}

const zero = () => ({ input_tokens: 0, cached_input_tokens: 0, cache_write_input_tokens: 0, output_tokens: 0, reasoning_output_tokens: 0, total_tokens: 0 });
