/**
 * The platform's tracer: spans recorded as plain values while they run and handed to the
 * OpenTelemetry SDK's tracer in batches after they end.
 *
 * What a span costs a request is mostly the SDK's code and data touched cold, once per request,
 * between the requests of a process that shares its cores with its load and Redis (docs/OPERATIONS.md,
 * "What tracing costs": a bare SDK span started and ended costs about ten times its warm cost
 * there). Here a running span is a small record: its ids (from the same pool as the SDK's),
 * the sampler's decision (taken at the start with the provider's own sampler, so the context
 * handed to children and to other processes carries the right flags), its start time, and what
 * is set on it. Ended spans wait in a queue; every `FLUSH_MS`, or at once past `FLUSH_AT` spans,
 * each is made into an SDK span in one hot loop: `startSpan` with the recorded start time and
 * attributes, its ids given by the id generator (the SDK's `IdGenerator` extension point), its
 * events, links and status replayed, then `end` with the recorded end time. From there on it is
 * the SDK's span: its limits and attribute checks, its span processor, batching and exporter.
 *
 * The samplers the platform configures (OTEL_TRACES_SAMPLER: always on or off, trace id ratio,
 * parent based) decide on the trace id and the parent alone, so the SDK's second call decides as
 * the first did; a span the SDK would not record is dropped there.
 */
import {
  context, diag, INVALID_SPAN_CONTEXT, SamplingDecision, SpanKind, trace, TraceFlags,
  type Attributes, type AttributeValue, type Context, type Exception, type Link, type Span, type SpanContext,
  type SpanOptions, type SpanStatus, type TimeInput, type Tracer,
} from '@opentelemetry/api';
import type { Sampler } from '@opentelemetry/sdk-trace-node';

/** Ids for new spans, and a way to have the SDK take the ids chosen at a span's start. */
export interface PresetIdGenerator {
  generateTraceId(): string;
  generateSpanId(): string;
  /** The next ids handed out are these (the trace id only if the SDK asks for one). */
  preset(traceId: string, spanId: string): void;
  /** Forget a preset the SDK did not take. */
  clearPreset(): void;
}

/** Ended spans are handed to the SDK at least this often… */
const FLUSH_MS = 50;
/** …and at once (on the next turn of the event loop) when this many wait. */
const FLUSH_AT = 256;

/** The key `suppressTracing` (@opentelemetry/core) sets in a context. */
const SUPPRESS_TRACING = Symbol.for('OpenTelemetry SDK Context Key SUPPRESS_TRACING');

/** Milliseconds since the epoch, to the microsecond (the clock every span of a process uses). */
const origin = performance.timeOrigin;
const nowMs = (): number => origin + performance.now();

type Recorded =
  | { kind: 'event'; name: string; attributes: Attributes | undefined; time: TimeInput }
  | { kind: 'exception'; exception: Exception; time: TimeInput }
  | { kind: 'link'; link: Link };

/** A running span: plain fields until it ends and is handed to the SDK. */
class DeferredSpan implements Span {
  attributes: Attributes | undefined;
  status: SpanStatus | undefined;
  recorded: Recorded[] | undefined;
  endTime: TimeInput = 0;
  private ended = false;

  constructor(
    private readonly owner: DeferredTracer,
    private readonly ctx: SpanContext,
    public name: string,
    readonly kind: SpanKind,
    readonly parent: Context,
    readonly links: Link[] | undefined,
    readonly startTime: TimeInput,
    attributes: Attributes | undefined,
  ) {
    this.attributes = attributes === undefined ? undefined : { ...attributes };
  }

  spanContext(): SpanContext {
    return this.ctx;
  }

  setAttribute(key: string, value: AttributeValue): this {
    if (!this.ended) (this.attributes ??= {})[key] = value;
    return this;
  }

  setAttributes(attributes: Attributes): this {
    if (!this.ended) this.attributes = this.attributes === undefined ? { ...attributes } : Object.assign(this.attributes, attributes);
    return this;
  }

  addEvent(name: string, attributesOrTime?: Attributes | TimeInput, time?: TimeInput): this {
    if (this.ended) return this;
    const isTime = typeof attributesOrTime === 'number' || Array.isArray(attributesOrTime) || attributesOrTime instanceof Date;
    (this.recorded ??= []).push({
      kind: 'event', name,
      attributes: isTime ? undefined : (attributesOrTime as Attributes | undefined),
      time: time ?? (isTime ? (attributesOrTime as TimeInput) : nowMs()),
    });
    return this;
  }

  addLink(link: Link): this {
    if (!this.ended) (this.recorded ??= []).push({ kind: 'link', link });
    return this;
  }

  addLinks(links: Link[]): this {
    for (const link of links) this.addLink(link);
    return this;
  }

  setStatus(status: SpanStatus): this {
    if (!this.ended) this.status = status;
    return this;
  }

  updateName(name: string): this {
    if (!this.ended) this.name = name;
    return this;
  }

  end(endTime?: TimeInput): void {
    if (this.ended) return;
    this.ended = true;
    this.endTime = endTime ?? nowMs();
    this.owner.ended(this);
  }

  isRecording(): boolean {
    return !this.ended;
  }

  recordException(exception: Exception, time?: TimeInput): void {
    if (!this.ended) (this.recorded ??= []).push({ kind: 'exception', exception, time: time ?? nowMs() });
  }
}

/**
 * A `Tracer` whose spans are made by `sdkTracer` in batches after they end (module comment).
 * `sampler` and `ids` must be the ones the SDK's provider was given.
 */
export class DeferredTracer implements Tracer {
  private queue: DeferredSpan[] = [];
  private timer: NodeJS.Timeout | undefined;
  private immediate: NodeJS.Immediate | undefined;
  private warnedIds = false;

  constructor(
    private readonly sdkTracer: Tracer,
    private readonly sampler: Sampler,
    private readonly ids: PresetIdGenerator,
  ) {}

  startSpan(name: string, options: SpanOptions = {}, ctx: Context = context.active()): Span {
    if (options.root) ctx = trace.deleteSpan(ctx);
    if (ctx.getValue(SUPPRESS_TRACING) === true) return trace.wrapSpanContext(INVALID_SPAN_CONTEXT);
    const parent = trace.getSpan(ctx)?.spanContext();
    const validParent = parent !== undefined && trace.isSpanContextValid(parent);
    const traceId = validParent ? parent.traceId : this.ids.generateTraceId();
    const spanId = this.ids.generateSpanId();
    const kind = options.kind ?? SpanKind.INTERNAL;
    const result = this.sampler.shouldSample(ctx, traceId, name, kind, options.attributes ?? {}, options.links ?? []);
    const traceState = result.traceState ?? (validParent ? parent.traceState : undefined);
    const spanContext: SpanContext = {
      traceId, spanId,
      traceFlags: result.decision === SamplingDecision.RECORD_AND_SAMPLED ? TraceFlags.SAMPLED : TraceFlags.NONE,
      ...(traceState ? { traceState } : {}),
    };
    if (result.decision === SamplingDecision.NOT_RECORD) return trace.wrapSpanContext(spanContext);
    return new DeferredSpan(this, spanContext, name, kind, ctx, options.links, options.startTime ?? nowMs(), options.attributes);
  }

  startActiveSpan<F extends (span: Span) => unknown>(name: string, fn: F): ReturnType<F>;
  startActiveSpan<F extends (span: Span) => unknown>(name: string, options: SpanOptions, fn: F): ReturnType<F>;
  startActiveSpan<F extends (span: Span) => unknown>(name: string, options: SpanOptions, ctx: Context, fn: F): ReturnType<F>;
  startActiveSpan<F extends (span: Span) => unknown>(name: string, a: F | SpanOptions, b?: F | Context, c?: F): ReturnType<F> {
    const fn = (c ?? (typeof b === 'function' ? b : a)) as F;
    const options = typeof a === 'function' ? {} : a;
    const parent = typeof b === 'object' ? b : context.active();
    const span = this.startSpan(name, options, parent);
    return context.with(trace.setSpan(parent, span), fn as (s: Span) => ReturnType<F>, undefined, span);
  }

  /** A span ended: queue it for the SDK. */
  ended(span: DeferredSpan): void {
    this.queue.push(span);
    if (this.queue.length >= FLUSH_AT) {
      this.immediate ??= setImmediate(() => this.flush());
    } else if (this.timer === undefined) {
      this.timer = setTimeout(() => this.flush(), FLUSH_MS);
      this.timer.unref();
    }
  }

  /** Hand every ended span to the SDK now (also before the provider shuts down). */
  flush(): void {
    if (this.timer !== undefined) clearTimeout(this.timer);
    if (this.immediate !== undefined) clearImmediate(this.immediate);
    this.timer = undefined;
    this.immediate = undefined;
    const batch = this.queue;
    this.queue = [];
    for (const s of batch) {
      try {
        this.toSdk(s);
      } catch (err) {
        diag.error('span dropped: the SDK refused it', err);
      }
    }
  }

  private toSdk(s: DeferredSpan): void {
    const ctx = s.spanContext();
    this.ids.preset(ctx.traceId, ctx.spanId);
    let span: Span;
    try {
      span = this.sdkTracer.startSpan(s.name, {
        kind: s.kind, startTime: s.startTime,
        ...(s.attributes ? { attributes: s.attributes } : {}),
        ...(s.links ? { links: s.links } : {}),
      }, s.parent);
    } finally {
      this.ids.clearPreset();
    }
    if (!span.isRecording()) return;
    if (span.spanContext().spanId !== ctx.spanId && !this.warnedIds) {
      // The SDK took no preset id (a change in how it asks for ids): children and other
      // processes name a parent that is exported under another id.
      this.warnedIds = true;
      diag.warn('deferred spans: the SDK did not take the span ids recorded at their start');
    }
    if (s.recorded) {
      for (const r of s.recorded) {
        if (r.kind === 'event') span.addEvent(r.name, r.attributes, r.time);
        else if (r.kind === 'exception') span.recordException(r.exception, r.time);
        else span.addLink(r.link);
      }
    }
    if (s.status) span.setStatus(s.status);
    span.end(s.endTime);
  }
}
