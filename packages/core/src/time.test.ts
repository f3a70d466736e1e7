import { describe, expect, it } from 'vitest';
import { backoffDelay } from './time.js';

describe('backoffDelay (full jitter)', () => {
  it('spans the whole window, from 0 up to the capped exponential', () => {
    expect(backoffDelay(0, 1_000, 64_000, () => 0)).toBe(0);
    expect(backoffDelay(3, 1_000, 64_000, () => 0)).toBe(0);
    expect(backoffDelay(3, 1_000, 64_000, () => 0.5)).toBe(4_000);
    expect(backoffDelay(3, 1_000, 64_000, () => 0.999_999)).toBe(7_999);
  });

  it('caps the window', () => {
    expect(backoffDelay(20, 1_000, 64_000, () => 0.5)).toBe(32_000);
    expect(backoffDelay(20, 1_000, 64_000, () => 0.999_999)).toBe(63_999);
  });

  it('treats a negative attempt as the first', () => {
    expect(backoffDelay(-1, 1_000, 64_000, () => 0.5)).toBe(500);
  });

  it('with real randomness, delays fall below the window and cover its lower half', () => {
    const delays = Array.from({ length: 2_000 }, () => backoffDelay(4, 1_000, 64_000));
    expect(delays.every((d) => Number.isInteger(d) && d >= 0 && d < 16_000)).toBe(true);
    // Equal jitter never goes below half the window; full jitter does, about half the time.
    expect(delays.filter((d) => d < 8_000).length).toBeGreaterThan(800);
  });
});
