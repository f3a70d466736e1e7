import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import * as sdk from '@opentelemetry/sdk-trace-node';
import { trace, INVALID_SPAN_CONTEXT, TraceFlags } from '@opentelemetry/api';
import { batchSettings, otlpProtocol, samplerFromEnv, spanTraceId, startSpanLazily, tracingRequested } from './tracing.js';

/** The OTEL_* variables these tests read: cleared before each, as they were after each. */
const READ_HERE = [
  'OTEL_SDK_DISABLED', 'OTEL_TRACES_EXPORTER', 'OTEL_EXPORTER_OTLP_ENDPOINT', 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT',
  'OTEL_EXPORTER_OTLP_PROTOCOL', 'OTEL_EXPORTER_OTLP_TRACES_PROTOCOL',
  'OTEL_BSP_SCHEDULE_DELAY', 'OTEL_BSP_MAX_QUEUE_SIZE', 'OTEL_BSP_MAX_EXPORT_BATCH_SIZE',
  'OTEL_TRACES_SAMPLER', 'OTEL_TRACES_SAMPLER_ARG',
];
const saved = new Map<string, string | undefined>();
beforeEach(() => {
  for (const name of READ_HERE) {
    saved.set(name, process.env[name]);
    delete process.env[name];
  }
});
afterEach(() => {
  for (const [name, value] of saved) {
    if (value === undefined) delete process.env[name];
    else process.env[name] = value;
  }
});

describe('tracing configuration from OTEL_*', () => {
  it('is off unless OTLP export is asked for, and off when disabled', () => {
    expect(tracingRequested()).toBe(false);
    process.env.OTEL_EXPORTER_OTLP_ENDPOINT = 'http://127.0.0.1:4318';
    expect(tracingRequested()).toBe(true);
    process.env.OTEL_TRACES_EXPORTER = 'none';
    expect(tracingRequested()).toBe(false);
    process.env.OTEL_TRACES_EXPORTER = 'otlp';
    process.env.OTEL_SDK_DISABLED = 'true';
    expect(tracingRequested()).toBe(false);
  });

  it('encodes as protobuf unless http/json is asked for (the traces variable first)', () => {
    expect(otlpProtocol()).toBe('http/protobuf');
    process.env.OTEL_EXPORTER_OTLP_PROTOCOL = 'http/json';
    expect(otlpProtocol()).toBe('http/json');
    process.env.OTEL_EXPORTER_OTLP_TRACES_PROTOCOL = 'grpc';
    expect(otlpProtocol()).toBe('http/protobuf');
  });

  it('batches with the platform defaults where OTEL_BSP_* is unset, and as set where it is', () => {
    expect(batchSettings()).toEqual({ scheduledDelayMillis: 5000, maxQueueSize: 8192, maxExportBatchSize: 2048 });
    process.env.OTEL_BSP_SCHEDULE_DELAY = '0';
    process.env.OTEL_BSP_MAX_QUEUE_SIZE = '100';
    // A queue smaller than the platform's batch bounds the batch (the SDK wants batch ≤ queue).
    expect(batchSettings()).toEqual({ scheduledDelayMillis: 0, maxQueueSize: 100, maxExportBatchSize: 100 });
    process.env.OTEL_BSP_MAX_EXPORT_BATCH_SIZE = '50';
    expect(batchSettings()).toEqual({ scheduledDelayMillis: 0, maxQueueSize: 100, maxExportBatchSize: 50 });
    // What is not a number is as if unset.
    process.env.OTEL_BSP_MAX_QUEUE_SIZE = 'many';
    expect(batchSettings()).toEqual({ scheduledDelayMillis: 0, maxQueueSize: 8192, maxExportBatchSize: 50 });
  });
});

describe('the sampler from OTEL_TRACES_SAMPLER', () => {
  const names = (): string => samplerFromEnv(sdk).toString();

  it('is parent based, always on, by default and for a name it does not know (as the SDK)', () => {
    expect(names()).toBe(new sdk.ParentBasedSampler({ root: new sdk.AlwaysOnSampler() }).toString());
    process.env.OTEL_TRACES_SAMPLER = 'sometimes';
    expect(names()).toBe(new sdk.ParentBasedSampler({ root: new sdk.AlwaysOnSampler() }).toString());
  });

  it('takes each name the SDK documents, with its ratio when it has one', () => {
    process.env.OTEL_TRACES_SAMPLER = 'always_off';
    expect(names()).toBe('AlwaysOffSampler');
    process.env.OTEL_TRACES_SAMPLER = 'always_on';
    expect(names()).toBe('AlwaysOnSampler');
    process.env.OTEL_TRACES_SAMPLER = 'parentbased_always_off';
    expect(names()).toBe(new sdk.ParentBasedSampler({ root: new sdk.AlwaysOffSampler() }).toString());
    process.env.OTEL_TRACES_SAMPLER = 'traceidratio';
    process.env.OTEL_TRACES_SAMPLER_ARG = '0.25';
    expect(names()).toBe('TraceIdRatioBased{0.25}');
    process.env.OTEL_TRACES_SAMPLER = 'parentbased_traceidratio';
    expect(names()).toBe(new sdk.ParentBasedSampler({ root: new sdk.TraceIdRatioBasedSampler(0.25) }).toString());
  });

  it('takes a ratio of 1 when the argument is missing or outside [0, 1]', () => {
    process.env.OTEL_TRACES_SAMPLER = 'traceidratio';
    expect(names()).toBe('TraceIdRatioBased{1}');
    process.env.OTEL_TRACES_SAMPLER_ARG = '1.5';
    expect(names()).toBe('TraceIdRatioBased{1}');
    process.env.OTEL_TRACES_SAMPLER_ARG = 'half';
    expect(names()).toBe('TraceIdRatioBased{1}');
  });
});

describe('a span\'s trace id (spanTraceId)', () => {
  it('is the id of a span with valid ids, and none for the invalid span of suppressed or absent tracing', () => {
    const valid = trace.wrapSpanContext({ traceId: '0af7651916cd43dd8448eb211c80319c', spanId: 'b7ad6b7169203331', traceFlags: TraceFlags.NONE });
    expect(spanTraceId(valid)).toBe('0af7651916cd43dd8448eb211c80319c');
    expect(spanTraceId(trace.wrapSpanContext(INVALID_SPAN_CONTEXT))).toBeUndefined();
  });
});

describe('a span whose context is made when asked for (startSpanLazily)', () => {
  it('makes the context once, with the span active in it', () => {
    const { span, context } = startSpanLazily('lazy', {});
    const first = context();
    expect(context()).toBe(first);
    expect(trace.getSpan(first)).toBe(span);
    span.end();
  });
});
