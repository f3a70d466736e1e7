import { describe, expect, it } from 'vitest';
import { newPairingCode, normalizePairingCode } from '@agentplane/domain';

describe('pairing codes', () => {
  it('are four groups of four Crockford base32 characters', () => {
    for (let i = 0; i < 100; i++) expect(newPairingCode()).toMatch(/^[0-9A-HJKMNP-TV-Z]{4}(-[0-9A-HJKMNP-TV-Z]{4}){3}$/);
  });
  it('normalise case, separators and look-alikes', () => {
    const code = newPairingCode();
    expect(normalizePairingCode(code.toLowerCase().replace(/-/g, ' '))).toBe(code.replace(/-/g, ''));
    expect(normalizePairingCode('OOOO-IIII-LLLL-0000')).toBe('0000111111110000');
    expect(normalizePairingCode('too-short')).toBeNull();
    expect(normalizePairingCode('UUUU-UUUU-UUUU-UUUU')).toBeNull();
  });
});
