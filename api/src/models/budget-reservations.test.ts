import { randomBytes } from 'node:crypto';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { ApiError, createLogger, SecretBox } from '@agentplane/core';
import { DocumentStore, keys, tags } from '@agentplane/store';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { createModelsModule, type ModelsModule } from './module.js';
import { BudgetGuard } from './budget.js';
import { UsageAccumulator } from './usage.js';
import { startReportingServer } from '../../../test/fixtures/provider-servers.js';

/**
 * Budget reservations: each is its own, whatever step id it is made under, and a candidate
 * without a list price reserves what its step can be charged.
 */
const testRedis = useEmbeddedRedis('budget-reservations');
let models: ModelsModule;
let server: { url: string; close(): void };
let baseUrl: string;

beforeAll(async () => {
  const redis = testRedis();
  models = createModelsModule({
    redis, docs: new DocumentStore(redis), secretBox: new SecretBox(randomBytes(32)), log: createLogger({ name: 'budget-reservations', level: 'silent' }),
    config: { providerTimeoutMs: 30_000 },
  });
  // An OpenAI-compatible server that serves any model as `gpt-4o` (a priced model), with a thousand output tokens.
  server = await startReportingServer('gpt-4o', { prompt_tokens: 1, completion_tokens: 1000 });
  baseUrl = server.url;
});
afterAll(() => server?.close());

/** What a workspace's reservations hold now (nano-USD). */
async function held(ws: string): Promise<number> {
  const members = await testRedis().zrange(keys.scoped(tags.workspace(ws), 'model_budget_reserved'), 0, -1);
  return members.reduce((n, m) => n + Number(m.slice(m.lastIndexOf('|') + 1)), 0);
}

describe('budget reservations', () => {
  it('two reservations under one step id (a retried step) are both held, and each release frees its own', async () => {
    const ws = `wrkspc_${'c'.repeat(32)}`;
    await models.budgets.setWorkspaceBudget(ws, 1, 'lifetime');
    const reserve = () => models.budgets.reserve({ workspace_id: ws, step_id: 'step-1', amount_nano_usd: 500_000_000, ttl_ms: 60_000 });
    const first = await reserve();
    const second = await reserve();
    expect(await held(ws)).toBe(1_000_000_000);
    // Spend plus what is held reaches the limit: a third step is refused.
    await expect(reserve()).rejects.toSatisfy((e: unknown) => e instanceof ApiError && e.type === 'budget.exceeded');
    await first?.release();
    await first?.release();
    expect(await held(ws)).toBe(500_000_000);
    await second?.release();
    expect(await held(ws)).toBe(0);
  });

  it('a candidate without a list price reserves at least what its step is charged when its provider reports a priced model', async () => {
    const ws = `wrkspc_${'d'.repeat(32)}`;
    await models.credentials.create(ws, { key: 'compat', provider_key: 'openai', base_url: baseUrl });
    await models.profiles.create(ws, { key: 'unpriced', candidates: [{ credential_key: 'compat', provider_model: 'local-unpriced' }] });
    await models.budgets.setWorkspaceBudget(ws, 0.000001, 'lifetime');
    const request = { routing_key: 'unpriced', messages: [{ role: 'user' as const, content: [{ type: 'text' as const, text: 'hi' }] }], tools: [], max_output_tokens: 1000 };
    const first = await models.gateway.plan(ws, request);
    const reserved = await held(ws);
    expect(reserved).toBeGreaterThan(0);
    // The first step holds the budget: a second one running beside it is refused, not charged after.
    await expect(models.gateway.plan(ws, request)).rejects.toSatisfy((e: unknown) => e instanceof ApiError && e.type === 'budget.exceeded');
    for await (const ev of models.gateway.execute(first, new AbortController().signal)) void ev;
    const total = await models.usage.read({ kind: 'workspace', workspace_id: ws });
    expect(total).toMatchObject({ steps: 1, unpriced_steps: 0 });
    expect(total.list_cost.amount).toBeGreaterThan(0);
    expect(reserved / 1e9).toBeGreaterThanOrEqual(total.list_cost.amount);
    expect(await held(ws)).toBe(0);
  });

  it('a caller that gives the step up after its plan, before its stream starts, frees its reservation at once', async () => {
    const ws = `wrkspc_${'e'.repeat(32)}`;
    await models.credentials.create(ws, { key: 'compat', provider_key: 'openai', base_url: baseUrl });
    await models.profiles.create(ws, { key: 'priced', candidates: [{ credential_key: 'compat', provider_model: 'gpt-4o' }] });
    await models.budgets.setWorkspaceBudget(ws, 100, 'lifetime');
    const request = { routing_key: 'priced', messages: [{ role: 'user' as const, content: [{ type: 'text' as const, text: 'hi' }] }], tools: [], max_output_tokens: 1000 };
    // Its stream given up (`return`), as a `for await` left before its first event does.
    const given = await models.gateway.plan(ws, request);
    expect(await held(ws)).toBeGreaterThan(0);
    await models.gateway.execute(given, new AbortController().signal).return(undefined);
    expect(await held(ws)).toBe(0);
    // Its stream failed (`throw`) before it started.
    const failed = await models.gateway.plan(ws, request);
    expect(await held(ws)).toBeGreaterThan(0);
    await expect(models.gateway.execute(failed, new AbortController().signal).throw(new Error('the response could not start'))).rejects.toThrow('could not start');
    expect(await held(ws)).toBe(0);
    expect((await models.usage.read({ kind: 'workspace', workspace_id: ws })).steps).toBe(0);
  });

  it('a reservation holds while its process renews it, up to its step\'s ttl; one its process stopped renewing goes within a hold', async () => {
    const redis = testRedis();
    const ws = `wrkspc_${'e'.repeat(32)}`;
    const HOLD = 1500;
    // Two processes' guards: `dead` stops renewing (its process died mid-step), `alive` renews.
    const dead = new BudgetGuard(redis, new UsageAccumulator(redis), HOLD);
    const alive = new BudgetGuard(redis, new UsageAccumulator(redis), HOLD);
    await alive.setWorkspaceBudget(ws, 1, 'lifetime');
    const step = (g: BudgetGuard, id: string, ttl = 60_000) => g.reserve({ workspace_id: ws, step_id: id, amount_nano_usd: 500_000_000, ttl_ms: ttl });
    const refused = (id: string) => expect(step(alive, id)).rejects.toSatisfy((e: unknown) => e instanceof ApiError && e.type === 'budget.exceeded');
    await step(dead, 'dies');
    dead.close();
    const running = await step(alive, 'runs');
    await refused('third');
    // Past one hold (and more): the dead step's reservation is gone, the running one's is not.
    await new Promise((r) => setTimeout(r, 2.5 * HOLD));
    const next = await step(alive, 'next');
    await refused('fourth');
    await running?.release();
    await next?.release();
    expect(await held(ws)).toBe(0);
    // A step past its own ttl is no longer renewed: its reservation goes a hold later.
    await step(alive, 'overdue', HOLD);
    await new Promise((r) => setTimeout(r, 2.5 * HOLD));
    const again = await step(alive, 'again');
    const another = await step(alive, 'another');
    await again?.release();
    await another?.release();
    alive.close();
  });

  it('a daily budget refused for what running steps hold answers no Retry-After; one refused for what was spent answers the reset', async () => {
    const redis = testRedis();
    const ws = `wrkspc_${'f'.repeat(32)}`;
    const guard = new BudgetGuard(redis, new UsageAccumulator(redis));
    await guard.setWorkspaceBudget(ws, 1, 'day');
    const step = (id: string) => guard.reserve({ workspace_id: ws, step_id: id, amount_nano_usd: 1_000_000_000, ttl_ms: 60_000 });
    const running = await step('running');
    const held = await step('held').then(() => null, (e: unknown) => e);
    expect(held).toBeInstanceOf(ApiError);
    expect((held as ApiError).type).toBe('budget.exceeded');
    expect((held as ApiError).headers['Retry-After']).toBeUndefined();
    await running?.release();
    // Spent: the recorded spend reaches the limit, which resets at the next UTC day.
    await redis.hset(UsageAccumulator.key({ kind: 'workspace', workspace_id: ws, period: { kind: 'day', at: new Date() } }), 'list_cost_nano_usd', 1_000_000_000);
    const spent = await step('spent').then(() => null, (e: unknown) => e);
    expect((spent as ApiError).type).toBe('budget.exceeded');
    expect(Number((spent as ApiError).headers['Retry-After'])).toBeGreaterThanOrEqual(1);
    guard.close();
  });
});
