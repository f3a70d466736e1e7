import { PresenceStore } from '@agentplane/gateway';
import type { RunnerCapabilities } from '@agentplane/lease';
import type { Redis } from '@agentplane/store';
import type { RunnerDirectory, RunnerView } from './directory.js';

/**
 * Runners of a pool, read from the presence projection. Presence is only a hint for placement:
 * a runner that looks free may still decline, and the lease itself is BullMQ's lock.
 */
export class PresenceDirectory implements RunnerDirectory {
  private readonly presence: PresenceStore;
  /** Last capabilities seen per pool and runner (for "no runner can ever serve this Run"). */
  private readonly seen = new Map<string, Map<string, RunnerCapabilities>>();
  private readonly cache = new Map<string, { at: number; views: RunnerView[] }>();

  constructor(
    redis: Redis,
    private readonly workspaceOf: (poolId: string) => string | undefined,
    private readonly cacheMs = 100,
  ) {
    this.presence = new PresenceStore(redis);
  }

  async live(poolId: string): Promise<RunnerView[]> {
    const hit = this.cache.get(poolId);
    if (hit && Date.now() - hit.at < this.cacheMs) return hit.views;
    const ws = this.workspaceOf(poolId);
    if (!ws) return [];
    const views: RunnerView[] = [];
    let page: string | undefined;
    do {
      const res = await this.presence.listPoolStored(ws, poolId, { limit: 500, page });
      for (const { presence: p, route } of res.data) {
        const caps = p.capabilities as unknown as RunnerCapabilities;
        views.push({ runner_id: p.runner, pool_id: poolId, status: p.status, capabilities: caps, seen_at: p.last_seen_at, node_id: route.node_id });
        let known = this.seen.get(poolId);
        if (!known) this.seen.set(poolId, (known = new Map()));
        known.set(p.runner, caps);
      }
      page = res.next_page ?? undefined;
    } while (page);
    this.cache.set(poolId, { at: Date.now(), views });
    return views;
  }

  /** The cached view is stale after an offer changed a runner's load. */
  invalidate(poolId: string): void {
    this.cache.delete(poolId);
  }

  async enrolled(poolId: string): Promise<RunnerCapabilities[]> {
    return [...(this.seen.get(poolId)?.values() ?? [])];
  }
}
