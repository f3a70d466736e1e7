// bench:a2a-tools — one external A2A tool call through the platform's call path (durable call
// record in Redis, one SendMessage + GetTask polling through the official SDK client, the
// `exec.tool_invocation` append under its producer key, settlement) against a loopback peer built
// on the SDK's server pieces, whose tasks complete at once. Floor, measured in the same run
// against the same peer: the same SendMessage + GetTask exchange made directly with the SDK
// client. Phases alternate floor / platform (BENCH_ROUNDS, default 3), BENCH_CALLS calls each
// (default 200), sequential: p50/p99 latency per call.
import { performance } from 'node:perf_hooks';
import { Redis } from 'ioredis';
import { Role, TaskState, type Task } from '@a2a-js/sdk';
import { EventLog } from '@agentplane/store';
import { A2aToolCalls, peerClient, type ToolSourceDoc } from '@agentplane/api';
import { startPlatform } from '../test/harness/platform.js';
import { cardJson, signCard, signingKey, startSdkPeer } from '../test/harness/a2a-peer.js';
import { printTable, summarize } from './lib/report.js';
import { benchHelp } from './lib/help.js';

benchHelp(import.meta.url);

const CALLS = Number(process.env.BENCH_CALLS ?? 200);
const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const out = (s: string) => process.stdout.write(`${s}\n`);
const POLICY = { initialMs: 1, factor: 2, maxMs: 20, jitter: 0.2, maxRetryAfterMs: 1_000, requestTimeoutMs: 5_000 };

const p = await startPlatform({ env: { AGENTPLANE_MODE: 'development' } });
const peer = await startSdkPeer(undefined, { instant: true });
const redis = new Redis(p.redisUrl());
try {
  const key = await signingKey('bench');
  peer.card = await signCard(cardJson(peer.rpcUrl), key);
  await p.root.post('/v1/provider-packages', { name: 'bench', package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
  const created = await p.root.post<{ id: string }>('/v1/tool-sources', { name: 'bench', provider: 'bench', source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] } });
  const source = await p.root.post<ToolSourceDoc>(`/v1/tool-sources/${created.id}/sync`, {});
  const envId = (await p.root.post<{ id: string }>('/v1/environments', { name: 'bench-env', image: 'agentplane/sandbox:1' })).id;
  const agentId = (await p.root.post<{ id: string }>('/v1/agents', { name: 'bench-agent', model: 'default' })).id;
  const sessionId = (await p.root.post<{ id: string }>('/v1/sessions', { agent: agentId, environment_id: envId })).id;
  const calls = new A2aToolCalls(redis, new EventLog(redis), { policy: POLICY, deadlineMs: 60_000, sweepMs: 60_000 });
  const client = await peerClient(source.discovery!);
  const headers = { authorization: 'Bearer bench' };

  let n = 0;
  const platformCall = async () => {
    const id = `toolu_${(n++).toString(16).padStart(32, '0')}`;
    const r = await calls.invoke({ workspace_id: p.bootstrap.workspace_id, session_id: sessionId, session_thread_id: null, call_id: id, source, tool: 'a2a_bench_summarize', text: 'hi', headers });
    if (r.outcome.status !== 'completed') throw new Error(`call ended ${r.outcome.status}`);
  };
  const directCall = async () => {
    const messageId = `direct-${n++}`;
    const sent = await client.sendMessage({
      tenant: '', metadata: undefined,
      message: { messageId, contextId: '', taskId: '', role: Role.ROLE_USER, metadata: undefined, extensions: [], referenceTaskIds: [], parts: [{ content: { $case: 'text', value: 'hi' }, metadata: undefined, filename: '', mediaType: 'text/plain' }] },
      configuration: { acceptedOutputModes: ['text/plain'], taskPushNotificationConfig: undefined, returnImmediately: true },
    }, { serviceParameters: headers });
    let task = sent as Task;
    while (task.status?.state !== TaskState.TASK_STATE_COMPLETED) task = await client.getTask({ tenant: '', id: task.id }, { serviceParameters: headers });
  };
  const measure = async (fn: () => Promise<void>, into: number[]) => {
    for (let i = 0; i < CALLS; i++) {
      const t = performance.now();
      await fn();
      into.push(performance.now() - t);
    }
  };
  // Warm-up, then alternating phases.
  await measure(directCall, []);
  await measure(platformCall, []);
  const ours: number[] = [];
  const floor: number[] = [];
  for (let r = 0; r < ROUNDS; r++) {
    await measure(directCall, floor);
    await measure(platformCall, ours);
  }
  const a = summarize(ours);
  const b = summarize(floor);
  out(`calls per phase ${CALLS}, rounds ${ROUNDS}; peer requests ${peer.calls.length}`);
  printTable('A2A tool call: platform call path vs direct SDK client (same peer, same exchange)', [
    { metric: 'p50 latency', ours: a.p50, floor: b.p50, unit: 'ms' },
    { metric: 'p99 latency', ours: a.p99, floor: b.p99, unit: 'ms' },
    { metric: 'mean latency', ours: a.mean, floor: b.mean, unit: 'ms' },
  ]);
} finally {
  redis.disconnect();
  await peer.close();
  await p.stop();
}
