import { describe, expect, it } from 'vitest';
import { secondsToReset } from './budget.js';
import { scrubSecret } from './gateway-service.js';

describe('budget reset boundaries', () => {
  it('counts seconds to the next UTC day and month, at least 1', () => {
    expect(secondsToReset('day', new Date('2026-03-10T23:59:30Z'))).toBe(30);
    expect(secondsToReset('month', new Date('2026-12-31T23:00:00Z'))).toBe(3600);
    expect(secondsToReset('day', new Date('2026-03-10T23:59:59.999Z'))).toBe(1);
  });
});

describe('secret scrubbing', () => {
  it('removes the secret and masked echoes of its prefix or suffix', () => {
    const secret = 'sk-proj-ABCDEFGHIJKLMNOPQRSTUVWXYZ012345';
    expect(scrubSecret(`bad key ${secret}!`, secret)).toBe('bad key [redacted]!');
    expect(scrubSecret('Incorrect API key provided: sk-proj-ABCD********************2345', secret)).not.toContain('sk-proj-ABCD');
    expect(scrubSecret('nothing here', secret)).toBe('nothing here');
    expect(scrubSecret('x', null)).toBe('x');
  });
});
