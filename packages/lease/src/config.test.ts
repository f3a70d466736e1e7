import { describe, expect, it } from 'vitest';
import { leaseConfigFrom } from './config.js';

describe('lease settings', () => {
  it('derive their defaults from LEASE_MS and refuse values that would break the lease', () => {
    expect(leaseConfigFrom({ LEASE_MS: '12000' })).toMatchObject({ leaseMs: 12_000, heartbeatMs: 4_000, fenceMarginMs: 1_000 });
    expect(leaseConfigFrom({ LEASE_MS: '12000', FENCE_MARGIN_MS: '3000', LEASE_HEARTBEAT_MS: '6000' })).toMatchObject({ fenceMarginMs: 3_000, heartbeatMs: 6_000 });
    expect(() => leaseConfigFrom({ LEASE_MS: '12000', FENCE_MARGIN_MS: '3001' })).toThrow(/FENCE_MARGIN_MS must be an integer in \[0, 3000\]/);
    expect(() => leaseConfigFrom({ LEASE_MS: '12000', LEASE_HEARTBEAT_MS: '12000' })).toThrow(/LEASE_HEARTBEAT_MS must be an integer in \[100, 6000\]/);
    expect(() => leaseConfigFrom({ LEASE_MS: '1000' })).toThrow(/LEASE_MS/);
  });
});
