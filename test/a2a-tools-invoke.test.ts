import { afterEach, describe, expect, it } from 'vitest';
import { backoffDelay, callPeer, parseRetryAfter, peerClient, type PollPolicy } from '@agentplane/api';
import { startSdkPeer, type SdkPeer } from './harness/a2a-peer.js';

const POLICY: PollPolicy = { initialMs: 20, factor: 2, maxMs: 80, jitter: 0.25, maxRetryAfterMs: 5_000, requestTimeoutMs: 2_000 };
const peers: SdkPeer[] = [];
afterEach(async () => {
  await Promise.all(peers.splice(0).map((p) => p.close()));
});

const discoveryOf = (peer: SdkPeer) => ({ interface: { url: peer.rpcUrl, protocol_binding: 'JSONRPC' as const, protocol_version: '1.0' }, agent_name: 'peer', agent_version: '1' });

describe('polling policy', () => {
  it('backs off exponentially with bounded, task-specific jitter, capped', () => {
    const delays = [1, 2, 3, 4, 5, 6].map((a) => backoffDelay(POLICY, 'task-a', a));
    expect(backoffDelay(POLICY, 'task-a', 0)).toBe(0);
    [20, 40, 80, 80, 80, 80].forEach((base, i) => {
      expect(delays[i]).toBeGreaterThanOrEqual(Math.floor(base * 0.75));
      expect(delays[i]).toBeLessThanOrEqual(POLICY.maxMs);
    });
    expect([1, 2, 3, 4, 5, 6].map((a) => backoffDelay(POLICY, 'task-a', a))).toEqual(delays);
    expect([1, 2, 3, 4, 5, 6].map((a) => backoffDelay(POLICY, 'task-b', a))).not.toEqual(delays);
  });

  it('accepts only valid Retry-After values within the ceiling', () => {
    const now = Date.parse('2026-11-24T10:00:00Z');
    expect(parseRetryAfter('2', now, 5_000)).toBe(2_000);
    expect(parseRetryAfter('Tue, 24 Nov 2026 10:00:03 GMT', now, 5_000)).toBe(3_000);
    for (const bad of ['-1', '1.5', 'soon', '', 'Tue, 24 Nov 2026 09:59:00 GMT', '600', null]) expect(parseRetryAfter(bad, now, 5_000)).toBeNull();
  });
});

describe('one consumed call against a loopback A2A peer', () => {
  it('sends once, polls at once, honours Retry-After on 429 and returns the completed task text', async () => {
    let busyAt = 0;
    const peer = await startSdkPeer((method, n, res) => {
      if (method !== 'GetTask' || n > 2) return false;
      if (n === 2) {
        busyAt = Date.now();
        peer.release();
      }
      res.writeHead(429, { 'retry-after': '1', 'content-type': 'application/json' }).end('{}');
      return true;
    });
    peers.push(peer);
    const out = await callPeer({ discovery: discoveryOf(peer), headers: { authorization: 'Bearer peer-secret' }, text: 'hello', messageId: 'msg-1', deadlineAt: Date.now() + 10_000, policy: POLICY });
    expect(out).toMatchObject({ status: 'completed', text: 'done: hello' });
    const methods = peer.calls.map((c) => c.method);
    expect(methods.filter((m) => m === 'SendMessage')).toHaveLength(1);
    expect(methods[0]).toBe('SendMessage');
    expect(peer.calls.every((c) => c.authorization === 'Bearer peer-secret' && c.version === '1.0')).toBe(true);
    // Polling starts immediately: the first GetTask follows the send with no backoff.
    expect(peer.calls[1]!.method).toBe('GetTask');
    // The poll after the second 429 waited the peer's Retry-After (1 s), not the 20-80 ms backoff.
    const third = peer.calls.filter((c) => c.method === 'GetTask')[2]!;
    expect(third.at - busyAt).toBeGreaterThanOrEqual(950);
  });

  it('ignores an invalid Retry-After and keeps backing off within the cap', async () => {
    const peer = await startSdkPeer((method, n, res) => {
      if (method !== 'GetTask' || n > 1) return false;
      peer.release();
      res.writeHead(503, { 'retry-after': 'later' }).end();
      return true;
    });
    peers.push(peer);
    const started = Date.now();
    const out = await callPeer({ discovery: discoveryOf(peer), headers: {}, text: 'x', messageId: 'msg-2', deadlineAt: Date.now() + 10_000, policy: POLICY });
    expect(out.status).toBe('completed');
    expect(Date.now() - started).toBeLessThan(3_000);
  });

  it('a peer that never completes loses to the hard deadline: indeterminate, and no call after it', async () => {
    const peer = await startSdkPeer();
    peers.push(peer);
    // When each request leaves the caller: "no call after the deadline" is about what the caller
    // issues (a request sent just before it may reach the peer just after it on a loaded machine).
    const client = await peerClient(discoveryOf(peer));
    const issued: number[] = [];
    const timed = new Proxy(client, {
      get(target, key, receiver) {
        const value: unknown = Reflect.get(target, key, receiver);
        if (typeof value !== 'function') return value;
        const fn = value as (...args: unknown[]) => unknown;
        return key === 'sendMessage' || key === 'getTask'
          ? (...args: unknown[]) => (issued.push(Date.now()), fn.apply(target, args))
          : fn.bind(target);
      },
    });
    const deadlineAt = Date.now() + 400;
    const out = await callPeer({ discovery: discoveryOf(peer), headers: {}, text: 'forever', messageId: 'msg-3', deadlineAt, policy: POLICY }, timed);
    expect(out.status).toBe('indeterminate');
    expect(out.task_id).toBeTruthy();
    // It gives up at most one capped, jittered delay (80 ms + 25 %) before the deadline, when the next poll could not come before it.
    expect(Date.now()).toBeGreaterThanOrEqual(deadlineAt - 101);
    expect(peer.calls.filter((c) => c.method === 'SendMessage')).toHaveLength(1);
    // Every request the peer saw was one of those timed, and none was issued after the deadline.
    expect(issued.length).toBe(out.polls + 1);
    expect(peer.calls.length).toBeLessThanOrEqual(issued.length);
    expect(issued.every((at) => at <= deadlineAt)).toBe(true);
    // Polls are capped at maxMs apart, so a 400 ms deadline sees a bounded handful.
    expect(out.polls).toBeGreaterThanOrEqual(1);
    expect(out.polls).toBeLessThan(40);
    peer.release();
  });

  it('refuses any request outside the provider package\'s egress ceiling, or to an address the guard refuses, before it leaves', async () => {
    const peer = await startSdkPeer();
    peers.push(peer);
    const development = { development: true, allowPrivate: false };
    const out = await callPeer({
      discovery: discoveryOf(peer), headers: {}, text: 'x', messageId: 'msg-e', deadlineAt: Date.now() + 5_000, policy: POLICY,
      egress: { rpcUrl: `${peer.base}/other`, policy: development },
    });
    expect(out.status).toBe('error');
    expect(out.text).toContain('egress refused');
    expect(peer.calls).toHaveLength(0);
    // In production mode the loopback peer is a private address: refused before anything connects.
    const refused = await callPeer({
      discovery: discoveryOf(peer), headers: {}, text: 'x', messageId: 'msg-e1', deadlineAt: Date.now() + 5_000, policy: POLICY,
      egress: { rpcUrl: peer.rpcUrl, policy: { development: false, allowPrivate: false } },
    });
    expect(refused.status).toBe('error');
    expect(refused.text).toMatch(/egress to 127\.0\.0\.1 is refused: it resolves to a private or reserved address/);
    expect(peer.calls).toHaveLength(0);
    const inside = callPeer({
      discovery: discoveryOf(peer), headers: {}, text: 'y', messageId: 'msg-e2', deadlineAt: Date.now() + 5_000, policy: POLICY,
      egress: { rpcUrl: peer.rpcUrl, policy: development },
      onPoll: () => peer.release(),
    });
    expect((await inside).status).toBe('completed');
    expect(peer.calls.map((c) => c.method)).toContain('SendMessage');
  });

  it('a deadline already past calls nothing', async () => {
    const peer = await startSdkPeer();
    peers.push(peer);
    const out = await callPeer({ discovery: discoveryOf(peer), headers: {}, text: 'late', messageId: 'msg-4', deadlineAt: Date.now() - 1, policy: POLICY });
    expect(out.status).toBe('indeterminate');
    expect(peer.calls).toHaveLength(0);
  });
});

describe('streaming', () => {
  it('sends one SendStreamingMessage and, after the connection drops, resumes with SubscribeToTask only', async () => {
    const peer = await startSdkPeer();
    peers.push(peer);
    peer.dropStreams = 1;
    const seenStates: string[] = [];
    const call = callPeer({
      discovery: discoveryOf(peer), headers: { authorization: 'Bearer s' }, text: 'streamed', messageId: 'msg-s1', deadlineAt: Date.now() + 10_000, policy: POLICY, streaming: true,
      onPoll: (state) => {
        seenStates.push(state);
        // Once resumed, the peer may finish.
        if (peer.calls.some((c) => c.method === 'SubscribeToTask')) peer.release();
      },
    });
    const out = await call;
    expect(out).toMatchObject({ status: 'completed', text: 'done: streamed' });
    const methods = peer.calls.map((c) => c.method);
    expect(methods.filter((m) => m === 'SendStreamingMessage' || m === 'SendMessage')).toEqual(['SendStreamingMessage']);
    expect(methods).toContain('SubscribeToTask');
    expect(methods).not.toContain('GetTask');
    expect(seenStates).toContain('TASK_STATE_COMPLETED');
  });

  it('a stream that never settles loses to the hard deadline', async () => {
    const peer = await startSdkPeer();
    peers.push(peer);
    const out = await callPeer({ discovery: discoveryOf(peer), headers: {}, text: 'forever', messageId: 'msg-s2', deadlineAt: Date.now() + 300, policy: POLICY, streaming: true });
    expect(out.status).toBe('indeterminate');
    expect(peer.calls.map((c) => c.method)).toEqual(['SendStreamingMessage']);
    peer.release();
  });
});
