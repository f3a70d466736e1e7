import { EventEmitter, once } from 'node:events';
import { createServer, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { LeaseFence, LeaseRecords } from '@agentplane/lease';
import { CLOSE, frame, type ModelStreamEvent } from '@agentplane/protocol';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { sample } from './harness/metrics.js';
import { connectRawRunner, HELLO, welcomeOf, type RunnerFrame } from './harness/raw-runner.js';

/**
 * The gateway's send bound on a runner socket (docs/PROTOCOL.md, "Timing"): a runner that stops
 * reading its socket is closed 4413 once more than the bound waits for it, instead of the gateway
 * holding every frame sent to it; the model step streaming to it is aborted at its provider; the
 * runner reconnects, its lease is resumed and it takes model steps again.
 *
 * The frames are a model step's: its provider (here, below) streams as fast as it is read, so a
 * runner that does not read makes the gateway the only place they can wait.
 */
type Frame = RunnerFrame<{ stream_id?: string; event?: ModelStreamEvent } & Record<string, unknown>>;
type Outcome = 'complete' | 'aborted';

/** Far above the bound and the kernel's socket buffers: a gateway that holds everything lets the whole reply through. */
const REPLY_CAP_BYTES = 96 * 1024 * 1024;
const DELTA = 'x'.repeat(256 * 1024);
const LEASE = { lease_id: 'lease-backlog', attempt: 1 };

let p: Platform;
let ws: string;
let runnerSecret: string;
let provider: Server;
/** Emits `outcome` once per provider request: `complete` (the whole reply was read) or `aborted` (its client went first). */
const outcomes = new EventEmitter();

/** OpenAI Chat Completions streaming `DELTA`s as fast as its client reads them, until it goes or `REPLY_CAP_BYTES` are out. */
function startProvider(): Promise<Server> {
  const server = createServer((req, res) => {
    if (req.method === 'GET') return void res.end(JSON.stringify({ data: [{ id: 'big-model' }] }));
    req.resume();
    req.on('end', () => void stream(res));
  });
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve(server)));
}

async function stream(res: ServerResponse): Promise<void> {
  let gone = false;
  res.on('close', () => (gone = true));
  const base = { id: 'chatcmpl-big', object: 'chat.completion.chunk', created: 1_700_000_000, model: 'big-model' };
  let bytes = 0;
  const write = async (chunk: unknown): Promise<void> => {
    const text = `data: ${JSON.stringify(chunk)}\n\n`;
    bytes += text.length;
    if (res.write(text) || gone) return;
    await new Promise<void>((resolve) => {
      const done = () => {
        res.off('drain', done);
        res.off('close', done);
        resolve();
      };
      res.on('drain', done);
      res.on('close', done);
    });
  };
  res.writeHead(200, { 'content-type': 'text/event-stream' });
  await write({ ...base, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }] });
  while (!gone && bytes < REPLY_CAP_BYTES) await write({ ...base, choices: [{ index: 0, delta: { content: DELTA }, finish_reason: null }] });
  if (gone) return void outcomes.emit('outcome', 'aborted' satisfies Outcome);
  await write({ ...base, choices: [{ index: 0, delta: {}, finish_reason: 'stop' }] });
  res.end('data: [DONE]\n\n');
  outcomes.emit('outcome', 'complete' satisfies Outcome);
}

beforeAll(async () => {
  provider = await startProvider();
  p = await startPlatform();
  ws = p.bootstrap.workspace_id;
  const pool = await p.root.post<{ id: string }>('/v1/runner-pools', { name: 'backlog-pool', placement: 'managed' });
  const key = await p.root.post<{ secret: string }>(`/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
    display_name: 'runner key', role: 'runner', scope: { type: 'workspace', workspace_id: ws },
  }, { idempotencyKey: 'rk-backlog' });
  runnerSecret = (await p.anon.with({ token: key.secret }).post<{ secret: string }>(`/v1/runner-pools/${pool.id}/enrollments`, { machine_label: 'backlog-1' }, { idempotencyKey: 'e-backlog' })).secret;
  await p.root.post(`/v1/organizations/workspaces/${ws}/model-credentials`, {
    key: 'big', provider_key: 'openai', base_url: `http://127.0.0.1:${(provider.address() as AddressInfo).port}/v1`, secret: 'sk-backlog-test-0011223344',
  });
  await p.root.post(`/v1/organizations/workspaces/${ws}/model-routing-profiles`, { key: 'big', candidates: [{ credential_key: 'big', provider_model: 'big-model' }] });
}, 120_000);

afterAll(async () => {
  await p?.stop();
  provider?.closeAllConnections();
  await new Promise((r) => provider?.close(r));
});

/** The lease this runner holds, recorded as the scheduler records an offer and claimed as an acceptance claims it. */
async function holdLease(runnerId: string): Promise<void> {
  const redis = new Redis(p.redisUrl());
  try {
    const run_id = `run_${'b'.repeat(32)}`;
    const session_id = `sess_${'b'.repeat(32)}`;
    await new LeaseRecords(redis).put({
      ...LEASE, runner_id: runnerId, workspace_id: ws, run_id, session_id, thread_id: `sthr_${'b'.repeat(32)}`, pool_id: 'rpool_test', reply_to: 'ap:test:offers',
    }, 600_000);
    await new LeaseFence(redis).claim({ sessionId: session_id, token: LEASE.lease_id, runnerId, attempt: 1, runId: run_id }, 600_000);
  } finally {
    redis.disconnect();
  }
}

const step = (routing_key: string, stream_id: string) =>
  frame('model.request', `m-${stream_id}`, { ...LEASE, stream_id, request: { routing_key, messages: [{ role: 'user', content: [{ type: 'text', text: 'hello scripted' }] }], tools: [] } });

describe('a runner that stops reading its socket', () => {
  it('is closed 4413 once the send bound is passed, its model step aborted at the provider; it reconnects, its lease resumed', async () => {
    const stalled = await connectRawRunner<Frame>(p, runnerSecret, { ...HELLO, held_leases: [LEASE] });
    await holdLease(welcomeOf(stalled).runner_id);
    // It takes nothing more off its socket (the kernel's buffers fill, then the gateway's) and
    // asks for a model step, whose reply is far larger than both.
    stalled.sock.pause();
    const outcome = once(outcomes, 'outcome') as Promise<[Outcome]>;
    stalled.sock.send(step('big', 'big-1'));
    // A gateway without a bound holds the whole reply for it; with one, it closes the socket and
    // the step's provider request is aborted before the reply is out.
    expect((await outcome)[0]).toBe('aborted');
    stalled.sock.resume();
    const metrics = await (await fetch(`${p.baseUrl}/metrics`)).text();
    expect(sample(metrics, 'agentplane_gateway_closes_total', { code: String(CLOSE.BACKLOGGED) })).toBe(1);
    // The close frame waits behind what the gateway held for the runner: a runner that reads
    // again in time gets it, else the gateway cuts the connection when its close times out.
    expect([CLOSE.BACKLOGGED, 1006]).toContain(await stalled.closed);

    // It reconnects: its lease is resumed (closing lost no work) and it takes model steps again.
    const back = await connectRawRunner<Frame>(p, runnerSecret, { ...HELLO, held_leases: [LEASE] });
    expect(back.frames.find((f) => f.type === 'welcome')?.payload.resumed_leases).toEqual([LEASE]);
    back.sock.send(step('default', 'small-1'));
    const end = await waitFor('the step\'s end', () => back.frames.find((f) => f.type === 'model.end' && f.payload.stream_id === 'small-1'), 15_000);
    expect(end.payload.event).toMatchObject({ type: 'end', provider: 'scripted' });
    back.sock.close();
  }, 120_000);
});
