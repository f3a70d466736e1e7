/**
 * The platform's tracer: spans recorded as plain values while they run and handed on in batches
 * after they end, encoded (OTLP/protobuf) or as records for the OpenTelemetry SDK's tracer.
 *
 * What a span costs a request is mostly the SDK's code and data touched cold, once per request,
 * between the requests of a process that shares its cores with its load and Redis (docs/OPERATIONS.md,
 * "What tracing costs": a bare SDK span started and ended costs about ten times its warm cost
 * there). Here a running span is a small record: its ids (from the same pool as the SDK's),
 * the sampler's decision (taken at the start with the provider's own sampler, so the context
 * handed to children and to other processes carries the right flags), its start time, and what
 * is set on it. Ended spans wait in a queue and are handed to a sink `FLUSH_MS` after the first of
 * them ended, one of two kinds. An `EncodedSink` (OTLP/protobuf, the default) gets the sampled
 * spans as OTLP Span messages, made by the SDK span's own rules (tracing-span-data.ts) and encoded
 * a batch at a time in one loop (sooner, once `FLUSH_AT` spans wait), sent on together (sooner,
 * past `POST_BYTES`); the exporter batches and sends the bytes (tracing-export.ts).
 * A `SpanSink` gets plain records (`SpanRecord`), each made into an SDK span with `SdkReplay`
 * (OTLP/JSON, and tests). `SdkReplay` makes them in one hot loop: `startSpan` with the
 * recorded start time and attributes, its ids given by the id generator (the SDK's `IdGenerator`
 * extension point), its events, links and status replayed, then `end` with the recorded end
 * time. From there on it is the SDK's span: its limits and attribute checks, its span processor,
 * batching and exporter.
 *
 * The samplers the platform configures (OTEL_TRACES_SAMPLER: always on or off, trace id ratio,
 * parent based) decide on the trace id and the parent alone, so the SDK's second call decides as
 * the first did; a span the SDK would not record is dropped there.
 */
import {
  context, createTraceState, diag, INVALID_SPAN_CONTEXT, ROOT_CONTEXT, SamplingDecision, SpanKind, trace, TraceFlags,
  type Attributes, type AttributeValue, type Context, type Exception, type HrTime, type Link, type Span, type SpanContext,
  type SpanOptions, type SpanStatus, type TimeInput, type Tracer,
} from '@opentelemetry/api';
import type { Sampler } from '@opentelemetry/sdk-trace-node';
import { encodeSpan, ProtoWriter } from './otlp-protobuf.js';
import { spanData, statusAfter, type RawSpan, type RecordedCall } from './tracing-span-data.js';

/** Ids for new spans, and a way to have the SDK take the ids chosen at a span's start. */
export interface PresetIdGenerator {
  generateTraceId(): string;
  generateSpanId(): string;
  /** The next ids handed out are these (the trace id only if the SDK asks for one). */
  preset(traceId: string, spanId: string): void;
  /** Forget a preset the SDK did not take. */
  clearPreset(): void;
}

/**
 * Ended spans are handed on (encoded, or to a `SpanSink`) this long after the first of them ended.
 * Each hand-off is a timer's wake-up of the event loop, work done cold between requests; the
 * exporter's batch processor sends at most every few seconds anyway.
 */
const FLUSH_MS = 500;
/**
 * …but encoded at once (on the next turn of the event loop) when this many wait… Few enough that
 * a span is rarely alive at a young-generation collection: with 256, a traced API at full load
 * held a few hundred ended spans most of the time, its scavenges took twice as long (median
 * 1.36 against 0.60 ms with tracing off, measured with `--trace-gc`) and its old generation grew
 * by 2–3 MB a second of dead spans until a mark-compact; with 128, 64 or 32 the scavenges cost
 * what they cost untraced, within 0.1 ms, and nothing piled up (docs/OPERATIONS.md).
 */
const FLUSH_AT = 64;
/** …and handed on at once when this many encoded bytes wait. */
const POST_BYTES = 256 * 1024;

/** What a sampler is shown for a span started without attributes or links (samplers only read them). */
const NO_ATTRIBUTES: Attributes = Object.freeze({});
const NO_LINKS: Link[] = Object.freeze([]) as unknown as Link[];

/** The key `suppressTracing` (@opentelemetry/core) sets in a context. */
const SUPPRESS_TRACING = Symbol.for('OpenTelemetry SDK Context Key SUPPRESS_TRACING');

/** Milliseconds since the epoch, to the microsecond (the clock every span of a process uses). */
const origin = performance.timeOrigin;
const nowMs = (): number => origin + performance.now();

/** A span context as plain data (its trace state serialised). */
export interface ContextRecord {
  traceId: string;
  spanId: string;
  traceFlags: number;
  traceState?: string;
  isRemote?: boolean;
}

/** A time as plain data: milliseconds since the epoch, or the SDK's `[seconds, nanoseconds]`. */
type TimeRecord = number | HrTime;

/** What happened on a span besides its fields, in order. */
export type RecordedRecord =
  | { kind: 'event'; name: string; attributes?: Attributes; time: TimeRecord }
  | { kind: 'exception'; exception: Exception; time: TimeRecord }
  | ({ kind: 'link' } & LinkRecord);

/** An ended span as plain data (structured-clone and JSON safe): what a sink receives, and what `SdkReplay` makes an SDK span of. */
export interface SpanRecord {
  name: string;
  kind: SpanKind;
  context: ContextRecord;
  parent?: ContextRecord;
  links?: LinkRecord[];
  startTime: TimeRecord;
  endTime: TimeRecord;
  attributes?: Attributes;
  status?: SpanStatus;
  recorded?: RecordedRecord[];
}

/** Where ended spans go, a batch at a time: as records (`SpanSink`), or encoded (`EncodedSink`). */
export type SpanSink = (spans: SpanRecord[]) => void;

/**
 * Where ended spans go as OTLP/protobuf: `bytes` holds the sampled spans of a batch, each a Span
 * message as field 2 of ScopeSpans (otlp-protobuf.ts `encodeSpan`), made by the SDK's span rules
 * (tracing-span-data.ts); span i ends at `ends[i]`. `bytes` is a view of the tracer's own writer,
 * which goes on in the same buffer after the call: the sink copies what it keeps; `ends` is its own.
 */
export interface EncodedSink {
  /** The spans whose bytes end at each of `ends` in `bytes`: valid during the call only (copy what is kept). */
  encoded(bytes: Uint8Array, ends: Uint32Array): void;
}

const timeRecord = (t: TimeInput): TimeRecord => (t instanceof Date ? t.getTime() : t);

function contextRecord(c: SpanContext): ContextRecord {
  const out: ContextRecord = { traceId: c.traceId, spanId: c.spanId, traceFlags: c.traceFlags };
  if (c.traceState) out.traceState = c.traceState.serialize();
  if (c.isRemote) out.isRemote = true;
  return out;
}

function spanContextOf(r: ContextRecord): SpanContext {
  return {
    traceId: r.traceId, spanId: r.spanId, traceFlags: r.traceFlags,
    ...(r.traceState ? { traceState: createTraceState(r.traceState) } : {}),
    ...(r.isRemote ? { isRemote: true } : {}),
  };
}

/** An exception's fields the SDK reads, as plain data (an Error's own are not enumerable: JSON would drop them). */
function exceptionRecord(e: Exception): Exception {
  if (typeof e === 'string') return e;
  const out: { name?: string; message?: string; stack?: string; code?: string | number } = {};
  if (e.name !== undefined) out.name = e.name;
  if (e.message !== undefined) out.message = e.message;
  if (e.stack !== undefined) out.stack = e.stack;
  if (e.code !== undefined) out.code = e.code;
  return out as Exception;
}

type LinkRecord = { context: ContextRecord; attributes?: Attributes };

function linkRecord(l: Link): LinkRecord {
  return l.attributes ? { context: contextRecord(l.context), attributes: l.attributes } : { context: contextRecord(l.context) };
}

function linkOf(l: LinkRecord): Link {
  return l.attributes ? { context: spanContextOf(l.context), attributes: l.attributes } : { context: spanContextOf(l.context) };
}

/** A running span: plain fields until it ends and is handed to the SDK. */
class DeferredSpan implements Span, RawSpan {
  attributes: Attributes | undefined;
  status: SpanStatus | undefined;
  recorded: RecordedCall[] | undefined;
  endTime: TimeInput = 0;
  private ended = false;

  constructor(
    private readonly owner: DeferredTracer,
    private readonly ctx: SpanContext,
    public name: string,
    readonly kind: SpanKind,
    readonly parent: SpanContext | undefined,
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
    if (!this.ended) this.status = statusAfter(this.status, status);
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

  /** The ended span as a plain record. */
  toRecord(): SpanRecord {
    const r: SpanRecord = { name: this.name, kind: this.kind, context: contextRecord(this.ctx), startTime: timeRecord(this.startTime), endTime: timeRecord(this.endTime) };
    if (this.parent) r.parent = contextRecord(this.parent);
    if (this.links) r.links = this.links.map(linkRecord);
    if (this.attributes) r.attributes = this.attributes;
    if (this.status) r.status = this.status;
    if (this.recorded) {
      r.recorded = this.recorded.map((e): RecordedRecord => {
        if (e.kind === 'event') return e.attributes ? { kind: 'event', name: e.name, attributes: e.attributes, time: timeRecord(e.time) } : { kind: 'event', name: e.name, time: timeRecord(e.time) };
        if (e.kind === 'exception') return { kind: 'exception', exception: exceptionRecord(e.exception), time: timeRecord(e.time) };
        return { kind: 'link', ...linkRecord(e.link) };
      });
    }
    return r;
  }
}

/**
 * A `Tracer` whose spans are written to `sink` as records in batches after they end (module
 * comment). `sampler` must decide as the SDK provider's that makes them into SDK spans (the same
 * kind, built from the same settings), and `ids` give their ids.
 */
export class DeferredTracer implements Tracer {
  private queue: DeferredSpan[] = [];
  private timer: NodeJS.Timeout | undefined;
  private immediate: NodeJS.Immediate | undefined;
  private writer: ProtoWriter | undefined;
  /** Where each encoded span not yet handed on ends in the writer. */
  private ends: number[] = [];

  constructor(
    private readonly sampler: Sampler,
    private readonly ids: Pick<PresetIdGenerator, 'generateTraceId' | 'generateSpanId'>,
    private readonly sink: SpanSink | EncodedSink,
  ) {}

  startSpan(name: string, options: SpanOptions = {}, ctx: Context = context.active()): Span {
    if (options.root) ctx = trace.deleteSpan(ctx);
    if (ctx.getValue(SUPPRESS_TRACING) === true) return trace.wrapSpanContext(INVALID_SPAN_CONTEXT);
    const parentSpan = trace.getSpan(ctx);
    const parent = parentSpan?.spanContext();
    // A parent this tracer made has valid ids by construction: the API's check (two regular
    // expressions) is left for the others.
    const validParent = parent !== undefined && (parentSpan instanceof DeferredSpan || trace.isSpanContextValid(parent));
    const traceId = validParent ? parent.traceId : this.ids.generateTraceId();
    const spanId = this.ids.generateSpanId();
    const kind = options.kind ?? SpanKind.INTERNAL;
    const result = this.sampler.shouldSample(ctx, traceId, name, kind, options.attributes ?? NO_ATTRIBUTES, options.links ?? NO_LINKS);
    const traceState = result.traceState ?? (validParent ? parent.traceState : undefined);
    const spanContext: SpanContext = {
      traceId, spanId,
      traceFlags: result.decision === SamplingDecision.RECORD_AND_SAMPLED ? TraceFlags.SAMPLED : TraceFlags.NONE,
      ...(traceState ? { traceState } : {}),
    };
    if (result.decision === SamplingDecision.NOT_RECORD) return trace.wrapSpanContext(spanContext);
    return new DeferredSpan(this, spanContext, name, kind, validParent ? parent : undefined, options.links, options.startTime ?? nowMs(), options.attributes);
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
    if (this.timer === undefined) {
      this.timer = setTimeout(() => this.handOn(true), FLUSH_MS);
      this.timer.unref();
    }
    if (this.queue.length >= FLUSH_AT) this.immediate ??= setImmediate(() => this.handOn(false));
  }

  /** Write every ended span to the sink now (also before the exporter shuts down). */
  flush(): void {
    this.handOn(true);
  }

  /**
   * Hand the ended spans on: records to a `SpanSink`; to an `EncodedSink`, encoded now and sent
   * when `due` (the first waiting span's time is up, or a flush), or once `POST_BYTES` wait.
   */
  private handOn(due: boolean): void {
    if (this.immediate !== undefined) clearImmediate(this.immediate);
    this.immediate = undefined;
    if (due) {
      if (this.timer !== undefined) clearTimeout(this.timer);
      this.timer = undefined;
    }
    const batch = this.queue;
    if (batch.length > 0) this.queue = [];
    if (typeof this.sink !== 'function') {
      if (batch.length > 0) this.encode(batch);
      if (due || (this.writer?.pos ?? 0) >= POST_BYTES) this.post(this.sink);
      return;
    }
    if (batch.length === 0) return;
    const records = new Array<SpanRecord>(batch.length);
    for (let i = 0; i < batch.length; i++) records[i] = (batch[i] as DeferredSpan).toRecord();
    try {
      this.sink(records);
    } catch (err) {
      diag.error('spans dropped: the exporter refused them', err);
    }
  }

  /**
   * The sampled spans of `batch` encoded in one loop (the encoder's code stays hot through it),
   * after those encoded before. A span the encoder refuses is dropped alone.
   */
  private encode(batch: readonly DeferredSpan[]): void {
    const w = (this.writer ??= new ProtoWriter(64 * 1024));
    // Every span of the batch ended before this: one clock read for all (tracing-span-data.ts).
    const perfNow = performance.now();
    for (const span of batch) {
      if ((span.spanContext().traceFlags & TraceFlags.SAMPLED) === 0) continue;
      const start = w.pos;
      try {
        encodeSpan(w, spanData(span, perfNow));
        this.ends.push(w.pos);
      } catch (err) {
        w.pos = start;
        diag.error('span dropped: it could not be encoded', err);
      }
    }
  }

  /** The encoded spans waiting, to `sink` in one message (nothing when none wait). */
  private post(sink: EncodedSink): void {
    // Nothing written (no sampled span, or none encodable): the writer is still empty.
    if (this.ends.length === 0 || this.writer === undefined) return;
    // The sink copies what it keeps: the writer goes on in the same buffer.
    const bytes = this.writer.view();
    const ends = Uint32Array.from(this.ends);
    this.ends = [];
    this.writer.pos = 0;
    try {
      sink.encoded(bytes, ends);
    } catch (err) {
      diag.error('spans dropped: the exporter refused them', err);
    }
  }
}

/**
 * Makes span records into SDK spans of `sdkTracer`, with the ids they ran with (`ids` must be the
 * id generator of the tracer's provider) and their recorded times and fields.
 */
export class SdkReplay {
  private warnedIds = false;

  constructor(private readonly sdkTracer: Tracer, private readonly ids: PresetIdGenerator) {}

  write(records: readonly SpanRecord[]): void {
    for (const r of records) {
      try {
        this.replay(r);
      } catch (err) {
        diag.error('span dropped: the SDK refused it', err);
      }
    }
  }

  private replay(r: SpanRecord): void {
    this.ids.preset(r.context.traceId, r.context.spanId);
    let span: Span;
    try {
      span = this.sdkTracer.startSpan(r.name, {
        kind: r.kind, startTime: r.startTime,
        ...(r.attributes ? { attributes: r.attributes } : {}),
        ...(r.links ? { links: r.links.map(linkOf) } : {}),
      }, r.parent ? trace.setSpanContext(ROOT_CONTEXT, spanContextOf(r.parent)) : ROOT_CONTEXT);
    } finally {
      this.ids.clearPreset();
    }
    if (!span.isRecording()) return;
    if (span.spanContext().spanId !== r.context.spanId && !this.warnedIds) {
      // The SDK took no preset id (a change in how it asks for ids): children and other
      // processes name a parent that is exported under another id.
      this.warnedIds = true;
      diag.warn('deferred spans: the SDK did not take the span ids recorded at their start');
    }
    if (r.recorded) {
      for (const e of r.recorded) {
        if (e.kind === 'event') span.addEvent(e.name, e.attributes, e.time);
        else if (e.kind === 'exception') span.recordException(e.exception, e.time);
        else span.addLink(linkOf(e));
      }
    }
    if (r.status) span.setStatus(r.status);
    span.end(r.endTime);
  }
}
