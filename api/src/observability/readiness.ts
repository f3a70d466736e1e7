import type { Redis } from '@agentplane/store';
import { within } from './redis-metrics.js';

/** How long `/readyz` waits for Redis to answer a PING before it reports Redis not ready. */
export const READY_TIMEOUT_MS = 1_000;

/** A `/readyz` answer: 200 when every check passed, else 503 naming the ones that did not. */
export interface Readiness {
  status: 200 | 503;
  body: { status: 'ready' } | { status: 'not_ready' | 'stopping'; not_ready: string[] };
}

/**
 * Readiness of a process that serves from Redis: its Redis answers a PING within
 * `READY_TIMEOUT_MS`, and every named connection it also needs (a subscriber, say) is connected.
 * Probes that come while a PING is still unanswered share it, so a stalled Redis does not pile
 * up one PING per probe.
 */
export function readinessCheck(redis: Redis, connections: Record<string, () => boolean> = {}, timeoutMs = READY_TIMEOUT_MS): (stopping: boolean) => Promise<Readiness> {
  let pending: Promise<boolean> | null = null;
  const ping = (): Promise<boolean> => {
    if (pending) return pending;
    const answer = redis.ping().then((r) => r === 'PONG');
    answer.catch(() => undefined);
    const current = within(answer, timeoutMs).then((ok) => ok === true, () => false).finally(() => {
      if (pending === current) pending = null;
    });
    pending = current;
    return current;
  };
  return async (stopping) => {
    if (stopping) return { status: 503, body: { status: 'stopping', not_ready: ['stopping'] } };
    const failing: string[] = [];
    if (!(await ping())) failing.push('redis');
    for (const [name, connected] of Object.entries(connections)) if (!connected()) failing.push(name);
    return failing.length === 0 ? { status: 200, body: { status: 'ready' } } : { status: 503, body: { status: 'not_ready', not_ready: failing } };
  };
}
