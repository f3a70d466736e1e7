import { createTraceState, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, TraceFlags, type Context } from '@opentelemetry/api';
import {
  AlwaysOnSampler, BasicTracerProvider, InMemorySpanExporter, ParentBasedSampler, SimpleSpanProcessor, TraceIdRatioBasedSampler,
  type ReadableSpan, type Sampler,
} from '@opentelemetry/sdk-trace-node';
import { describe, expect, it, vi } from 'vitest';
import { PooledIdGenerator } from './trace-ids.js';
import { DeferredTracer, SdkReplay } from './tracing-deferred.js';

/**
 * A deferred tracer whose records reach an SDK provider exporting to memory (as with OTLP/JSON),
 * cloned on the way so that nothing the test holds is shared with the exported spans.
 */
function setup(sampler: Sampler = new ParentBasedSampler({ root: new AlwaysOnSampler() })) {
  const providerIds = new PooledIdGenerator();
  const exporter = new InMemorySpanExporter();
  const provider = new BasicTracerProvider({ idGenerator: providerIds, sampler, spanProcessors: [new SimpleSpanProcessor(exporter)] });
  const sdk = provider.getTracer('test');
  const replay = new SdkReplay(sdk, providerIds);
  const tracer = new DeferredTracer(sampler, new PooledIdGenerator(), (records) => replay.write(structuredClone(records)));
  return { tracer, sdk, exported: (): ReadableSpan[] => exporter.getFinishedSpans() };
}

const remoteParent = (sampled: boolean): Context => trace.setSpanContext(ROOT_CONTEXT, {
  traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: sampled ? TraceFlags.SAMPLED : TraceFlags.NONE, isRemote: true,
});

describe('the deferred tracer', () => {
  it('hands nothing to the SDK until flushed, then spans with the ids, times and fields they ran with', () => {
    const { tracer, exported } = setup();
    const before = Date.now();
    const span = tracer.startSpan('GET', { kind: SpanKind.SERVER, attributes: { 'a': 1 } }, remoteParent(true));
    span.setAttribute('b', 'two');
    span.setAttributes({ c: true });
    span.addEvent('ev', { n: 3 });
    span.updateName('GET /v1/x');
    span.setStatus({ code: SpanStatusCode.ERROR });
    span.end();
    span.setAttribute('late', 1); // after the end: ignored, as by the SDK
    expect(exported()).toHaveLength(0);
    tracer.flush();
    const [s] = exported();
    expect(s).toBeDefined();
    if (!s) return;
    expect(s.spanContext()).toMatchObject({ traceId: span.spanContext().traceId, spanId: span.spanContext().spanId, traceFlags: TraceFlags.SAMPLED });
    expect(s.spanContext().traceId).toBe('0af7651916cd43dd8448eb211c80319c');
    expect(s.parentSpanContext?.spanId).toBe('b7ad6b7169203331');
    expect(s.name).toBe('GET /v1/x');
    expect(s.kind).toBe(SpanKind.SERVER);
    expect(s.attributes).toEqual({ a: 1, b: 'two', c: true });
    expect(s.events.map((e) => [e.name, e.attributes])).toEqual([['ev', { n: 3 }]]);
    expect(s.status.code).toBe(SpanStatusCode.ERROR);
    // Times are those of the span's run, not of the flush.
    const startMs = s.startTime[0] * 1e3 + s.startTime[1] / 1e6;
    const endMs = s.endTime[0] * 1e3 + s.endTime[1] / 1e6;
    expect(startMs).toBeGreaterThanOrEqual(before - 1);
    expect(endMs).toBeGreaterThanOrEqual(startMs);
    expect(endMs).toBeLessThanOrEqual(Date.now() + 1);
  });

  it('gives children, deferred or made by the SDK at once, the running span as their parent', () => {
    const { tracer, sdk, exported } = setup();
    const root = tracer.startSpan('root', {}, ROOT_CONTEXT);
    const inRoot = trace.setSpan(ROOT_CONTEXT, root);
    const child = tracer.startSpan('child', {}, inRoot);
    const direct = sdk.startSpan('direct', {}, inRoot);
    direct.end();
    child.end();
    root.end();
    tracer.flush();
    const byName = new Map(exported().map((s) => [s.name, s]));
    const rootId = root.spanContext().spanId;
    expect(byName.get('root')?.parentSpanContext).toBeUndefined();
    expect(byName.get('child')?.parentSpanContext?.spanId).toBe(rootId);
    expect(byName.get('direct')?.parentSpanContext?.spanId).toBe(rootId);
    expect(new Set(exported().map((s) => s.spanContext().traceId))).toEqual(new Set([root.spanContext().traceId]));
  });

  it('samples at the start as the SDK does at the flush: an unsampled span is not recorded and carries its flag', () => {
    const { tracer, exported } = setup(new ParentBasedSampler({ root: new TraceIdRatioBasedSampler(0.5) }));
    const unsampled = tracer.startSpan('x', {}, remoteParent(false));
    expect(unsampled.isRecording()).toBe(false);
    expect(unsampled.spanContext().traceFlags).toBe(TraceFlags.NONE);
    unsampled.end();
    const spans = Array.from({ length: 200 }, (_, i) => tracer.startSpan(`root-${i}`, {}, ROOT_CONTEXT));
    for (const s of spans) s.end();
    tracer.flush();
    const sampled = spans.filter((s) => s.spanContext().traceFlags === TraceFlags.SAMPLED).map((s) => s.spanContext().spanId);
    // Some of each (a 0.5 ratio over 200 random trace ids), and exactly those the start sampled.
    expect(sampled.length).toBeGreaterThan(0);
    expect(sampled.length).toBeLessThan(200);
    expect(exported().map((s) => s.spanContext().spanId).sort()).toEqual([...sampled].sort());
  });

  it('flushes on its own: at once past a full batch, and on a timer for a few', async () => {
    const { tracer, exported } = setup();
    const settled = (n: number): Promise<void> => new Promise((resolve) => {
      const check = (): void => void (exported().length >= n ? resolve() : setImmediate(check));
      check();
    });
    tracer.startSpan('one', {}, ROOT_CONTEXT).end();
    await settled(1);
    for (let i = 0; i < 300; i++) tracer.startSpan(`s${i}`, {}, ROOT_CONTEXT).end();
    await settled(301);
    expect(exported()).toHaveLength(301);
  });

  it('carries trace state, links, exceptions and event times given as dates through the records', () => {
    const { tracer, exported } = setup();
    const parent = trace.setSpanContext(ROOT_CONTEXT, {
      traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: TraceFlags.SAMPLED, isRemote: true,
      traceState: createTraceState('vendor=abc'),
    });
    const linked = { traceId: '4bf92f3577b34da6a3ce929d0e0e4736', spanId: '00f067aa0ba902b7', traceFlags: TraceFlags.SAMPLED };
    const at = new Date(Date.now() - 5);
    const span = tracer.startSpan('work', { links: [{ context: linked, attributes: { why: 'job' } }] }, parent);
    span.addEvent('stamped', at);
    span.recordException(Object.assign(new Error('boom'), { code: 'E_X' }));
    span.addLink({ context: linked });
    span.end();
    tracer.flush();
    const [s] = exported();
    expect(s?.spanContext().traceState?.get('vendor')).toBe('abc');
    expect(s?.parentSpanContext).toMatchObject({ spanId: 'b7ad6b7169203331', isRemote: true });
    expect(s?.links.map((l) => [l.context.spanId, l.attributes])).toEqual([['00f067aa0ba902b7', { why: 'job' }], ['00f067aa0ba902b7', undefined]]);
    const [stamped, exception] = s?.events ?? [];
    expect(stamped?.name).toBe('stamped');
    expect((stamped?.time[0] ?? 0) * 1e3 + (stamped?.time[1] ?? 0) / 1e6).toBeCloseTo(at.getTime(), 0);
    expect(exception?.name).toBe('exception');
    expect(exception?.attributes).toMatchObject({ 'exception.message': 'boom', 'exception.type': 'E_X' });
  });

  it('runs a callback in a new active span with startActiveSpan', () => {
    const { tracer, exported } = setup();
    const seen = tracer.startActiveSpan('active', (span) => {
      span.end();
      return span.spanContext().spanId;
    });
    tracer.flush();
    expect(exported().map((s) => s.spanContext().spanId)).toEqual([seen]);
  });

  it('hands encoded spans to the exporter in one call 500 ms after the first ended, at once when asked or past 256 KiB (encoded once 64 wait)', () => {
    vi.useFakeTimers();
    try {
      const sent: { bytes: number; spans: number }[] = [];
      const sampler = new ParentBasedSampler({ root: new AlwaysOnSampler() });
      const tracer = new DeferredTracer(sampler, new PooledIdGenerator(), { encoded: (bytes, ends) => void sent.push({ bytes: bytes.length, spans: ends.length }) });
      // Spans ended 60 ms apart wait to leave together.
      tracer.startSpan('a', {}, ROOT_CONTEXT).end();
      vi.advanceTimersByTime(60);
      tracer.startSpan('b', {}, ROOT_CONTEXT).end();
      vi.advanceTimersByTime(439);
      expect(sent).toEqual([]);
      // 500 ms after the first ended.
      vi.advanceTimersByTime(1);
      expect(sent.map((m) => m.spans)).toEqual([2]);
      // The next span starts a new wait.
      tracer.startSpan('b2', {}, ROOT_CONTEXT).end();
      vi.advanceTimersByTime(499);
      expect(sent).toHaveLength(1);
      vi.advanceTimersByTime(1);
      expect(sent.map((m) => m.spans)).toEqual([2, 1]);
      // An unsampled span is not sent; a flush sends what waits at once.
      tracer.startSpan('c', {}, remoteParent(false)).end();
      tracer.startSpan('d', {}, ROOT_CONTEXT).end();
      tracer.flush();
      expect(sent.map((m) => m.spans)).toEqual([2, 1, 1]);
      tracer.flush();
      expect(sent).toHaveLength(3);
      // Past 256 KiB waiting, the batch leaves as soon as it is encoded.
      const big = 'x'.repeat(1000);
      for (let i = 0; i < 300; i++) tracer.startSpan('big', { attributes: { name: big } }, ROOT_CONTEXT).end();
      vi.advanceTimersByTime(0);
      expect(sent).toHaveLength(4);
      expect(sent[3]?.spans).toBe(300);
      expect(sent[3]?.bytes).toBeGreaterThanOrEqual(256 * 1024);
      // Past 64 spans waiting they are encoded at once (on the next turn of the event loop):
      // 63 spans of 4.5 KB wait, unencoded, for their time; the 64th has them encoded, and past
      // 256 KiB they leave.
      const mid = 'x'.repeat(4500);
      for (let i = 0; i < 63; i++) tracer.startSpan('mid', { attributes: { name: mid } }, ROOT_CONTEXT).end();
      vi.advanceTimersByTime(0);
      expect(sent).toHaveLength(4);
      tracer.startSpan('mid', { attributes: { name: mid } }, ROOT_CONTEXT).end();
      vi.advanceTimersByTime(0);
      expect(sent).toHaveLength(5);
      expect(sent[4]?.spans).toBe(64);
      expect(sent[4]?.bytes).toBeGreaterThanOrEqual(256 * 1024);
      // Small spans past 64 are encoded at once too, but wait for their time to leave.
      vi.advanceTimersByTime(500);
      for (let i = 0; i < 70; i++) tracer.startSpan('small', {}, ROOT_CONTEXT).end();
      vi.advanceTimersByTime(0);
      expect(sent).toHaveLength(5);
      vi.advanceTimersByTime(500);
      expect(sent[5]?.spans).toBe(70);
    } finally {
      vi.useRealTimers();
    }
  });
});
