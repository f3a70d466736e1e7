import { describe, expect, it } from 'vitest';
import { snippetOf } from './service.js';

describe('memory search snippets', () => {
  it('is at most 240 characters around the first matching term', () => {
    const content = `${'a '.repeat(300)}needle ${'b '.repeat(300)}`;
    const s = snippetOf(content, ['NEEDLE']);
    expect(s.length).toBe(240);
    expect(s).toContain('needle');
    expect(snippetOf('short text', ['missing'])).toBe('short text');
    expect(snippetOf(`${'x'.repeat(500)} end`, ['end']).endsWith('end')).toBe(true);
  });
});
