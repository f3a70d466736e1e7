import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { developerWorkspace, type Json } from './harness/turns.js';
import { startOpenAiServer, type ProviderServer } from './fixtures/provider-servers.js';

/**
 * A skill proposal's authoring job retried after its model step failed mid-answer: each attempt
 * is its own model step for the usage ledger, so the workspace is charged for both provider
 * calls (the cut one's output, and the whole answer of the retry), not for the first alone.
 * No runner: the source Session only needs to exist.
 */
let p: Platform;
let api: HttpClient;
let oai: ProviderServer;
let envId: string;

const CREATE = { 'service-version': '2026-08-29' };
const ANSWER = {
  name: 'house-greeting', description: 'Greets visitors in the house style.', instructions: 'Greet with GREETING-OK and the visitor\'s name.',
  task: 'Greet the visitor named Ada.', rubric: '- The answer greets Ada with GREETING-OK',
};

type Totals = { steps: number; usage: { input_tokens: number; output_tokens: number; reasoning_output_tokens: number } };
const usage = async (): Promise<Totals> => {
  const r = await p.root.request('GET', `/v1/organizations/workspaces/${p.bootstrap.workspace_id}/usage`);
  expect(r.status).toBe(200);
  return (r.body as { total: Totals }).total;
};

beforeAll(async () => {
  // The author's answer, one word per chunk, spaced so that the words reach the gateway before a cut.
  oai = await startOpenAiServer({ text: JSON.stringify(ANSWER, null, 1), chunkDelayMs: 20 });
  p = await startPlatform();
  ({ api, envId } = await developerWorkspace(p, 'authoring-retry'));
  const ws = p.bootstrap.workspace_id;
  expect((await p.root.request('POST', `/v1/organizations/workspaces/${ws}/model-credentials`, { body: { key: 'local', provider_key: 'openai', base_url: oai.url } })).status).toBe(201);
  expect((await p.root.request('POST', `/v1/organizations/workspaces/${ws}/model-routing-profiles`, {
    body: { key: 'author', candidates: [{ credential_key: 'local', provider_model: 'local-model' }] },
  })).status).toBe(201);
}, 120_000);
afterAll(async () => {
  await p?.stop();
  await oai?.close();
});

describe('skill proposal authoring retried after a mid-stream failure', () => {
  it('charges the retried attempt as its own step', async () => {
    const agent = (await api.post<{ id: string }>('/v1/agents', { name: 'greeter', model: 'default', system: 'Be brief.' })).id;
    const source = (await api.post<{ id: string }>('/v1/sessions', { agent, environment_id: envId })).id;
    const before = await usage();
    const requestsBefore = oai.requests.length;
    // The first call streams its opening words, then the connection drops (a retryable failure
    // after output, charged its estimate); the job's retry gets the whole answer.
    oai.behavior = { ...oai.behavior, mode: 'cut', failTimes: 1 };
    const created = await api.request<Json & { id: string }>('POST', '/v1/skill-proposals', { body: { source_session_ids: [source], model_routing_profile_key: 'author' }, headers: CREATE });
    expect(created.status).toBe(201);
    const drafted = await waitFor('the proposal authored', async () => {
      const x = await api.get<Json & { status: string; usage: Totals['usage'] }>(`/v1/skill-proposals/${created.body.id}`);
      return x.status !== 'authoring' ? x : undefined;
    }, 60_000);
    expect(drafted.status).toBe('drafted');
    expect(oai.requests.length - requestsBefore).toBe(2);

    const after = await usage();
    // Two provider calls, two steps charged: the cut one and the retry.
    expect(after.steps - before.steps).toBe(2);
    // The retry's whole answer is in the ledger (the proposal counts that step), beside the cut call's output.
    expect(after.usage.reasoning_output_tokens - before.usage.reasoning_output_tokens).toBe(drafted.usage.reasoning_output_tokens);
    expect(after.usage.output_tokens - before.usage.output_tokens).toBeGreaterThan(drafted.usage.output_tokens);
    expect(after.usage.input_tokens - before.usage.input_tokens).toBeGreaterThan(drafted.usage.input_tokens);
  }, 90_000);
});
