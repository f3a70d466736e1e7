/**
 * The span processor of a process exporting OTLP/protobuf (the default encoding): a batch span
 * processor that encodes each sampled span the moment it ends, into the batch being filled
 * (otlp-protobuf.ts), and keeps no reference to the span. A span then dies young, in the
 * allocation that made it, instead of living in a queue until its batch is exported (long enough
 * to be copied by the young generation's collections and promoted to the old one); and a batch's
 * export costs the event loop only the framing of bytes already written and an HTTP request.
 *
 * Batching is the SDK BatchSpanProcessor's, with its OTEL_BSP_* settings: a batch is sent when it
 * holds `maxExportBatchSize` spans or `scheduledDelayMillis` after its first span; one export is in
 * flight at a time; at most `maxQueueSize` spans wait (those past it are dropped and counted);
 * `forceFlush` sends everything that ended before it; `shutdown` flushes, then refuses spans.
 */
import { diag, TraceFlags, type Context } from '@opentelemetry/api';
import type { ReadableSpan, Span, SpanProcessor } from '@opentelemetry/sdk-trace-node';
import { ProtoWriter, TraceRequestBuilder } from './otlp-protobuf.js';

/** Where encoded requests go: resolves true when the export succeeded. */
export interface OtlpSender {
  send(request: Uint8Array, spans: number): Promise<boolean>;
  shutdown(): Promise<void>;
}

export interface OtlpBatchOptions {
  maxQueueSize: number;
  maxExportBatchSize: number;
  scheduledDelayMillis: number;
}

export class OtlpSpanProcessor implements SpanProcessor {
  /** The batch being filled. */
  private open: TraceRequestBuilder | null = null;
  /** Full (or due) batches waiting for the export in flight. */
  private readonly ready: TraceRequestBuilder[] = [];
  /** Sent batches, kept for their buffers. */
  private readonly spare: TraceRequestBuilder[] = [];
  private waiting = 0;
  private inFlight: Promise<void> | null = null;
  private timer: NodeJS.Timeout | null = null;
  private stopped = false;
  /** Spans dropped because the queue was full. */
  dropped = 0;
  private readonly writer = new ProtoWriter(256 * 1024);
  private readonly options: OtlpBatchOptions;

  constructor(private readonly sender: OtlpSender, options: Partial<OtlpBatchOptions> = {}) {
    const maxQueueSize = options.maxQueueSize ?? 2048;
    this.options = {
      maxQueueSize,
      // As the SDK: a batch never larger than the queue.
      maxExportBatchSize: Math.min(options.maxExportBatchSize ?? 512, maxQueueSize),
      scheduledDelayMillis: options.scheduledDelayMillis ?? 5000,
    };
  }

  onStart(_span: Span, _parentContext: Context): void {
    // Nothing until the span ends.
  }

  onEnd(span: ReadableSpan): void {
    if (this.stopped || (span.spanContext().traceFlags & TraceFlags.SAMPLED) === 0) return;
    if (this.waiting >= this.options.maxQueueSize) {
      if (this.dropped++ === 0) diag.warn('span queue full: spans are dropped until an export makes room');
      return;
    }
    const batch = (this.open ??= this.spare.pop() ?? new TraceRequestBuilder());
    batch.add(span);
    this.waiting++;
    if (batch.count >= this.options.maxExportBatchSize) {
      this.close();
    } else if (!this.timer) {
      this.timer = setTimeout(() => {
        this.timer = null;
        this.close();
      }, this.options.scheduledDelayMillis);
      this.timer.unref();
    }
  }

  async forceFlush(): Promise<void> {
    this.close();
    while (this.inFlight) await this.inFlight;
  }

  async shutdown(): Promise<void> {
    if (this.stopped) return;
    await this.forceFlush();
    this.stopped = true;
    await this.sender.shutdown();
  }

  /** The open batch joins the ready ones, and the export loop runs. */
  private close(): void {
    if (this.timer) {
      clearTimeout(this.timer);
      this.timer = null;
    }
    if (this.open) {
      this.ready.push(this.open);
      this.open = null;
    }
    this.pump();
  }

  private pump(): void {
    if (this.inFlight) return;
    const batch = this.ready.shift();
    if (!batch) return;
    this.waiting -= batch.count;
    batch.writeTo(this.writer);
    const request = this.writer.take();
    const count = batch.count;
    batch.reset();
    if (this.spare.length < 2) this.spare.push(batch);
    this.inFlight = this.sender.send(request, count).then(
      (ok) => {
        if (!ok) diag.debug(`span export failed: ${count} spans dropped`);
      },
      () => undefined,
    ).then(() => {
      this.inFlight = null;
      this.pump();
    });
  }
}
