/**
 * Span export, chosen by the OTLP encoding. OTLP/protobuf (the default): spans the event loop
 * encoded are batched as request bytes (`encodedExport`, by the SDK batch processor's rules) and
 * sent with the SDK's own OTLP/HTTP export delegate, so HTTP, retries, the concurrency limit and
 * the standard OTEL_EXPORTER_OTLP_* settings stay the SDK's (otlp-protobuf.ts writes the SDK
 * serializer's bytes at a fraction of its cost). OTLP/JSON: the SDK's BatchSpanProcessor and
 * OTLP/HTTP JSON exporter as they come. Both run on the process's event loop: an export is one
 * HTTP request, every 5 s or once a batch is full.
 */
import { diag } from '@opentelemetry/api';
import type { SpanExporter, SpanProcessor } from '@opentelemetry/sdk-trace-node';
import { beginScopeSpans, endScopeSpans, ProtoWriter, type OpenScopeSpans } from './otlp-protobuf.js';

type ExportCallback = Parameters<SpanExporter['export']>[1];
/** The SDK's `ExportResultCode` (its enum lives in @opentelemetry/core, not a dependency here). */
const ExportResultCode = { FAILED: 1 } as const;
/** Writers kept for the next batches (exports run a few at a time at most). */
const MAX_IDLE_WRITERS = 4;

/** An encoded ExportTraceServiceRequest and how many spans it holds. */
interface EncodedRequest { bytes: Uint8Array; count: number }

/** The SDK's OTLP/HTTP export delegate for requests already encoded as protobuf. */
async function protobufDelegate(): Promise<{ export(r: EncodedRequest, done: ExportCallback): void; shutdown(): Promise<void>; forceFlush(): Promise<void> }> {
  const [{ convertLegacyHttpOptions, createOtlpHttpExportDelegate }, { ProtobufTraceSerializer }] = await Promise.all([
    import('@opentelemetry/otlp-exporter-base/node-http'),
    import('@opentelemetry/otlp-transformer'),
  ]);
  return createOtlpHttpExportDelegate<EncodedRequest, unknown>(
    convertLegacyHttpOptions({}, 'TRACES', 'v1/traces', { 'Content-Type': 'application/x-protobuf' }),
    { serializeRequest: (r) => r.bytes, deserializeResponse: (b) => ProtobufTraceSerializer.deserializeResponse(b) },
    'otlp_http_span_exporter',
    { name: 'span', countItems: (r) => r.count },
    undefined,
  );
}

/** OTLP/JSON: the SDK's batch processor, batching as `settings` say, and its OTLP/HTTP JSON exporter. */
export async function jsonExportProcessor(settings: BatchSettings): Promise<SpanProcessor> {
  const [{ BatchSpanProcessor }, { OTLPTraceExporter }] = await Promise.all([
    import('@opentelemetry/sdk-trace-node'),
    import('@opentelemetry/exporter-trace-otlp-http'),
  ]);
  return new BatchSpanProcessor(new OTLPTraceExporter(), settings);
}

/** Spans the event loop encoded, batched and exported on the same thread (`encodedExport`). */
export interface EncodedExport {
  /** The spans whose bytes end at each of `ends` in `bytes`, in order (copied: `bytes` may be reused). */
  write(bytes: Uint8Array, ends: Uint32Array): void;
  /** Export what waits, then stop. */
  shutdown(): Promise<void>;
  /** Spans taken and not yet exported (waiting for their batch, or in an export not yet answered). */
  readonly waiting: number;
}

/** How spans are batched: the SDK batch processor's settings (`OTEL_BSP_*`). */
export interface BatchSettings { scheduledDelayMillis: number; maxQueueSize: number; maxExportBatchSize: number }

/** A batch being filled: the request itself, its resource and scope written at its head. */
interface OpenBatch { writer: ProtoWriter; open: OpenScopeSpans; spans: number }

/**
 * OTLP/protobuf export of spans already encoded (tracing-deferred.ts), batched as the batch
 * processor of the SDK batches (`OTEL_BSP_*`: sent every `scheduledDelayMillis`, or as soon as
 * `maxExportBatchSize` spans wait; one export at a time; past `maxQueueSize` waiting, new spans are
 * dropped and counted) but held as bytes: each batch is the request itself, in a writer taken
 * from a small pool, its resource and scope written at its head and each span's bytes copied in
 * as they come. No object per span is held until its export, and no fresh memory per batch:
 * a span's bytes cost a copy, and the request is sent from the writer's own buffer, which goes
 * back to the pool once the export succeeded (a failed export's writer is dropped: the
 * transport may still hold its bytes). Sent with the SDK's OTLP/HTTP export delegate
 * (`OTEL_EXPORTER_OTLP_*`), under this process's resource and the platform's scope.
 */
export async function encodedExport(service: string, version: string, settings: BatchSettings): Promise<EncodedExport> {
  const [{ resourceFromAttributes }, { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION }] = await Promise.all([
    import('@opentelemetry/resources'),
    import('@opentelemetry/semantic-conventions'),
  ]);
  const delegate = await protobufDelegate();
  const resource = resourceFromAttributes({ [ATTR_SERVICE_NAME]: service, [ATTR_SERVICE_VERSION]: version });
  const scope = { name: 'agentplane', version };
  const idle: ProtoWriter[] = [];
  const ready: OpenBatch[] = [];
  let filling: OpenBatch | undefined;
  let waiting = 0;
  let exporting = false;
  let timer: NodeJS.Timeout | undefined;
  let drained: (() => void) | undefined;
  const batch = (): OpenBatch => {
    const writer = idle.pop() ?? new ProtoWriter(256 * 1024);
    writer.pos = 0;
    return { writer, open: beginScopeSpans(writer, resource, scope), spans: 0 };
  };
  const pump = (): void => {
    const next = exporting ? undefined : ready.shift();
    if (!next) {
      if (!exporting && ready.length === 0 && filling === undefined) drained?.();
      return;
    }
    exporting = true;
    endScopeSpans(next.writer, next.open);
    delegate.export({ bytes: next.writer.view(), count: next.spans }, (result) => {
      exporting = false;
      waiting -= next.spans;
      if (result.code === ExportResultCode.FAILED) diag.error('spans not exported', result.error);
      else if (idle.length < MAX_IDLE_WRITERS) idle.push(next.writer);
      pump();
    });
  };
  const due = (): void => {
    if (timer !== undefined) clearTimeout(timer);
    timer = undefined;
    if (filling) ready.push(filling);
    filling = undefined;
    pump();
  };
  return {
    get waiting() {
      return waiting;
    },
    write(bytes, ends) {
      let from = 0;
      let dropped = 0;
      for (let i = 0; i < ends.length;) {
        if (waiting >= settings.maxQueueSize) {
          dropped += ends.length - i;
          break;
        }
        const b = (filling ??= batch());
        // As many of the spans as the batch and the queue take, copied in one piece.
        const n = Math.min(ends.length - i, settings.maxExportBatchSize - b.spans, settings.maxQueueSize - waiting);
        const to = ends[i + n - 1] as number;
        b.writer.raw(bytes.subarray(from, to));
        b.spans += n;
        waiting += n;
        from = to;
        i += n;
        if (b.spans >= settings.maxExportBatchSize) {
          ready.push(b);
          filling = undefined;
        }
      }
      if (dropped > 0) diag.warn('spans dropped: the export queue is full (OTEL_BSP_MAX_QUEUE_SIZE)');
      if (ready.length > 0) pump();
      if (filling && timer === undefined) {
        timer = setTimeout(due, settings.scheduledDelayMillis);
        timer.unref();
      }
    },
    async shutdown() {
      const done = new Promise<void>((resolve) => (drained = resolve));
      due();
      await done;
      await delegate.shutdown();
    },
  };
}
