import { afterAll, beforeAll } from 'vitest';
import { startTracing, type Span, type Tracing, type TracingOptions } from './tracing.js';

/**
 * Tracing started once for this test file's process (a process starts it once), with
 * `propagation`, exporting nowhere (an unused port), and shut down after the file. Returns the
 * started tracing, once `beforeAll` has run.
 */
export function tracingForFile(service: string, propagation: TracingOptions['propagation']): () => Tracing {
  let tracing: Tracing | undefined;
  beforeAll(async () => {
    process.env.OTEL_EXPORTER_OTLP_ENDPOINT = 'http://127.0.0.1:9';
    tracing = await startTracing(service, { warn: () => undefined, error: () => undefined }, { propagation });
  });
  afterAll(async () => {
    await tracing?.shutdown();
    delete process.env.OTEL_EXPORTER_OTLP_ENDPOINT;
  });
  return () => {
    if (!tracing) throw new Error('tracing is started in beforeAll');
    return tracing;
  };
}

/** The parent span id a recorded span will be exported with. */
export const parentOf = (span: Span): string | undefined => (span as unknown as { toRecord(): { parent?: { spanId: string } } }).toRecord().parent?.spanId;
