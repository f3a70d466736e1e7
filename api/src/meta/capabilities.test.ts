import { describe, expect, it } from 'vitest';
import { allOperations } from '../routes.js';
import { CAPABILITY_AREAS } from './operations.js';

describe('capability report', () => {
  it('places every operation group of the table in exactly one area, and names no group the table lacks', () => {
    const groups = new Set(allOperations().map((o) => o.operationId.split('.')[0] ?? ''));
    const placed = CAPABILITY_AREAS.flatMap((a) => a.groups);
    expect(placed.filter((g, i) => placed.indexOf(g) !== i)).toEqual([]);
    expect([...groups].filter((g) => !placed.includes(g)).sort()).toEqual([]);
    expect(placed.filter((g) => !groups.has(g)).sort()).toEqual([]);
  });
});
