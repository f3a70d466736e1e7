import { PresenceStore, type StoredPresence } from '@agentplane/gateway';
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
  /**
   * Each pool's views of its last read, by the presence's stored text: a presence unchanged since
   * (most of them, between two heartbeats) keeps its view object, unparsed, and with it what the
   * dispatcher remembers about that object (see StaticFit).
   */
  private readonly lastRead = new Map<string, Map<string, RunnerView>>();
  /** The read of a pool's presences under way, if any: callers meanwhile share it. */
  private readonly reading = new Map<string, Promise<RunnerView[]>>();

  /**
   * `cacheMs`: a pool's view is served as read for this long. `staleMs`: until then an older view
   * is still served at once while one read refreshes it in the background, so a placement never
   * waits on that read (presence is only a hint: the runner's answer decides, and an offer to a
   * runner that left is refused at once by its gateway). Older than that, or none: read now.
   */
  constructor(
    redis: Redis,
    private readonly workspaceOf: (poolId: string) => string | undefined,
    private readonly cacheMs = 100,
    private readonly staleMs = 1000,
  ) {
    this.presence = new PresenceStore(redis);
  }

  async live(poolId: string, fresh = false): Promise<RunnerView[]> {
    const hit = this.cache.get(poolId);
    const age = hit ? Date.now() - hit.at : Number.POSITIVE_INFINITY;
    if (hit && age < this.cacheMs) return hit.views;
    const read = this.refresh(poolId);
    if (hit && age < this.staleMs && !fresh) {
      read.catch(() => undefined);
      return hit.views;
    }
    return read;
  }

  private refresh(poolId: string): Promise<RunnerView[]> {
    let read = this.reading.get(poolId);
    if (!read) {
      read = this.read(poolId).finally(() => this.reading.delete(poolId));
      this.reading.set(poolId, read);
    }
    return read;
  }

  private async read(poolId: string): Promise<RunnerView[]> {
    const ws = this.workspaceOf(poolId);
    if (!ws) return [];
    const views: RunnerView[] = [];
    const before = this.lastRead.get(poolId);
    const now = new Map<string, RunnerView>();
    let known = this.seen.get(poolId);
    if (!known) this.seen.set(poolId, (known = new Map()));
    let page: string | undefined;
    do {
      const res = await this.presence.listPoolRaw(ws, poolId, { limit: 500, page });
      for (const raw of res.data) {
        let view = before?.get(raw);
        if (!view) {
          const { presence: p, route } = JSON.parse(raw) as StoredPresence;
          const caps = p.capabilities as unknown as RunnerCapabilities;
          view = { runner_id: p.runner, pool_id: poolId, status: p.status, capabilities: caps, seen_at: p.last_seen_at, node_id: route.node_id };
          known.set(p.runner, caps);
        }
        now.set(raw, view);
        views.push(view);
      }
      page = res.next_page ?? undefined;
    } while (page);
    this.lastRead.set(poolId, now);
    this.cache.set(poolId, { at: Date.now(), views });
    return views;
  }

  async enrolled(poolId: string): Promise<RunnerCapabilities[]> {
    return [...(this.seen.get(poolId)?.values() ?? [])];
  }
}
