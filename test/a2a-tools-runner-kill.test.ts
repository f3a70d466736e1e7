import type { ChildProcess } from 'node:child_process';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { pairDaemon, startDaemon } from './harness/daemon.js';
import { cardJson, signCard, signingKey, startSdkPeer, type SdkPeer } from './harness/a2a-peer.js';
import { FAST_LEASES, idleCount, SCRIPT, untilEvents } from './harness/turns.js';

/**
 * Exactly once across a runner crash: the runner daemon holding the Run is killed with SIGKILL
 * while the peer holds the A2A task open; the Run is rescheduled onto another runner and
 * completes, and the Session has exactly one `exec.tool_invocation` for the call (one send to
 * the peer), carrying the calling Run's thread id.
 */
let p: Platform;
let peer: SdkPeer;
let owner: string;
let envId: string;
let sourceId: string;
const daemons: ChildProcess[] = [];

beforeAll(async () => {
  const key = await signingKey('k1');
  [p, peer] = await Promise.all([
    startPlatform({ runner: false, scheduler: true, env: { ...FAST_LEASES, AGENTPLANE_MODE: 'development', A2A_TOOLS_POLL_INITIAL_MS: '100', A2A_TOOLS_POLL_MAX_MS: '300' } }),
    startSdkPeer(),
  ]);
  peer.card = await signCard(cardJson(peer.rpcUrl), key);
  owner = (await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: 'owner', principal_type: 'person', display_name: 'Owner',
  })).id;
  envId = (await p.root.post<{ id: string }>('/v1/environments', {
    name: 'sandbox', image: 'agentplane/sandbox:latest', resources: { cpu_millis: 1000, memory_mib: 256, disk_mib: 512, max_duration_seconds: 120 },
  })).id;
  await p.root.post('/v1/provider-packages', { name: 'peer', package_version: 1, card_url: peer.cardUrl, rpc_url: peer.rpcUrl });
  sourceId = (await p.root.post<{ id: string }>('/v1/tool-sources', { name: 'peer', provider: 'peer', source: { kind: 'a2a', card_url: peer.cardUrl, verification_keys: [key.jwk] } })).id;
  expect((await p.root.post<{ sync: { state: string } }>(`/v1/tool-sources/${sourceId}/sync`, {})).sync.state).toBe('synced');
}, 120_000);
afterAll(async () => {
  for (const d of daemons) d.kill('SIGKILL');
  await Promise.all([p?.stop(), peer?.close()]);
});

async function daemon(label: string, paired?: { dir: string; runnerId: string }): Promise<{ proc: ChildProcess; runnerId: string }> {
  const { dir, runnerId } = paired ?? (await pairDaemon(p, owner, label));
  const proc = startDaemon(dir);
  daemons.push(proc);
  await waitFor(`${label} ready`, async () => ((await p.root.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data
    .some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined), 60_000);
  return { proc, runnerId };
}

describe('A2A tool call across a runner crash', () => {
  it('kill -9 the runner mid-call: the Run is rescheduled and completes with exactly one exec.tool_invocation', async () => {
    const a = await daemon('box-a');
    const bPaired = await pairDaemon(p, owner, 'box-b');
    const session = (await p.root.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'a2a-user', model: 'default', tools: [],
        system: SCRIPT([
          { when: { user_contains: 'summarize' }, then: [{ tool: 'peer__a2a_peer_summarize', input: { text: 'the quarterly report' } }] },
          { when: { on: 'tool_result' }, then: [{ reply: 'Peer said: {{tool_result}}' }] },
        ]),
        mcp_servers: [{ name: 'peer', type: 'a2a_tool_source', tool_source_id: sourceId }],
      },
      environment_id: envId,
    })).id;
    await p.root.post(`/v1/sessions/${session}/events`, { type: 'user.message', payload: { content: 'summarize please', authored_by: owner, caused_by: { kind: 'api' } } });
    const first = await untilEvents(p.root, session, (e) => idleCount(e) >= 1, 90_000);
    const use = first.filter((e) => e.type === 'agent.tool_use').at(-1);
    expect(use?.payload).toMatchObject({ name: 'peer__a2a_peer_summarize' });
    await p.root.post(`/v1/sessions/${session}/events`, {
      type: 'user.tool_confirmation', payload: { tool_use_id: String(use?.payload.id), result: 'allow', authored_by: owner, caused_by: { kind: 'api' } },
    });

    // The call reached the peer, which holds the task open: the runner dies mid-call.
    await waitFor('the send to the peer', () => (peer.calls.some((c) => c.method === 'SendMessage') ? true : undefined), 60_000);
    const gone = new Promise((r) => a.proc.once('exit', r));
    a.proc.kill('SIGKILL');
    await gone;
    await daemon('box-b', bPaired);
    await untilEvents(p.root, session, (e) => e.some((x) => x.type === 'session.thread_status_rescheduled'), 60_000);
    // Go: the peer completes the task.
    peer.release();

    const all = await untilEvents(p.root, session, (e) => idleCount(e) >= 2, 90_000);
    expect(all.filter((e) => e.type === 'session.status_idle').at(-1)?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(JSON.stringify(all.filter((e) => e.type === 'agent.message').map((e) => e.payload))).toContain('done: the quarterly report');
    const invocations = all.filter((e) => e.type === 'exec.tool_invocation');
    expect(invocations, JSON.stringify(all.map((e) => e.type))).toHaveLength(1);
    expect(invocations[0]?.payload).toMatchObject({ tool_use_id: use?.payload.id, status: 'completed' });
    // The event is on the calling Run's thread.
    expect(invocations[0]?.session_thread_id).toMatch(/^sthr_/);
    expect(invocations[0]?.session_thread_id).toBe(use?.session_thread_id);
    // One consumed call: one send; the run rescheduled once.
    expect(peer.calls.filter((c) => c.method === 'SendMessage' || c.method === 'SendStreamingMessage')).toHaveLength(1);
    expect(all.filter((e) => e.type === 'session.thread_status_rescheduled')).toHaveLength(1);
    const runs = (await p.root.get<{ data: { status: string; attempts: { runner_id: string; outcome: string }[] }[] }>(`/v1/sessions/${session}/runs`)).data;
    const rescheduled = runs.find((r) => r.attempts.length > 1);
    expect(rescheduled?.attempts.map((x) => x.runner_id)).toEqual([a.runnerId, bPaired.runnerId]);
    expect(rescheduled?.status).toBe('succeeded');
  }, 240_000);
});
