import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { context, SpanKind, SpanStatusCode, trace, TraceFlags } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-node';
import { JsonTraceSerializer } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { startOtlpReceiver, type OtlpReceiver, type Received } from './harness/otlp-receiver.js';
// The export processor is loaded by tracing.ts only when tracing is on; it is tested here from the build.
import { jsonExportProcessor } from '../packages/core/dist/tracing-export.js';

/**
 * Span export under OTLP/JSON as a process runs it: the SDK's batch processor and OTLP/HTTP JSON
 * exporter against a real HTTP receiver. What arrives is exactly what the SDK's own serializer
 * writes for the same spans. (The default encoding, OTLP/protobuf, is the encoded export:
 * tracing-encoded-export.test.ts.)
 */
const RESOURCE = { 'service.name': 'export-test', 'service.version': '0.1.0' };
let receiver: OtlpReceiver;
let received: Received[] = [];
/** The variables these tests set (removed after each). */
const SET_HERE = ['OTEL_EXPORTER_OTLP_ENDPOINT'];

beforeAll(async () => {
  receiver = await startOtlpReceiver();
  received = receiver.received;
});
afterAll(async () => {
  await receiver.close();
});
afterEach(() => {
  for (const name of SET_HERE) delete process.env[name];
  received.length = 0;
  receiver.status = 200;
});

/** `count` SERVER spans with a child each, exported through the JSON processor; the spans as the SDK kept them. */
async function exportSpans(count: number): Promise<ReadableSpan[]> {
  process.env.OTEL_EXPORTER_OTLP_ENDPOINT = receiver.url;
  const memory = new InMemorySpanExporter();
  const processor = await jsonExportProcessor({ maxExportBatchSize: 512, maxQueueSize: 2048, scheduledDelayMillis: 60_000 });
  const provider = new BasicTracerProvider({ resource: resourceFromAttributes(RESOURCE), spanProcessors: [new SimpleSpanProcessor(memory), processor] });
  const tracer = provider.getTracer('agentplane', '0.1.0');
  const remote = trace.setSpanContext(context.active(), { traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: TraceFlags.SAMPLED, isRemote: true });
  for (let i = 0; i < count; i++) {
    const server = tracer.startSpan('GET /v1/principals/{principal_id}', { kind: SpanKind.SERVER, attributes: { 'http.request.method': 'GET', 'url.path': `/v1/principals/prn_${i}`, 'agentplane.request_id': `req_${i}` } }, remote);
    tracer.startSpan('read', { attributes: { 'db.system.name': 'redis', n: i, ok: i % 2 === 0 } }, trace.setSpan(context.active(), server)).end();
    server.setStatus({ code: i % 3 === 0 ? SpanStatusCode.ERROR : SpanStatusCode.UNSET });
    server.setAttribute('http.response.status_code', 200);
    server.end();
  }
  await provider.forceFlush();
  const spans = [...memory.getFinishedSpans()];
  await provider.shutdown();
  return spans;
}

describe('span export, OTLP/JSON', () => {
  it('sends the SDK serializer\'s document, batched as the platform resolves OTEL_BSP_*', async () => {
    const spans = await exportSpans(5);
    expect(received).toHaveLength(1);
    const [got] = received as [Received];
    expect(got.path).toBe('/v1/traces');
    expect(got.headers['content-type']).toBe('application/json');
    expect(JSON.parse(got.body.toString('utf8'))).toEqual(JSON.parse(Buffer.from(JsonTraceSerializer.serializeRequest(spans) as Uint8Array).toString('utf8')));
  });
});
