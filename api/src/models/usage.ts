import { keys, LuaScript, tags, type Redis } from '@agentplane/store';
import { ZERO_USAGE, type TokenUsage } from '@agentplane/protocol';
import { nanoToUsd } from '@agentplane/models';
import type { ReservationEntry } from './budget.js';

const COUNTERS = ['input_tokens', 'cached_input_tokens', 'cache_write_input_tokens', 'output_tokens', 'reasoning_output_tokens', 'total_tokens'] as const;

/**
 * Adds one step to several counter hashes at most once, and releases the step's budget
 * reservation in the same script (so a step is never both charged and still held, nor released
 * and not yet charged, whatever dies when): KEYS[1] is the step marker (SET NX, expires after
 * ARGV[1] seconds), KEYS[2..] the hashes, then, when ARGV[5] is not empty, the sorted set of
 * reservations whose member ARGV[5] is removed (also when the step was counted before). ARGV[2]
 * is the number of field/increment pairs that follow ARGV[5]; a TTL ARGV[4] (0 = none) is
 * applied to the hashes from KEYS[ARGV[3]] onwards.
 */
const RECORD_LUA = `
local last = #KEYS
if ARGV[5] ~= '' then
  redis.call('ZREM', KEYS[last], ARGV[5])
  last = last - 1
end
if not redis.call('SET', KEYS[1], '1', 'NX', 'EX', tonumber(ARGV[1])) then return 0 end
local nfields = tonumber(ARGV[2])
local ttl_from = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
for k = 2, last do
  for i = 0, nfields - 1 do
    redis.call('HINCRBY', KEYS[k], ARGV[6 + i * 2], ARGV[7 + i * 2])
  end
  if ttl > 0 and k >= ttl_from then redis.call('EXPIRE', KEYS[k], ttl) end
end
return 1`;
const recordScript = new LuaScript('model_usage_record', RECORD_LUA);

const STEP_MARKER_TTL = 7 * 24 * 3600;
const PERIOD_TTL = 400 * 24 * 3600;

/** Who a step is billed to. The workspace always; Session, thread and Run when known. */
export interface UsageAttribution {
  workspace_id: string;
  session_id?: string | undefined;
  thread_id?: string | undefined;
  run_id?: string | undefined;
  /** Unique per model step: recording the same step twice counts once. */
  step_id: string;
}

export interface UsageSummary {
  usage: TokenUsage;
  /** List cost priced from the price table. */
  list_cost: { amount: number; currency: 'USD' };
  /** Model steps counted. */
  steps: number;
  /** Steps whose model had no price in the table (their cost counts as 0). */
  unpriced_steps: number;
}

export type UsageScope =
  | { kind: 'workspace'; workspace_id: string; period?: { kind: 'day' | 'month'; at?: Date } }
  | { kind: 'session'; session_id: string }
  | { kind: 'thread'; session_id: string; thread_id: string }
  | { kind: 'run'; session_id: string; run_id: string };

export const dayKey = (d: Date): string => d.toISOString().slice(0, 10);
export const monthKey = (d: Date): string => d.toISOString().slice(0, 7);

/**
 * Token and list-cost counters per Run, thread, Session and workspace (total, UTC day, UTC month).
 * Session-side counters share the Session's hash tag and workspace counters the workspace's, so
 * each side is one atomic script and the layout is Redis Cluster-safe. A step id makes
 * recording idempotent (a retried report does not double count).
 */
export class UsageAccumulator {
  constructor(private readonly redis: Redis) {}

  static key(scope: UsageScope): string {
    switch (scope.kind) {
      case 'workspace': {
        const tag = tags.workspace(scope.workspace_id);
        if (!scope.period) return keys.scoped(tag, 'model_usage:total');
        const at = scope.period.at ?? new Date();
        return keys.scoped(tag, scope.period.kind === 'day' ? `model_usage:day:${dayKey(at)}` : `model_usage:month:${monthKey(at)}`);
      }
      case 'session':
        return keys.scoped(tags.session(scope.session_id), 'model_usage');
      case 'thread':
        return keys.scoped(tags.session(scope.session_id), `model_usage:thread:${scope.thread_id}`);
      case 'run':
        return keys.scoped(tags.session(scope.session_id), `model_usage:run:${scope.run_id}`);
    }
  }

  /**
   * Count one step (once per step id). `release`: the step's budget reservation entries
   * (`BudgetReservation.entries`), each removed in the script of its side (same hash tag).
   */
  async record(who: UsageAttribution, usage: TokenUsage, costNanoUsd: number | null, at = new Date(), release: readonly ReservationEntry[] = []): Promise<void> {
    const fields: (string | number)[] = [];
    for (const c of COUNTERS) fields.push(c, Math.max(0, Math.round(usage[c])));
    fields.push('list_cost_nano_usd', Math.max(0, Math.round(costNanoUsd ?? 0)), 'steps', 1, 'unpriced_steps', costNanoUsd === null ? 1 : 0);
    const nfields = fields.length / 2;
    const wtag = tags.workspace(who.workspace_id);
    const wsKeys = [
      keys.scoped(wtag, `model_usage_step:${who.step_id}`),
      UsageAccumulator.key({ kind: 'workspace', workspace_id: who.workspace_id }),
      UsageAccumulator.key({ kind: 'workspace', workspace_id: who.workspace_id, period: { kind: 'day', at } }),
      UsageAccumulator.key({ kind: 'workspace', workspace_id: who.workspace_id, period: { kind: 'month', at } }),
    ];
    const held = (scope: ReservationEntry['scope'], keys: string[]): string => {
      const entry = release.find((e) => e.scope === scope);
      if (!entry) return '';
      keys.push(entry.key);
      return entry.member;
    };
    const jobs: Promise<unknown>[] = [recordScript.run(this.redis, wsKeys, [STEP_MARKER_TTL, nfields, 3, PERIOD_TTL, held('workspace', wsKeys), ...fields])];
    if (who.session_id) {
      const s = who.session_id;
      const sKeys = [keys.scoped(tags.session(s), `model_usage_step:${who.step_id}`), UsageAccumulator.key({ kind: 'session', session_id: s })];
      if (who.thread_id) sKeys.push(UsageAccumulator.key({ kind: 'thread', session_id: s, thread_id: who.thread_id }));
      if (who.run_id) sKeys.push(UsageAccumulator.key({ kind: 'run', session_id: s, run_id: who.run_id }));
      jobs.push(recordScript.run(this.redis, sKeys, [STEP_MARKER_TTL, nfields, 0, 0, held('session', sKeys), ...fields]));
      // Which workspace a Session's counters belong to (the read route checks the boundary).
      jobs.push(this.redis.hset(UsageAccumulator.key({ kind: 'session', session_id: s }), 'workspace_id', who.workspace_id));
    }
    await Promise.all(jobs);
  }

  async read(scope: UsageScope): Promise<UsageSummary> {
    return summarize(await this.redis.hgetall(UsageAccumulator.key(scope)));
  }

  /** One workspace's counters for each UTC day ending with `until`, oldest first: one round trip. */
  async daily(workspaceId: string, days: number, until = new Date()): Promise<{ date: string; summary: UsageSummary }[]> {
    const dates = Array.from({ length: days }, (_, i) => new Date(until.getTime() - (days - 1 - i) * 86_400_000));
    const pipe = this.redis.pipeline();
    for (const at of dates) pipe.hgetall(UsageAccumulator.key({ kind: 'workspace', workspace_id: workspaceId, period: { kind: 'day', at } }));
    const res = (await pipe.exec()) ?? [];
    return dates.map((at, i) => {
      const [err, h] = res[i] ?? [null, {}];
      if (err) throw err;
      return { date: dayKey(at), summary: summarize((h ?? {}) as Record<string, string>) };
    });
  }

  /** The workspace a Session's counters were recorded under, or null if none were. */
  async sessionWorkspace(sessionId: string): Promise<string | null> {
    return this.redis.hget(UsageAccumulator.key({ kind: 'session', session_id: sessionId }), 'workspace_id');
  }

  /** List cost in nano-USD of one scope (what budget checks compare). */
  async costNano(scope: UsageScope): Promise<number> {
    return Number((await this.redis.hget(UsageAccumulator.key(scope), 'list_cost_nano_usd')) ?? 0);
  }
}

export function summarize(h: Record<string, string>): UsageSummary {
  const usage: TokenUsage = { ...ZERO_USAGE };
  for (const c of COUNTERS) usage[c] = Number(h[c] ?? 0);
  return {
    usage,
    list_cost: { amount: nanoToUsd(Number(h.list_cost_nano_usd ?? 0)), currency: 'USD' },
    steps: Number(h.steps ?? 0),
    unpriced_steps: Number(h.unpriced_steps ?? 0),
  };
}
