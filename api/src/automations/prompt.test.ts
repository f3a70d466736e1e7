import { describe, expect, it } from 'vitest';
import { expandPrompt, MAX_PROMPT_BYTES } from './prompt.js';

const ctx = { event: { a: { b: 'deep', n: 3 } }, firing_id: 'afire_x', automation_id: 'auto_y', source: 'webhook', fired_at: '2026-01-01T00:00:00Z' };

describe('prompt expansion', () => {
  it('expands the event, its members and the firing fields; leaves unknown placeholders', () => {
    expect(expandPrompt('E={{event}} B={{ event.a.b }} N={{event.a.n}} M={{event.none}} F={{firing_id}} {{other}}', ctx))
      .toBe('E={"a":{"b":"deep","n":3}} B=deep N=3 M= F=afire_x {{other}}');
  });
  it('refuses an expansion past 64 KiB', () => {
    expect(() => expandPrompt('{{event}}', { ...ctx, event: 'x'.repeat(MAX_PROMPT_BYTES + 1) })).toThrow(expect.objectContaining({ type: 'validation.malformed' }));
    expect(expandPrompt('{{event}}', { ...ctx, event: 'x'.repeat(MAX_PROMPT_BYTES) })).toHaveLength(MAX_PROMPT_BYTES);
  });
});
