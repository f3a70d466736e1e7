/**
 * Span export, chosen by the OTLP encoding. OTLP/protobuf (the default): the platform's
 * OtlpSpanProcessor encodes each span as it ends (otlp-span-processor.ts, otlp-protobuf.ts: the
 * SDK serializer's bytes at a fraction of its cost) and sends each batch with the SDK's own
 * OTLP/HTTP export delegate, so HTTP, retries, the concurrency limit and the standard
 * OTEL_EXPORTER_OTLP_* settings stay the SDK's. OTLP/JSON: the SDK's BatchSpanProcessor and
 * OTLP/HTTP JSON exporter, as they come.
 */
import type { SpanProcessor } from '@opentelemetry/sdk-trace-node';
import { OtlpSpanProcessor, type OtlpBatchOptions, type OtlpSender } from './otlp-span-processor.js';

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

/** The span processor exporting over OTLP/HTTP in `protocol`, batching as `options` say. */
export async function exportProcessor(protocol: 'http/protobuf' | 'http/json', options: Partial<OtlpBatchOptions>): Promise<SpanProcessor> {
  if (protocol === 'http/protobuf') return new OtlpSpanProcessor(await protobufSender(), options);
  const [{ BatchSpanProcessor }, { OTLPTraceExporter }] = await Promise.all([
    import('@opentelemetry/sdk-trace-node'),
    import('@opentelemetry/exporter-trace-otlp-http'),
  ]);
  return new BatchSpanProcessor(new OTLPTraceExporter(), options);
}
