import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WebSocket } from 'ws';
import { HttpClient } from '@agentplane/client';
import { cancelMarkKey } from '@agentplane/lease';
import { frame, MODEL_GATEWAY_PROTOCOL, type Payload } from '@agentplane/protocol';
import { connectRedis, type Redis } from '@agentplane/store';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { connectRawRunner, dockerHello, pairedRunnerSecret, type RawRunner, type RunnerFrame } from './harness/raw-runner.js';
import { developerWorkspace, idleCount, untilEvents } from './harness/turns.js';

/**
 * An interrupt whose `lease.cancel` never reaches the runner holding the lease (sent while the
 * runner was between connections, or lost on the way to its gateway node) is not lost: the
 * interrupt leaves a cancel mark on the Run, the lease's next heartbeat finds it, and the
 * cancellation then rides on every `heartbeat.ack` until the runner stops listing the lease.
 * The runner here is a protocol client written in the test, so every frame is seen.
 */
let p: Platform;
let redis: Redis;
let api: HttpClient;
let principal = '';
let envId = '';
let secret = '';
const sockets: WebSocket[] = [];

type Frame = RunnerFrame<Record<string, unknown>>;

async function connect(held: Payload<'hello'>['held_leases'] = []): Promise<RawRunner<Frame>> {
  const r = await connectRawRunner<Frame>(p, secret, dockerHello([MODEL_GATEWAY_PROTOCOL], { held }));
  sockets.push(r.sock);
  return r;
}

const nextFrame = (r: RawRunner<Frame>, type: string, after = 0): Promise<Frame> =>
  waitFor(type, () => r.frames.slice(after).find((f) => f.type === type), 15_000);

const interrupt = { type: 'user.interrupt', payload: { authored_by: '', caused_by: { kind: 'api' } } };

beforeAll(async () => {
  p = await startPlatform({ scheduler: true, runner: false, env: { LOG_LEVEL: 'warn' } });
  redis = connectRedis(p.redisUrl(), { name: 'test' });
  ({ api, principal, envId } = await developerWorkspace(p, 'lease-cancel'));
  interrupt.payload.authored_by = principal;
  secret = await pairedRunnerSecret(p, principal, 'cancel-box');
}, 120_000);

afterAll(async () => {
  for (const s of sockets) s.terminate();
  redis?.disconnect();
  await p?.stop();
});

describe('an interrupt whose lease.cancel did not reach the runner', () => {
  it('is repaired by the lease\'s next heartbeat after the runner reconnects, and repeats in heartbeat.ack until the lease ends', async () => {
    const first = await connect();
    const session = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: envId });
    await api.post(`/v1/sessions/${session.id}/events`, { type: 'user.message', payload: { content: 'hi', authored_by: principal, caused_by: { kind: 'api' } } });
    const offer = await nextFrame(first, 'lease.offer');
    const runId = String(offer.payload.run_id);
    const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
    first.sock.send(frame('lease.accept', 'a1', ref));
    await waitFor('the Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status === 'running' ? true : undefined), 10_000);

    // The runner's connection drops; the interrupt comes while it is away, so its lease.cancel
    // goes nowhere.
    first.sock.terminate();
    await first.closed;
    await api.post(`/v1/sessions/${session.id}/events`, interrupt);
    await waitFor('the cancel mark', async () => ((await redis.exists(cancelMarkKey(session.id, runId))) === 1 ? true : undefined), 10_000);

    // Back, still holding the lease: nothing has told it of the interrupt yet.
    const second = await connect([ref]);
    expect(second.frames.some((f) => f.type === 'lease.cancel')).toBe(false);
    const before = second.frames.length;
    second.sock.send(frame('lease.heartbeat', 'lh1', ref));
    const cancel = await nextFrame(second, 'lease.cancel', before);
    expect(cancel.payload).toMatchObject({ ...ref, reason: 'user.interrupt' });
    expect(cancel.payload.grace_ms).toEqual(expect.any(Number));

    // Until the runner stops listing the lease, every heartbeat.ack carries the cancellation.
    const acked = second.frames.length;
    second.sock.send(frame('heartbeat', 'hb1', { status: 'ready', available_slots: 0, held_leases: [ref] }));
    const ack = await nextFrame(second, 'heartbeat.ack', acked);
    expect(ack.payload.cancellations).toEqual([{ ...ref, reason: 'user.interrupt' }]);

    // The runner stops the work and reports the attempt's end: the turn ends interrupted.
    second.sock.send(frame('lease.complete', 'c1', { ...ref, result: { stop_reason: { type: 'interrupted' } } }));
    await waitFor('the Run ended', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status === 'succeeded' ? true : undefined), 10_000);
    const evs = await untilEvents(api, session.id, (e) => idleCount(e) >= 1, 15_000);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'interrupted' });
    const done = second.frames.length;
    second.sock.send(frame('heartbeat', 'hb2', { status: 'ready', available_slots: 1, held_leases: [] }));
    expect((await nextFrame(second, 'heartbeat.ack', done)).payload.cancellations).toEqual([]);
  }, 60_000);
});
