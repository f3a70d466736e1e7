import type { ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { EventLog } from '@agentplane/store';
import { A2aToolCalls, type A2aCallInput, type A2aCallSettings, type ToolSourceDoc } from '@agentplane/api';
import { startPlatform, type Platform } from './harness/platform.js';
import { signCard, cardJson, signingKey, startSdkPeer, type SdkPeer } from './harness/a2a-peer.js';
import { spawnOwned } from './harness/spawn.js';

type Json = Record<string, unknown>;

const ROOT = join(import.meta.dirname, '..');
const POLICY = { initialMs: 20, factor: 2, maxMs: 60, jitter: 0.2, maxRetryAfterMs: 2_000, requestTimeoutMs: 2_000 };

let p: Platform;
let peer: SdkPeer;
let redis: Redis;
let source: ToolSourceDoc;
let sessionId: string;
let threadId: string;

beforeAll(async () => {
  const key = await signingKey('k1');
  [p, peer] = await Promise.all([startPlatform({ env: { AGENTPLANE_MODE: 'development', A2A_TOOLS_SWEEP_MS: '60000' } }), startSdkPeer()]);
  redis = new Redis(p.redisUrl());
  peer.card = await signCard(cardJson(peer.rpcUrl), key);
  await p.root.post('/v1/provider-packages', { name: 'peer', package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
  const created = await p.root.post<{ id: string }>('/v1/tool-sources', { name: 'peer', provider: 'peer', source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] } });
  source = await p.root.post<ToolSourceDoc>(`/v1/tool-sources/${created.id}/sync`, {});
  const envId = (await p.root.post<{ id: string }>('/v1/environments', { name: 'a2a-env', image: 'agentplane/sandbox:1' })).id;
  const agentId = (await p.root.post<{ id: string }>('/v1/agents', { name: 'a2a-agent', model: 'default' })).id;
  sessionId = (await p.root.post<{ id: string }>('/v1/sessions', { agent: agentId, environment_id: envId })).id;
  threadId = (await p.root.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]!.id;
});
afterAll(async () => {
  redis?.disconnect();
  await Promise.all([p?.stop(), peer?.close()]);
});

const settings = (deadlineMs: number): A2aCallSettings => ({ policy: POLICY, deadlineMs, sweepMs: 60_000 });
const input = (callId: string, text: string): A2aCallInput => ({
  workspace_id: p.bootstrap.workspace_id, session_id: sessionId, session_thread_id: threadId, call_id: callId, source, tool: 'a2a_peer_summarize', text,
  headers: { authorization: 'Bearer from-vault' },
});

async function invocations(): Promise<Json[]> {
  const page = await p.root.get<{ data: { type: string; payload: Json }[] }>(`/v1/sessions/${sessionId}/threads/${threadId}/events`, { limit: 1000 });
  return page.data.filter((e) => e.type === 'exec.tool_invocation').map((e) => e.payload);
}

/** Starts a call in a child process and resolves once the peer has seen its first GetTask. */
async function callInChild(callId: string, text: string, deadlineMs: number): Promise<ChildProcess> {
  const before = peer.calls.length;
  const child = spawnOwned(process.execPath, ['--import', 'tsx', join(ROOT, 'test/fixtures/a2a-call-child.ts'), JSON.stringify({ redisUrl: p.redisUrl(), settings: settings(deadlineMs), input: input(callId, text) })], {
    cwd: ROOT, stdio: ['ignore', 'pipe', 'pipe'],
  });
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  await Promise.race([
    (async () => {
      while (!peer.calls.slice(before).some((c) => c.method === 'GetTask')) await new Promise((r) => setTimeout(r, 10));
    })(),
    exited.then(() => { throw new Error('the call process ended before polling'); }),
  ]);
  return child;
}

async function kill9(child: ChildProcess): Promise<void> {
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  child.kill('SIGKILL');
  await exited;
}

describe('exactly one exec.tool_invocation per consumed call', () => {
  it('a caller killed mid-call is resumed by polling the same task (no second send), and settles once', async () => {
    const child = await callInChild('toolu_00000000000000000000000000000001', 'first', 30_000);
    await kill9(child);
    expect(peer.calls.filter((c) => c.method === 'SendMessage')).toHaveLength(1);

    const calls = new A2aToolCalls(redis, new EventLog(redis), settings(30_000));
    const resumed = calls.invoke(input('toolu_00000000000000000000000000000001', 'first'));
    peer.release();
    const r = await resumed;
    expect(r.outcome).toMatchObject({ status: 'completed', text: 'done: first' });
    expect(peer.calls.filter((c) => c.method === 'SendMessage')).toHaveLength(1);

    // A retry after the settlement appends nothing and answers the same result.
    const again = await calls.invoke(input('toolu_00000000000000000000000000000001', 'first'));
    expect(again.event.id).toBe(r.event.id);
    expect(again.outcome).toMatchObject({ status: 'completed', text: 'done: first' });
    const evs = await invocations();
    expect(evs).toHaveLength(1);
    expect(evs[0]).toMatchObject({ tool_use_id: 'toolu_00000000000000000000000000000001', tool_source_id: source.id, tool: 'a2a_peer_summarize', skill_id: 'summarize', status: 'completed', result: { type: 'text', text: 'done: first' } });
  });

  it('the due sweep settles a call whose caller died as indeterminate without calling the peer; a late retry gets that result', async () => {
    const child = await callInChild('toolu_00000000000000000000000000000002', 'second', 3_000);
    await kill9(child);
    const calls = new A2aToolCalls(redis, new EventLog(redis), settings(3_000));
    // Before its deadline nothing is due.
    expect(await calls.sweep(Date.now() - 1_000)).toBe(0);
    const seen = peer.calls.length;
    // The sweep runs as if its clock were past the deadline.
    expect(await calls.sweep(Date.now() + 5_000)).toBe(1);
    expect(peer.calls.length).toBe(seen);
    expect(await calls.sweep(Date.now() + 5_000)).toBe(0);

    const late = await calls.invoke(input('toolu_00000000000000000000000000000002', 'second'));
    expect(late.outcome.status).toBe('indeterminate');
    expect(peer.calls.length).toBe(seen);
    const evs = (await invocations()).filter((e) => e.tool_use_id === 'toolu_00000000000000000000000000000002');
    expect(evs).toHaveLength(1);
    expect(evs[0]).toMatchObject({ status: 'indeterminate' });
    expect(await invocations()).toHaveLength(2);
    peer.release();
  });

  it('push: the task-scoped callback only wakes the observer, which re-reads the task with GetTask', async () => {
    const pushPeer = await startSdkPeer(undefined, { push: true });
    try {
      const key = await signingKey('push');
      pushPeer.card = await signCard(cardJson(pushPeer.rpcUrl, { capabilities: { streaming: false, pushNotifications: true, extensions: [] } }), key);
      await p.root.post('/v1/provider-packages', { name: 'pushpeer', package_version: 1, card_url: pushPeer.cardUrl, rpc_url: pushPeer.rpcUrl });
      const created = await p.root.post<{ id: string }>('/v1/tool-sources', { name: 'pushpeer', provider: 'pushpeer', source: { kind: 'a2a', card_url: pushPeer.cardUrl, verification_keys: [key.jwk] } });
      const pushSource = await p.root.post<ToolSourceDoc>(`/v1/tool-sources/${created.id}/sync`, {});
      expect(pushSource.discovery?.push_notifications).toBe(true);

      // Polls 10 s apart: only a notification can settle the call within the test's time.
      const calls = new A2aToolCalls(redis, new EventLog(redis), { policy: { ...POLICY, initialMs: 10_000, maxMs: 10_000 }, deadlineMs: 30_000, sweepMs: 60_000, callbackBaseUrl: p.baseUrl });
      try {
        const started = Date.now();
        const call = calls.invoke({ ...input('toolu_00000000000000000000000000000003', 'pushed'), source: pushSource, tool: 'a2a_pushpeer_summarize' });
        while (!pushPeer.calls.some((c) => c.method === 'GetTask')) await new Promise((r) => setTimeout(r, 10));
        const url = `${p.baseUrl}/v1/a2a-tool-callbacks/${sessionId}/toolu_00000000000000000000000000000003`;
        const forged = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/a2a+json', authorization: 'Bearer forged-forged-forged-forged' }, body: '{}' });
        expect(forged.status).toBe(401);
        pushPeer.release();
        const r = await call;
        expect(r.outcome).toMatchObject({ status: 'completed', text: 'done: pushed' });
        expect(Date.now() - started).toBeLessThan(8_000);
        const raw = JSON.parse((await redis.get(`ap:{s:${sessionId}}:a2acall:toolu_00000000000000000000000000000003`))!) as Json;
        expect(raw.push_digest).toMatch(/^[0-9a-f]{64}$/);
        expect(JSON.stringify(raw)).not.toContain('Bearer');
      } finally {
        calls.close();
      }
    } finally {
      await pushPeer.close();
    }
  });
});
