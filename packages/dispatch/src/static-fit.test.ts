import { describe, expect, it } from 'vitest';
import type { RunnerCapabilities, RunRequirements } from '@agentplane/lease';
import { StaticFit } from './static-fit.js';

const caps = (tiers: string[]): RunnerCapabilities => ({
  available_slots: 4,
  providers: [{ id: 'docker', drivers: ['docker'], tiers, network_modes: ['none'], maximum_resources: { memory_mib: 4096 } }],
});
const req = (tier: string, memory = 512): RunRequirements => ({
  driver: 'docker', tier, network_mode: 'none', resources: { cpu_millis: 1000, memory_mib: memory, disk_mib: 1024, max_duration_seconds: 600 },
});

describe('StaticFit', () => {
  it('answers as the matcher does, per requirements', () => {
    const fit = new StaticFit();
    const c = caps(['container']);
    for (const [r, want] of [[req('container'), true], [req('gvisor'), false], [req('container', 8192), false]] as const) {
      expect(fit.fits(c, r, StaticFit.key(r))).toBe(want);
      expect(fit.fits(c, r, StaticFit.key(r))).toBe(want); // kept
    }
  });

  it('asks again for a runner whose presence was read anew (a new capabilities object)', () => {
    const fit = new StaticFit();
    const r = req('gvisor');
    const key = StaticFit.key(r);
    expect(fit.fits(caps(['container']), r, key)).toBe(false);
    // The same runner, now reporting gVisor: its new presence is a new object.
    expect(fit.fits(caps(['container', 'gvisor']), r, key)).toBe(true);
  });
});
