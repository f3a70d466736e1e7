import { flushTickWrites, isCluster, keys, LuaScript, type Redis } from '@agentplane/store';

/**
 * An offer (and, once accepted, the lease) as the gateway needs to find it from a runner frame
 * that carries only `lease_id` and `attempt`. Written by the scheduler before the offer is sent;
 * its TTL is refreshed with every lease heartbeat.
 */
export interface LeaseRecord {
  lease_id: string;
  run_id: string;
  session_id: string;
  thread_id: string;
  workspace_id: string;
  pool_id: string;
  attempt: number;
  runner_id: string;
  /** Channel on which the offering scheduler waits for the answer. */
  reply_to: string;
}

/**
 * How long a lease record lives: written with it by the offering scheduler, so an accepted
 * offer's record needs no refresh until the lease's first heartbeat (each heartbeat renews it).
 * Three lease periods: a late frame of a lease that was just lost still finds its record.
 */
export const leaseRecordTtlMs = (leaseMs: number): number => leaseMs * 3;

/** The runner index outlives any one record it lists. */
const INDEX_TTL_MS = 24 * 3600_000;

/**
 * `recorded`: the answering node already wrote the lease on the Run (nothing left for the
 * scheduler to record). `runner_id`: the runner the answer is about. The offers of one lease go
 * to one runner after another under the same lease id, so a late answer about an earlier offer
 * (a refused claim of an offer withdrawn since) must not settle the offer out now; an answer
 * without it is taken for the offer out.
 */
export type OfferReply = { lease_id: string; runner_id?: string; outcome: 'accepted' | 'rejected'; reason?: string; recorded?: boolean };

const recordKey = (leaseId: string): string => keys.global(`lease:${leaseId}`);
/** The lease ids offered to one runner (a set; members whose record expired are pruned on read). */
const runnerIndexKey = (runnerId: string): string => keys.global(`runner_leases:${runnerId}`);

/** Deletes the lease record KEYS[1] only while it is the offer to runner ARGV[1]. */
const REMOVE_OFFER = new LuaScript(
  'lease_record_remove_offer',
  `local raw = redis.call('GET', KEYS[1])
if not raw then return 0 end
local ok, rec = pcall(cjson.decode, raw)
if not ok or type(rec) ~= 'table' or rec['runner_id'] ~= ARGV[1] then return 0 end
return redis.call('DEL', KEYS[1])`,
);

/** Scheduler instance channel for offer answers. */
export const offerReplyChannel = (instanceId: string): string => `ap:scheduler:${instanceId}:offers`;

export class LeaseRecords {
  constructor(private readonly redis: Redis) {}

  /**
   * `now`: on a single Redis the commands are written to the connection before this returns (an
   * explicit pipeline, and the turn's held-back writes flushed), so a frame sent to the gateway
   * node right after, over a socket of its own, cannot reach it before the record is on its way
   * to Redis. Otherwise they share the turn's one write with the caller's other commands.
   */
  async put(record: LeaseRecord, ttlMs: number, options: { now?: boolean } = {}): Promise<void> {
    // Two keys in two slots (each its own hash tag), so no one script and no one pipeline (on a
    // cluster a pipeline must stay on one node): the record is the truth, the index only finds
    // it. The commands go out together (one write per node, one round trip); a crash that
    // writes only the index leaves an entry the next read prunes, one that writes only the
    // record leaves an offer a reconnecting runner cannot be asked about, which expires with it.
    const index = runnerIndexKey(record.runner_id);
    if (options.now === true && !isCluster(this.redis)) {
      const written = this.redis.pipeline()
        .set(recordKey(record.lease_id), JSON.stringify(record), 'PX', ttlMs)
        .sadd(index, record.lease_id)
        .pexpire(index, Math.max(ttlMs, INDEX_TTL_MS))
        .exec();
      // Held back behind the turn's other commands when the connection wrote some this turn.
      flushTickWrites();
      const results = await written;
      const failed = results?.find(([err]) => err);
      if (failed?.[0]) throw failed[0];
      return;
    }
    await Promise.all([
      this.redis.set(recordKey(record.lease_id), JSON.stringify(record), 'PX', ttlMs),
      this.redis.sadd(index, record.lease_id),
      this.redis.pexpire(index, Math.max(ttlMs, INDEX_TTL_MS)),
    ]);
  }

  /**
   * Leases this runner was offered or holds that are not in `held`: when a runner (re)connects
   * it names the leases it still holds, and the rest are lost with the process that held them.
   */
  async orphansOf(runnerId: string, held: ReadonlySet<string>): Promise<LeaseRecord[]> {
    const ids = (await this.redis.smembers(runnerIndexKey(runnerId))).filter((id) => !held.has(id));
    if (ids.length === 0) return [];
    const raws = await Promise.all(ids.map((id) => this.redis.get(recordKey(id))));
    const gone = ids.filter((_, i) => !raws[i]);
    if (gone.length > 0) await this.redis.srem(runnerIndexKey(runnerId), ...gone);
    return raws.flatMap((raw) => {
      if (!raw) return [];
      const rec = JSON.parse(raw) as LeaseRecord;
      return rec.runner_id === runnerId ? [rec] : [];
    });
  }

  async get(leaseId: string): Promise<LeaseRecord | null> {
    const raw = await this.redis.get(recordKey(leaseId));
    return raw ? (JSON.parse(raw) as LeaseRecord) : null;
  }

  async touch(leaseId: string, ttlMs: number): Promise<void> {
    await this.redis.pexpire(recordKey(leaseId), ttlMs);
  }

  async remove(leaseId: string, runnerId: string): Promise<void> {
    // Both at once (two slots): an index entry whose record is gone is pruned on read anyway.
    await Promise.all([this.redis.del(recordKey(leaseId)), this.redis.srem(runnerIndexKey(runnerId), leaseId)]);
  }

  /**
   * `remove`, but the record only while it is still the offer to `runnerId`: an acceptance that
   * came too late is refused while the scheduler may already have offered the lease (the same
   * lease id) to the next runner, whose record must stay.
   */
  async removeOffer(leaseId: string, runnerId: string): Promise<void> {
    await Promise.all([REMOVE_OFFER.run(this.redis, [recordKey(leaseId)], [runnerId]), this.redis.srem(runnerIndexKey(runnerId), leaseId)]);
  }
}
