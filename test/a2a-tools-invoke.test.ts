import { afterEach, describe, expect, it } from 'vitest';
import { backoffDelay, callPeer, parseRetryAfter, peerClient, type PollPolicy } from '@agentplane/api';
import type { ServerResponse } from 'node:http';
import { startSdkPeer, type SdkPeer } from './harness/a2a-peer.js';

const POLICY: PollPolicy = { initialMs: 20, factor: 2, maxMs: 80, jitter: 0.25, maxRetryAfterMs: 5_000, requestTimeoutMs: 2_000 };
const peers: SdkPeer[] = [];
afterEach(async () => {
  await Promise.all(peers.splice(0).map((p) => p.close()));
});

/** The most of one peer answer read: 4 MiB and its framing. */
const ANSWER_CEILING = 4 * 1024 * 1024 + 64 * 1024;

/**
 * Writes `prefix`, then 32 MiB of `a` as fast as it is read, then holds the answer open. Settles
 * when the connection closes: whether all 32 MiB were written before it did.
 */
function flood(res: ServerResponse, prefix: string): Promise<{ wroteAll: boolean }> {
  const offered = 32 * 1024 * 1024;
  return new Promise((resolve) => {
    let written = 0;
    let wroteAll = false;
    res.on('close', () => resolve({ wroteAll }));
    res.write(prefix);
    const chunk = Buffer.alloc(64 * 1024, 'a');
    const pump = () => {
      while (written < offered && !res.destroyed) {
        written += chunk.length;
        if (!res.write(chunk)) {
          res.once('drain', pump);
          return;
        }
      }
      if (written >= offered) wroteAll = true;
    };
    pump();
  });
}

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

  it('an answer past the size ceiling is not read on: the call fails at once and the peer connection is closed', async () => {
    let flooded: Promise<{ wroteAll: boolean }> | undefined;
    const peer = await startSdkPeer((method, _n, res) => {
      if (method !== 'SendMessage') return false;
      res.writeHead(200, { 'content-type': 'application/json' });
      flooded = flood(res, '{"jsonrpc":"2.0","id":1,"result":{"message":{"messageId":"m","role":"ROLE_AGENT","parts":[{"text":"');
      return true;
    });
    peers.push(peer);
    const out = await callPeer({ discovery: discoveryOf(peer), headers: {}, text: 'x', messageId: 'msg-big', deadlineAt: Date.now() + 30_000, policy: { ...POLICY, requestTimeoutMs: 20_000 } });
    expect(out.status).toBe('error');
    expect(out.text).toContain(`${ANSWER_CEILING}-byte`);
    expect(await flooded).toEqual({ wroteAll: false });
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

  it('a streamed result that grows past 4 Mi characters in appended chunks ends the call as an error, not a result of any size', async () => {
    const sse = (result: unknown) => `data: ${JSON.stringify({ jsonrpc: '2.0', id: 1, result })}\n\n`;
    const peer = await startSdkPeer((method, _n, res) => {
      if (method !== 'SendStreamingMessage') return false;
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = 'c'.repeat(16 * 1024);
      let out = sse({ task: { id: 't-grow', contextId: 't-grow', status: { state: 'TASK_STATE_WORKING' } } });
      // 5 MiB of one artifact, 16 KiB an event, each event well under any per-event limit.
      for (let i = 0; i < 320; i++) out += sse({ artifactUpdate: { taskId: 't-grow', contextId: 't-grow', artifact: { artifactId: 'r', parts: [{ text: chunk }] }, append: i > 0 } });
      out += sse({ statusUpdate: { taskId: 't-grow', contextId: 't-grow', status: { state: 'TASK_STATE_COMPLETED' } } });
      res.end(out);
      return true;
    });
    peers.push(peer);
    const out = await callPeer({ discovery: discoveryOf(peer), headers: {}, text: 'x', messageId: 'msg-grow', deadlineAt: Date.now() + 30_000, policy: POLICY, streaming: true });
    expect(out.status).toBe('error');
    expect(out.task_id).toBe('t-grow');
    expect(out.text).toContain(`${4 * 1024 * 1024} characters`);
  });

  it('the hard deadline wins over a transport whose stream does not end when aborted: indeterminate at the deadline', async () => {
    let closed = false;
    // A client whose stream names a working task, then waits for ever, deaf to its abort signal.
    const deaf = {
      sendMessageStream: () => (async function* () {
        try {
          yield { payload: { $case: 'task', value: { id: 't-deaf', contextId: '', status: { state: 2, message: undefined, timestamp: undefined }, artifacts: [], history: [], metadata: undefined } } };
          await new Promise(() => undefined);
        } finally {
          closed = true;
        }
      })(),
    } as unknown as Parameters<typeof callPeer>[1];
    const started = Date.now();
    const out = await callPeer({ discovery: { interface: { url: 'http://peer.invalid/a2a', protocol_binding: 'JSONRPC', protocol_version: '1.0' }, agent_name: 'p', agent_version: '1' }, headers: {}, text: 'x', messageId: 'msg-deaf', deadlineAt: Date.now() + 300, policy: POLICY, streaming: true }, deaf);
    expect(out).toMatchObject({ status: 'indeterminate', task_id: 't-deaf' });
    expect(Date.now() - started).toBeLessThan(10_000);
    // The generator is suspended in its endless wait: asked to close, not yet closed.
    expect(closed).toBe(false);
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
