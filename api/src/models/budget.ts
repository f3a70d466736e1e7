import { ApiError } from '@agentplane/core';
import { cachedGet, forgetWritten, keys, tags, type Redis } from '@agentplane/store';
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
 * Refuses new model work once a Session or workspace budget is spent. Call `check` before a
 * step (the gateway service does) or before admitting new work (Session create / new turn):
 * it throws 429 `budget.exceeded`, with `Retry-After` only for a workspace `day`/`month` budget
 * (whose UTC reset is known). A step already running may overshoot by its own cost.
 */
export class BudgetGuard {
  constructor(private readonly redis: Redis, private readonly usage: UsageAccumulator) {}

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
      const scope = wb.period === 'lifetime'
        ? { kind: 'workspace' as const, workspace_id: subject.workspace_id }
        : { kind: 'workspace' as const, workspace_id: subject.workspace_id, period: { kind: wb.period, at: now } };
      const spent = await this.usage.costNano(scope);
      if (spent >= usdToNano(wb.max_list_cost.amount)) {
        const headers = wb.period === 'lifetime' ? undefined : { 'Retry-After': String(secondsToReset(wb.period, now)) };
        throw new ApiError('budget.exceeded', `the workspace ${wb.period === 'lifetime' ? '' : wb.period === 'day' ? 'daily ' : 'monthly '}budget of ${wb.max_list_cost.amount} USD (list cost) is spent`, headers ? { headers } : {});
      }
    }
  }
}
