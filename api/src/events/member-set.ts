import type { Redis } from '@agentplane/store';

/**
 * A Redis set's members as this process read them last, read again at most once a `ttlMs`
 * (default one second): answered at once while fresh, so the event tap's listeners ask it for
 * every append without a promise. Concurrent reads of a stale set share one SMEMBERS.
 */
export class CachedMemberSet {
  private members = new Set<string>();
  private at = 0;
  private reading: Promise<Set<string>> | null = null;

  constructor(private readonly redis: Redis, private readonly key: string, private readonly ttlMs = 1000) {}

  has(member: string): boolean | Promise<boolean> {
    if (Date.now() - this.at <= this.ttlMs) return this.members.has(member);
    this.reading ??= this.redis.smembers(this.key).then(
      (list) => {
        this.members = new Set(list);
        this.at = Date.now();
        this.reading = null;
        return this.members;
      },
      (err: unknown) => {
        this.reading = null;
        throw err;
      },
    );
    return this.reading.then((set) => set.has(member));
  }

  /** The set changed here: the next question reads it again. */
  invalidate(): void {
    this.at = 0;
  }
}
