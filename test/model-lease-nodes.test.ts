import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { frame, MODEL_GATEWAY_PROTOCOL } from '@agentplane/protocol';
import { startApiNode, type ApiNode } from './harness/cluster-platform.js';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { connectRawRunner, dockerHello, pairedRunnerSecret, type RawRunner, type RunnerFrame } from './harness/raw-runner.js';
import { developerWorkspace } from './harness/turns.js';
import { startOpenAiServer, type ProviderServer } from './fixtures/provider-servers.js';

/**
 * A lease's end reaches the model streams served under it on every API node: two API processes
 * on one Redis, a runner connected to node B streams a model step there, and the Run is cancelled
 * through node A. The provider holds the stream open after its first words, so only the lease's
 * end can end it.
 */
let p: Platform;
let b: ApiNode;
let provider: ProviderServer;
let api: HttpClient;
let principal = '';
let envId = '';
let secret = '';
const runners: RawRunner<Frame>[] = [];
type Frame = RunnerFrame<Record<string, unknown>>;

const request = { routing_key: 'held', messages: [{ role: 'user', content: [{ type: 'text', text: 'hello' }] }], tools: [] };

/** The first frame `match` accepts, received already or when it arrives; rejects after `timeoutMs`. */
function frameWhere(r: RawRunner<Frame>, what: string, match: (f: Frame) => boolean, timeoutMs: number): Promise<Frame> {
  const seen = r.frames.find(match);
  if (seen) return Promise.resolve(seen);
  return new Promise((resolve, reject) => {
    const onMessage = (data: Buffer): void => {
      const f = JSON.parse(data.toString()) as Frame;
      if (!match(f)) return;
      done();
      resolve(f);
    };
    const timer = setTimeout(() => {
      done();
      reject(new Error(`no ${what} within ${timeoutMs} ms`));
    }, timeoutMs);
    const done = (): void => {
      clearTimeout(timer);
      r.sock.off('message', onMessage);
    };
    r.sock.on('message', onMessage);
  });
}

const streamFrame = (type: string, streamId: string) => (f: Frame) => f.type === type && f.payload.stream_id === streamId;

beforeAll(async () => {
  provider = await startOpenAiServer({ text: 'The first words and then the rest of a long answer.', holdAfter: 3 });
  p = await startPlatform({ scheduler: true, runner: false, env: { LOG_LEVEL: 'warn' } });
  b = await startApiNode(p, p.redisUrl(), 'api-b', { LOG_LEVEL: 'warn' });
  ({ api, principal, envId } = await developerWorkspace(p, 'model-lease-nodes'));
  const ws = p.bootstrap.workspace_id;
  await p.root.post(`/v1/organizations/workspaces/${ws}/model-credentials`, { key: 'held', provider_key: 'openai', base_url: provider.url });
  await p.root.post(`/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key: 'held', candidates: [{ credential_key: 'held', provider_model: 'local-model' }] });
  secret = await pairedRunnerSecret(p, principal, 'model-lease-nodes-box');
}, 150_000);
afterAll(async () => {
  for (const r of runners) r.sock.terminate();
  await b?.stop();
  await p?.stop();
  await provider?.close();
});

describe('a lease ended on one node ends its model streams on another', () => {
  it('the Run cancelled through node A: the stream node B serves for its lease ends canceled at once, charged once; a step asked after the cancel ends at once too', async () => {
    const r = await connectRawRunner<Frame>({ baseUrl: b.baseUrl }, secret, dockerHello([MODEL_GATEWAY_PROTOCOL]));
    runners.push(r);
    const session = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: envId });
    await api.post(`/v1/sessions/${session.id}/events`, { type: 'user.message', payload: { content: 'hi', authored_by: principal, caused_by: { kind: 'api' } } });
    const offer = await frameWhere(r, 'lease offer', (f) => f.type === 'lease.offer', 20_000);
    const runId = String(offer.payload.run_id);
    const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
    r.sock.send(frame('lease.accept', 'a1', ref));
    await waitFor('the Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status === 'running' ? true : undefined), 15_000);

    // Node B serves the step: its first words reach the runner, then the provider holds the rest.
    const firstWords = frameWhere(r, 'the first model.delta', streamFrame('model.delta', 'held-1'), 15_000);
    r.sock.send(frame('model.request', 'm1', { ...ref, stream_id: 'held-1', request }));
    const delta = await firstWords;
    expect(delta.payload.event).toMatchObject({ type: 'text_delta' });
    expect(r.frames.some(streamFrame('model.end', 'held-1'))).toBe(false);

    // The Run is cancelled through node A.
    const ended = frameWhere(r, 'the model.end of the held stream', streamFrame('model.end', 'held-1'), 10_000);
    await api.post(`/v1/sessions/${session.id}/events`, { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } });
    const end = await ended;
    expect(end.payload.event).toMatchObject({ type: 'end', stop_reason: 'canceled' });
    // The provider request was aborted (its client went away), and the step's output is charged once.
    await waitFor('the provider to see its client go', () => (provider.aborted >= 1 ? true : undefined), 10_000);
    const usage = await api.get<{ summary: { steps: number; usage: { output_tokens: number } } }>(`/v1/sessions/${session.id}/usage?run_id=${runId}`);
    expect(usage.summary.steps).toBe(1);
    expect(usage.summary.usage.output_tokens).toBeGreaterThan(0);

    // The runner has not let the lease go (its fence still holds), but its Run is cancelled: a
    // step it asks for now (after the announcement) is read once it is registered, and ends at
    // once. Its provider sends nothing this time, so it could end no other way.
    provider.behavior = { ...provider.behavior, holdAfter: 0 };
    const late = frameWhere(r, 'the model.end of a step asked after the cancel', streamFrame('model.end', 'held-2'), 10_000);
    r.sock.send(frame('model.request', 'm2', { ...ref, stream_id: 'held-2', request }));
    const lateEnd = await late;
    expect(lateEnd.payload.event).toMatchObject({ type: 'end', stop_reason: 'canceled' });
    expect(r.frames.some(streamFrame('model.delta', 'held-2'))).toBe(false);
    const after = await api.get<{ summary: { steps: number } }>(`/v1/sessions/${session.id}/usage?run_id=${runId}`);
    expect(after.summary.steps).toBe(1);
  }, 90_000);

  it("a runner's socket lost mid-stream: the provider request it was streaming is aborted at once, not at its next event", async () => {
    provider.behavior = { ...provider.behavior, holdAfter: 3 };
    // A runner of its own (the first one's slot still holds the cancelled lease it never gave back).
    const r = await connectRawRunner<Frame>({ baseUrl: b.baseUrl }, await pairedRunnerSecret(p, principal, 'model-lease-nodes-box-2'), dockerHello([MODEL_GATEWAY_PROTOCOL]));
    runners.push(r);
    const session = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: envId });
    const offered = frameWhere(r, 'lease offer', (f) => f.type === 'lease.offer' && f.payload.session_id === session.id, 20_000);
    await api.post(`/v1/sessions/${session.id}/events`, { type: 'user.message', payload: { content: 'hi', authored_by: principal, caused_by: { kind: 'api' } } });
    const offer = await offered;
    const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
    r.sock.send(frame('lease.accept', 'a2', ref));
    await waitFor('the Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${String(offer.payload.run_id)}`)).status === 'running' ? true : undefined), 15_000);
    const firstWords = frameWhere(r, 'the first model.delta', streamFrame('model.delta', 'lost-1'), 15_000);
    r.sock.send(frame('model.request', 'm3', { ...ref, stream_id: 'lost-1', request }));
    await firstWords;
    const abortedBefore = provider.aborted;
    // The provider holds the rest for good: only the socket's loss can end its request.
    r.sock.terminate();
    await waitFor('the provider to see its client go', () => (provider.aborted > abortedBefore ? true : undefined), 10_000);
  }, 90_000);
});
