import { describe, expect, it } from 'vitest';
import { context, createTraceState, SpanKind, SpanStatusCode, trace, TraceFlags } from '@opentelemetry/api';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-node';
import { JsonTraceSerializer, ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { fromWire, toWire } from './tracing-export.js';

/** Finished SDK spans covering what the platform sets: parents (local and remote), attributes, status, events, links, trace state. */
function finishedSpans() {
  const memory = new InMemorySpanExporter();
  const resource = resourceFromAttributes({ 'service.name': 'agentplane-test', 'service.version': '0.1.0' });
  const provider = new BasicTracerProvider({ resource, spanProcessors: [new SimpleSpanProcessor(memory)] });
  const tracer = provider.getTracer('agentplane', '0.1.0');
  const remote = trace.setSpanContext(context.active(), {
    traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: TraceFlags.SAMPLED, isRemote: true,
    traceState: createTraceState('vendor=abc'),
  });
  const server = tracer.startSpan('GET /v1/sessions/{id}', { kind: SpanKind.SERVER, attributes: { 'http.request.method': 'GET', 'http.response.status_code': 200 } }, remote);
  const child = tracer.startSpan('append session_events', {
    kind: SpanKind.CLIENT,
    attributes: { 'agentplane.append.events': 3, 'agentplane.flag': true, 'agentplane.list': ['a', 'b'] },
    links: [{ context: { traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7', traceFlags: 1 }, attributes: { why: 'cause' } }],
  }, trace.setSpan(context.active(), server));
  child.addEvent('retry', { attempt: 2 });
  child.setStatus({ code: SpanStatusCode.ERROR, message: 'the append failed' });
  child.end();
  server.end();
  tracer.startSpan('root', { kind: SpanKind.INTERNAL }).end();
  return { spans: memory.getFinishedSpans(), resource };
}

describe('span export off the event loop', () => {
  it('a span rebuilt from its wire form encodes to the same OTLP bytes, protobuf and JSON', () => {
    const { spans, resource } = finishedSpans();
    expect(spans).toHaveLength(3);
    // What crosses to the export thread is plain data: a structured clone keeps every field.
    const rebuilt = structuredClone(spans.map(toWire)).map((w) => fromWire(w, resource));
    expect(Buffer.from(ProtobufTraceSerializer.serializeRequest(rebuilt) as Uint8Array)).toEqual(Buffer.from(ProtobufTraceSerializer.serializeRequest(spans) as Uint8Array));
    expect(Buffer.from(JsonTraceSerializer.serializeRequest(rebuilt) as Uint8Array).toString()).toBe(Buffer.from(JsonTraceSerializer.serializeRequest(spans) as Uint8Array).toString());
  });

  it('keeps the parent, its remoteness and the span kind', () => {
    const { spans, resource } = finishedSpans();
    const server = fromWire(structuredClone(toWire(spans[1]!)), resource);
    expect(server.parentSpanContext).toMatchObject({ spanId: 'b7ad6b7169203331', isRemote: true });
    expect(server.kind).toBe(SpanKind.SERVER);
    const root = fromWire(structuredClone(toWire(spans[2]!)), resource);
    expect(root.parentSpanContext).toBeUndefined();
    const child = fromWire(structuredClone(toWire(spans[0]!)), resource);
    expect(child.spanContext().traceState?.serialize()).toBe('vendor=abc');
    expect(child.status).toEqual({ code: SpanStatusCode.ERROR, message: 'the append failed' });
    expect(child.attributes).toEqual({ 'agentplane.append.events': 3, 'agentplane.flag': true, 'agentplane.list': ['a', 'b'] });
    expect(child.events.map((e) => e.name)).toEqual(['retry']);
    expect(child.links).toHaveLength(1);
  });
});
