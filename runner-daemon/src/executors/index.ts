import type { LeaseExecutor, LeaseHandle } from '../agent.js';

export { noopExecutor } from './noop.js';
export { turnExecutor, type TurnExecutorOptions } from './turn.js';
export { LeaseSink } from './lease-sink.js';

/**
 * The first executor that takes the offer runs it (e.g. the turn executor, then the noop
 * driver). Sandbox hooks go to every executor that keeps sandboxes.
 */
export function firstWilling(...executors: LeaseExecutor[]): LeaseExecutor {
  const pick = (offer: LeaseHandle['offer']) => executors.find((e) => e.refuse(offer) === null);
  return {
    refuse: (offer) => (pick(offer) ? null : (executors[0]?.refuse(offer) ?? 'no executor is installed')),
    run: (handle) => {
      const e = pick(handle.offer);
      if (!e) return Promise.reject(new Error('no executor takes this offer'));
      return e.run(handle);
    },
    sandboxes: () => executors.flatMap((e) => e.sandboxes?.() ?? []),
    releaseSandbox: async (sessionId, reason) => {
      for (const e of executors) await e.releaseSandbox?.(sessionId, reason);
    },
    leaseLost: async (sessionId, lease) => {
      for (const e of executors) await e.leaseLost?.(sessionId, lease);
    },
  };
}
