/**
 * The export thread (see tracing-export.ts). OTLP/protobuf batches arrive encoded and are sent
 * with the SDK's OTLP/HTTP export delegate; OTLP/JSON batches arrive as WireSpans, are rebuilt as
 * the SDK's ReadableSpan shape and exported with the SDK's JSON exporter. Both are configured by
 * the process's OTEL_EXPORTER_OTLP_* settings.
 */
import { parentPort, workerData } from 'node:worker_threads';
import type { SpanExporter } from '@opentelemetry/sdk-trace-node';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { fromWire, type ExportThreadData, type FromExporter, type ToExporter } from './tracing-export.js';

const data = workerData as ExportThreadData;
const port = parentPort;
if (!port) throw new Error('tracing-export-thread runs as a worker thread only');
const reply = (m: FromExporter): void => port.postMessage(m);

/** An encoded request and the number of spans in it (the SDK's exporter metrics count spans). */
interface Encoded {
  bytes: Uint8Array;
  count: number;
}

interface Sender {
  send(m: Extract<ToExporter, { kind: 'export' | 'otlp' }>, done: (ok: boolean) => void): void;
  shutdown(): Promise<void>;
}

async function protobufSender(): Promise<Sender> {
  const [{ convertLegacyHttpOptions, createOtlpHttpExportDelegate }, { ProtobufTraceSerializer }] = await Promise.all([
    import('@opentelemetry/otlp-exporter-base/node-http'),
    import('@opentelemetry/otlp-transformer'),
  ]);
  // What the SDK's OTLPTraceExporter (protobuf) builds, with the encoding already done.
  const delegate = createOtlpHttpExportDelegate<Encoded, unknown>(
    convertLegacyHttpOptions({}, 'TRACES', 'v1/traces', { 'Content-Type': 'application/x-protobuf' }),
    { serializeRequest: (r) => r.bytes, deserializeResponse: (b) => ProtobufTraceSerializer.deserializeResponse(b) },
    'otlp_http_span_exporter',
    { name: 'span', countItems: (r) => r.count },
    undefined,
  );
  return {
    send: (m, done) => {
      if (m.kind !== 'otlp') return done(false);
      delegate.export({ bytes: m.bytes, count: m.count }, (result) => done(result.code === 0));
    },
    shutdown: () => delegate.shutdown(),
  };
}

async function jsonSender(): Promise<Sender> {
  const resource = resourceFromAttributes(data.resource);
  const { OTLPTraceExporter } = await import('@opentelemetry/exporter-trace-otlp-http');
  const exporter: SpanExporter = new OTLPTraceExporter();
  return {
    send: (m, done) => {
      if (m.kind !== 'export') return done(false);
      exporter.export(m.spans.map((w) => fromWire(w, resource)), (result) => done(result.code === 0));
    },
    shutdown: () => exporter.shutdown(),
  };
}

const sender = data.protocol === 'http/json' ? await jsonSender() : await protobufSender();

port.on('message', (m: ToExporter) => {
  if (m.kind === 'shutdown') {
    sender.shutdown().then(() => reply({ id: m.id, ok: true }), () => reply({ id: m.id, ok: false }));
    return;
  }
  try {
    sender.send(m, (ok) => reply({ id: m.id, ok }));
  } catch {
    reply({ id: m.id, ok: false });
  }
});
