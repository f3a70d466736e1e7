import { describe, expect, it } from 'vitest';
import { snippetOf } from './service.js';

const wellFormed = (s: string) => (s as string & { isWellFormed(): boolean }).isWellFormed();

describe('memory search snippets', () => {
  it('is at most 240 characters around the first matching term', () => {
    const content = `${'a '.repeat(300)}needle ${'b '.repeat(300)}`;
    const s = snippetOf(content, ['NEEDLE']);
    expect(s.length).toBe(240);
    expect(s).toContain('needle');
    expect(snippetOf('short text', ['missing'])).toBe('short text');
    expect(snippetOf(`${'x'.repeat(500)} end`, ['end']).endsWith('end')).toBe(true);
  });

  it('never splits a character outside the Basic Multilingual Plane: a snippet is well-formed text', () => {
    for (let pad = 0; pad < 4; pad++) {
      for (const content of [
        `${'x'.repeat(pad)}${'\u{1F600}'.repeat(200)} needle ${'\u{1F600}'.repeat(200)}`,
        `${'x'.repeat(pad)}${'\u{1F600}'.repeat(400)}`,
        `${'x'.repeat(pad)}${'\u{10FFFF}'.repeat(150)}needle`,
      ]) {
        const s = snippetOf(content, ['needle']);
        expect(wellFormed(s), `pad ${pad}`).toBe(true);
        expect(s.length).toBeLessThanOrEqual(240);
        expect(s.length).toBeGreaterThanOrEqual(238);
        expect(content.includes(s)).toBe(true);
      }
    }
  });

  it('finds the term in text whose lower case is longer than it (a dotted capital I is two code units in lower case)', () => {
    const content = `${'\u0130'.repeat(300)} needle ${'x'.repeat(300)}`;
    const s = snippetOf(content, ['needle']);
    expect(s).toContain('needle');
    expect(s.length).toBe(240);
    expect(snippetOf(`${'\u0130stanbul '.repeat(40)}needle`, ['needle']).endsWith('needle')).toBe(true);
  });
});
