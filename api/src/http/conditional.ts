/**
 * Whether a conditional GET's `If-None-Match` (RFC 9110 13.1.2) matches the representation's
 * `etag`: the header is `*` or a comma-separated list of entity tags, compared weakly (a `W/`
 * prefix on either side is ignored). An absent or empty header matches nothing.
 */
export function ifNoneMatchHits(header: string | undefined, etag: string): boolean {
  if (!header) return false;
  const strong = etag.replace(/^W\//, '');
  return header.split(',').some((raw) => {
    const tag = raw.trim();
    return tag === '*' || tag.replace(/^W\//, '') === strong;
  });
}
