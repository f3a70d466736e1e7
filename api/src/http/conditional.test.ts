import { describe, expect, it } from 'vitest';
import { ifNoneMatchHits } from './conditional.js';

describe('ifNoneMatchHits', () => {
  const etag = '"abc"';
  it('matches the tag itself, in a list, weak or strong, and *', () => {
    expect(ifNoneMatchHits('"abc"', etag)).toBe(true);
    expect(ifNoneMatchHits('"x", "abc"', etag)).toBe(true);
    expect(ifNoneMatchHits('"x","abc" ,"y"', etag)).toBe(true);
    expect(ifNoneMatchHits('W/"abc"', etag)).toBe(true);
    expect(ifNoneMatchHits('"abc"', 'W/"abc"')).toBe(true);
    expect(ifNoneMatchHits('*', etag)).toBe(true);
  });
  it('matches nothing else', () => {
    expect(ifNoneMatchHits(undefined, etag)).toBe(false);
    expect(ifNoneMatchHits('', etag)).toBe(false);
    expect(ifNoneMatchHits('"abcd"', etag)).toBe(false);
    expect(ifNoneMatchHits('abc', etag)).toBe(false);
    expect(ifNoneMatchHits('"x", "y"', etag)).toBe(false);
  });
});
