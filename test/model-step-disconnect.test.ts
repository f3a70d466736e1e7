import { randomUUID } from 'node:crypto';
import { mkdtempSync, writeFileSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { connect, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { startOpenAiServer, type ProviderServer } from './fixtures/provider-servers.js';

/**
 * A REST model step whose client goes away holds no budget: the estimate its plan reserved is
 * released as soon as the client is gone, whether it left while the provider was streaming or
 * right after sending the request (while the step was still being planned, before its stream
 * started), and no provider request is left running for it. Without that the reservation would
 * hold the budget until it expires (the step deadline and then some, minutes).
 */
let p: Platform;
let ws: string;
let c: HttpClient;
let oai: ProviderServer;

const user = (text: string) => [{ role: 'user', content: [{ type: 'text', text }] }];
/** A step that reserves about 1 USD at the test prices: more than the whole budget below. */
const heldStep = () => JSON.stringify({ routing_key: 'held', messages: user('hold on'), max_output_tokens: 1000 });
/** Bounded well under the reservation's own expiry and the provider's idle timeout. */
const PROMPTLY_MS = 10_000;

beforeAll(async () => {
  // The provider streams two words, then holds the stream open until its client goes.
  oai = await startOpenAiServer({ text: 'one two three four five', holdAfter: 2 });
  const pricesFile = join(mkdtempSync(join(tmpdir(), 'agentplane-step-disconnect-')), 'prices.json');
  writeFileSync(pricesFile, JSON.stringify({ scripted: { 'scripted-priced': { input: 1000, output: 1000 } }, openai: { 'local-model': { input: 1000, output: 1000 } } }));
  p = await startPlatform({ env: { MODEL_PRICES_FILE: pricesFile } });
  const w = await p.root.request('POST', `/v1/organizations/${p.bootstrap.organization_id}/workspaces`, { body: { name: 'step-disconnect' } });
  ws = (w.body as { id: string }).id;
  c = p.root.with({ workspaceId: ws });
  const post = async (path: string, body: unknown) => expect((await c.request('POST', `/v1/organizations/workspaces/${ws}/${path}`, { body })).status).toBe(201);
  await post('model-credentials', { key: 'loc', provider_key: 'openai', base_url: oai.url });
  await post('model-routing-profiles', { key: 'held', candidates: [{ credential_key: 'loc', provider_model: 'local-model' }] });
  await post('model-routing-profiles', { key: 'probe', candidates: [{ credential_key: 'default', provider_model: 'scripted-priced' }] });
  // One step's reservation fills it: while a step holds its reservation, every other is refused.
  expect((await c.request('PUT', `/v1/organizations/workspaces/${ws}/budget`, { body: { max_list_cost: { amount: 0.5 }, period: 'lifetime' } })).status).toBe(200);
}, 120_000);
afterAll(async () => {
  await p?.stop();
  await oai?.close();
});

/** The status a new step gets: 200 when the budget admits it, 429 while another step's reservation holds it. */
const probe = async () => (await c.request('POST', `/v1/organizations/workspaces/${ws}/model-steps`, { body: { routing_key: 'probe', messages: user('probe'), max_output_tokens: 1000 } })).status;
const untilAdmitted = (what: string) => waitFor(what, async () => ((await probe()) === 200 ? true : undefined), PROMPTLY_MS);

/** The audit record of the request with this id, once it exists (written after the step was planned). */
async function audited(requestId: string): Promise<boolean | undefined> {
  let after = 0;
  for (;;) {
    const r = await c.request('POST', '/v1/audit/export', { body: { action: 'models.runModelStepStream', after, limit: 1000 } });
    expect(r.status).toBe(200);
    const page = r.body as { data: { request_id: string | null }[]; next_after: number | null };
    if (page.data.some((x) => x.request_id === requestId)) return true;
    if (page.next_after === null || page.data.length === 0) return undefined;
    after = page.next_after;
  }
}

describe('a REST model step whose client leaves releases its budget reservation', () => {
  it('the client destroys its socket while the stream runs: the budget is free again at once and the provider request is aborted', async () => {
    expect(await probe()).toBe(200);
    const abortedBefore = oai.aborted;
    const url = `${p.baseUrl}/v1/organizations/workspaces/${ws}/model-steps`;
    const socket = await new Promise<Socket>((resolve, reject) => {
      const req = httpRequest(url, { method: 'POST', headers: c.headers({ accept: 'text/event-stream' }, true) }, (res) => {
        expect(res.statusCode).toBe(200);
        res.once('data', () => resolve(res.socket));
      });
      req.on('error', reject);
      req.end(heldStep());
    });
    // The stream runs (the provider holds it open): its reservation holds the budget.
    expect(await probe()).toBe(429);
    socket.destroy();
    await untilAdmitted('the budget admitting a step after the client left mid-stream');
    await expect.poll(() => oai.aborted - abortedBefore, { timeout: PROMPTLY_MS }).toBe(1);
  }, 60_000);

  it('the client destroys its socket right after sending the request, before its stream starts: the budget is free again at once', async () => {
    expect(await probe()).toBe(200);
    const requestsBefore = oai.requests.length;
    const abortedBefore = oai.aborted;
    const requestId = `disconnect-${randomUUID()}`;
    const url = new URL(`${p.baseUrl}/v1/organizations/workspaces/${ws}/model-steps`);
    const body = heldStep();
    const headers = {
      ...c.headers({ accept: 'text/event-stream' }, true), host: url.host, 'x-request-id': requestId, 'content-length': String(Buffer.byteLength(body)), connection: 'close',
    };
    const socket = connect(Number(url.port), url.hostname);
    await new Promise<void>((resolve, reject) => {
      socket.once('connect', resolve);
      socket.once('error', reject);
    });
    socket.write(`POST ${url.pathname} HTTP/1.1\r\n${Object.entries(headers).map(([k, v]) => `${k}: ${v}`).join('\r\n')}\r\n\r\n${body}`);
    socket.destroy();
    // The step was planned (its audit record is written after the plan reserved its estimate)…
    await waitFor('the step planned', () => audited(requestId), PROMPTLY_MS);
    // …and its reservation is gone promptly, not when it expires.
    await untilAdmitted('the budget admitting a step after the client left before the stream');
    // No provider request is left running for it.
    await expect.poll(() => oai.aborted - abortedBefore, { timeout: PROMPTLY_MS }).toBe(oai.requests.length - requestsBefore);
  }, 60_000);
});
