import { describe, expect, it } from 'vitest';
import { ApiError } from '@agentplane/core';
import { MEMORY_LIMITS } from './model.js';
import { cursorBinding, decodeListingCursor, encodeListingCursor, MAX_CURSOR_CHARS, pathDigest } from './store.js';

/**
 * Document listing cursors are bounded by construction: whatever path a page ends on (up to the
 * path limit, up to three UTF-8 bytes a code unit), its cursor fits the cursor schema, and it
 * decodes back to that path or to the digest that names the path's history.
 */
const binding = cursorBinding('');
const what = 'listing (path_prefix)';

describe('document listing cursors', () => {
  it('fit the cursor schema for every path the limits allow, and name the path or its digest', () => {
    const paths = [
      'a.md',
      'x'.repeat(200),
      'x'.repeat(240),
      'x'.repeat(MEMORY_LIMITS.maxPathChars),
      '\u8a9e'.repeat(MEMORY_LIMITS.maxPathChars),
      '\u{1F600}'.repeat(MEMORY_LIMITS.maxPathChars / 2),
    ];
    for (const path of paths) {
      const cursor = encodeListingCursor(binding, path);
      expect(cursor).toMatch(/^c1_[0-9a-z]+$/);
      expect(cursor.length).toBeLessThanOrEqual(MAX_CURSOR_CHARS);
      const at = decodeListingCursor(cursor, 'query.page', binding, what);
      expect(at).toEqual('path' in at ? { path } : { digest: pathDigest(path) });
    }
    // Short paths stay in the cursor; the longest are named by their digest.
    expect(decodeListingCursor(encodeListingCursor(binding, 'a.md'), 'query.page', binding, what)).toEqual({ path: 'a.md' });
    expect('digest' in decodeListingCursor(encodeListingCursor(binding, 'x'.repeat(240)), 'query.page', binding, what)).toBe(true);
  });

  it('refuses another listing\'s cursor and a malformed digest with a typed 400', () => {
    const long = encodeListingCursor(binding, 'x'.repeat(MEMORY_LIMITS.maxPathChars));
    const forged = (text: string) => `c1_${Buffer.from(text, 'utf8').toString('hex')}`;
    for (const [cursor, b] of [
      [long, cursorBinding('other/')],
      [forged(`path_sha:${binding}:xyz`), binding],
      [forged(`path_sha:${binding}:${'0'.repeat(31)}`), binding],
      [forged(`path_sha:${binding}:${'A'.repeat(32)}`), binding],
      [forged('path_sha:'), binding],
      [long.slice(0, -1), binding],
    ] as const) {
      let err: unknown;
      try {
        decodeListingCursor(cursor, 'query.page', b, what);
      } catch (e) {
        err = e;
      }
      expect(err, cursor).toBeInstanceOf(ApiError);
      expect((err as ApiError).type).toBe('validation.malformed');
    }
  });
});
