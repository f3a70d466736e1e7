import { existsSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { useCrashPlatforms } from './harness/crash-platform.js';

type Totals = { steps: number; list_cost: { amount: number } };

/**
 * The API killed right after a model step was charged (crash point `model-step-charged`): the
 * charge released the step's budget reservation in the same scripts, so the step is counted once
 * (its real cost) and holds nothing of the budget after the crash; the next step is admitted.
 */
describe('a crash right after a model step is charged', () => {
  const crash = useCrashPlatforms('model-charge-crash');
  const dir = mkdtempSync(join(tmpdir(), 'agentplane-charge-crash-'));
  afterAll(() => rmSync(dir, { recursive: true, force: true }));

  it('leaves no reservation held beside the charge', async () => {
    const pricesFile = join(dir, 'prices.json');
    writeFileSync(pricesFile, JSON.stringify({ scripted: { 'scripted-priced': { input: 1000, output: 1000 } } }));
    const q = await crash.start(['model-step-charged'], { env: { LOG_LEVEL: 'warn', MODEL_PRICES_FILE: pricesFile } });
    const c = q.p.root;
    const ws = q.p.bootstrap.workspace_id;
    const base = `/v1/organizations/workspaces/${ws}`;
    expect((await c.request('POST', `${base}/model-routing-profiles`, { body: { key: 'priced', candidates: [{ credential_key: 'default', provider_model: 'scripted-priced' }] } })).status).toBe(201);
    // A step reserves about 1 USD (1000 output tokens at 1000 USD/MTok) and costs a few cents.
    expect((await c.request('PUT', `${base}/budget`, { body: { max_list_cost: { amount: 0.5 }, period: 'lifetime' } })).status).toBe(200);
    const step = async (): Promise<number> => {
      const res = await fetch(`${q.p.baseUrl}${base}/model-steps`, {
        method: 'POST', headers: c.headers({ accept: 'text/event-stream' }, true),
        body: JSON.stringify({ routing_key: 'priced', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }], max_output_tokens: 1000 }),
      });
      await res.text();
      return res.status;
    };

    const before = q.p.pids().api;
    await step().catch(() => undefined);
    expect(existsSync(q.marker('model-step-charged'))).toBe(true);
    await q.apiRestarted(before, { client: c, path: `${base}/budget` });

    const usage = (await c.request('GET', `${base}/usage`)).body as { total: Totals };
    expect(usage.total.steps).toBe(1);
    expect(usage.total.list_cost.amount).toBeGreaterThan(0);
    expect(usage.total.list_cost.amount).toBeLessThan(0.5);
    expect(await q.redis().zcard(`ap:{w:${ws}}:model_budget_reserved`)).toBe(0);
    expect(await step()).toBe(200);
  }, 180_000);
});
