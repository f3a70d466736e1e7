import { describe, expect, it } from 'vitest';
import { context, inSpan, ROOT_CONTEXT, startSpan, trace } from './tracing.js';
import { parentOf, tracingForFile } from './tracing.test-support.js';

// One tracing start per process: this file's process propagates explicitly (the API's, the
// gateway's and the scheduler's way); tracing-async.test.ts checks the other way.
const tracing = tracingForFile('explicit-test', 'explicit');

describe('explicit trace context propagation', () => {
  it('keeps no active context: a context entered is not seen inside, before or after an await', async () => {
    expect(tracing().enabled).toBe(true);
    const { span, context: ctx } = startSpan('outer', {});
    const seen = await context.with(ctx, async () => {
      const now = context.active();
      await new Promise((r) => setTimeout(r, 1));
      return [now, context.active()];
    });
    expect(seen).toEqual([ROOT_CONTEXT, ROOT_CONTEXT]);
    span.end();
  });

  it('parents a span on the context handed to it, across awaits', async () => {
    let childParent: string | undefined;
    let outerId = '';
    await inSpan('outer', {}, async (outer, ctx) => {
      outerId = outer.spanContext().spanId;
      expect(trace.getSpan(ctx)).toBe(outer);
      await new Promise((r) => setTimeout(r, 1));
      await inSpan('inner', { parent: ctx }, async (inner) => {
        await new Promise((r) => setTimeout(r, 1));
        inner.end();
        childParent = parentOf(inner);
      });
    });
    expect(childParent).toBe(outerId);
  });

  it('starts a root span when no parent is handed to it', async () => {
    await inSpan('outer', {}, async () => {
      await inSpan('orphan', {}, async (orphan) => {
        orphan.end();
        expect(parentOf(orphan)).toBeUndefined();
      });
    });
  });
});
