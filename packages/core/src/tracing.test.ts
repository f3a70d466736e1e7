import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { batchDefaults, otlpProtocol, tracingRequested } from './tracing.js';

/** The OTEL_* variables these tests read: cleared before each, as they were after each. */
const READ_HERE = [
  'OTEL_SDK_DISABLED', 'OTEL_TRACES_EXPORTER', 'OTEL_EXPORTER_OTLP_ENDPOINT', 'OTEL_EXPORTER_OTLP_TRACES_ENDPOINT',
  'OTEL_EXPORTER_OTLP_PROTOCOL', 'OTEL_EXPORTER_OTLP_TRACES_PROTOCOL',
  'OTEL_BSP_SCHEDULE_DELAY', 'OTEL_BSP_MAX_QUEUE_SIZE', 'OTEL_BSP_MAX_EXPORT_BATCH_SIZE',
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

  it('batches with the platform defaults where OTEL_BSP_* is unset, and leaves what is set to the SDK', () => {
    expect(batchDefaults()).toEqual({ scheduledDelayMillis: 1000, maxQueueSize: 4096 });
    process.env.OTEL_BSP_SCHEDULE_DELAY = '0';
    process.env.OTEL_BSP_MAX_QUEUE_SIZE = '100';
    expect(batchDefaults()).toEqual({});
  });
});
