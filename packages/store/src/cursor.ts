import { ApiError } from '@agentplane/core';

/** Opaque list cursor `c1_<hex>` over a (score, member) keyset position. */
export interface KeysetPosition {
  score: number;
  member: string;
}

export function encodeCursor(pos: KeysetPosition): string {
  return `c1_${Buffer.from(`${pos.score}:${pos.member}`, 'utf8').toString('hex')}`;
}

export function decodeCursor(cursor: string): KeysetPosition {
  const m = /^c1_([0-9a-f]+)$/.exec(cursor);
  if (m?.[1] && m[1].length % 2 === 0) {
    const text = Buffer.from(m[1], 'hex').toString('utf8');
    const sep = text.indexOf(':');
    const score = Number(text.slice(0, sep));
    const member = text.slice(sep + 1);
    if (sep > 0 && Number.isFinite(score) && member.length > 0) return { score, member };
  }
  throw new ApiError('validation.malformed', 'query.page: not a cursor issued by this list');
}
