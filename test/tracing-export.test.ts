import { createServer } from 'node:http';
import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import { context, SpanKind, SpanStatusCode, trace, TraceFlags } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-node';
import { JsonTraceSerializer, ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { freePort } from '@agentplane/store';
import { startOtlpReceiver, type OtlpReceiver, type Received } from './harness/otlp-receiver.js';
// The export processor is loaded by tracing.ts only when tracing is on; it is tested here from the build.
import { exportProcessor, protobufExporter } from '../packages/core/dist/tracing-export.js';

/**
 * Span export as a process runs it: the span processor of each OTLP encoding, the SDK's
 * OTLP/HTTP transport and the standard OTEL_EXPORTER_OTLP_* settings, against a real HTTP
 * receiver. What arrives is exactly what the SDK's own serializers write for the same spans, in
 * either encoding.
 */
const RESOURCE = { 'service.name': 'export-test', 'service.version': '0.1.0' };
let receiver: OtlpReceiver;
let received: Received[] = [];
/** The variables these tests set (removed after each). */
const SET_HERE = ['OTEL_EXPORTER_OTLP_ENDPOINT', 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT', 'OTEL_EXPORTER_OTLP_HEADERS'];

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

/** `count` SERVER spans with a child each, exported through `protocol`'s processor; the spans as the SDK kept them. */
async function exportSpans(protocol: 'http/protobuf' | 'http/json', count: number): Promise<ReadableSpan[]> {
  process.env.OTEL_EXPORTER_OTLP_ENDPOINT = receiver.url;
  const memory = new InMemorySpanExporter();
  const processor = await exportProcessor(protocol, { maxExportBatchSize: 512, maxQueueSize: 2048, scheduledDelayMillis: 60_000 });
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

describe('span export', () => {
  it('sends OTLP/protobuf: the SDK serializer\'s bytes, to /v1/traces, as application/x-protobuf', async () => {
    const spans = await exportSpans('http/protobuf', 50);
    expect(received).toHaveLength(1);
    const [got] = received as [Received];
    expect(got.path).toBe('/v1/traces');
    expect(got.headers['content-type']).toBe('application/x-protobuf');
    expect(got.body).toEqual(Buffer.from(ProtobufTraceSerializer.serializeRequest(spans) as Uint8Array));
  });

  it('sends OTLP/JSON: the SDK serializer\'s document', async () => {
    const spans = await exportSpans('http/json', 5);
    expect(received).toHaveLength(1);
    const [got] = received as [Received];
    expect(got.headers['content-type']).toBe('application/json');
    expect(JSON.parse(got.body.toString('utf8'))).toEqual(JSON.parse(Buffer.from(JsonTraceSerializer.serializeRequest(spans) as Uint8Array).toString('utf8')));
  });

  it('honours the traces endpoint and headers variables, and reports a refused export as failed', async () => {
    process.env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = `${receiver.url}/custom/traces`;
    process.env.OTEL_EXPORTER_OTLP_HEADERS = 'x-tenant=acme';
    // The spans of an earlier export, sent again by the exporter: the refusal is its FAILED result.
    const spans = await exportSpans('http/protobuf', 1);
    received.length = 0;
    receiver.status = 400;
    const exporter = await protobufExporter();
    expect(await new Promise<number>((resolve) => exporter.export(spans, (r) => resolve(r.code)))).toBe(1);
    await exporter.shutdown();
    expect(received).toHaveLength(1);
    expect(received[0]?.path).toBe('/custom/traces');
    expect(received[0]?.headers['x-tenant']).toBe('acme');
  });

  it('fails a batch it cannot encode without sending it, and the next batch is whole', async () => {
    const spans = await exportSpans('http/protobuf', 1);
    received.length = 0;
    const [good] = spans as [ReadableSpan];
    // Encoded after a good span: the failure comes with part of the request already written.
    const broken = Object.create(good, { spanContext: { value: () => { throw new Error('unreadable span'); } } }) as ReadableSpan;
    const exporter = await protobufExporter();
    const result = await new Promise<{ code: number; error?: Error }>((resolve) => exporter.export([good, broken], resolve));
    expect(result.code).toBe(1);
    expect(result.error?.message).toBe('unreadable span');
    expect(await new Promise<number>((resolve) => exporter.export([good], (r) => resolve(r.code)))).toBe(0);
    await exporter.forceFlush?.();
    await exporter.shutdown();
    expect(received).toHaveLength(1);
    expect(received[0]?.body).toEqual(Buffer.from(ProtobufTraceSerializer.serializeRequest([good]) as Uint8Array));
  });

  it('keeps the bytes of an export in flight while the next batch is written, and reuses a buffer only after its export', async () => {
    const [first, second] = (await exportSpans('http/protobuf', 1)) as [ReadableSpan, ReadableSpan];
    // Batches of several MB, so that much of a body still waits in its socket (the receiver reads
    // nothing until both requests are there) while the other batch is encoded.
    const batchA = Array<ReadableSpan>(40_000).fill(first);
    const batchB = Array<ReadableSpan>(40_000).fill(second);
    const bodies: Buffer[] = [];
    const waiting: (() => void)[] = [];
    const slow = createServer((req, res) => {
      req.pause();
      waiting.push(() => {
        const chunks: Buffer[] = [];
        req.on('data', (c: Buffer) => chunks.push(c));
        req.on('end', () => {
          bodies.push(Buffer.concat(chunks));
          res.writeHead(200, { 'content-type': 'application/json' }).end('{}');
        });
        req.resume();
      });
      if (waiting.length === 2) for (const go of waiting.splice(0)) go();
    });
    const slowPort = await freePort();
    await new Promise<void>((r) => slow.listen(slowPort, '127.0.0.1', () => r()));
    try {
      process.env.OTEL_EXPORTER_OTLP_ENDPOINT = `http://127.0.0.1:${slowPort}`;
      const exporter = await protobufExporter();
      const run = (batch: ReadableSpan[]): Promise<number> => new Promise((resolve) => exporter.export(batch, (r) => resolve(r.code)));
      expect(await Promise.all([run(batchA), run(batchB)])).toEqual([0, 0]);
      // Both writers are idle now: the next two batches are written into them, in flight together again.
      expect(await Promise.all([run(batchB), run(batchA)])).toEqual([0, 0]);
      await exporter.shutdown();
      const want = (batch: ReadableSpan[]): Buffer => Buffer.from(ProtobufTraceSerializer.serializeRequest(batch) as Uint8Array);
      const [a, b] = [want(batchA), want(batchB)];
      expect(a.length).toBeGreaterThan(2 * 1024 * 1024);
      expect(bodies).toHaveLength(4);
      // Arrival order within a pair is not fixed; each body is one of the two batches, whole
      // (compared as names: a diff of MBs of bytes is no use).
      const which = (body: Buffer): string => (body.equals(a) ? 'A' : body.equals(b) ? 'B' : `neither (${body.length} bytes)`);
      expect(bodies.slice(0, 2).map(which).sort()).toEqual(['A', 'B']);
      expect(bodies.slice(2).map(which).sort()).toEqual(['A', 'B']);
    } finally {
      await new Promise<void>((r) => slow.close(() => r()));
    }
  });
});
