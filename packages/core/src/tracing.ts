/**
 * OpenTelemetry tracing for every process: off by default, on when the standard OTEL_* variables
 * ask for OTLP (`OTEL_TRACES_EXPORTER=otlp`, or an `OTEL_EXPORTER_OTLP_ENDPOINT` /
 * `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`), exported over OTLP/HTTP (protobuf unless
 * `OTEL_EXPORTER_OTLP_PROTOCOL=http/json`). Sampling, batching and the
 * exporter's endpoint, headers and timeout come from the SDK's own OTEL_* variables. With
 * OTLP/protobuf each batch is encoded in one pass by the platform's encoder (tracing-export.ts).
 * Spans are recorded on the event loop as plain records and handed on in batches (tracing-deferred.ts):
 * with OTLP/protobuf encoded there a batch at a time, batched as request bytes by the SDK batch
 * processor's rules and sent from the same loop with the SDK's OTLP/HTTP transport
 * (tracing-export.ts), every 5 s or once a batch is full.
 *
 * Trace context crosses processes as W3C `traceparent`/`tracestate`: HTTP headers into the API,
 * the Run's queue job (`RunJobData.trace`), and the runner protocol's frame envelope.
 *
 * Inside a process it travels one of two ways, chosen by the process at start
 * (`TracingOptions.propagation`). `explicit` (the API, the gateway and the scheduler): no store
 * at all, so a span's parent is handed to it as a value (`parent`), from the request's SERVER
 * span, the runner frame's envelope or the placement's span down to the appends, the job, the
 * offer and the model call made for them (on Node 20 an AsyncLocalStorage, once entered, hooks
 * every promise the process makes, which cost the API 10-16% of its CPU per request and per
 * Run). `async` (the runner daemon, whose spans nest deep in its own loops): OpenTelemetry's
 * active context, kept in an async-local store. Code shared by both kinds of process passes
 * parents explicitly where it has them; without one, a span's parent is the active context (the
 * root, in an `explicit` process).
 *
 * Attributes name things (ids, models, counts, statuses), never content: no message text, tool
 * input or output, prompt, command line or secret is put on a span.
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import {
  context, diag, DiagLogLevel, INVALID_SPAN_CONTEXT, propagation, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace,
  type Attributes, type Context, type ContextManager, type Span, type Tracer,
} from '@opentelemetry/api';
import type { Logger } from './logger.js';
import { DeferredTracer, type EncodedSink, type SpanSink } from './tracing-deferred.js';
import type { BatchSettings } from './tracing-export.js';

export { context, ROOT_CONTEXT, SpanKind, SpanStatusCode, trace, type Attributes, type Context, type Span };

/** W3C trace context as carried in a job or a frame. */
export interface TraceCarrier {
  traceparent?: string;
  tracestate?: string;
}

/** How a process hands the trace context on (module comment). */
export interface TracingOptions {
  /** `async` (default): an async-local active context. `explicit`: parents are passed as values. */
  propagation?: 'async' | 'explicit';
}

/** What `startTracing` returns: whether spans are exported, and a flush for shutdown. */
export interface Tracing {
  enabled: boolean;
  shutdown(): Promise<void>;
}

const env = (name: string): string | undefined => {
  const v = process.env[name];
  return v === undefined || v.trim() === '' ? undefined : v.trim();
};

/** Whether the OTEL_* environment asks for trace export (off unless it does). */
export function tracingRequested(): boolean {
  if (env('OTEL_SDK_DISABLED')?.toLowerCase() === 'true') return false;
  const exporters = env('OTEL_TRACES_EXPORTER')?.toLowerCase().split(',').map((s) => s.trim());
  if (exporters?.includes('none')) return false;
  return exporters?.includes('otlp') === true || env('OTEL_EXPORTER_OTLP_ENDPOINT') !== undefined || env('OTEL_EXPORTER_OTLP_TRACES_ENDPOINT') !== undefined;
}

/**
 * The OTLP/HTTP encoding: `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, else `OTEL_EXPORTER_OTLP_PROTOCOL`,
 * else `http/protobuf` (the OTLP default). `grpc` is not served: it is exported as http/protobuf.
 */
export function otlpProtocol(): 'http/protobuf' | 'http/json' {
  const p = (env('OTEL_EXPORTER_OTLP_TRACES_PROTOCOL') ?? env('OTEL_EXPORTER_OTLP_PROTOCOL'))?.toLowerCase();
  return p === 'http/json' ? 'http/json' : 'http/protobuf';
}

/**
 * The batching settings as the SDK's batch processor resolves them (`OTEL_BSP_SCHEDULE_DELAY`,
 * default 5,000 ms; `OTEL_BSP_MAX_QUEUE_SIZE` and `OTEL_BSP_MAX_EXPORT_BATCH_SIZE`; a batch no
 * larger than the queue), with the platform's defaults where those two are unset. Batches of up
 * to 2,048 spans, four times the SDK's 512: an export's cost is mostly per request (its HTTP
 * round trip and socket wake-ups), not per byte, so a busy API's exporter spent about a third
 * less per span (measured under `bench:observability`'s load: 4.5 → 2.9 µs per traced request;
 * 4,096 saved nothing more). Sent every 5 s (the SDK's default), or as soon as a batch is full,
 * and up to 8,192 waiting (bursts of a busy API are not dropped while an export is in flight): an
 * export costs its process 1–3 ms of CPU on a small VM whatever its size, a cost per second that a
 * quiet process pays five times less. A smaller `OTEL_BSP_MAX_QUEUE_SIZE` bounds the batch too.
 * Both encodings batch by these: the encoded spans' own batching (tracing-export.ts) and the SDK's
 * batch processor under OTLP/JSON, given them resolved.
 */
export function batchSettings(): BatchSettings {
  const number = (name: string, fallback: number): number => {
    const v = Number(env(name));
    return env(name) !== undefined && Number.isFinite(v) && v >= 0 ? v : fallback;
  };
  const maxQueueSize = Math.max(1, number('OTEL_BSP_MAX_QUEUE_SIZE', 8192));
  const maxExportBatchSize = Math.max(1, Math.min(maxQueueSize, number('OTEL_BSP_MAX_EXPORT_BATCH_SIZE', 2048)));
  return { scheduledDelayMillis: number('OTEL_BSP_SCHEDULE_DELAY', 5000), maxQueueSize, maxExportBatchSize };
}

let active: Tracing | null = null;

/** Where tracing reports its own trouble: a failed export, a span it could not hand on. */
export type TracingLog = Pick<Logger, 'warn' | 'error'>;

/** The same report at most once a minute (an unreachable collector fails every export). */
export const REPORT_EVERY_MS = 60_000;

/**
 * Start tracing for this process (once). `service` is the default `service.name`
 * (`OTEL_SERVICE_NAME` and `OTEL_RESOURCE_ATTRIBUTES` override it). The SDK is loaded only when
 * tracing is on: a process with tracing off pays nothing for it at start.
 */
export async function startTracing(service: string, log?: TracingLog, options: TracingOptions = {}): Promise<Tracing> {
  if (active) return active;
  if (!tracingRequested()) {
    active = { enabled: false, shutdown: async () => undefined };
    return active;
  }
  const [sdk, { PooledIdGenerator }] = await Promise.all([
    import('@opentelemetry/sdk-trace-node'),
    import('./trace-ids.js'),
  ]);
  const reported = new Map<string, number>();
  // Keyed by the message alone: the values beside it (an error's text) may differ each time.
  const report = (level: 'warn' | 'error', message: string, detail: unknown[]): void => {
    const now = Date.now();
    if (now - (reported.get(message) ?? -Infinity) < REPORT_EVERY_MS) return;
    reported.set(message, now);
    log?.[level]({ component: 'tracing' }, withDetail(message, detail));
  };
  // What the OpenTelemetry SDK and API report on this thread (a failed export, a span the tracer
  // could not hand on).
  const quiet = (): void => undefined;
  diag.setLogger({ error: (m, ...args) => report('error', m, args), warn: (m, ...args) => report('warn', m, args), info: quiet, debug: quiet, verbose: quiet }, DiagLogLevel.WARN);
  const name = env('OTEL_SERVICE_NAME') ?? service;
  const exporter = otlpProtocol() === 'http/protobuf' ? await protobufExport(name) : await jsonExporter(name);
  const deferred = new DeferredTracer(samplerFromEnv(sdk), new PooledIdGenerator(), exporter.sink);
  // Registered globally: the W3C trace context propagator, a provider that hands this tracer to
  // anything asking the OpenTelemetry API for one (it makes no span itself), and with `async`
  // propagation the active context in an async-local store (with `explicit`, none: the
  // OpenTelemetry API's no-op manager, whose active context is always the root).
  class PlatformProvider extends sdk.NodeTracerProvider {
    override getTracer(): Tracer {
      return deferred;
    }
  }
  new PlatformProvider().register({ contextManager: options.propagation === 'explicit' ? null : new AsyncContextManager() });
  cachedTracer = deferred;
  active = {
    enabled: true,
    shutdown: () => {
      deferred.flush();
      return exporter.shutdown();
    },
  };
  return active;
}

/** Where the deferred tracer hands its spans, and how they are flushed at shutdown. */
interface Exporter {
  sink: SpanSink | EncodedSink;
  shutdown(): Promise<void>;
}

/** A diagnostic's message with the values the SDK passed beside it (an error's message). */
const withDetail = (message: string, args: unknown[]): string =>
  [message, ...args.map((a) => (a instanceof Error ? a.message : typeof a === 'string' ? a : JSON.stringify(a) ?? String(a)))].join(' ');

/** At most `ms` for `work`, then on (a collector that does not answer must not hold a shutdown). */
const bounded = (work: Promise<unknown>, ms: number): Promise<void> => new Promise<void>((resolve) => {
  const timer = setTimeout(resolve, ms);
  void work.catch(() => undefined).finally(() => {
    clearTimeout(timer);
    resolve();
  });
});

/** OTLP/protobuf: spans encoded on the event loop, batched and sent from it (tracing-export.ts). */
async function protobufExport(service: string): Promise<Exporter> {
  const { encodedExport } = await import('./tracing-export.js');
  const exporter = await encodedExport(service, VERSION, batchSettings());
  return { sink: { encoded: (bytes, ends) => exporter.write(bytes, ends) }, shutdown: () => bounded(exporter.shutdown(), SHUTDOWN_MS) };
}

/**
 * OTLP/JSON: the records made into SDK spans (`SdkReplay`, with the ids they ran with) under a
 * provider of their own with the same sampler, exported by the SDK's OTLP/HTTP JSON exporter.
 */
async function jsonExporter(service: string): Promise<Exporter> {
  const [sdk, { resourceFromAttributes }, { ATTR_SERVICE_NAME, ATTR_SERVICE_VERSION }, { jsonExportProcessor }, { PooledIdGenerator }, { SdkReplay }] = await Promise.all([
    import('@opentelemetry/sdk-trace-node'),
    import('@opentelemetry/resources'),
    import('@opentelemetry/semantic-conventions'),
    import('./tracing-export.js'),
    import('./trace-ids.js'),
    import('./tracing-deferred.js'),
  ]);
  const ids = new PooledIdGenerator();
  const resource = resourceFromAttributes({ [ATTR_SERVICE_NAME]: service, [ATTR_SERVICE_VERSION]: VERSION });
  const processor = await jsonExportProcessor(batchSettings());
  const provider = new sdk.BasicTracerProvider({ resource, idGenerator: ids, sampler: samplerFromEnv(sdk), spanProcessors: [processor] });
  const replay = new SdkReplay(provider.getTracer('agentplane', VERSION), ids);
  return { sink: (records) => replay.write(records), shutdown: () => bounded(provider.shutdown(), SHUTDOWN_MS) };
}

const VERSION = '0.1.0';
/** How long a shutdown waits for the last export. */
const SHUTDOWN_MS = 10_000;

type Sdk = typeof import('@opentelemetry/sdk-trace-node');
type Sampler = import('@opentelemetry/sdk-trace-node').Sampler;

/**
 * The sampler `OTEL_TRACES_SAMPLER` and `OTEL_TRACES_SAMPLER_ARG` name, as the SDK's provider
 * builds it when given none (the same names, default `parentbased_always_on`, ratio 1 when the
 * argument is missing or outside [0, 1]). Built here because the deferred tracer asks it too.
 */
export function samplerFromEnv(sdk: Pick<Sdk, 'AlwaysOnSampler' | 'AlwaysOffSampler' | 'ParentBasedSampler' | 'TraceIdRatioBasedSampler'>): Sampler {
  const arg = Number(env('OTEL_TRACES_SAMPLER_ARG'));
  const ratio = env('OTEL_TRACES_SAMPLER_ARG') !== undefined && Number.isFinite(arg) && arg >= 0 && arg <= 1 ? arg : 1;
  switch (env('OTEL_TRACES_SAMPLER')?.toLowerCase()) {
    case 'always_on': return new sdk.AlwaysOnSampler();
    case 'always_off': return new sdk.AlwaysOffSampler();
    case 'traceidratio': return new sdk.TraceIdRatioBasedSampler(ratio);
    case 'parentbased_always_off': return new sdk.ParentBasedSampler({ root: new sdk.AlwaysOffSampler() });
    case 'parentbased_traceidratio': return new sdk.ParentBasedSampler({ root: new sdk.TraceIdRatioBasedSampler(ratio) });
    default: return new sdk.ParentBasedSampler({ root: new sdk.AlwaysOnSampler() });
  }
}

/** OpenTelemetry's context manager over an async-local store (`async` propagation). */
class AsyncContextManager implements ContextManager {
  private readonly store = new AsyncLocalStorage<Context>();

  active(): Context {
    return this.store.getStore() ?? ROOT_CONTEXT;
  }

  with<A extends unknown[], F extends (...args: A) => ReturnType<F>>(ctx: Context, fn: F, thisArg?: ThisParameterType<F>, ...args: A): ReturnType<F> {
    return this.store.run(ctx, () => fn.apply(thisArg, args));
  }

  bind<T>(ctx: Context, target: T): T {
    if (typeof target !== 'function') return target;
    const fn = target as unknown as (...args: unknown[]) => unknown;
    const manager = this;
    return function bound(this: unknown, ...args: unknown[]) {
      return manager.with(ctx, () => fn.apply(this, args));
    } as unknown as T;
  }

  enable(): this {
    return this;
  }

  disable(): this {
    return this;
  }
}

/** Whether this process exports spans (every tracing call is skipped when it does not). */
export const tracingEnabled = (): boolean => active?.enabled === true;

const NOOP_SPAN: Span = trace.wrapSpanContext(INVALID_SPAN_CONTEXT);

let cachedTracer: Tracer | undefined;

/** The platform's tracer: the deferred tracer once tracing started, else the global (no-op) one. */
export const tracer = (): Tracer => (cachedTracer ??= trace.getTracer('agentplane', VERSION));

/** The W3C context of the active span (empty when tracing is off or nothing is active). */
export function injectTrace(ctx: Context = context.active()): TraceCarrier | undefined {
  if (!tracingEnabled()) return undefined;
  const carrier: Record<string, string> = {};
  propagation.inject(ctx, carrier);
  if (!carrier.traceparent) return undefined;
  return carrier.tracestate ? { traceparent: carrier.traceparent, tracestate: carrier.tracestate } : { traceparent: carrier.traceparent };
}

/** A context whose parent is the carried span (the root context when there is none). */
export function extractTrace(carrier: TraceCarrier | Readonly<Record<string, string | string[] | undefined>> | undefined): Context {
  // No traceparent, nothing to continue (the platform carries no baggage): skip the propagator.
  if (!carrier?.traceparent) return ROOT_CONTEXT;
  return propagation.extract(ROOT_CONTEXT, carrier, {
    keys: (c) => Object.keys(c),
    get: (c, key) => {
      const v = (c as Record<string, string | string[] | undefined>)[key];
      return Array.isArray(v) ? v[0] : v;
    },
  });
}

/** What a span is started with: its parent defaults to the active context. */
export interface SpanStart {
  kind?: SpanKind;
  attributes?: Attributes;
  parent?: Context | undefined;
}

/**
 * Run `fn` in a new span, active while it runs (with `async` propagation) and handed to it with
 * its context (the parent of what `fn` starts, with `explicit` propagation); it ends when `fn`
 * settles, with an error status (exception type only, never its message) when `fn` throws.
 */
export function inSpan<T>(name: string, options: SpanStart, fn: (span: Span, ctx: Context) => Promise<T>): Promise<T> {
  // Tracing off: a plain call, no extra promise.
  return tracingEnabled() ? recordSpan(name, options, fn) : fn(NOOP_SPAN, ROOT_CONTEXT);
}

function recordSpan<T>(name: string, options: SpanStart, fn: (span: Span, ctx: Context) => Promise<T>): Promise<T> {
  const { span, context: ctx } = startSpan(name, options);
  // Plain callbacks rather than async wrappers: no extra promises per span on a hot path.
  return context.with(ctx, () => {
    let running: Promise<T>;
    try {
      running = fn(span, ctx);
    } catch (err) {
      failSpan(span, err);
      span.end();
      return Promise.reject(err as Error);
    }
    return running.then(
      (value) => {
        span.end();
        return value;
      },
      (err: unknown) => {
        failSpan(span, err);
        span.end();
        throw err;
      },
    );
  });
}

/** A span started under `options.parent` (default: the active context), and that parent. */
function startUnder(name: string, options: SpanStart): { span: Span; parent: Context } {
  const parent = options.parent ?? context.active();
  const kind = options.kind ?? SpanKind.INTERNAL;
  return { span: tracer().startSpan(name, options.attributes ? { kind, attributes: options.attributes } : { kind }, parent), parent };
}

/**
 * Start a span (the caller ends it) and the context it is the active span of: the parent to
 * hand to the work done inside it.
 */
export function startSpan(name: string, options: SpanStart): { span: Span; context: Context } {
  const { span, parent } = startUnder(name, options);
  return { span, context: trace.setSpan(parent, span) };
}

/**
 * `startSpan` whose context is made when first asked for (then kept): for a span most of whose
 * work starts nothing under it (a request served from the read cache needs no context).
 */
export function startSpanLazily(name: string, options: SpanStart): { span: Span; context: () => Context } {
  const { span, parent } = startUnder(name, options);
  let made: Context | undefined;
  return { span, context: () => (made ??= trace.setSpan(parent, span)) };
}

/**
 * The trace id of a span the platform's tracer made, or undefined for an invalid one (a span
 * started under suppressed tracing, or any span with tracing off). The tracer makes only valid
 * ids or the all-zero ones, so one comparison replaces the API's check (two regular expressions).
 */
export function spanTraceId(span: Span): string | undefined {
  const { traceId } = span.spanContext();
  return traceId === INVALID_SPAN_CONTEXT.traceId ? undefined : traceId;
}

/** Mark a span failed: the error's class, not its message (which may quote content). */
export function failSpan(span: Span, err: unknown): void {
  span.setStatus({ code: SpanStatusCode.ERROR });
  span.setAttribute('error.type', err instanceof Error ? (('type' in err && typeof err.type === 'string' ? err.type : undefined) ?? err.name) : 'unknown');
}

/**
 * Semantic-convention attribute names used across processes (HTTP ones come from
 * @opentelemetry/semantic-conventions; GenAI and messaging are still incubating there, so their
 * names are spelled here as the conventions give them).
 */
export const ATTR = {
  genAiOperationName: 'gen_ai.operation.name',
  genAiProviderName: 'gen_ai.provider.name',
  genAiRequestModel: 'gen_ai.request.model',
  genAiResponseModel: 'gen_ai.response.model',
  genAiUsageInputTokens: 'gen_ai.usage.input_tokens',
  genAiUsageOutputTokens: 'gen_ai.usage.output_tokens',
  genAiResponseFinishReasons: 'gen_ai.response.finish_reasons',
  genAiAgentName: 'gen_ai.agent.name',
  messagingSystem: 'messaging.system',
  messagingOperationType: 'messaging.operation.type',
  messagingOperationName: 'messaging.operation.name',
  messagingDestinationName: 'messaging.destination.name',
  messagingMessageId: 'messaging.message.id',
  dbSystemName: 'db.system.name',
  dbOperationName: 'db.operation.name',
  processExitCode: 'process.exit.code',
} as const;
