import { createMetrics, Gauge } from '@agentplane/core';
import { DispatchMetrics } from '@agentplane/dispatch';
import type { RunQueues } from '@agentplane/lease';

const STATES = ['wait', 'prioritized', 'delayed', 'active'] as const;

/**
 * The placements' metrics (`DispatchMetrics`), and the backlog, so operators can autoscale pools. The `pool` label is bounded by
 * the runner pools this scheduler serves (operator-created resources, not request input);
 * `cause` and `state` are closed sets.
 */
export class SchedulerMetrics extends DispatchMetrics {
  private readonly counts = new Map<string, Record<string, number>>();

  constructor(dispatched: () => number = () => 0) {
    super(createMetrics());
    const counts = this.counts;
    new Gauge({
      name: 'agentplane_scheduler_pools_dispatched', help: 'Runner pools this scheduler dispatches now (idle pools are let go: POOL_IDLE_MS)',
      registers: [this.registry],
      collect() {
        this.set(dispatched());
      },
    });
    new Gauge({
      name: 'agentplane_run_queue_depth', help: 'Runs in a pool queue, by pool and state (wait, prioritized, delayed, active)', labelNames: ['pool', 'state'] as const,
      registers: [this.registry],
      collect() {
        // Pools no longer dispatched drop out of the gauge.
        this.reset();
        for (const [pool, c] of counts) for (const state of STATES) this.set({ pool, state }, c[state] ?? 0);
      },
    });
  }

  /** Refresh queue depths (wait, prioritized, delayed, active) for the pools this process serves. */
  async refresh(queues: RunQueues, pools: readonly string[]): Promise<void> {
    for (const pool of pools) this.counts.set(pool, await queues.depth(pool));
  }

  /** A pool's job counts at the last refresh (every state `RunQueues.depth` reads). */
  depthOf(pool: string): Readonly<Record<string, number>> | undefined {
    return this.counts.get(pool);
  }

  /** A pool no longer dispatched here: its depths leave the gauge. */
  forget(pool: string): void {
    this.counts.delete(pool);
  }
}
