import type { ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { ApiResponse } from '@agentplane/client';
import { findPrice, listCostNanoUsd, nanoToUsd, SHIPPED_PRICES } from '@agentplane/models';
import type { TokenUsage } from '@agentplane/protocol';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { pairDaemon, startDaemon } from './harness/daemon.js';
import { startOpenAiServer, type ProviderServer } from './fixtures/provider-servers.js';

/**
 * A Session budget refuses new turns end to end: a turn on a priced model (the shipped price
 * table's gpt-4.1-mini, served by a local OpenAI-compatible server) spends more than the
 * Session's budget, and the next user.message is refused with 429 `budget.exceeded` before
 * anything reaches the Session log.
 */
const SECRET = 'sk-budget-TESTSECRET-0123456789abcdef';
const PRICED_MODEL = 'gpt-4.1-mini';
const REPLY = 'Hello from the priced model.';
/** USD; far below one step of gpt-4.1-mini, so the first turn spends it. */
const BUDGET = 0.000001;

let p: Platform;
let oai: ProviderServer;
let daemon: ChildProcess | undefined;
let principal: string;
let envId: string;

type Json = Record<string, unknown>;
interface Ev { id: string; seq: number; type: string; payload: Json }
interface SessionView {
  id: string;
  status: string;
  budget: { max_list_cost: { amount: number; currency: string } } | null;
  stats: { events: number; user_messages: number; agent_messages: number };
  usage: { input_tokens: number; output_tokens: number; cache_read_input_tokens: number; cache_creation_input_tokens: number };
}
interface UsageSummary {
  usage: TokenUsage;
  list_cost: { amount: number; currency: string };
  steps: number;
  unpriced_steps: number;
}

const errorOf = (r: ApiResponse) => (r.body as { error?: { type?: string; message?: string } }).error;
const msg = (content: string) => ({ type: 'user.message', payload: { content, authored_by: principal, caused_by: { kind: 'api' } } });

beforeAll(async () => {
  oai = await startOpenAiServer({ apiKey: SECRET, text: REPLY });
  p = await startPlatform({ scheduler: true });
  const ws = p.bootstrap.workspace_id;
  const cred = await p.root.request('POST', `/v1/organizations/workspaces/${ws}/model-credentials`, {
    body: { key: 'local-openai', provider_key: 'openai', base_url: oai.url, secret: SECRET },
  });
  expect(cred.status).toBe(201);
  const prof = await p.root.request('POST', `/v1/organizations/workspaces/${ws}/model-routing-profiles`, {
    body: { key: 'priced', candidates: [{ credential_key: 'local-openai', provider_model: PRICED_MODEL }] },
  });
  expect(prof.status).toBe(201);
  principal = (await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
    external_subject_id: 'budget-owner', principal_type: 'person', display_name: 'Budget Owner',
  })).id;
  envId = (await p.root.post<{ id: string }>('/v1/environments', { name: 'sandbox', image: 'agentplane/sandbox:latest' })).id;
  const { dir, runnerId } = await pairDaemon(p, principal, 'budget-box');
  daemon = startDaemon(dir);
  await waitFor('the paired runner to be ready', async () => {
    const r = await p.root.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences');
    return r.data.some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined;
  }, 60_000);
}, 120_000);
afterAll(async () => {
  if (daemon && daemon.exitCode === null && daemon.signalCode === null) {
    const exited = new Promise<void>((r) => daemon?.once('exit', () => r()));
    daemon.kill('SIGTERM');
    const timer = setTimeout(() => daemon?.kill('SIGKILL'), 10_000);
    await exited;
    clearTimeout(timer);
  }
  await p?.stop();
  await oai?.close();
});

async function newSession(): Promise<{ id: string; thread: string }> {
  const s = await p.root.request<{ id: string }>('POST', '/v1/sessions', {
    body: { agent: { name: 'priced agent', model: 'priced', tools: [] }, environment_id: envId, budget: { max_list_cost: { amount: BUDGET } } },
  });
  expect(s.status).toBe(201);
  const threads = await p.root.get<{ data: { id: string }[] }>(`/v1/sessions/${s.body.id}/threads`);
  return { id: s.body.id, thread: threads.data[0]?.id ?? '' };
}

const events = async (s: { id: string; thread: string }) =>
  (await p.root.get<{ data: Ev[]; next_page: string | null }>(`/v1/sessions/${s.id}/threads/${s.thread}/events`, { limit: 1000 })).data;
const view = (id: string) => p.root.get<SessionView>(`/v1/sessions/${id}`);
const usage = async (id: string) => (await p.root.get<{ summary: UsageSummary }>(`/v1/sessions/${id}/usage`)).summary;

/** Sends one user.message and waits until the thread is idle again after it. */
async function turn(s: { id: string; thread: string }, text: string): Promise<Ev[]> {
  const idleBefore = (await events(s)).filter((e) => e.type === 'session.status_idle').length;
  const r = await p.root.request('POST', `/v1/sessions/${s.id}/events`, { body: msg(text) });
  expect(r.status, JSON.stringify(r.body)).toBe(201);
  return waitFor('session.status_idle', async () => {
    const evs = await events(s);
    return evs.filter((e) => e.type === 'session.status_idle').length > idleBefore ? evs : undefined;
  }, 60_000);
}

describe('Session budget on user.message', () => {
  let s: { id: string; thread: string };
  let firstTurn: Ev[];

  beforeAll(async () => {
    s = await newSession();
    firstTurn = await turn(s, 'spend the budget');
  }, 90_000);

  it('a turn on a priced model spends past the budget, and its usage is on the Session', async () => {
    expect(firstTurn.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(JSON.stringify(firstTurn.filter((e) => e.type === 'agent.message'))).toContain(REPLY);
    // The turn went through the routing profile to the local provider, with the sealed secret.
    expect(oai.requests).toHaveLength(1);
    const sent = oai.requests[0];
    expect(sent?.body.model).toBe(PRICED_MODEL);
    expect(sent?.headers.authorization).toBe(`Bearer ${SECRET}`);

    // The provider reports prompt_tokens = characters of the messages it got, completion_tokens =
    // one per word + 5 (5 of them reasoning), cached_tokens = 7.
    const promptTokens = JSON.stringify(sent?.body.messages ?? []).length;
    const completionTokens = REPLY.split(' ').length + 5;
    const sess = await view(s.id);
    expect(sess.budget).toEqual({ max_list_cost: { amount: BUDGET, currency: 'USD' } });
    expect(sess.usage.input_tokens).toBe(promptTokens);
    expect(sess.usage.cache_read_input_tokens).toBe(7);
    expect(sess.usage.output_tokens).toBeGreaterThanOrEqual(completionTokens);

    const metered = await usage(s.id);
    expect(metered.steps).toBe(1);
    expect(metered.unpriced_steps).toBe(0);
    expect(metered.usage).toMatchObject({ input_tokens: promptTokens, cached_input_tokens: 7, output_tokens: completionTokens, reasoning_output_tokens: 5 });
    // Priced from the shipped table, and well past the budget.
    const price = findPrice(SHIPPED_PRICES, 'openai', PRICED_MODEL);
    if (!price) throw new Error(`${PRICED_MODEL} has no shipped price`);
    expect(metered.list_cost).toEqual({ amount: nanoToUsd(listCostNanoUsd(price, metered.usage)), currency: 'USD' });
    expect(metered.list_cost.amount).toBeGreaterThan(BUDGET);
  });

  // Reasoning tokens are a subset of output tokens (docs/MODELS.md): counted once in the views.
  it('the Session and thread usage count reasoning tokens once', async () => {
    const metered = await usage(s.id);
    const thread = await p.root.get<{ usage: SessionView['usage'] | null }>(`/v1/sessions/${s.id}/threads/${s.thread}`);
    expect([(await view(s.id)).usage.output_tokens, thread.usage?.output_tokens]).toEqual([metered.usage.output_tokens, metered.usage.output_tokens]);
  });

  it('the next user.message is refused with 429 budget.exceeded, without Retry-After, and nothing reaches the log', async () => {
    const before = await events(s);
    const statsBefore = (await view(s.id)).stats;
    const runsBefore = (await p.root.get<{ data: unknown[] }>(`/v1/sessions/${s.id}/runs`)).data;
    const providerCalls = oai.requests.length;

    const refused = await p.root.request('POST', `/v1/sessions/${s.id}/events`, { body: msg('one more, please') });
    expect(refused.status).toBe(429);
    expect(errorOf(refused)).toMatchObject({ type: 'budget.exceeded', message: expect.stringContaining('Session budget') });
    // A Session budget has no reset: no boundary is known, so no Retry-After.
    expect(refused.headers.get('retry-after')).toBeNull();
    // The same with an Idempotency-Key.
    const keyed = await p.root.request('POST', `/v1/sessions/${s.id}/events`, { body: msg('one more, please'), idempotencyKey: `budget-${s.id}` });
    expect([keyed.status, errorOf(keyed)?.type]).toEqual([429, 'budget.exceeded']);

    // Nothing was appended, no Run was created, the model was not called, the thread stays idle.
    expect(await events(s)).toEqual(before);
    const after = await view(s.id);
    expect(after.stats).toEqual(statsBefore);
    expect(after.status).toBe('idle');
    expect((await p.root.get<{ data: unknown[] }>(`/v1/sessions/${s.id}/runs`)).data).toEqual(runsBefore);
    expect(oai.requests).toHaveLength(providerCalls);
  });

  it('raising the budget admits the next turn again', async () => {
    const raised = await p.root.request('POST', `/v1/sessions/${s.id}`, { body: { budget: { max_list_cost: { amount: 1 } } } });
    expect(raised.status).toBe(200);
    const evs = await turn(s, 'and now?');
    expect(evs.filter((e) => e.type === 'session.status_idle').at(-1)?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    expect((await usage(s.id)).steps).toBe(2);
  });
});

describe('Session budget on create', () => {
  it('a create whose initial user.message would start a turn on a spent budget is refused, and nothing is created', async () => {
    const listed = async () => (await p.root.get<{ data: unknown[] }>('/v1/sessions', { limit: 100 })).data.length;
    const before = await listed();
    const body = {
      agent: { name: 'priced agent', model: 'priced', tools: [] }, environment_id: envId,
      budget: { max_list_cost: { amount: 0 } }, initial_events: [msg('start right away')],
    };
    const refused = await p.root.request('POST', '/v1/sessions', { body });
    expect(refused.status).toBe(429);
    expect((refused.body as { error: { type: string } }).error.type).toBe('budget.exceeded');
    expect(await listed()).toBe(before);
    // Without a first message no turn starts: the same budget is fine.
    const { initial_events: _skip, ...quiet } = body;
    void _skip;
    expect((await p.root.request('POST', '/v1/sessions', { body: quiet })).status).toBe(201);
  });
});
