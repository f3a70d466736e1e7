import type { LeaseExecutor, LeaseHandle, LeaseOffer } from '../agent.js';

const MAX_NOOP_MS = 3_600_000;

/**
 * The built-in `noop` driver: holds the lease for `spec.duration_ms` (default 0) and completes,
 * or stops early when the lease is canceled. It lets the whole lease path (offer → accept →
 * heartbeats → complete, drain with held work) run before a sandbox driver is installed.
 */
export const noopExecutor: LeaseExecutor = {
  refuse(offer: LeaseOffer): string | null {
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
