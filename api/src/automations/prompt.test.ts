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
    // The whole payload goes in as JSON: a string payload takes its two quotes.
    expect(expandPrompt('{{event}}', { ...ctx, event: 'x'.repeat(MAX_PROMPT_BYTES - 2) })).toHaveLength(MAX_PROMPT_BYTES);
    expect(() => expandPrompt('{{event}}', { ...ctx, event: 'x'.repeat(MAX_PROMPT_BYTES - 1) })).toThrow(expect.objectContaining({ type: 'validation.malformed' }));
  });
  it('writes the whole payload as JSON whatever it is, and a member that is a string as it is', () => {
    expect(expandPrompt('hello {{event}}', { ...ctx, event: 'disk full' })).toBe('hello "disk full"');
    expect(expandPrompt('{{event}} {{event.s}}', { ...ctx, event: { s: 'as is' } })).toBe('{"s":"as is"} as is');
    expect(expandPrompt('n={{event}}', { ...ctx, event: 7 })).toBe('n=7');
  });
});
