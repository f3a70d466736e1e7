import net from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { HttpClient } from '@agentplane/client';
import { frame, MODEL_GATEWAY_PROTOCOL, type LeaseRef, type Payload } from '@agentplane/protocol';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { connectRawRunner, dockerHello, pairedRunnerSecret, runnerConnectUrl, type RawRunner, type RunnerFrame } from './harness/raw-runner.js';
import { developerWorkspace, FAST_LEASES, untilEvents } from './harness/turns.js';

/**
 * The runner edge against what a runner (or anything else that reaches the connect path) may
 * send it: a connection reset while its upgrade is refused, a hello sent twice, a hello naming
 * leases that are not (or no longer) its own, a turn's end whose result the Run cannot record.
 * The runner here is a protocol client written in the test, so every frame is seen.
 */
let p: Platform;
let api: HttpClient;
let principal = '';
let envId = '';
const sockets: WebSocket[] = [];
type Frame = RunnerFrame<Record<string, unknown>>;

beforeAll(async () => {
  p = await startPlatform({ scheduler: true, runner: false, env: { ...FAST_LEASES, LOG_LEVEL: 'warn' } });
  ({ api, principal, envId } = await developerWorkspace(p, 'gateway-edge'));
}, 120_000);

afterAll(async () => {
  for (const s of sockets) s.terminate();
  await p?.stop();
});

async function connect(secret: string, held: Payload<'hello'>['held_leases'] = [], slots = 1): Promise<RawRunner<Frame>> {
  const r = await connectRawRunner<Frame>(p, secret, dockerHello([MODEL_GATEWAY_PROTOCOL], { held, slots }));
  sockets.push(r.sock);
  return r;
}

/** A turn started and its lease accepted by `r`: the Run is running under it. */
async function leased(r: RawRunner<Frame>): Promise<{ session: string; runId: string; ref: LeaseRef }> {
  const before = r.frames.length;
  const session = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: envId });
  await api.post(`/v1/sessions/${session.id}/events`, { type: 'user.message', payload: { content: 'hi', authored_by: principal, caused_by: { kind: 'api' } } });
  // Only this Session's: a Run an earlier test left behind may be offered too.
  const offer = await waitFor('an offer', () => r.frames.slice(before).find((f) => f.type === 'lease.offer' && f.payload.session_id === session.id), 20_000);
  const runId = String(offer.payload.run_id);
  const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
  r.sock.send(frame('lease.accept', `a-${ref.lease_id}`, ref));
  await waitFor('the Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status === 'running' ? true : undefined), 15_000);
  return { session: session.id, runId, ref };
}

/** Asks for an upgrade on `path` with `bearer`, reads the refusal, then resets the connection. */
function refusedThenReset(path: string, bearer: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const c = net.connect(p.port, '127.0.0.1', () => {
      c.write(`GET ${path} HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer ${bearer}\r\n\r\n`);
    });
    c.once('data', (d) => {
      c.resetAndDestroy();
      resolve(d.toString());
    });
    c.on('error', (err) => reject(err));
  });
}

describe('the runner edge', () => {
  it('a second hello, even sent before the first is welcomed, is closed 4422 with at most one welcome', async () => {
    const secret = await pairedRunnerSecret(p, principal, 'hello-twice');
    const sock = new WebSocket(runnerConnectUrl(p.baseUrl), { headers: { authorization: `Bearer ${secret}` } });
    sockets.push(sock);
    const types: string[] = [];
    sock.on('message', (d) => types.push((JSON.parse(d.toString()) as { type: string }).type));
    const closed = new Promise<number>((r) => sock.on('close', (code) => r(code)));
    await new Promise<void>((r) => sock.once('open', () => r()));
    const hello = dockerHello([MODEL_GATEWAY_PROTOCOL]);
    sock.send(frame('hello', 'h1', hello));
    sock.send(frame('hello', 'h2', hello));
    expect(await closed).toBe(4422);
    expect(types.filter((t) => t === 'welcome').length).toBeLessThanOrEqual(1);
  }, 60_000);

  it('welcome resumes only the held leases still the runner\'s: not one never offered to it, not one lost while it was away', async () => {
    const secret = await pairedRunnerSecret(p, principal, 'resume-box');
    const first = await connect(secret);
    const { runId, ref } = await leased(first);
    first.sock.terminate();
    await first.closed;
    // Back inside the lease: it is resumed; a lease id it was never given is not.
    const second = await connect(secret, [ref, { lease_id: 'never-offered-to-this-runner', attempt: 1 }]);
    expect(second.frames.find((f) => f.type === 'welcome')?.payload.resumed_leases).toEqual([ref]);
    second.sock.terminate();
    await second.closed;
    // Away longer than the lease: it is lost (the Run goes back to the queue), and not resumed.
    await waitFor('the lease lost', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status !== 'running' ? true : undefined), 60_000);
    const third = await connect(secret, [ref]);
    expect(third.frames.find((f) => f.type === 'welcome')?.payload.resumed_leases).toEqual([]);
    third.sock.terminate();
    await third.closed;
  }, 120_000);

  it('a turn\'s end whose result the Run cannot record is refused before anything is written; a valid one then ends the turn', async () => {
    const secret = await pairedRunnerSecret(p, principal, 'result-box');
    const r = await connect(secret, [], 3);
    const answer = (id: string) => waitFor(`the answer to ${id}`, () => r.frames.find((f) => f.re === id), 15_000);
    const refused = { type: 'error', payload: { code: 'invalid_result', retryable: false } };

    const a = await leased(r);
    r.sock.send(frame('lease.complete', 'c1', { ...a.ref, result: { stop_reason: 'not an object' } }));
    expect(await answer('c1')).toMatchObject(refused);
    expect((await api.get<{ status: string }>(`/v1/runs/${a.runId}`)).status).toBe('running');
    r.sock.send(frame('lease.complete', 'c1-again', { ...a.ref, result: { stop_reason: { type: 'end_turn' } } }));
    expect(await answer('c1-again')).toMatchObject({ type: 'ack' });
    const events = await untilEvents(api, a.session, (es) => es.some((e) => e.type === 'session.status_idle'), 15_000);
    expect(events.filter((e) => e.type === 'session.status_idle').map((e) => e.payload)).toEqual([{ stop_reason: { type: 'end_turn' } }]);

    const b = await leased(r);
    const waiting = { type: 'requires_action', tool_use_ids: ['toolu_x'] };
    r.sock.send(frame('lease.complete', 'c2', { ...b.ref, result: { stop_reason: waiting, waits: 'x' } }));
    expect(await answer('c2')).toMatchObject(refused);
    r.sock.send(frame('lease.complete', 'c3', { ...b.ref, result: { stop_reason: waiting, waits: [{ tool_use_id: 'toolu_x', kind: 'made_up' }] } }));
    expect(await answer('c3')).toMatchObject(refused);
    expect((await api.get<{ status: string }>(`/v1/runs/${b.runId}`)).status).toBe('running');
  }, 120_000);

  it('a runner cannot fail a Run it was offered but never accepted: the lease is revoked, the Run is not failed', async () => {
    const secret = await pairedRunnerSecret(p, principal, 'fail-box');
    const r = await connect(secret);
    const session = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default' }, environment_id: envId });
    await api.post(`/v1/sessions/${session.id}/events`, { type: 'user.message', payload: { content: 'hi', authored_by: principal, caused_by: { kind: 'api' } } });
    const offer = await waitFor('an offer', () => r.frames.find((f) => f.type === 'lease.offer' && f.payload.session_id === session.id), 20_000);
    const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
    r.sock.send(frame('lease.fail', 'f1', { ...ref, failure_class: 'work', reason: 'never accepted' }));
    await waitFor('the lease revoked', () => r.frames.find((f) => f.type === 'lease.revoked' && f.payload.lease_id === ref.lease_id), 15_000);
    expect((await api.get<{ status: string }>(`/v1/runs/${String(offer.payload.run_id)}`)).status).not.toBe('failed');
  }, 60_000);

  it('a client that resets its connection after a refused upgrade does not take the API down', async () => {
    expect(await refusedThenReset('/v1/runners/connect', 'ap_runner_unknown_credential')).toMatch(/^HTTP\/1\.1 401 /);
    expect(await refusedThenReset('/internal/gateway-link', 'not-a-link-ticket')).toMatch(/^HTTP\/1\.1 401 /);
    // Still serving, and still taking runners.
    const r = await p.root.request('GET', '/v1/runner-pools/presences', { signal: AbortSignal.timeout(10_000) });
    expect(r.status).toBe(200);
    const runner = await connect(await pairedRunnerSecret(p, principal, 'after-reset'));
    expect(runner.frames.some((f) => f.type === 'welcome')).toBe(true);
  }, 60_000);

  it('a refused upgrade whose peer never closes its side is let go all the same', async () => {
    const closedBy = await new Promise<{ refusal: string; ended: boolean }>((resolve, reject) => {
      let refusal = '';
      let ended = false;
      // allowHalfOpen: this client reads the refusal and its end, and never ends its own side.
      const c = net.connect({ port: p.port, host: '127.0.0.1', allowHalfOpen: true }, () => {
        c.write('GET /v1/runners/connect HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\nAuthorization: Bearer ap_runner_unknown_credential\r\n\r\n');
      });
      c.on('data', (d) => void (refusal += d.toString()));
      // Once the refusal has ended, the client keeps its side open and probes it: the server's
      // socket, once let go, answers a probe with a reset.
      let probe: NodeJS.Timeout | undefined;
      c.on('end', () => {
        ended = true;
        probe = setInterval(() => c.write('.'), 250);
      });
      c.on('close', () => {
        clearInterval(probe);
        resolve({ refusal, ended });
      });
      c.on('error', (err) => {
        if ((err as NodeJS.ErrnoException).code !== 'ECONNRESET' && (err as NodeJS.ErrnoException).code !== 'EPIPE') reject(err);
      });
    });
    expect(closedBy.refusal).toMatch(/^HTTP\/1\.1 401 /);
    expect(closedBy.ended).toBe(true);
  }, 30_000);
});
