import { createServer } from 'node:http';
import { afterAll, beforeAll, beforeEach, describe, expect, it } from 'vitest';
import { SpanKind } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-node';
import { ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
// Loaded by tracing.ts only when tracing is on; tested here from the build.
import { encodedExport } from '../packages/core/dist/tracing-export.js';
import { encodeSpan, ProtoWriter } from '../packages/core/dist/otlp-protobuf.js';
import { freePort } from '@agentplane/store';
import { startOtlpReceiver, type OtlpReceiver } from './harness/otlp-receiver.js';

/**
 * The export of spans the event loop encoded (the default, OTLP/protobuf): batched as request
 * bytes, by the SDK batch processor's rules, sent with the SDK's OTLP/HTTP transport to a real
 * receiver. Each request is exactly what the SDK's serializer writes for the same spans.
 */
let receiver: OtlpReceiver;

beforeAll(async () => {
  receiver = await startOtlpReceiver();
  process.env.OTEL_EXPORTER_OTLP_ENDPOINT = receiver.url;
});
afterAll(async () => {
  delete process.env.OTEL_EXPORTER_OTLP_ENDPOINT;
  await receiver.close();
});
beforeEach(() => {
  receiver.received.length = 0;
  receiver.status = 200;
});
/** The bodies received so far. */
const received = (): Buffer[] => receiver.received.map((r) => r.body);

/** `n` SDK spans under the resource and scope `encodedExport('export-test', '0.1.0')` exports under. */
function sdkSpans(n: number): ReadableSpan[] {
  const memory = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'export-test', 'service.version': '0.1.0' }),
    spanProcessors: [new SimpleSpanProcessor(memory)],
  });
  const tracer = provider.getTracer('agentplane', '0.1.0');
  for (let i = 0; i < n; i++) tracer.startSpan(`GET ${i}`, { kind: SpanKind.SERVER, attributes: { 'url.path': `/v1/x/${i}`, n: i } }).end();
  return memory.getFinishedSpans();
}

/** The spans encoded one after another in one buffer, as the tracer hands them on. */
function encoded(spans: ReadableSpan[]): { bytes: Uint8Array; ends: Uint32Array } {
  const w = new ProtoWriter(16);
  const ends: number[] = [];
  for (const s of spans) {
    encodeSpan(w, s);
    ends.push(w.pos);
  }
  return { bytes: w.view(), ends: Uint32Array.from(ends) };
}

const request = (spans: ReadableSpan[]): Buffer => Buffer.from(ProtobufTraceSerializer.serializeRequest(spans) as Uint8Array);

const until = async (what: () => boolean): Promise<void> => {
  const deadline = Date.now() + 10_000;
  while (!what()) {
    if (Date.now() > deadline) throw new Error('timed out');
    await new Promise((r) => setTimeout(r, 10));
  }
};

describe('encoded span export', () => {
  it('sends a full batch at once, the rest when due or at shutdown, each request the SDK serializer\'s bytes', async () => {
    const spans = sdkSpans(5);
    const exporter = await encodedExport('export-test', '0.1.0', { scheduledDelayMillis: 60_000, maxQueueSize: 100, maxExportBatchSize: 2 });
    const { bytes, ends } = encoded(spans);
    exporter.write(bytes, ends);
    // The caller's buffer is copied: writing over it changes nothing sent.
    bytes.fill(0);
    await until(() => received().length === 2);
    await exporter.shutdown();
    expect(received()).toHaveLength(3);
    expect(received()).toEqual([request(spans.slice(0, 2)), request(spans.slice(2, 4)), request(spans.slice(4))]);
  });

  it('sends what waits once the schedule delay has passed', async () => {
    const spans = sdkSpans(3);
    const exporter = await encodedExport('export-test', '0.1.0', { scheduledDelayMillis: 50, maxQueueSize: 100, maxExportBatchSize: 100 });
    const first = encoded(spans.slice(0, 2));
    exporter.write(first.bytes, first.ends);
    const second = encoded(spans.slice(2));
    exporter.write(second.bytes, second.ends);
    await until(() => received().length === 1);
    expect(received()[0]).toEqual(request(spans));
    await exporter.shutdown();
    expect(received()).toHaveLength(1);
  });

  it('drops the spans past the queue size, and takes new ones once an export has made room', async () => {
    const spans = sdkSpans(6);
    const exporter = await encodedExport('export-test', '0.1.0', { scheduledDelayMillis: 50, maxQueueSize: 3, maxExportBatchSize: 10 });
    const five = encoded(spans.slice(0, 5));
    exporter.write(five.bytes, five.ends);
    expect(exporter.waiting).toBe(3);
    // Room is made when the export is answered, which the exporter hears after the receiver has
    // the request: wait for the exporter's own count, not the receiver's.
    await until(() => exporter.waiting === 0);
    expect(received()).toHaveLength(1);
    const sixth = encoded(spans.slice(5));
    exporter.write(sixth.bytes, sixth.ends);
    await exporter.shutdown();
    expect(received()).toEqual([request(spans.slice(0, 3)), request(spans.slice(5))]);
  });
  it('goes to the traces endpoint with the headers OTEL_EXPORTER_OTLP_* name, as application/x-protobuf; a refused batch is not sent again', async () => {
    process.env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT = `${receiver.url}/custom/traces`;
    process.env.OTEL_EXPORTER_OTLP_HEADERS = 'x-tenant=acme';
    try {
      const spans = sdkSpans(2);
      const exporter = await encodedExport('export-test', '0.1.0', { scheduledDelayMillis: 60_000, maxQueueSize: 10, maxExportBatchSize: 1 });
      receiver.status = 400;
      const first = encoded(spans.slice(0, 1));
      exporter.write(first.bytes, first.ends);
      await until(() => received().length === 1);
      receiver.status = 200;
      const second = encoded(spans.slice(1));
      exporter.write(second.bytes, second.ends);
      await exporter.shutdown();
      expect(receiver.received.map((r) => [r.path, r.headers['content-type'], r.headers['x-tenant']])).toEqual([
        ['/custom/traces', 'application/x-protobuf', 'acme'],
        ['/custom/traces', 'application/x-protobuf', 'acme'],
      ]);
      // The refused batch's buffer is not reused for the next (the transport may still hold it).
      expect(received()).toEqual([request(spans.slice(0, 1)), request(spans.slice(1))]);
    } finally {
      delete process.env.OTEL_EXPORTER_OTLP_TRACES_ENDPOINT;
      delete process.env.OTEL_EXPORTER_OTLP_HEADERS;
    }
  });

  it('keeps the bytes of an export in flight while the next batches are written, and reuses a buffer only after its export', async () => {
    const [a, b] = sdkSpans(2) as [ReadableSpan, ReadableSpan];
    // Batches of several MB, so that much of a body still waits in its socket while the receiver
    // holds the first request unread and the next batch is written.
    const batchA = Array<ReadableSpan>(40_000).fill(a);
    const batchB = Array<ReadableSpan>(40_000).fill(b);
    const bodies: Buffer[] = [];
    let held: (() => void) | undefined;
    let firstArrived: () => void = () => undefined;
    const arrived = new Promise<void>((r) => (firstArrived = r));
    const slow = createServer((req, res) => {
      const read = (): void => {
        const chunks: Buffer[] = [];
        req.on('data', (c: Buffer) => chunks.push(c));
        req.on('end', () => {
          bodies.push(Buffer.concat(chunks));
          res.writeHead(200, { 'content-type': 'application/x-protobuf' }).end();
        });
        req.resume();
      };
      if (held === undefined) {
        req.pause();
        held = read;
        firstArrived();
      } else read();
    });
    const port = await freePort();
    await new Promise<void>((r) => slow.listen(port, '127.0.0.1', () => r()));
    const endpoint = process.env.OTEL_EXPORTER_OTLP_ENDPOINT;
    process.env.OTEL_EXPORTER_OTLP_ENDPOINT = `http://127.0.0.1:${port}`;
    try {
      const exporter = await encodedExport('export-test', '0.1.0', { scheduledDelayMillis: 60_000, maxQueueSize: 200_000, maxExportBatchSize: 40_000 });
      const [encA, encB] = [encoded(batchA), encoded(batchB)];
      exporter.write(encA.bytes, encA.ends);
      await arrived;
      // Written while the first request is in flight, unread: into a buffer of its own.
      exporter.write(encB.bytes, encB.ends);
      held?.();
      // (The second may be read too by the time this looks: its request follows at once.)
      await until(() => bodies.length >= 1);
      // The first export is done: its buffer takes the third batch while the second is in flight.
      exporter.write(encA.bytes, encA.ends);
      await exporter.shutdown();
      const [wantA, wantB] = [request(batchA), request(batchB)];
      expect(wantA.length).toBeGreaterThan(2 * 1024 * 1024);
      // Compared as names: a diff of MBs of bytes is no use.
      const which = (body: Buffer): string => (body.equals(wantA) ? 'A' : body.equals(wantB) ? 'B' : `neither (${body.length} bytes)`);
      expect(bodies.map(which)).toEqual(['A', 'B', 'A']);
    } finally {
      process.env.OTEL_EXPORTER_OTLP_ENDPOINT = endpoint;
      await new Promise<void>((r) => slow.close(() => r()));
    }
  });
});
