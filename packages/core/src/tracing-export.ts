/**
 * Span export off the request thread. The process's BatchSpanProcessor hands each finished batch
 * to a worker thread as plain records (`WireSpan`: ids, times, names, attributes; no class
 * instances); the worker rebuilds them as the SDK's ReadableSpan shape and exports them with the
 * SDK's own OTLP/HTTP exporter (serialisation, HTTP, retries and the standard OTEL_EXPORTER_OTLP_*
 * settings all stay the SDK's). What the event loop pays per span is its creation and a
 * structured clone; the OTLP encoding and the HTTP export run beside it.
 *
 * The worker answers each batch once its export settled, so the batch processor keeps its own
 * back-pressure (one export in flight, its queue bounded by OTEL_BSP_MAX_QUEUE_SIZE, spans past
 * it dropped and counted by the SDK). If the worker dies, every later batch fails at once.
 */
import { Worker } from 'node:worker_threads';
import type { Attributes, HrTime, Link, SpanContext, SpanStatus } from '@opentelemetry/api';
import type { ReadableSpan, SpanExporter, TimedEvent } from '@opentelemetry/sdk-trace-node';

/** A finished span as it crosses to the export thread. */
export interface WireSpan {
  name: string;
  kind: number;
  traceId: string;
  spanId: string;
  traceFlags: number;
  traceState?: string;
  parentSpanId?: string;
  parentIsRemote?: boolean;
  startTime: HrTime;
  endTime: HrTime;
  duration: HrTime;
  status: SpanStatus;
  attributes: Attributes;
  links: Link[];
  events: TimedEvent[];
  droppedAttributesCount: number;
  droppedEventsCount: number;
  droppedLinksCount: number;
  scope: { name: string; version?: string; schemaUrl?: string };
}

/** What the main thread sends to the export thread. */
export type ToExporter = { kind: 'export'; id: number; spans: WireSpan[] } | { kind: 'shutdown'; id: number };

/** The export thread's answer to one message: `ok` false when the export failed. */
export interface FromExporter {
  id: number;
  ok: boolean;
}

/** Set up once for the export thread: the resource and the OTLP encoding. */
export interface ExportThreadData {
  resource: Attributes;
  protocol: 'http/protobuf' | 'http/json';
}

/** A ReadableSpan as plain data (what a structured clone carries). */
export function toWire(span: ReadableSpan): WireSpan {
  const ctx = span.spanContext();
  const parent = span.parentSpanContext;
  const scope = span.instrumentationScope;
  const wire: WireSpan = {
    name: span.name,
    kind: span.kind,
    traceId: ctx.traceId,
    spanId: ctx.spanId,
    traceFlags: ctx.traceFlags,
    startTime: span.startTime,
    endTime: span.endTime,
    duration: span.duration,
    status: span.status,
    attributes: span.attributes,
    links: span.links,
    events: span.events,
    droppedAttributesCount: span.droppedAttributesCount,
    droppedEventsCount: span.droppedEventsCount,
    droppedLinksCount: span.droppedLinksCount,
    scope: scope.version === undefined && scope.schemaUrl === undefined ? { name: scope.name } : { name: scope.name, version: scope.version, schemaUrl: scope.schemaUrl },
  };
  const state = ctx.traceState?.serialize();
  if (state) wire.traceState = state;
  if (parent?.spanId) {
    wire.parentSpanId = parent.spanId;
    wire.parentIsRemote = parent.isRemote === true;
  }
  return wire;
}

/** One scope object per name@version:schema (the OTLP encoder groups spans by it). */
const scopes = new Map<string, WireSpan['scope']>();
const scopeOf = (s: WireSpan['scope']): WireSpan['scope'] => {
  const key = `${s.name}@${s.version ?? ''}:${s.schemaUrl ?? ''}`;
  let scope = scopes.get(key);
  if (!scope) scopes.set(key, (scope = s));
  return scope;
};

/** A WireSpan as the SDK's ReadableSpan shape, as the OTLP encoder reads it. */
export function fromWire(w: WireSpan, resource: ReadableSpan['resource']): ReadableSpan {
  const traceState = w.traceState === undefined ? undefined : { serialize: () => w.traceState as string };
  const ctx = { traceId: w.traceId, spanId: w.spanId, traceFlags: w.traceFlags, ...(traceState ? { traceState } : {}) } as SpanContext;
  const parent: SpanContext | undefined = w.parentSpanId === undefined
    ? undefined
    : { traceId: w.traceId, spanId: w.parentSpanId, traceFlags: w.traceFlags, isRemote: w.parentIsRemote === true };
  const span = {
    name: w.name,
    kind: w.kind,
    spanContext: () => ctx,
    parentSpanContext: parent,
    startTime: w.startTime,
    endTime: w.endTime,
    duration: w.duration,
    status: w.status,
    attributes: w.attributes,
    links: w.links,
    events: w.events,
    ended: true,
    resource,
    instrumentationScope: scopeOf(w.scope),
    droppedAttributesCount: w.droppedAttributesCount,
    droppedEventsCount: w.droppedEventsCount,
    droppedLinksCount: w.droppedLinksCount,
  };
  return span as unknown as ReadableSpan;
}

type ExportCallback = Parameters<SpanExporter['export']>[1];

/** A SpanExporter whose work happens on a worker thread running `tracing-export-thread.js`. */
export class ThreadSpanExporter implements SpanExporter {
  private readonly worker: Worker;
  private readonly pending = new Map<number, (ok: boolean) => void>();
  private nextId = 1;
  private dead = false;

  constructor(data: ExportThreadData) {
    this.worker = new Worker(new URL('./tracing-export-thread.js', import.meta.url), { workerData: data });
    // The thread never keeps the process alive: shutdown flushes it explicitly.
    this.worker.unref();
    this.worker.on('message', (m: FromExporter) => {
      const settle = this.pending.get(m.id);
      this.pending.delete(m.id);
      settle?.(m.ok);
    });
    const fail = (): void => {
      this.dead = true;
      for (const settle of this.pending.values()) settle(false);
      this.pending.clear();
    };
    this.worker.on('error', fail);
    this.worker.on('exit', fail);
  }

  export(spans: ReadableSpan[], done: ExportCallback): void {
    // ExportResultCode: 0 = SUCCESS, 1 = FAILED.
    if (this.dead) return done({ code: 1 });
    this.send({ kind: 'export', id: this.nextId++, spans: spans.map(toWire) }, (ok) => done({ code: ok ? 0 : 1 }));
  }

  async shutdown(): Promise<void> {
    if (this.dead) return;
    await new Promise<void>((resolve) => this.send({ kind: 'shutdown', id: this.nextId++ }, () => resolve()));
    await this.worker.terminate();
  }

  async forceFlush(): Promise<void> {
    // Each batch is answered only after its export settled: nothing is held here.
  }

  private send(message: ToExporter, settle: (ok: boolean) => void): void {
    this.pending.set(message.id, settle);
    this.worker.postMessage(message);
  }
}
