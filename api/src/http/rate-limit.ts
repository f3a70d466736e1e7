import { ApiError } from '@agentplane/core';
import { keys, type Redis } from '@agentplane/store';

/**
 * Fixed one-minute windows per credential (or what `counted` names), counted in Redis so the limit holds across
 * API replicas. Over the limit: 429 `budget.exceeded` with `Retry-After` = seconds to the
 * window's end (at least 1).
 */
export async function enforceRateLimit(redis: Redis, credentialId: string, perMinute: number | null, now = Date.now(), counted = 'this key'): Promise<void> {
  if (perMinute === null || perMinute <= 0) return;
  const window = Math.floor(now / 60_000);
  const key = keys.rate(credentialId, window);
  const res = await redis.multi().incr(key).pexpire(key, 61_000).exec();
  const count = Number(res?.[0]?.[1] ?? 0);
  if (count > perMinute) {
    const retryAfter = Math.max(1, Math.ceil(((window + 1) * 60_000 - now) / 1000));
    throw new ApiError('budget.exceeded', `rate limit of ${perMinute} requests per minute reached for ${counted}`, {
      headers: { 'Retry-After': String(retryAfter) },
    });
  }
}
