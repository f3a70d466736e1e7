import { totalmem } from 'node:os';
import { describe, expect, it } from 'vitest';
import * as si from 'systeminformation';
import { diskFreeMib, memoryAvailableMib } from './capabilities.js';

const MIB = 2 ** 20;

/** `theirs` read between two of our reads lies within what ours read then (other writers move both). */
function between(before: number, theirs: number, after: number, slack: number): void {
  expect(theirs).toBeGreaterThanOrEqual(Math.min(before, after) - slack);
  expect(theirs).toBeLessThanOrEqual(Math.max(before, after) + slack);
}

describe('host facts', () => {
  it('free disk from one statfs agrees with df for the filesystem that holds the path; an absent path reads its nearest ancestor', async () => {
    const before = (await diskFreeMib('/')) as number;
    const root = (await si.fsSize()).find((f) => f.mount === '/');
    const after = (await diskFreeMib('/no/such/directory/here')) as number;
    expect(root).toBeDefined();
    expect(before).toBeGreaterThan(0);
    between(before, Math.floor(root!.available / MIB), after, 64);
  });

  it('available memory is the kernel figure systeminformation reports', async () => {
    const before = await memoryAvailableMib();
    const theirs = Math.floor((await si.mem()).available / MIB);
    const after = await memoryAvailableMib();
    expect(before).toBeGreaterThan(0);
    expect(before).toBeLessThanOrEqual(Math.floor(totalmem() / MIB));
    between(before, theirs, after, 64);
  });
});
