import type { Redis } from 'ioredis';
import { LuaScript } from './script.js';

/**
 * Removes entry `ARGV[1]` only while it is still past its deadline (its score at most `ARGV[2]`):
 * an entry begun again meanwhile (a keyed create's retry under the same id) stays. KEYS: the set.
 */
const REMOVE_DUE = new LuaScript('in_flight_remove_due', `
local score = redis.call('ZSCORE', KEYS[1], ARGV[1])
if score and tonumber(score) <= tonumber(ARGV[2]) then return redis.call('ZREM', KEYS[1], ARGV[1]) end
return 0`);

/**
 * Writes in flight that leave data behind if their process dies before they finish (a File's
 * bytes made permanent before its head exists, a Project's contents before its head): a sorted
 * set of `<workspace_id> <id>` scored by a deadline far past the write's own duration. `begin`
 * records an entry before the point of no return, `end` removes it once the head exists, and
 * `sweep` (run after each finished write) hands the entries past their deadline whose head never
 * came to `reclaim`; either way their entries go. A process that serves such writes also runs the
 * sweep on a timer (`startSweeping`), so entries whose process died are reclaimed even when
 * no write of their kind ever finishes again.
 */
export class InFlightWrites {
  private stopTimer: (() => void) | null = null;

  constructor(
    private readonly redis: Redis,
    private readonly key: string,
    private readonly graceMs: number,
    private readonly batch = 32,
  ) {}

  begin(workspaceId: string, id: string): Promise<unknown> {
    return this.redis.zadd(this.key, Date.now() + this.graceMs, `${workspaceId} ${id}`);
  }

  end(workspaceId: string, id: string): Promise<unknown> {
    return this.redis.zrem(this.key, `${workspaceId} ${id}`);
  }

  /**
   * Whether the entry of `id` is on record and still past its deadline at `now`: not begun again
   * since a sweep read it (a write that takes over the same id begins it again before writing).
   */
  async due(workspaceId: string, id: string, now: number): Promise<boolean> {
    const score = await this.redis.zscore(this.key, `${workspaceId} ${id}`);
    return score !== null && Number(score) <= now;
  }

  /**
   * Entries past their deadline: those `finished` says have no head are `reclaim`ed. Returns how
   * many were reclaimed. An entry is removed only while still past its deadline: one begun again
   * meanwhile stays on record for the write that began it.
   */
  async sweep(finished: (workspaceId: string, id: string) => Promise<boolean>, reclaim: (id: string) => Promise<void>, now = Date.now()): Promise<number> {
    const dead = await this.redis.zrangebyscore(this.key, '-inf', String(now), 'LIMIT', 0, this.batch);
    let reclaimed = 0;
    for (const entry of dead) {
      const [workspaceId = '', id = ''] = entry.split(' ');
      if (id && !(workspaceId && (await finished(workspaceId, id)))) {
        await reclaim(id);
        reclaimed += 1;
      }
      await REMOVE_DUE.run(this.redis, [this.key], [entry, now]);
    }
    return reclaimed;
  }

  /**
   * Runs `sweep` (its owner's, which calls `sweep` above with what it knows of heads) now and every
   * `intervalMs` until `stopSweeping` (`sweepPeriodically`); a call while one runs does nothing.
   */
  startSweeping(sweep: () => Promise<unknown>, onError: (err: unknown) => void, intervalMs: number): void {
    this.stopTimer ??= sweepPeriodically(intervalMs, sweep, onError);
  }

  stopSweeping(): void {
    this.stopTimer?.();
    this.stopTimer = null;
  }
}

/**
 * Runs `sweep` now and then every `intervalMs` until the returned function is called; the timer
 * does not hold the process open, and a failure goes to `onError`, never thrown.
 */
export function sweepPeriodically(intervalMs: number, sweep: () => Promise<unknown>, onError: (err: unknown) => void): () => void {
  const run = (): void => void Promise.resolve().then(sweep).catch(onError);
  const timer = setInterval(run, intervalMs);
  timer.unref();
  run();
  return () => clearInterval(timer);
}
