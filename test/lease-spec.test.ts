import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WebSocket } from 'ws';
import { HttpClient } from '@agentplane/client';
import { cancelMarkKey } from '@agentplane/lease';
import { frame, LEASE_SPEC_PROTOCOL, MODEL_GATEWAY_PROTOCOL, type Payload } from '@agentplane/protocol';
import { connectRedis, type Redis } from '@agentplane/store';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { connectRawRunner, dockerHello, pairedRunnerSecret, type RawRunner, type RunnerFrame } from './harness/raw-runner.js';
import { developerWorkspace, idleCount, untilEvents, type TurnEvent } from './harness/turns.js';

/**
 * Offers whose spec follows (`lease-spec-v1`): the scheduler offers a first attempt at once,
 * without its turn spec, to a runner that says it takes the spec later; the runner accepts (and
 * the lease is claimed) while the spec is built, and the spec comes in a `lease.spec` frame. A
 * runner that does not say so gets the spec inside the offer, as before. A Run interrupted while
 * such an offer is out is never leased: its cancel mark refuses the lease's claim at the gateway.
 * These runners are protocol clients written here, so every frame is seen.
 */
let p: Platform;
let redis: Redis;
let api: HttpClient;
let principal = '';
let envId = '';
const sockets: WebSocket[] = [];

const hello = (planes: string[]): Payload<'hello'> => dockerHello(planes, { slots: 4 });

type Frame = RunnerFrame<Record<string, unknown>>;

async function pairedRunner(label: string, planes: string[]): Promise<RawRunner<Frame>> {
  const r = await connectRawRunner<Frame>(p, await pairedRunnerSecret(p, principal, label), hello(planes));
  sockets.push(r.sock);
  return r;
}

/** Closes a runner and waits until the directory no longer lists it as ready. */
async function closeRunner(r: RawRunner<Frame>): Promise<void> {
  r.sock.close(1000);
  await r.closed;
  await waitFor('no ready runner', async () => {
    const listed = await p.root.get<{ data: { status: string }[] }>('/v1/runner-pools/presences');
    return listed.data.some((x) => x.status === 'ready') ? undefined : true;
  }, 10_000);
}

const nextFrame = (r: RawRunner<Frame>, type: string, after = 0): Promise<Frame> =>
  waitFor(type, () => r.frames.slice(after).find((f) => f.type === type), 15_000);

async function sessionWithMessage(): Promise<string> {
  const s = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: envId });
  await api.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'hi', authored_by: principal, caused_by: { kind: 'api' } } });
  return s.id;
}

/** The Session's events up to its turn's end (its stream, replayed from the start). */
const events = (sessionId: string): Promise<TurnEvent[]> => untilEvents(api, sessionId, (evs) => idleCount(evs) >= 1, 15_000);

beforeAll(async () => {
  p = await startPlatform({ scheduler: true, runner: false, env: { LOG_LEVEL: 'warn', OFFER_TIMEOUT_MS: '10000' } });
  redis = connectRedis(p.redisUrl(), { name: 'test' });
  ({ api, principal, envId } = await developerWorkspace(p, 'lease-spec'));
}, 120_000);

afterAll(async () => {
  for (const s of sockets) s.terminate();
  redis?.disconnect();
  await p?.stop();
});

describe('offers whose spec follows (lease-spec-v1)', () => {
  it('the offer comes without its spec, the runner accepts at once, the spec follows and the turn completes', async () => {
    const r = await pairedRunner('spec-follows', [MODEL_GATEWAY_PROTOCOL, LEASE_SPEC_PROTOCOL]);
    const sessionId = await sessionWithMessage();
    const offer = await nextFrame(r, 'lease.offer');
    expect(offer.payload.session_id).toBe(sessionId);
    expect(offer.payload).not.toHaveProperty('spec');
    const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
    // Accepted before the spec is in: the lease is claimed while it is built.
    r.sock.send(frame('lease.accept', 'a1', ref));
    const spec = await nextFrame(r, 'lease.spec');
    expect(spec.payload).toMatchObject({ ...ref, spec: { run_id: offer.payload.run_id, session_id: sessionId } });
    expect(spec.payload).not.toHaveProperty('error');
    await waitFor('the Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${String(offer.payload.run_id)}`)).status === 'running' ? true : undefined), 10_000);
    const before = r.frames.length;
    r.sock.send(frame('events.batch', 'b1', { ...ref, session_id: sessionId, events: [{ producer_key: `${ref.lease_id}:0`, type: 'agent.message', payload: { content: [{ type: 'text', text: 'hello' }] } }] }));
    await nextFrame(r, 'events.ack', before);
    r.sock.send(frame('lease.complete', 'c1', { ...ref, result: { stop_reason: { type: 'end_turn' } } }));
    await waitFor('the Run succeeded', async () => ((await api.get<{ status: string }>(`/v1/runs/${String(offer.payload.run_id)}`)).status === 'succeeded' ? true : undefined), 10_000);
    const evs = await events(sessionId);
    expect(evs.filter((e) => e.type === 'agent.message')).toHaveLength(1);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    await closeRunner(r);
  }, 60_000);

  it('a runner that does not speak lease-spec-v1 gets the spec inside the offer and no lease.spec frame', async () => {
    const r = await pairedRunner('spec-inline', [MODEL_GATEWAY_PROTOCOL]);
    const sessionId = await sessionWithMessage();
    const offer = await nextFrame(r, 'lease.offer');
    expect(offer.payload.spec).toMatchObject({ run_id: offer.payload.run_id, session_id: sessionId });
    const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
    r.sock.send(frame('lease.accept', 'a1', ref));
    await waitFor('the Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${String(offer.payload.run_id)}`)).status === 'running' ? true : undefined), 10_000);
    r.sock.send(frame('lease.complete', 'c1', { ...ref, result: { stop_reason: { type: 'end_turn' } } }));
    await waitFor('the Run succeeded', async () => ((await api.get<{ status: string }>(`/v1/runs/${String(offer.payload.run_id)}`)).status === 'succeeded' ? true : undefined), 10_000);
    expect(r.frames.some((f) => f.type === 'lease.spec')).toBe(false);
    await closeRunner(r);
  }, 60_000);

  it('a turn that takes thousands of queued message parts gets a spec within a frame: the newest parts, one note for the rest', async () => {
    const r = await pairedRunner('spec-fitted', [MODEL_GATEWAY_PROTOCOL]);
    const sessionId = await sessionWithMessage();
    const first = await nextFrame(r, 'lease.offer');
    const ref = { lease_id: String(first.payload.lease_id), attempt: Number(first.payload.attempt) };
    r.sock.send(frame('lease.accept', 'a1', ref));
    await waitFor('the Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${String(first.payload.run_id)}`)).status === 'running' ? true : undefined), 10_000);
    // Queued while the turn runs: 60 messages of 100 parts each, all the next turn's input.
    for (let m = 0; m < 60; m++) {
      await api.post(`/v1/sessions/${sessionId}/events`, {
        type: 'user.message',
        payload: { content: Array.from({ length: 100 }, (_, i) => ({ type: 'text', text: `m${m} p${i} ${'x'.repeat(80)}` })), authored_by: principal, caused_by: { kind: 'api' } },
      });
    }
    const before = r.frames.length;
    r.sock.send(frame('lease.complete', 'c1', { ...ref, result: { stop_reason: { type: 'end_turn' } } }));
    const next = await nextFrame(r, 'lease.offer', before);
    const spec = next.payload.spec as { history: { role: string; content: { type: string; text?: string }[] }[] };
    expect(Buffer.byteLength(JSON.stringify(next.payload))).toBeLessThan(1024 * 1024);
    const last = spec.history.at(-1);
    expect(last?.role).toBe('user');
    const texts = (last?.content ?? []).map((b) => b.text ?? '');
    expect(texts.some((t) => /^\[agentplane: the first \d+ parts of this message \(\d+ bytes\) were left out/.test(t))).toBe(true);
    expect(texts.at(-1)).toBe(`m59 p99 ${'x'.repeat(80)}`);
    const ref2 = { lease_id: String(next.payload.lease_id), attempt: Number(next.payload.attempt) };
    r.sock.send(frame('lease.accept', 'a2', ref2));
    r.sock.send(frame('lease.complete', 'c2', { ...ref2, result: { stop_reason: { type: 'end_turn' } } }));
    await untilEvents(api, sessionId, (evs) => idleCount(evs) >= 2, 15_000);
    await closeRunner(r);
  }, 90_000);

  it('a turn spec no runner frame can take fails the Run at once, saying why, instead of offering it again and again', async () => {
    const r = await pairedRunner('spec-too-large', [MODEL_GATEWAY_PROTOCOL]);
    // A custom tool whose schema alone is heavier than a frame.
    const tool = { type: 'custom', name: 'huge', description: 'h', input_schema: { type: 'object', description: 'd'.repeat(1_200_000) } };
    const s = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'heavy', model: 'default', tools: [tool] }, environment_id: envId });
    await api.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'hi', authored_by: principal, caused_by: { kind: 'api' } } });
    const evs = await untilEvents(api, s.id, (e) => idleCount(e) >= 1, 20_000);
    const stop = evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason as { type: string; error?: { code: string; message: string } };
    expect(stop).toMatchObject({ type: 'error', error: { code: 'spec_too_large' } });
    expect(stop.error?.message).toMatch(/the turn spec is \d+ bytes/);
    const runId = String(evs.find((e) => e.type === 'session.status_running')?.payload.run_id);
    expect((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status).toBe('failed');
    expect(r.frames.some((f) => f.type === 'lease.offer' && f.payload.run_id === runId)).toBe(false);
    await closeRunner(r);
  }, 60_000);

  it('a Run interrupted while its offer is out is never leased: the acceptance is refused and the turn ends interrupted', async () => {
    const r = await pairedRunner('spec-interrupted', [MODEL_GATEWAY_PROTOCOL, LEASE_SPEC_PROTOCOL]);
    const sessionId = await sessionWithMessage();
    const offer = await nextFrame(r, 'lease.offer');
    const runId = String(offer.payload.run_id);
    const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
    // The scheduler holds the job while the offer is out: the interrupt leaves a cancel mark.
    await api.post(`/v1/sessions/${sessionId}/events`, { type: 'user.interrupt', payload: { authored_by: principal, caused_by: { kind: 'api' } } });
    await waitFor('the cancel mark', async () => ((await redis.exists(cancelMarkKey(sessionId, runId))) === 1 ? true : undefined), 10_000);
    const before = r.frames.length;
    r.sock.send(frame('lease.accept', 'a1', ref));
    const revoked = await nextFrame(r, 'lease.revoked', before);
    expect(revoked.payload).toMatchObject({ ...ref, reason: 'the Run was interrupted' });
    await waitFor('the Run canceled', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status === 'canceled' ? true : undefined), 10_000);
    const run = await api.get<{ attempts: unknown[] }>(`/v1/runs/${runId}`);
    expect(run.attempts).toHaveLength(0);
    // A write under the refused lease is fenced: nothing reaches the log.
    const fenced = r.frames.length;
    r.sock.send(frame('events.batch', 'b1', { ...ref, session_id: sessionId, events: [{ producer_key: `${ref.lease_id}:0`, type: 'agent.message', payload: { content: [{ type: 'text', text: 'late' }] } }] }));
    await nextFrame(r, 'lease.revoked', fenced);
    const evs = await events(sessionId);
    expect(evs.some((e) => e.type === 'agent.message')).toBe(false);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'interrupted' });
    await waitFor('the mark cleared', async () => ((await redis.exists(cancelMarkKey(sessionId, runId))) === 0 ? true : undefined), 10_000);
    await closeRunner(r);
  }, 60_000);
});
