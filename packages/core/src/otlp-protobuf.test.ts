import { describe, expect, it } from 'vitest';
import { context, createTraceState, SpanKind, SpanStatusCode, trace, TraceFlags, type Attributes } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-node';
import { ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { beginScopeSpans, encodeSpan, encodeTraceRequest, endScopeSpans, ProtoWriter } from './otlp-protobuf.js';

const sdkBytes = (spans: ReadableSpan[]): Buffer => Buffer.from(ProtobufTraceSerializer.serializeRequest(spans) as Uint8Array);
const ourBytes = (spans: ReadableSpan[], writer = new ProtoWriter(16)): Buffer => {
  encodeTraceRequest(writer, spans);
  return Buffer.from(writer.take());
};

/** Attribute values of every kind an encoder has to get right. */
const ODD_VALUES: Attributes = {
  ascii: 'GET /v1/sessions/{session_id}',
  empty: '',
  accents: 'café ünïcödé',
  emoji: 'turn 🚀 done',
  lone_surrogate: 'bad \ud800 half',
  zero: 0,
  small: 42,
  negative: -7,
  big: 2 ** 40 + 3,
  huge_negative: -(2 ** 52),
  beyond_int64: 2 ** 64,
  fraction: 3.25,
  negative_fraction: -0.5,
  nan: Number.NaN,
  infinite: Number.POSITIVE_INFINITY,
  yes: true,
  no: false,
  strings: ['a', 'ü', ''],
  numbers: [1, 2.5, -3],
  flags: [true, false],
  holes: ['x', null, undefined] as unknown as string[],
  long: 'x'.repeat(300),
};

function spans(): ReadableSpan[] {
  const memory = new InMemorySpanExporter();
  const resource = resourceFromAttributes({ 'service.name': 'agentplane-test', 'service.version': '0.1.0', 'host.name': 'höst' });
  const provider = new BasicTracerProvider({ resource, spanProcessors: [new SimpleSpanProcessor(memory)] });
  const tracer = provider.getTracer('agentplane', '0.1.0');
  const other = provider.getTracer('agentplane-other', undefined, { schemaUrl: 'https://opentelemetry.io/schemas/1.30.0' });
  const remote = trace.setSpanContext(context.active(), {
    traceId: '0AF7651916CD43DD8448EB211C80319C', spanId: 'b7ad6b7169203331', traceFlags: TraceFlags.SAMPLED, isRemote: true,
    traceState: createTraceState('vendor=abc,other=x'),
  });
  const server = tracer.startSpan('GET /v1/sessions/{id}', { kind: SpanKind.SERVER, attributes: { 'http.request.method': 'GET', 'http.response.status_code': 200 } }, remote);
  const child = tracer.startSpan('append session_events', {
    kind: SpanKind.CLIENT,
    attributes: ODD_VALUES,
    links: [
      { context: { traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7', traceFlags: 1, isRemote: true, traceState: createTraceState('k=v') }, attributes: { why: 'cause', n: 2 } },
      { context: { traceId: '4bf92f3577b34da6a3ce929d0e0e4737', spanId: '00f067aa0ba902b8', traceFlags: 0 } },
    ],
  }, trace.setSpan(context.active(), server));
  child.addEvent('retry', { attempt: 2, reason: 'réessai' });
  child.addEvent('plain');
  child.setStatus({ code: SpanStatusCode.ERROR, message: 'the append failed: ünïcode' });
  child.end();
  server.setStatus({ code: SpanStatusCode.OK });
  server.end([1_764_000_000, 999_999_999]);
  tracer.startSpan('root', { kind: SpanKind.INTERNAL, startTime: [0, 1] }).end([4_294_967_296, 5]);
  for (const kind of [SpanKind.PRODUCER, SpanKind.CONSUMER]) other.startSpan(`kind ${kind}`, { kind }).end();
  // A message over 127 bytes at every level: multi-byte length prefixes.
  tracer.startSpan('n'.repeat(20_000), { attributes: { big: 'y'.repeat(70_000) } }).end();
  return memory.getFinishedSpans();
}

describe('OTLP/protobuf encoding', () => {
  it('writes the SDK serializer\'s bytes for every kind of span, attribute, event, link and status', () => {
    const all = spans();
    expect(all.length).toBe(6);
    expect(ourBytes(all)).toEqual(sdkBytes(all));
  });

  it('writes the same bytes span by span, and for spans of two scopes interleaved', () => {
    const all = spans();
    for (const s of all) expect(ourBytes([s])).toEqual(sdkBytes([s]));
    const interleaved = [all[3]!, all[0]!, all[4]!, all[1]!];
    expect(ourBytes(interleaved)).toEqual(sdkBytes(interleaved));
  });

  it('a reused writer starts each batch empty', () => {
    const all = spans();
    const writer = new ProtoWriter(8);
    const first = ourBytes(all, writer);
    expect(ourBytes(all.slice(0, 2), writer)).toEqual(sdkBytes(all.slice(0, 2)));
    expect(ourBytes(all, writer)).toEqual(first);
  });

  it('a request begun with its resource and scope, its spans\' bytes written after, is the SDK\'s request', () => {
    // The spans of one resource and scope, each encoded alone, then copied in after the head.
    const all = spans().filter((x) => x.instrumentationScope.name === 'agentplane');
    const first = all[0] as ReadableSpan;
    const w = new ProtoWriter(16);
    const open = beginScopeSpans(w, first.resource, first.instrumentationScope);
    for (const x of all) {
      const one = new ProtoWriter(16);
      encodeSpan(one, x);
      w.raw(one.view());
    }
    endScopeSpans(w, open);
    expect(Buffer.from(w.view())).toEqual(sdkBytes(all));
  });

  it('an empty batch is an empty request', () => {
    expect(ourBytes([])).toEqual(sdkBytes([]));
  });
});
