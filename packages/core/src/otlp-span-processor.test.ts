import { describe, expect, it } from 'vitest';
import { context, SpanKind, SpanStatusCode, trace, TraceFlags } from '@opentelemetry/api';
import { AlwaysOffSampler, BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor, type ReadableSpan } from '@opentelemetry/sdk-trace-node';
import { ProtobufTraceSerializer } from '@opentelemetry/otlp-transformer';
import { resourceFromAttributes } from '@opentelemetry/resources';
import { OtlpSpanProcessor, type OtlpBatchOptions, type OtlpSender } from './otlp-span-processor.js';

/** A sender that records each request and settles it when the test says so. */
class HeldSender implements OtlpSender {
  readonly sent: { bytes: Uint8Array; spans: number }[] = [];
  private readonly settles: ((ok: boolean) => void)[] = [];
  private waiter: (() => void) | null = null;
  shutdowns = 0;

  send(bytes: Uint8Array, spans: number): Promise<boolean> {
    this.sent.push({ bytes, spans });
    this.waiter?.();
    return new Promise((resolve) => this.settles.push(resolve));
  }

  /** Settle the oldest unsettled export. */
  settle(ok = true): void {
    this.settles.shift()?.(ok);
  }

  /** Resolves once `n` requests have been sent. */
  async sentCount(n: number): Promise<void> {
    while (this.sent.length < n) await new Promise<void>((r) => (this.waiter = r));
  }

  async shutdown(): Promise<void> {
    this.shutdowns++;
  }
}

/** An auto-settling sender. */
const okSender = (): HeldSender & { auto: true } => {
  const s = new HeldSender() as HeldSender & { auto: true };
  const send = s.send.bind(s);
  s.send = (bytes, spans) => {
    const p = send(bytes, spans);
    s.settle(true);
    return p;
  };
  return s;
};

function setup(sender: OtlpSender, options: Partial<OtlpBatchOptions> = {}, sampled = true) {
  const memory = new InMemorySpanExporter();
  const processor = new OtlpSpanProcessor(sender, options);
  const provider = new BasicTracerProvider({
    resource: resourceFromAttributes({ 'service.name': 'processor-test', 'host.name': 'höst' }),
    spanProcessors: [new SimpleSpanProcessor(memory), processor],
    ...(sampled ? {} : { sampler: new AlwaysOffSampler() }),
  });
  return { memory, processor, provider };
}

/** `n` finished spans: a SERVER span and its child per pair, from two instrumentation scopes. */
function makeSpans(provider: BasicTracerProvider, n: number): void {
  const main = provider.getTracer('agentplane', '0.1.0');
  const other = provider.getTracer('agentplane-other', undefined, { schemaUrl: 'https://opentelemetry.io/schemas/1.30.0' });
  for (let i = 0; i < n; i++) {
    const tracer = i % 3 === 2 ? other : main;
    const span = tracer.startSpan(`GET /v1/things/{id} ${i}`, { kind: i % 2 ? SpanKind.CLIENT : SpanKind.SERVER, attributes: { 'url.path': `/v1/things/thg_${i}`, n: i, ok: i % 2 === 0, 'ünï': 'cödé' } }, trace.setSpanContext(context.active(), {
      traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: TraceFlags.SAMPLED, isRemote: true,
    }));
    if (i % 4 === 0) span.addEvent('retry', { attempt: i });
    span.setStatus({ code: i % 5 === 0 ? SpanStatusCode.ERROR : SpanStatusCode.UNSET });
    span.end();
  }
}

const sdkBytes = (spans: ReadableSpan[]): Buffer => Buffer.from(ProtobufTraceSerializer.serializeRequest(spans) as Uint8Array);

describe('OtlpSpanProcessor', () => {
  it('sends what the SDK serializer writes for the same spans, batch after batch (buffers reused)', async () => {
    const sender = okSender();
    const { memory, processor, provider } = setup(sender, { maxExportBatchSize: 4, maxQueueSize: 100, scheduledDelayMillis: 60_000 });
    makeSpans(provider, 10);
    await processor.forceFlush();
    const spans = memory.getFinishedSpans();
    expect(sender.sent.map((s) => s.spans)).toEqual([4, 4, 2]);
    for (const [i, request] of sender.sent.entries()) {
      expect(Buffer.from(request.bytes)).toEqual(sdkBytes(spans.slice(i * 4, i * 4 + 4)));
    }
    // A later batch whose spans are of one scope only: no empty scope is written.
    memory.reset();
    provider.getTracer('agentplane', '0.1.0').startSpan('only main').end();
    await processor.forceFlush();
    expect(Buffer.from(sender.sent[3]!.bytes)).toEqual(sdkBytes(memory.getFinishedSpans()));
  });

  it('keeps one export in flight; spans past the queue are dropped and counted', async () => {
    const sender = new HeldSender();
    const { processor, provider } = setup(sender, { maxExportBatchSize: 2, maxQueueSize: 4, scheduledDelayMillis: 60_000 });
    makeSpans(provider, 2);
    await sender.sentCount(1);
    // Two more batches fill the queue while the first export is held; the rest are dropped.
    makeSpans(provider, 7);
    expect(sender.sent).toHaveLength(1);
    expect(processor.dropped).toBe(3);
    sender.settle();
    await sender.sentCount(2);
    sender.settle(false); // a failed export is dropped, not retried here (the transport retries)
    await sender.sentCount(3);
    expect(sender.sent.map((s) => s.spans)).toEqual([2, 2, 2]);
    sender.settle();
    await processor.forceFlush();
    expect(sender.sent).toHaveLength(3);
  });

  it('sends a partial batch after the scheduled delay', async () => {
    const sender = okSender();
    const { provider } = setup(sender, { maxExportBatchSize: 512, scheduledDelayMillis: 10 });
    makeSpans(provider, 3);
    await sender.sentCount(1);
    expect(sender.sent[0]?.spans).toBe(3);
  });

  it('exports nothing of an unsampled span', async () => {
    const sender = okSender();
    const { processor, provider } = setup(sender, {}, false);
    makeSpans(provider, 5);
    await processor.forceFlush();
    expect(sender.sent).toHaveLength(0);
  });

  it('flushes on shutdown, shuts the sender down once, and takes no span after', async () => {
    const sender = okSender();
    const { processor, provider } = setup(sender, { scheduledDelayMillis: 60_000 });
    makeSpans(provider, 3);
    await processor.shutdown();
    await processor.shutdown();
    expect(sender.sent.map((s) => s.spans)).toEqual([3]);
    expect(sender.shutdowns).toBe(1);
    makeSpans(provider, 3);
    await processor.forceFlush();
    expect(sender.sent).toHaveLength(1);
  });
});
