import { describe, expect, it } from 'vitest';
import { context, inSpan, trace } from './tracing.js';
import { parentOf, tracingForFile } from './tracing.test-support.js';

// One tracing start per process: this file's process keeps the active context in an async-local
// store (the runner daemon's way); tracing-explicit.test.ts checks the other way.
tracingForFile('async-test', 'async');

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
