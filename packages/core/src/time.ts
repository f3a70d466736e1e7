export const nowIso = (): string => new Date().toISOString();
export const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms));

/**
 * Capped exponential backoff with full jitter: a uniformly random delay in [0, min(cap, base·2^attempt)),
 * so that clients cut off together (a gateway restart) spread their retries over the whole window.
 */
export function backoffDelay(attempt: number, baseMs: number, capMs: number, random: () => number = Math.random): number {
  const exp = Math.min(capMs, baseMs * 2 ** Math.max(0, attempt));
  return Math.floor(random() * exp);
}
