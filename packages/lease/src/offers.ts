import { keys, type Redis } from '@agentplane/store';

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

export type OfferReply = { lease_id: string; outcome: 'accepted' | 'rejected'; reason?: string };

const recordKey = (leaseId: string): string => keys.global(`lease:${leaseId}`);

/** Scheduler instance channel for offer answers. */
export const offerReplyChannel = (instanceId: string): string => `ap:scheduler:${instanceId}:offers`;

export class LeaseRecords {
  constructor(private readonly redis: Redis) {}

  async put(record: LeaseRecord, ttlMs: number): Promise<void> {
    await this.redis.set(recordKey(record.lease_id), JSON.stringify(record), 'PX', ttlMs);
  }

  async get(leaseId: string): Promise<LeaseRecord | null> {
    const raw = await this.redis.get(recordKey(leaseId));
    return raw ? (JSON.parse(raw) as LeaseRecord) : null;
  }

  async touch(leaseId: string, ttlMs: number): Promise<void> {
    await this.redis.pexpire(recordKey(leaseId), ttlMs);
  }

  async remove(leaseId: string): Promise<void> {
    await this.redis.del(recordKey(leaseId));
  }

  async reply(record: LeaseRecord, reply: OfferReply): Promise<void> {
    await this.redis.publish(record.reply_to, JSON.stringify(reply));
  }
}

/** Pools with Runs to place: the scheduler watches this set (pool id → workspace id). */
export const ACTIVE_POOLS_KEY = keys.global('active_pools');

export async function markPoolActive(redis: Redis, poolId: string, workspaceId: string): Promise<void> {
  await redis.hset(ACTIVE_POOLS_KEY, poolId, workspaceId);
}

export async function activePools(redis: Redis): Promise<Map<string, string>> {
  return new Map(Object.entries(await redis.hgetall(ACTIVE_POOLS_KEY)));
}
