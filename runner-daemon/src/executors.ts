import type { Payload } from '@agentplane/protocol';
import type { LeaseExecutor, LeaseHandle } from './agent.js';

const MAX_NOOP_MS = 3_600_000;

/**
 * The built-in `noop` driver: holds the lease for `spec.duration_ms` (default 0) and completes,
 * or stops early when the lease is canceled. It lets the whole lease path (offer → accept →
 * heartbeats → complete, drain with held work) run before a sandbox driver is installed.
 */
export const noopExecutor: LeaseExecutor = {
  refuse(offer: Payload<'lease.offer'>): string | null {
    const driver = offer.spec.driver;
    if (driver !== 'noop') return `driver '${typeof driver === 'string' ? driver : 'unspecified'}' is not installed on this runner`;
    const d = offer.spec.duration_ms;
    if (d !== undefined && (typeof d !== 'number' || !Number.isInteger(d) || d < 0 || d > MAX_NOOP_MS)) return 'spec.duration_ms must be an integer in [0, 3600000]';
    return null;
  },
  run(handle: LeaseHandle): Promise<Record<string, unknown>> {
    const ms = typeof handle.offer.spec.duration_ms === 'number' ? handle.offer.spec.duration_ms : 0;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => resolve({ driver: 'noop', duration_ms: ms }), ms);
      const onAbort = () => {
        clearTimeout(timer);
        const reason: unknown = handle.signal.reason;
        reject(new Error(`canceled: ${reason instanceof Error ? reason.message : String(reason)}`));
      };
      if (handle.signal.aborted) onAbort();
      else handle.signal.addEventListener('abort', onAbort, { once: true });
    });
  },
};

/** Offers go to the first executor that does not refuse them; refused by all: the first reason. */
export function firstAccepting(...executors: LeaseExecutor[]): LeaseExecutor {
  const chosen = new WeakMap<Payload<'lease.offer'>, LeaseExecutor>();
  return {
    refuse(offer) {
      let first: string | null = null;
      for (const e of executors) {
        const reason = e.refuse(offer);
        if (reason === null) {
          chosen.set(offer, e);
          return null;
        }
        first ??= reason;
      }
      return first ?? 'no executor is installed on this runner';
    },
    run(handle) {
      const e = chosen.get(handle.offer) ?? executors.find((x) => x.refuse(handle.offer) === null);
      if (!e) return Promise.reject(new Error('no executor accepts this offer'));
      return e.run(handle);
    },
  };
}
