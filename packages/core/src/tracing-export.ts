/**
 * Span export, chosen by the OTLP encoding; batching is the SDK's BatchSpanProcessor in both.
 * OTLP/protobuf (the default): each batch is encoded in one pass by otlp-protobuf.ts (the SDK
 * serializer's bytes at a fraction of its cost) and sent with the SDK's own OTLP/HTTP export
 * delegate, so HTTP, retries, the concurrency limit and the standard OTEL_EXPORTER_OTLP_*
 * settings stay the SDK's. OTLP/JSON: the SDK's OTLP/HTTP JSON exporter as it comes. Both run on
 * the event loop.
 */
import type { SpanExporter, SpanProcessor } from '@opentelemetry/sdk-trace-node';
import { encodeTraceRequest, ProtoWriter } from './otlp-protobuf.js';

/** Where encoded requests go: resolves true when the export succeeded. */
export interface OtlpSender {
  send(request: Uint8Array, spans: number): Promise<boolean>;
  shutdown(): Promise<void>;
}

/** The batch settings (OTEL_BSP_*) of the export processor. */
export interface BatchOptions {
  maxQueueSize: number;
  maxExportBatchSize: number;
  scheduledDelayMillis: number;
}

/** The SDK's OTLP/HTTP transport for requests already encoded as OTLP/protobuf. */
export async function protobufSender(): Promise<OtlpSender> {
  const [{ convertLegacyHttpOptions, createOtlpHttpExportDelegate }, { ProtobufTraceSerializer }] = await Promise.all([
    import('@opentelemetry/otlp-exporter-base/node-http'),
    import('@opentelemetry/otlp-transformer'),
  ]);
  interface Encoded { bytes: Uint8Array; count: number }
  // What the SDK's OTLPTraceExporter (protobuf) builds, with the encoding already done.
  const delegate = createOtlpHttpExportDelegate<Encoded, unknown>(
    convertLegacyHttpOptions({}, 'TRACES', 'v1/traces', { 'Content-Type': 'application/x-protobuf' }),
    { serializeRequest: (r) => r.bytes, deserializeResponse: (b) => ProtobufTraceSerializer.deserializeResponse(b) },
    'otlp_http_span_exporter',
    { name: 'span', countItems: (r) => r.count },
    undefined,
  );
  return {
    send: (bytes, count) => new Promise((resolve) => delegate.export({ bytes, count }, (result) => resolve(result.code === 0))),
    shutdown: () => delegate.shutdown(),
  };
}

type ExportCallback = Parameters<SpanExporter['export']>[1];

/** A SpanExporter writing OTLP/protobuf with the platform's encoder and sending it through `sender`. */
export class ProtobufSpanExporter implements SpanExporter {
  private readonly writer = new ProtoWriter(256 * 1024);

  constructor(private readonly sender: OtlpSender) {}

  export(spans: Parameters<SpanExporter['export']>[0], done: ExportCallback): void {
    encodeTraceRequest(this.writer, spans);
    // ExportResultCode: 0 = SUCCESS, 1 = FAILED.
    this.sender.send(this.writer.take(), spans.length).then((ok) => done({ code: ok ? 0 : 1 }), () => done({ code: 1 }));
  }

  shutdown(): Promise<void> {
    return this.sender.shutdown();
  }

  async forceFlush(): Promise<void> {
    // Each batch is answered only once its export settled: nothing is held here.
  }
}

/** The span processor exporting over OTLP/HTTP in `protocol`, batching as `options` say. */
export async function exportProcessor(protocol: 'http/protobuf' | 'http/json', options: BatchOptions): Promise<SpanProcessor> {
  const { BatchSpanProcessor } = await import('@opentelemetry/sdk-trace-node');
  if (protocol === 'http/protobuf') return new BatchSpanProcessor(new ProtobufSpanExporter(await protobufSender()), options);
  const { OTLPTraceExporter } = await import('@opentelemetry/exporter-trace-otlp-http');
  return new BatchSpanProcessor(new OTLPTraceExporter(), options);
}
