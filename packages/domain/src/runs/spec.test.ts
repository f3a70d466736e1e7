import { describe, expect, it } from 'vitest';
import { fileMountName } from './spec.js';

const bytes = (s: string) => Buffer.byteLength(s, 'utf8');

describe('fileMountName', () => {
  it('keeps a filename a file system takes as it is', () => {
    expect(fileMountName('people.csv')).toBe('people.csv');
    const ascii = `${'a'.repeat(251)}.txt`;
    expect(fileMountName(ascii)).toBe(ascii);
  });

  it('cuts a filename of more than 255 bytes to fit, at a character boundary, keeping its extension', () => {
    // 200 CJK characters: 600 bytes of UTF-8, well within the 255 characters a filename may have.
    const cjk = `${'報'.repeat(200)}.pdf`;
    const name = fileMountName(cjk);
    expect(bytes(name)).toBeLessThanOrEqual(255);
    expect(name.endsWith('.pdf')).toBe(true);
    expect(name).toBe(`${'報'.repeat(83)}.pdf`);
    // Characters outside the BMP are never split into halves.
    const emoji = '😀'.repeat(100);
    const cut = fileMountName(emoji);
    expect(bytes(cut)).toBeLessThanOrEqual(255);
    expect(cut).toBe('😀'.repeat(63));
    // A long "extension" is part of the stem.
    const longExt = `a.${'é'.repeat(200)}`;
    expect(bytes(fileMountName(longExt))).toBeLessThanOrEqual(255);
    expect(fileMountName(longExt).startsWith('a.')).toBe(true);
  });
});
