/**
 * Span export, chosen by the OTLP encoding; batching is the SDK's BatchSpanProcessor in both.
 * OTLP/protobuf (the default): each batch is encoded in one pass by otlp-protobuf.ts (the SDK
 * serializer's bytes at a fraction of its cost) and sent with the SDK's own OTLP/HTTP export
 * delegate, so HTTP, retries, the concurrency limit and the standard OTEL_EXPORTER_OTLP_*
 * settings stay the SDK's; spans the event loop already encoded (`EncodedSpan`) are copied as
 * they are (`encodedExport`). OTLP/JSON: the SDK's OTLP/HTTP JSON exporter as it comes. Both run
 * on the process's event loop: an export is one HTTP request, every 5 s or once a batch is full.
 */
import type { ReadableSpan, SpanExporter, SpanProcessor } from '@opentelemetry/sdk-trace-node';
import { encodeTraceRequest, ProtoWriter, type EncodedSpan } from './otlp-protobuf.js';

/** The batch settings the platform gives the SDK's batch processor (it reads OTEL_BSP_* for the rest). */
export type BatchOptions = Partial<{ maxQueueSize: number; maxExportBatchSize: number; scheduledDelayMillis: number }>;

type ExportCallback = Parameters<SpanExporter['export']>[1];
/** The SDK's `ExportResultCode` (its enum lives in @opentelemetry/core, not a dependency here). */
const ExportResultCode = { FAILED: 1 } as const;
/** Writers kept for the next batches (exports run a few at a time at most). */
const MAX_IDLE_WRITERS = 4;

/**
 * A SpanExporter writing OTLP/protobuf with the platform's encoder and sending it with the SDK's
 * OTLP/HTTP export delegate: what the SDK's OTLPTraceExporter (protobuf) builds, with the
 * encoding already done.
 */
export async function protobufExporter(): Promise<SpanExporter> {
  const [{ convertLegacyHttpOptions, createOtlpHttpExportDelegate }, { ProtobufTraceSerializer }] = await Promise.all([
    import('@opentelemetry/otlp-exporter-base/node-http'),
    import('@opentelemetry/otlp-transformer'),
  ]);
  interface Encoded { bytes: Uint8Array; count: number }
  const delegate = createOtlpHttpExportDelegate<Encoded, unknown>(
    convertLegacyHttpOptions({}, 'TRACES', 'v1/traces', { 'Content-Type': 'application/x-protobuf' }),
    { serializeRequest: (r) => r.bytes, deserializeResponse: (b) => ProtobufTraceSerializer.deserializeResponse(b) },
    'otlp_http_span_exporter',
    { name: 'span', countItems: (r) => r.count },
    undefined,
  );
  // Each batch is written into a writer of its own and sent from the writer's buffer, which goes
  // back to `idle` once the export succeeded (nothing refers to it then). Fresh memory for every
  // batch (a new buffer to copy the bytes into) cost far more than the copy: on a virtual machine
  // each new page of a batch's buffer faults in, about 1.6 ms for a batch of 2,048 GET spans
  // against 0.02 ms to fill a buffer already in use. A failed export's writer is dropped: the
  // transport may still hold its bytes.
  const idle: ProtoWriter[] = [];
  const release = (writer: ProtoWriter): void => {
    writer.pos = 0;
    if (idle.length < MAX_IDLE_WRITERS) idle.push(writer);
  };
  return {
    export(spans, done: ExportCallback): void {
      const writer = idle.pop() ?? new ProtoWriter(256 * 1024);
      let bytes: Uint8Array;
      try {
        encodeTraceRequest(writer, spans);
        bytes = writer.view();
      } catch (err) {
        // A batch that cannot be encoded fails as an export does (the batch processor counts it
        // and goes on), and leaves nothing half-written for the next one.
        release(writer);
        done({ code: ExportResultCode.FAILED, error: err instanceof Error ? err : new Error(String(err)) });
        return;
      }
      delegate.export({ bytes, count: spans.length }, (result) => {
        if (result.code !== ExportResultCode.FAILED) release(writer);
        done(result);
      });
    },
    shutdown: () => delegate.shutdown(),
    forceFlush: () => delegate.forceFlush(),
  };
}

/** The span processor exporting over OTLP/HTTP in `protocol`, batching as `options` say. */
export async function exportProcessor(protocol: 'http/protobuf' | 'http/json', options: BatchOptions): Promise<SpanProcessor> {
  const { BatchSpanProcessor } = await import('@opentelemetry/sdk-trace-node');
  if (protocol === 'http/protobuf') return new BatchSpanProcessor(await protobufExporter(), options);
  const { OTLPTraceExporter } = await import('@opentelemetry/exporter-trace-otlp-http');
  return new BatchSpanProcessor(new OTLPTraceExporter(), options);
}

/** Spans the event loop encoded, batched and exported on the same thread (`encodedExport`). */
export interface EncodedExport {
  /** The spans whose bytes end at each of `ends` in `bytes`, in order. */
  write(bytes: Uint8Array, ends: Uint32Array): void;
  /** Export what waits, then stop. */
  shutdown(): Promise<void>;
}

/**
 * OTLP/protobuf export of spans already encoded (tracing-deferred.ts): the SDK's batch processor
 * and OTLP/HTTP delegate, on the thread that recorded them, under this process's resource
 * (`service.name`, `service.version`) and the platform's scope.
 */
export async function encodedExport(service: string, version: string, options: BatchOptions): Promise<EncodedExport> {
  const [{ resourceFromAttributes }, { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION }, { TraceFlags }] = await Promise.all([
    import('@opentelemetry/resources'),
    import('@opentelemetry/semantic-conventions'),
    import('@opentelemetry/api'),
  ]);
  const { BatchSpanProcessor } = await import('@opentelemetry/sdk-trace-node');
  const processor = new BatchSpanProcessor(await protobufExporter(), options);
  const resource = resourceFromAttributes({ [ATTR_SERVICE_NAME]: service, [ATTR_SERVICE_VERSION]: version });
  // An encoded span in the batch processor: the processor reads its trace flags (every encoded
  // span was sampled) and its resource; the exporter copies its bytes.
  const scope = { name: 'agentplane', version };
  const sampled = { traceId: '', spanId: '', traceFlags: TraceFlags.SAMPLED };
  const spanContext = (): typeof sampled => sampled;
  return {
    write(bytes, ends) {
      let from = 0;
      for (const end of ends) {
        const span: EncodedSpan & Pick<ReadableSpan, 'spanContext'> = { encoded: bytes.subarray(from, end), resource, instrumentationScope: scope, spanContext };
        // The processor takes any object with those fields; its type names the SDK's span.
        processor.onEnd(span as unknown as ReadableSpan);
        from = end;
      }
    },
    shutdown: () => processor.shutdown(),
  };
}
