/**
 * The export thread (see tracing-export.ts): rebuilds each batch as the SDK's ReadableSpan shape
 * and exports it with the SDK's OTLP/HTTP exporter, configured by the process's OTEL_* settings.
 */
import { parentPort, workerData } from 'node:worker_threads';
import type { SpanExporter } from '@opentelemetry/sdk-trace-node';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { fromWire, type ExportThreadData, type FromExporter, type ToExporter } from './tracing-export.js';

const data = workerData as ExportThreadData;
const resource = resourceFromAttributes(data.resource);
const { OTLPTraceExporter } = data.protocol === 'http/json'
  ? await import('@opentelemetry/exporter-trace-otlp-http')
  : await import('@opentelemetry/exporter-trace-otlp-proto');
const exporter: SpanExporter = new OTLPTraceExporter();

const port = parentPort;
if (!port) throw new Error('tracing-export-thread runs as a worker thread only');
const reply = (m: FromExporter): void => port.postMessage(m);

port.on('message', (m: ToExporter) => {
  if (m.kind === 'shutdown') {
    exporter.shutdown().then(() => reply({ id: m.id, ok: true }), () => reply({ id: m.id, ok: false }));
    return;
  }
  try {
    exporter.export(m.spans.map((w) => fromWire(w, resource)), (result) => reply({ id: m.id, ok: result.code === 0 }));
  } catch {
    reply({ id: m.id, ok: false });
  }
});
