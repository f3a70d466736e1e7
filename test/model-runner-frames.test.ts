import { readFileSync } from 'node:fs';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { frame, type ModelStreamEvent } from '@agentplane/protocol';
import { FrameModelClient } from '@agentplane/models';
import { LeaseFence, LeaseRecords } from '@agentplane/lease';
import { Redis } from 'ioredis';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { startOpenAiServer, type ProviderServer } from './fixtures/provider-servers.js';
import { connectRawRunner, HELLO, welcomeOf, type RawRunner, type RunnerFrame } from './harness/raw-runner.js';

const SECRET = 'sk-runner-path-SECRET-0011223344556677';

let p: Platform;
let oai: ProviderServer;
let ws: string;
let runnerSecret: string;

type Frame = RunnerFrame<{ stream_id?: string; event?: ModelStreamEvent } & Record<string, unknown>>;

const LEASES = ['lease-1', 'lease-2', 'lease-3'];

async function connect(): Promise<RawRunner<Frame>> {
  // The runner names the leases as still held: a reconnect would otherwise abandon them (and
  // drop their fences) as the leases of a restarted runner.
  const runner = await connectRawRunner<Frame>(p, runnerSecret, { ...HELLO, held_leases: LEASES.map((lease_id) => ({ lease_id, attempt: 1 })) });
  // Model steps need a live lease held by this runner: record the leases these tests use, as
  // the scheduler does when it offers a Run, and claim their fences, as an acceptance does.
  const runnerId = welcomeOf(runner).runner_id;
  const redis = new Redis(p.redisUrl());
  const records = new LeaseRecords(redis);
  const fence = new LeaseFence(redis);
  for (const [i, lease_id] of LEASES.entries()) {
    const run_id = `run_${String(i).repeat(32)}`;
    const session_id = `sess_${'0'.repeat(32)}`;
    await records.put({
      lease_id, attempt: 1, runner_id: runnerId, workspace_id: ws, run_id, session_id,
      thread_id: `sthr_${'0'.repeat(32)}`, pool_id: 'rpool_test', reply_to: 'ap:test:offers',
    }, 600_000);
    await fence.claim({ sessionId: session_id, token: lease_id, runnerId, attempt: 1, runId: run_id }, 600_000);
  }
  redis.disconnect();
  return runner;
}

const request = (routing_key: string, text: string) => ({ routing_key, messages: [{ role: 'user', content: [{ type: 'text', text }] }], tools: [] });
const ofStream = (frames: Frame[], id: string) => frames.filter((f) => f.payload.stream_id === id);
const ended = (frames: Frame[], id: string) => (ofStream(frames, id).some((f) => f.type === 'model.end') ? true : undefined);

beforeAll(async () => {
  oai = await startOpenAiServer({ apiKey: SECRET });
  p = await startPlatform();
  ws = p.bootstrap.workspace_id;
  const pool = await p.root.request('POST', '/v1/runner-pools', { body: { name: 'models-pool', placement: 'managed' } });
  expect(pool.status).toBe(201);
  const key = await p.root.request('POST', `/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
    idempotencyKey: 'rk-models', body: { display_name: 'runner key', role: 'runner', scope: { type: 'workspace', workspace_id: ws } },
  });
  const enr = await p.anon.with({ token: (key.body as { secret: string }).secret }).request('POST', `/v1/runner-pools/${(pool.body as { id: string }).id}/enrollments`, {
    idempotencyKey: 'e-models', body: { machine_label: 'models-1' },
  });
  expect(enr.status).toBe(201);
  runnerSecret = (enr.body as { secret: string }).secret;
  const cred = await p.root.request('POST', `/v1/organizations/workspaces/${ws}/model-credentials`, { body: { key: 'local', provider_key: 'openai', base_url: oai.url, secret: SECRET } });
  expect(cred.status).toBe(201);
  const prof = await p.root.request('POST', `/v1/organizations/workspaces/${ws}/model-routing-profiles`, { body: { key: 'local', candidates: [{ credential_key: 'local', provider_model: 'local-model' }] } });
  expect(prof.status).toBe(201);
});
afterAll(async () => {
  await p?.stop();
  await oai?.close();
});

describe('model-gateway-v1 over the runner WebSocket', () => {
  it('model.request streams model.delta frames and one model.end; no secret in any frame', async () => {
    const { sock, frames, raw } = await connect();
    oai.behavior = { ...oai.behavior, mode: 'text', text: 'Hello over the runner socket.' };
    sock.send(frame('model.request', 'm1', { lease_id: 'lease-1', attempt: 1, stream_id: 's1', request: request('local', 'hi') }));
    sock.send(frame('model.request', 'm2', { lease_id: 'lease-1', attempt: 1, stream_id: 's2', request: request('default', 'hello scripted') }));
    await waitFor('both streams', () => (ended(frames, 's1') && ended(frames, 's2') ? true : undefined), 10_000);
    const s1 = ofStream(frames, 's1');
    expect(s1.slice(0, -1).every((f) => f.type === 'model.delta')).toBe(true);
    expect(s1.flatMap((f) => (f.payload.event?.type === 'text_delta' ? [f.payload.event.text] : [])).join('')).toBe('Hello over the runner socket.');
    expect(s1.at(-1)?.payload.event).toMatchObject({ type: 'end', provider: 'openai', stop_reason: 'end_turn' });
    expect(ofStream(frames, 's2').at(-1)?.payload.event).toMatchObject({ type: 'end', provider: 'scripted' });
    expect(oai.requests.at(-1)?.headers.authorization).toBe(`Bearer ${SECRET}`);
    // Errors come back as model.end too.
    sock.send(frame('model.request', 'm3', { lease_id: 'lease-1', attempt: 1, stream_id: 's3', request: request('missing', 'x') }));
    sock.send(frame('model.request', 'm4', { lease_id: 'lease-1', attempt: 1, stream_id: 's4', request: { routing_key: 'local' } }));
    await waitFor('errors', () => (ended(frames, 's3') && ended(frames, 's4') ? true : undefined), 5000);
    expect(ofStream(frames, 's3')).toEqual([expect.objectContaining({ type: 'model.end', payload: { stream_id: 's3', event: expect.objectContaining({ error: expect.objectContaining({ type: 'model.no_eligible_model' }) }) } })]);
    expect(ofStream(frames, 's4')[0]?.payload.event).toMatchObject({ type: 'error', error: { type: 'validation.malformed' } });
    // A runner spends model budget only for a lease it holds.
    sock.send(frame('model.request', 'm5', { lease_id: 'not-a-lease', attempt: 1, stream_id: 's5', request: request('default', 'x') }));
    sock.send(frame('model.request', 'm6', { lease_id: 'lease-1', attempt: 2, stream_id: 's6', request: request('default', 'x') }));
    await waitFor('refusals', () => (ended(frames, 's5') && ended(frames, 's6') ? true : undefined), 5000);
    for (const id of ['s5', 's6']) {
      expect(ofStream(frames, id)).toEqual([expect.objectContaining({ type: 'model.end', payload: { stream_id: id, event: expect.objectContaining({ error: expect.objectContaining({ type: 'policy.denied' }) }) } })]);
    }
    const all = raw.join('\n');
    expect(all).not.toContain(SECRET);
    expect(all).not.toContain('mcred_');
    expect(readFileSync(p.logFile, 'utf8')).not.toContain(SECRET);
    sock.close();
  });

  it('model.cancel and a closed socket abort the provider request', async () => {
    const { sock, frames } = await connect();
    oai.behavior = { ...oai.behavior, mode: 'text', text: 'a b c d e f g h i j k l m n o p', chunkDelayMs: 80 };
    const before = oai.aborted;
    sock.send(frame('model.request', 'c1', { lease_id: 'lease-2', attempt: 1, stream_id: 'c1', request: request('local', 'slow') }));
    await waitFor('first delta', () => (ofStream(frames, 'c1').length > 0 ? true : undefined), 5000);
    sock.send(frame('model.cancel', 'c1x', { stream_id: 'c1' }));
    await waitFor('end', () => ended(frames, 'c1'), 5000);
    expect(ofStream(frames, 'c1').at(-1)?.payload.event).toMatchObject({ type: 'end', stop_reason: 'canceled' });
    await expect.poll(() => oai.aborted, { timeout: 5000 }).toBe(before + 1);

    sock.send(frame('model.request', 'c2', { lease_id: 'lease-2', attempt: 1, stream_id: 'c2', request: request('local', 'slow') }));
    await waitFor('first delta', () => (ofStream(frames, 'c2').length > 0 ? true : undefined), 5000);
    sock.terminate();
    await expect.poll(() => oai.aborted, { timeout: 5000 }).toBe(before + 2);
    oai.behavior = { ...oai.behavior, chunkDelayMs: 0 };
  });

  it('FrameModelClient (the runner side): a harness drives the scripted default over the socket, and aborts cancel', async () => {
    const { sock, raw } = await connect();
    const client = new FrameModelClient((type, payload) => {
      if (sock.readyState !== WebSocket.OPEN) return false;
      sock.send(frame(type, `f-${Math.random()}`, payload as never));
      return true;
    }, { lease_id: 'lease-3', attempt: 1 });
    sock.on('message', (d) => {
      const f = JSON.parse(d.toString()) as Frame;
      client.deliver(f.type, f.payload as { stream_id: string; event: unknown });
    });
    const system = 'Test agent.\n```scripted\n{"rules": [{"when": {"user_contains": "weather"}, "then": [{"tool": "get_weather", "input": {"city": "Paris"}}]}, {"when": {"after_tool": "get_weather"}, "then": [{"reply": "It is {{tool_result}}."}]}]}\n```';
    const collect = async (req: Parameters<FrameModelClient['stream']>[0], signal = new AbortController().signal) => {
      const out: ModelStreamEvent[] = [];
      for await (const e of client.stream(req, signal)) out.push(e);
      return out;
    };
    const first = await collect({ routing_key: 'default', system, messages: [{ role: 'user', content: [{ type: 'text', text: 'weather?' }] }], tools: [{ name: 'get_weather', description: 'w', input_schema: {} }] });
    const tool = first.find((e) => e.type === 'tool_use');
    if (tool?.type !== 'tool_use') throw new Error('no tool call');
    expect(first.at(-1)).toMatchObject({ type: 'end', stop_reason: 'tool_use', provider: 'scripted' });
    const second = await collect({
      routing_key: 'default', system, tools: [],
      messages: [
        { role: 'user', content: [{ type: 'text', text: 'weather?' }] },
        { role: 'assistant', content: [{ type: 'tool_use', id: tool.id, name: tool.name, input: tool.input }] },
        { role: 'user', content: [{ type: 'tool_result', tool_use_id: tool.id, content: 'sunny' }] },
      ],
    });
    expect(second.flatMap((e) => (e.type === 'text_delta' ? [e.text] : [])).join('')).toBe('It is sunny.');

    oai.behavior = { ...oai.behavior, mode: 'text', text: 'a b c d e f g h i j k l', chunkDelayMs: 80 };
    const before = oai.aborted;
    const ctl = new AbortController();
    const slow: ModelStreamEvent[] = [];
    for await (const e of client.stream({ routing_key: 'local', messages: [{ role: 'user', content: [{ type: 'text', text: 'x' }] }], tools: [] }, ctl.signal)) {
      slow.push(e);
      if (slow.length === 1) ctl.abort();
    }
    expect(slow.at(-1)).toMatchObject({ type: 'end', stop_reason: 'canceled' });
    await expect.poll(() => oai.aborted, { timeout: 5000 }).toBe(before + 1);
    oai.behavior = { ...oai.behavior, chunkDelayMs: 0 };
    expect(raw.join('\n')).not.toContain(SECRET);

    // A dropped socket ends open steps with a retryable error.
    const pending = collect({ routing_key: 'default', system: '```scripted\n{"rules": [{"then": [{"sleep_ms": 5000}, {"reply": "late"}]}]}\n```', messages: [{ role: 'user', content: [{ type: 'text', text: 'x' }] }], tools: [] });
    await new Promise((r) => setTimeout(r, 100));
    sock.terminate();
    client.disconnect();
    expect(await pending).toEqual([{ type: 'error', error: expect.objectContaining({ type: 'runtime.internal', retryable: true }) }]);
  });
});
