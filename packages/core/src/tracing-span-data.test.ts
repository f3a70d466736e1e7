import { createTraceState, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, TraceFlags, type Attributes, type Context, type Span, type Tracer } from '@opentelemetry/api';
import { AlwaysOnSampler, BasicTracerProvider, InMemorySpanExporter, ParentBasedSampler, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-node';
import { ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { describe, expect, it } from 'vitest';
import { beginScopeSpans, endScopeSpans, ProtoWriter } from './otlp-protobuf.js';
import { PooledIdGenerator } from './trace-ids.js';
import { DeferredTracer } from './tracing-deferred.js';

/**
 * The same calls on the SDK's own span and on a deferred span encoded on the event loop
 * (tracing-span-data.ts, the OTLP/protobuf path) give the same OTLP bytes: the SDK's serializer
 * of the SDK's span against the platform's encoding of the deferred one, under the same
 * resource and scope.
 */
type Calls = (span: Span) => void;

const T0 = 1_790_000_000_123.456;
const remote = (sampled = true): Context => trace.setSpanContext(ROOT_CONTEXT, {
  traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: sampled ? TraceFlags.SAMPLED : TraceFlags.NONE, isRemote: true,
  traceState: createTraceState('vendor=abc'),
});

function both(name: string, options: { kind?: SpanKind; attributes?: Attributes; links?: Parameters<Tracer['startSpan']>[1] extends infer O ? O extends { links?: infer L } ? L : never : never; startTime?: number | Date | [number, number] }, parent: Context, calls: Calls, end: number | Date | [number, number] = T0 + 2.5): { sdk: Buffer; ours: Buffer } {
  const sampler = new ParentBasedSampler({ root: new AlwaysOnSampler() });
  const providerIds = new PooledIdGenerator();
  const memory = new InMemorySpanExporter();
  const resource = resourceFromAttributes({ 'service.name': 'agentplane-test', 'service.version': '0.1.0' });
  const provider = new BasicTracerProvider({ resource, idGenerator: providerIds, sampler, spanProcessors: [new SimpleSpanProcessor(memory)] });
  const sdkTracer = provider.getTracer('agentplane', '0.1.0');

  let encoded: { bytes: Uint8Array; ends: Uint32Array } | undefined;
  const deferred = new DeferredTracer(sampler, new PooledIdGenerator(), { encoded: (bytes, ends) => void (encoded = { bytes: bytes.slice(), ends }) });
  const ours = deferred.startSpan(name, { ...options, startTime: options.startTime ?? T0 }, parent);
  providerIds.preset(ours.spanContext().traceId, ours.spanContext().spanId);
  const theirs = sdkTracer.startSpan(name, { ...options, startTime: options.startTime ?? T0 }, parent);
  providerIds.clearPreset();
  for (const s of [ours, theirs]) {
    calls(s);
    s.end(end);
  }
  deferred.flush();
  const [sdkSpan] = memory.getFinishedSpans() as ReadableSpan[];
  if (!sdkSpan || !encoded) throw new Error('a span is missing');
  expect(encoded.ends).toHaveLength(1);
  // The span's bytes in a request under the SDK span's resource and scope, as the export writes it.
  const w = new ProtoWriter(64);
  const open = beginScopeSpans(w, sdkSpan.resource, sdkSpan.instrumentationScope);
  w.raw(encoded.bytes.subarray(0, encoded.ends[0]));
  endScopeSpans(w, open);
  return { sdk: Buffer.from(ProtobufTraceSerializer.serializeRequest([sdkSpan]) as Uint8Array), ours: Buffer.from(w.take()) };
}

const same = (r: { sdk: Buffer; ours: Buffer }) => expect(r.ours.toString('hex')).toBe(r.sdk.toString('hex'));

describe('a deferred span encoded on the event loop', () => {
  it('is the SDK span: name, kind, parent, trace state, times and attributes', () => {
    same(both('GET', { kind: SpanKind.SERVER, attributes: { 'http.request.method': 'GET', n: 2, f: 0.5, yes: true } }, remote(), (s) => {
      s.setAttribute('http.response.status_code', 200);
      s.setAttributes({ 'http.route': '/v1/x/{id}', list: ['a', 'b'], nums: [1, 2] });
      s.updateName('GET /v1/x/{id}');
    }));
  });

  it('is the SDK span under a parent the deferred tracer made (its ids taken without the API check)', () => {
    const parentTracer = new DeferredTracer(new AlwaysOnSampler(), new PooledIdGenerator(), { encoded: () => undefined });
    const parent = parentTracer.startSpan('parent', {}, remote());
    same(both('child', { kind: SpanKind.CLIENT }, trace.setSpan(ROOT_CONTEXT, parent), (s) => s.setAttribute('db.system.name', 'redis')));
    parent.end();
  });

  it('drops what the SDK drops: invalid values and keys, over 128 attributes (counted)', () => {
    const many: Attributes = {};
    for (let i = 0; i < 200; i++) many[`k${i}`] = i;
    same(both('odd', { attributes: { obj: { a: 1 } as unknown as string, mixed: [1, 'a'] as unknown as string[], nul: null as unknown as string, '': 'empty key', holes: ['x', null] as unknown as string[] } }, ROOT_CONTEXT, (s) => {
      s.setAttributes(many);
      s.setAttribute('late', 'after the limit');
      s.setAttribute('k3', 'replaced');
    }));
  });

  it('keeps the newest 128 events and links, each with checked and limited attributes', () => {
    const wide: Attributes = { bad: { x: 1 } as unknown as string };
    for (let i = 0; i < 140; i++) wide[`a${i}`] = `v${i}`;
    same(both('events', {
      links: [
        { context: { traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7', traceFlags: 1, isRemote: true }, attributes: wide },
        { context: { traceId: '4bf92f3577b34da6a3ce929d0e0e4737', spanId: '00f067aa0ba902b8', traceFlags: 0 } },
      ],
    }, remote(), (s) => {
      for (let i = 0; i < 130; i++) s.addEvent(`e${i}`, { i }, T0 + i);
      s.addEvent('wide', wide, T0 + 200);
      s.addEvent('hr', [1_790_000_001, 5]);
      s.addEvent('date', new Date(1_790_000_002_000));
      for (let i = 0; i < 130; i++) s.addLink({ context: { traceId: '4bf92f3577b34da6a3ce929d0e0e4738', spanId: (1000 + i).toString(16).padStart(16, '0'), traceFlags: 1 } });
    }));
  });

  it('records exceptions and statuses as the SDK does', () => {
    const err = Object.assign(new Error('boom'), { code: 'E_BOOM' });
    same(both('errors', {}, ROOT_CONTEXT, (s) => {
      s.recordException(err, T0 + 1);
      s.recordException('a plain message', T0 + 1.5);
      s.recordException({} as Error, T0 + 1.6);
      s.setStatus({ code: SpanStatusCode.UNSET });
      s.setStatus({ code: SpanStatusCode.ERROR, message: 'failed' });
    }));
    same(both('ok-final', {}, ROOT_CONTEXT, (s) => {
      s.setStatus({ code: SpanStatusCode.OK, message: 'dropped: only errors keep a message' });
      s.setStatus({ code: SpanStatusCode.ERROR, message: 'ignored after OK' });
    }));
    same(both('bad-message', {}, ROOT_CONTEXT, (s) => s.setStatus({ code: SpanStatusCode.ERROR, message: 42 as unknown as string })));
  });

  it('takes times as the SDK does, and an end before the start as the start', () => {
    same(both('dates', { startTime: new Date(1_790_000_000_000) }, ROOT_CONTEXT, () => undefined, new Date(1_790_000_000_007)));
    same(both('hrtime', { startTime: [1_790_000_000, 123_456_789] }, ROOT_CONTEXT, () => undefined, [1_790_000_000, 223_456_789]));
    same(both('backwards', {}, ROOT_CONTEXT, () => undefined, T0 - 5));
  });

  it('leaves out spans the sampler did not sample', () => {
    let handed = 0;
    const sampler = new ParentBasedSampler({ root: new AlwaysOnSampler() });
    const deferred = new DeferredTracer(sampler, new PooledIdGenerator(), { encoded: (_bytes, ends) => void (handed += ends.length) });
    deferred.startSpan('unsampled', {}, remote(false)).end();
    deferred.startSpan('sampled', {}, remote(true)).end();
    deferred.flush();
    expect(handed).toBe(1);
  });
});
