import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WebSocket } from 'ws';
import type { HttpClient } from '@agentplane/client';
import { frame, MODEL_GATEWAY_PROTOCOL } from '@agentplane/protocol';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { connectRawRunner, dockerHello, pairedRunnerSecret, type RawRunner, type RunnerFrame } from './harness/raw-runner.js';
import { developerWorkspace } from './harness/turns.js';

/**
 * Model steps and tool checks are served only under a lease its attempt still holds: a runner
 * that stopped renewing its lease (the Run was rescheduled) is refused, and its open model
 * streams end when the lease is revoked.
 */
let p: Platform;
let api: HttpClient;
let principal = '';
let envId = '';
let secret = '';
const sockets: WebSocket[] = [];
type Frame = RunnerFrame<Record<string, unknown>>;

const script = (rules: unknown) => '```scripted\n' + JSON.stringify({ rules }) + '\n```';
const modelRequest = (system?: string) => ({
  routing_key: 'default', ...(system ? { system } : {}), messages: [{ role: 'user', content: [{ type: 'text', text: 'hello' }] }], tools: [],
});

beforeAll(async () => {
  p = await startPlatform({ scheduler: true, runner: false, env: { LOG_LEVEL: 'warn', LEASE_MS: '3000', STALLED_INTERVAL_MS: '500', RUN_BACKOFF_MS: '100', OFFER_TIMEOUT_MS: '1500' } });
  ({ api, principal, envId } = await developerWorkspace(p, 'model-lease'));
  secret = await pairedRunnerSecret(p, principal, 'model-lease-box');
}, 120_000);
afterAll(async () => {
  for (const s of sockets) s.terminate();
  await p?.stop();
});

describe('model steps and tool checks need a live lease', () => {
  it('a lease that ended (not renewed, the Run rescheduled): its open stream ends at the revocation, new model steps and tool checks are refused', async () => {
    const r: RawRunner<Frame> = await connectRawRunner<Frame>(p, secret, dockerHello([MODEL_GATEWAY_PROTOCOL], { held: [] }));
    sockets.push(r.sock);
    const session = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: envId });
    await api.post(`/v1/sessions/${session.id}/events`, { type: 'user.message', payload: { content: 'hi', authored_by: principal, caused_by: { kind: 'api' } } });
    const offer = await waitFor('offer', () => r.frames.find((f) => f.type === 'lease.offer'), 15_000);
    const runId = String(offer.payload.run_id);
    const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
    r.sock.send(frame('lease.accept', 'a1', ref));
    await waitFor('running', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status === 'running' ? true : undefined), 10_000);

    // While the lease is live: a slow step opens (it would take a minute).
    r.sock.send(frame('model.request', 'm0', { ...ref, stream_id: 'slow-1', request: modelRequest(script([{ then: [{ sleep_ms: 60_000 }, { reply: 'late' }] }])) }));
    // The lease is never renewed: wait until the platform has moved on.
    await waitFor('the lease lost', async () => {
      const run = await api.get<Record<string, unknown>>(`/v1/runs/${runId}`);
      const second = r.frames.find((f) => f.type === 'lease.offer' && f.payload.lease_id !== ref.lease_id);
      return second || run.status !== 'running' || Number(run.attempt ?? 1) > ref.attempt ? true : undefined;
    }, 30_000);
    expect(r.frames.some((f) => f.type === 'model.end' && f.payload.stream_id === 'slow-1')).toBe(false);

    // A heartbeat of the old lease is answered with its revocation, which ends the open stream.
    r.sock.send(frame('lease.heartbeat', 'h1', ref));
    await waitFor('revoked', () => r.frames.find((f) => f.type === 'lease.revoked' && f.payload.lease_id === ref.lease_id), 10_000);
    const slowEnd = await waitFor('the open stream ends', () => r.frames.find((f) => f.type === 'model.end' && f.payload.stream_id === 'slow-1'), 10_000);
    expect(slowEnd.payload.event).toMatchObject({ type: 'end', stop_reason: 'canceled' });

    // A new model step under the old lease is refused, and nothing is spent.
    const before = (await api.get<{ summary: { steps: number } }>(`/v1/sessions/${session.id}/usage`).catch(() => ({ summary: { steps: 0 } }))).summary.steps;
    r.sock.send(frame('model.request', 'm1', { ...ref, stream_id: 'late-1', request: modelRequest() }));
    const end = await waitFor('model.end', () => r.frames.find((f) => f.type === 'model.end' && f.payload.stream_id === 'late-1'), 15_000);
    expect(end.payload.event).toMatchObject({ type: 'error', error: { type: 'policy.denied', retryable: false } });
    const after = (await api.get<{ summary: { steps: number } }>(`/v1/sessions/${session.id}/usage`).catch(() => ({ summary: { steps: 0 } }))).summary.steps;
    expect(after).toBe(before);

    // So is a tool check.
    r.sock.send(frame('tool.check', 't1', { ...ref, tool_use_id: 'tu_1', tool: { kind: 'builtin', name: 'bash' }, input: { command: 'true' } }));
    const decision = await waitFor('tool.decision', () => r.frames.find((f) => f.type === 'tool.decision' && f.payload.tool_use_id === 'tu_1'), 10_000);
    expect(decision.payload.decision).toBe('deny');
  }, 90_000);
});
