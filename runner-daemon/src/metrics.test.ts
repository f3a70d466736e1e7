import { describe, expect, it } from 'vitest';
import { RunnerMetrics } from './metrics.js';

describe('runner metrics', () => {
  it('collect the Node runtime metrics (and run their event-loop monitor) only when served', async () => {
    const names = async (m: RunnerMetrics) => (await m.registry.getMetricsAsJSON()).map((x) => x.name);
    const served = new RunnerMetrics(() => 2, { served: true });
    const unserved = new RunnerMetrics(() => 2, { served: false });
    expect(await names(served)).toEqual(expect.arrayContaining(['nodejs_eventloop_lag_p99_seconds', 'process_cpu_seconds_total', 'agentplane_runner_leases_total']));
    const off = await names(unserved);
    expect(off.filter((n) => n.startsWith('nodejs_') || n.startsWith('process_'))).toEqual([]);
    // The runner's own measures are there either way.
    expect(off).toEqual(expect.arrayContaining(['agentplane_runner_leases_total', 'agentplane_runner_held_leases', 'agentplane_runner_connected']));
    expect(await unserved.registry.metrics()).toContain('agentplane_runner_held_leases 2');
  });
});
