import type { Logger } from '@agentplane/core';
import type { ModelStreamEvent } from '@agentplane/protocol';
import type { ModelGatewayService, ModelStepContext } from './gateway-service.js';

/** A frame for the runner: `model.delta` for every event but the last, `model.end` for `end` or `error`. */
export interface ModelFrame {
  type: 'model.delta' | 'model.end';
  stream_id: string;
  event: ModelStreamEvent;
}

export interface ModelStreamsOptions {
  /** Concurrent model streams per connection (default 32). */
  maxStreams?: number;
}

/**
 * One runner connection's model streams, for the gateway's frame handlers:
 *
 *   const streams = new ModelStreams(deps.models.gateway, (f) => socket.sendFrame(f), log);
 *   on 'model.request' → streams.open(workspaceId, frame.stream_id, frame.request, { session_id, thread_id, run_id });
 *   on 'model.cancel'  → streams.cancel(frame.stream_id);
 *   on socket close    → streams.closeAll();
 *
 * `send` may return a promise (socket backpressure); the next event waits for it. `send`
 * returning false means the socket is gone: the provider request is aborted. Every stream
 * ends with exactly one `model.end` frame (an `end` or `error` event), also when canceled. Frames carry only model-gateway-v1 events: never a credential or secret.
 */
export class ModelStreams {
  private readonly open_ = new Map<string, AbortController>();
  /** The group (the lease) each open stream was opened under, when it names one. */
  private readonly groups = new Map<string, string>();
  private readonly max: number;

  constructor(
    private readonly gateway: ModelGatewayService,
    private readonly send: (frame: ModelFrame) => boolean | void | Promise<boolean | void>,
    private readonly log: Logger,
    options: ModelStreamsOptions = {},
  ) {
    this.max = options.maxStreams ?? 32;
  }

  get size(): number {
    return this.open_.size;
  }

  /**
   * Start streaming one step; resolves when its `model.end` frame was sent. `observe` sees each
   * frame of this stream before it is sent (e.g. to publish delta previews to its Session).
   * `group` names the lease the stream is served under: `cancelGroup` aborts them all here, and
   * the step ends when that lease ends on any node (the context's `lease_id`, `LeaseStreams`).
   */
  async open(workspaceId: string, streamId: string, request: unknown, context: ModelStepContext = {}, observe?: (frame: ModelFrame) => void, group?: string): Promise<void> {
    if (group !== undefined && context.lease_id === undefined) context = { ...context, lease_id: group };
    const send = observe ? (f: ModelFrame) => {
      observe(f);
      return this.send(f);
    } : this.send;
    if (this.open_.has(streamId)) {
      await send({ type: 'model.end', stream_id: streamId, event: { type: 'error', error: { type: 'validation.conflict', message: `stream ${streamId} is already open`, retryable: false } } });
      return;
    }
    if (this.open_.size >= this.max) {
      await send({ type: 'model.end', stream_id: streamId, event: { type: 'error', error: { type: 'model.platform_capacity_reached', message: `at most ${this.max} concurrent model streams per connection`, retryable: true, retry_after_seconds: 1 } } });
      return;
    }
    const ctl = new AbortController();
    this.open_.set(streamId, ctl);
    if (group !== undefined) this.groups.set(streamId, group);
    try {
      let pending: ModelStreamEvent | null = null;
      for await (const ev of this.gateway.runModelStep(workspaceId, request, ctl.signal, context)) {
        if (pending && (await send({ type: 'model.delta', stream_id: streamId, event: pending })) === false) ctl.abort();
        pending = ev;
      }
      await send({
        type: 'model.end', stream_id: streamId,
        event: pending ?? { type: 'error', error: { type: 'runtime.internal', message: 'the model step produced nothing', retryable: true } },
      });
    } catch (err) {
      this.log.warn({ stream_id: streamId, err: (err as Error).message }, 'model stream could not be delivered');
    } finally {
      this.open_.delete(streamId);
      this.groups.delete(streamId);
    }
  }

  /** Abort the provider request; the stream still ends with its `model.end` frame. */
  cancel(streamId: string): boolean {
    const ctl = this.open_.get(streamId);
    ctl?.abort();
    return ctl !== undefined;
  }

  /** Abort the provider requests of every stream opened under `group` (each still ends with its `model.end`). */
  cancelGroup(group: string): number {
    let n = 0;
    for (const [streamId, g] of this.groups) {
      if (g === group && this.cancel(streamId)) n++;
    }
    return n;
  }

  /** The connection is gone: abort every provider request. */
  closeAll(): void {
    for (const ctl of this.open_.values()) ctl.abort();
  }
}
