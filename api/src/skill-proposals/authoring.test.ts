import { describe, expect, it } from 'vitest';
import { authoringStepId } from './authoring.js';

describe('the authoring model step id', () => {
  const job = { timestamp: 1_760_000_000_000, attemptsMade: 0 };

  it('is the same for a replay of one attempt (charged once) and new for each retry (charged again)', () => {
    const first = authoringStepId('skp_1', job);
    expect(authoringStepId('skp_1', { ...job })).toBe(first);
    const retry = authoringStepId('skp_1', { ...job, attemptsMade: 1 });
    expect(retry).not.toBe(first);
    expect(authoringStepId('skp_1', { ...job, attemptsMade: 2 })).not.toBe(retry);
  });

  it('differs between proposals and between jobs of one proposal', () => {
    expect(authoringStepId('skp_2', job)).not.toBe(authoringStepId('skp_1', job));
    expect(authoringStepId('skp_1', { ...job, timestamp: job.timestamp + 1 })).not.toBe(authoringStepId('skp_1', job));
  });
});
