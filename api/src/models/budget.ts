import { randomUUID } from 'node:crypto';
import { ApiError } from '@agentplane/core';
import { cachedGet, forgetWritten, keys, LuaScript, tags, type Redis } from '@agentplane/store';
import { usdToNano } from '@agentplane/models';
import { UsageAccumulator } from './usage.js';

/** A workspace's model spend limit. `lifetime` never resets; `day` and `month` reset at UTC boundaries. */
export interface WorkspaceBudget {
  workspace_id: string;
  max_list_cost: { amount: number; currency: 'USD' };
  period: 'day' | 'month' | 'lifetime';
  updated_at: string;
}

/** The Session `budget` field as the contract states it. */
export interface SessionBudget {
  max_list_cost: { amount: number; currency?: 'USD' };
}

export interface BudgetSubject {
  workspace_id: string;
  session_id?: string | undefined;
  /** The Session's `budget` (null or absent: no Session limit). */
  session_budget?: SessionBudget | null | undefined;
}

/** Seconds until the next UTC day or month begins (at least 1). */
export function secondsToReset(period: 'day' | 'month', now = new Date()): number {
  const next = period === 'day'
    ? Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), now.getUTCDate() + 1)
    : Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1);
  return Math.max(1, Math.ceil((next - now.getTime()) / 1000));
}

/**
 * Lua: reserve one step's estimated cost against a limit, in one script with the check.
 * KEYS: the usage counter hash the limit is about | the sorted set of reservations (member
 * `<step>:<reservation>|<nano-USD>`, score: when it expires). ARGV: limit (nano-USD) | amount |
 * member (without the amount) | hold ms (renewed by `RENEW` while the step runs).
 * Expired reservations (a process that died mid-step) are pruned first. A step is admitted while
 * the recorded spend plus what the steps still running reserved is under the limit: 'ok' (its
 * estimate is added), else 'spent' (the recorded spend alone reaches it) or 'held'.
 */
const RESERVE = new LuaScript('model_budget_reserve', `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
local limit = tonumber(ARGV[1])
local spent = tonumber(redis.call('HGET', KEYS[1], 'list_cost_nano_usd') or '0')
if spent >= limit then return 'spent' end
local held = 0
for _, m in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  held = held + (tonumber(string.match(m, '|(%d+)$')) or 0)
end
if spent + held >= limit then return 'held' end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[3] .. '|' .. ARGV[2])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[4]) + 60000)
return 'ok'`);

/**
 * Lua: hold a reservation longer, while its step runs. KEYS: its sorted set. ARGV: member |
 * hold ms. Only an entry still there is renewed (one pruned meanwhile, its process stalled
 * past its hold, is not brought back); the set lives as long as its longest hold.
 */
const RENEW = new LuaScript('model_budget_renew', `
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if redis.call('ZADD', KEYS[1], 'XX', 'GT', 'CH', now + tonumber(ARGV[2]), ARGV[1]) == 1 and redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) + 60000 then
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]) + 60000)
end
return 1`);

/**
 * How long a reservation holds unless its process renews it (every third of that while its step
 * runs, up to the step's `ttl_ms`): a process that dies mid-step holds no budget for longer.
 */
export const RESERVATION_HOLD_MS = 30_000;

/** One reservation entry: the sorted set it is in (one budget's) and its member. */
export interface ReservationEntry {
  scope: 'session' | 'workspace';
  key: string;
  member: string;
}

/**
 * One step's reservations (Session and workspace). Each entry is its own (the member names the
 * step and an id of its own), so two reservations under one step id (a retried step)
 * are held side by side and released each once. `release` is idempotent and never throws; a
 * charge that removed the entries in its own script (`UsageAccumulator.record`) calls `settled`,
 * after which `release` has nothing left to do.
 */
export interface BudgetReservation {
  readonly entries: readonly ReservationEntry[];
  settled(): void;
  release(): Promise<void>;
}

/** A step's estimated cost, reserved against the Session and workspace budgets (`BudgetGuard.reserve`). */
export interface ReserveRequest extends BudgetSubject {
  step_id: string;
  /** The estimate, in nano-USD (the worst case the step is expected to cost). */
  amount_nano_usd: number;
  /** How long the reservation holds at most (the step's deadline and then some). */
  ttl_ms: number;
  /** The workspace budget, when the caller read it already (undefined: read here). */
  workspace_budget?: WorkspaceBudget | null | undefined;
}

/**
 * Refuses new model work once a Session or workspace budget is spent. Before a step the gateway
 * service reserves the step's estimated cost (`reserve`: a Lua check-and-add against each limit,
 * released when the step ends and its actual cost is recorded), so steps running at once cannot
 * all pass a budget that only one of them fits in; before admitting new work (Session create /
 * new turn) call `check`. Both throw 429 `budget.exceeded`, with `Retry-After` only for a
 * workspace `day`/`month` budget (whose UTC reset is known). The limit is overshot by at most
 * the cost of the last step admitted under it (admitted while spend plus reservations were
 * still under the limit).
 */
export class BudgetGuard {
  /** The reservations of the steps running in this process, renewed together (`renew`). */
  private readonly held = new Set<{ sides: ReservationEntry[]; until: number }>();
  private renewer: NodeJS.Timeout | undefined;

  constructor(private readonly redis: Redis, private readonly usage: UsageAccumulator, private readonly holdMs = RESERVATION_HOLD_MS) {}

  /** Every held reservation's hold starts again; those past their step's `ttl_ms` are let go (they expire). */
  private renew(): void {
    const now = Date.now();
    for (const h of this.held) {
      if (now >= h.until) {
        this.held.delete(h);
        continue;
      }
      for (const s of h.sides) void RENEW.run(this.redis, [s.key], [s.member, this.holdMs]).catch(() => undefined);
    }
    if (this.held.size === 0) this.stopRenewing();
  }

  private stopRenewing(): void {
    if (this.renewer) clearInterval(this.renewer);
    this.renewer = undefined;
  }

  /** Stop renewing (the process is stopping: its reservations expire within a hold). */
  close(): void {
    this.held.clear();
    this.stopRenewing();
  }

  private key(ws: string): string {
    return keys.scoped(tags.workspace(ws), 'model_budget');
  }

  async getWorkspaceBudget(ws: string): Promise<WorkspaceBudget | null> {
    // Read on every admitted turn: through the process's read cache (invalidated by Redis on change).
    const raw = await cachedGet(this.redis, this.key(ws));
    return raw === null ? null : (JSON.parse(raw) as WorkspaceBudget);
  }

  async setWorkspaceBudget(ws: string, amount: number, period: WorkspaceBudget['period']): Promise<WorkspaceBudget> {
    const b: WorkspaceBudget = { workspace_id: ws, max_list_cost: { amount, currency: 'USD' }, period, updated_at: new Date().toISOString() };
    await this.redis.set(this.key(ws), JSON.stringify(b));
    forgetWritten(this.redis, [this.key(ws)]);
    return b;
  }

  async clearWorkspaceBudget(ws: string): Promise<boolean> {
    const removed = (await this.redis.del(this.key(ws))) === 1;
    forgetWritten(this.redis, [this.key(ws)]);
    return removed;
  }

  private reservedKey(scope: 'workspace' | 'session', id: string): string {
    return keys.scoped(scope === 'workspace' ? tags.workspace(id) : tags.session(id), 'model_budget_reserved');
  }

  private workspaceScope(ws: string, wb: WorkspaceBudget, now: Date) {
    return wb.period === 'lifetime'
      ? { kind: 'workspace' as const, workspace_id: ws }
      : { kind: 'workspace' as const, workspace_id: ws, period: { kind: wb.period, at: now } };
  }

  /**
   * `held`: refused for what the steps running now reserved, not for what was spent: they free it
   * when they end, at no known time, so no `Retry-After` (the contract gives one only for a known
   * release or reset; the reset would tell the caller to wait hours for what may free in seconds).
   */
  private workspaceExceeded(wb: WorkspaceBudget, now: Date, why = 'is spent', held = false): ApiError {
    const headers = wb.period === 'lifetime' || held ? undefined : { 'Retry-After': String(secondsToReset(wb.period, now)) };
    return new ApiError('budget.exceeded', `the workspace ${wb.period === 'lifetime' ? '' : wb.period === 'day' ? 'daily ' : 'monthly '}budget of ${wb.max_list_cost.amount} USD (list cost) ${why}`, headers ? { headers } : {});
  }

  /**
   * Reserve a step's estimated cost against the Session budget and the workspace budget, each
   * in one script with its check (the two live in different slots: two scripts, sent at once;
   * one refused releases the other). Throws `budget.exceeded` as `check` does. Null, with no
   * Redis round trip, when neither budget is set. The reservation holds for `RESERVATION_HOLD_MS`
   * and is renewed while the step runs, up to `ttl_ms`: a process that dies mid-step holds no
   * budget past one hold.
   */
  async reserve(req: ReserveRequest, now = new Date()): Promise<BudgetReservation | null> {
    const limit = req.session_budget?.max_list_cost.amount;
    const session = req.session_id && limit !== undefined ? req.session_id : null;
    const wb = req.workspace_budget !== undefined ? req.workspace_budget : await this.getWorkspaceBudget(req.workspace_id);
    if (!session && !wb) return null;
    const amount = String(Math.max(0, Math.round(req.amount_nano_usd)));
    const hold = Math.max(1000, Math.min(this.holdMs, Math.round(req.ttl_ms)));
    const sides: ReservationEntry[] = [];
    // A member of this reservation's own: another reservation under the same step id (a retried
    // step, a second caller naming the same id) neither merges with it nor releases it.
    const own = `${req.step_id}:${randomUUID()}`;
    const reserveOn = async (scope: ReservationEntry['scope'], usageKey: string, key: string, limitNano: number): Promise<string> => {
      const answer = String(await RESERVE.run(this.redis, [usageKey, key], [limitNano, amount, own, hold]));
      if (answer === 'ok') sides.push({ scope, key, member: `${own}|${amount}` });
      return answer;
    };
    const live = { sides, until: Date.now() + Math.max(1000, Math.round(req.ttl_ms)) };
    const release = async (): Promise<void> => {
      this.held.delete(live);
      const taken = sides.splice(0);
      await Promise.all(taken.map((s) => this.redis.zrem(s.key, s.member).catch(() => undefined)));
    };
    const settled = await Promise.allSettled([
      session ? reserveOn('session', UsageAccumulator.key({ kind: 'session', session_id: session }), this.reservedKey('session', session), usdToNano(limit as number)) : 'ok',
      wb ? reserveOn('workspace', UsageAccumulator.key(this.workspaceScope(req.workspace_id, wb, now)), this.reservedKey('workspace', req.workspace_id), usdToNano(wb.max_list_cost.amount)) : 'ok',
    ]);
    const failed = settled.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failed) {
      await release();
      throw failed.reason;
    }
    const [sAnswer, wAnswer] = settled.map((r) => (r as PromiseFulfilledResult<string>).value);
    if (sAnswer !== 'ok') {
      await release();
      throw new ApiError('budget.exceeded', `the Session budget of ${limit} USD (list cost) ${sAnswer === 'spent' ? 'is spent' : 'is spent or held by the steps running now'}`);
    }
    if (wAnswer !== 'ok' && wb) {
      await release();
      throw this.workspaceExceeded(wb, now, wAnswer === 'spent' ? 'is spent' : 'is spent or held by the steps running now', wAnswer !== 'spent');
    }
    const entries = [...sides];
    if (sides.length > 0) {
      this.held.add(live);
      if (!this.renewer) {
        this.renewer = setInterval(() => this.renew(), Math.max(100, Math.floor(this.holdMs / 3)));
        this.renewer.unref();
      }
    }
    return {
      entries,
      settled: () => {
        this.held.delete(live);
        sides.splice(0);
      },
      release,
    };
  }

  /** Throws `budget.exceeded` when a limit is reached; resolves otherwise. */
  async check(subject: BudgetSubject, now = new Date()): Promise<void> {
    const limit = subject.session_budget?.max_list_cost.amount;
    if (subject.session_id && limit !== undefined) {
      const spent = await this.usage.costNano({ kind: 'session', session_id: subject.session_id });
      if (spent >= usdToNano(limit)) {
        throw new ApiError('budget.exceeded', `the Session budget of ${limit} USD (list cost) is spent`);
      }
    }
    const wb = await this.getWorkspaceBudget(subject.workspace_id);
    if (wb) {
      const spent = await this.usage.costNano(this.workspaceScope(subject.workspace_id, wb, now));
      if (spent >= usdToNano(wb.max_list_cost.amount)) throw this.workspaceExceeded(wb, now);
    }
  }
}
