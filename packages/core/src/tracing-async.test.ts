import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { context, inSpan, startTracing, trace, type Span, type Tracing } from './tracing.js';

// One tracing start per process: this file's process keeps the active context in an async-local
// store (the scheduler's and the runner's way); tracing-explicit.test.ts checks the other way.
let tracing: Tracing;
beforeAll(async () => {
  process.env.OTEL_EXPORTER_OTLP_ENDPOINT = 'http://127.0.0.1:9';
  tracing = await startTracing('async-test', { warn: () => undefined, error: () => undefined });
});
afterAll(async () => {
  await tracing.shutdown();
  delete process.env.OTEL_EXPORTER_OTLP_ENDPOINT;
});

/** The parent span id a recorded span will be exported with. */
const parentOf = (span: Span): string | undefined => (span as unknown as { toRecord(): { parent?: { spanId: string } } }).toRecord().parent?.spanId;

describe('async-local trace context propagation', () => {
  it('makes a span active for what runs inside it, across awaits, and not after', async () => {
    let childParent: string | undefined;
    let outerId = '';
    await inSpan('outer', {}, async (outer) => {
      outerId = outer.spanContext().spanId;
      await new Promise((r) => setTimeout(r, 1));
      expect(trace.getSpan(context.active())).toBe(outer);
      await inSpan('inner', {}, async (inner) => {
        inner.end();
        childParent = parentOf(inner);
      });
    });
    expect(childParent).toBe(outerId);
    expect(trace.getSpan(context.active())).toBeUndefined();
  });
});
