import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { WebSocket } from 'ws';
import type { HttpClient } from '@agentplane/client';
import { frame, MODEL_GATEWAY_PROTOCOL } from '@agentplane/protocol';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { connectRawRunner, dockerHello, pairedRunnerSecret, type RawRunner, type RunnerFrame } from './harness/raw-runner.js';
import { developerWorkspace, idleCount, untilEvents } from './harness/turns.js';

/**
 * The runner's `tool.check`, the tool-call boundary of Runs. A tool use whose ActionApproval was
 * approved: the approval covers that very call (same tool and input), for the Run that continues
 * after the use's wait; the same tool use id checked with other input, or by a later Run of the
 * Session, is refused. A file tool's `path_glob` rule holds however the path is spelled. A
 * protocol client written here plays the runner, so each check is exactly the one sent.
 */
let p: Platform;
let api: HttpClient;
let principal = '';
let envId = '';
const sockets: WebSocket[] = [];
type Frame = RunnerFrame<Record<string, unknown>>;
interface Decision { decision: string; rule_id: string | null; message: string }

beforeAll(async () => {
  p = await startPlatform({ scheduler: true, runner: false, env: { LOG_LEVEL: 'warn', OFFER_TIMEOUT_MS: '10000' } });
  ({ api, principal, envId } = await developerWorkspace(p, 'approvals-tool-check'));
}, 120_000);
afterAll(async () => {
  for (const s of sockets) s.terminate();
  await p?.stop();
});

const nextFrame = (r: RawRunner<Frame>, type: string, after: number, match: (f: Frame) => boolean = () => true): Promise<Frame> =>
  waitFor(type, () => r.frames.slice(after).find((f) => f.type === type && match(f)), 15_000);

/** Takes the next offer: accepted, and running once the Run says so. */
async function takeOffer(r: RawRunner<Frame>, after: number): Promise<{ ref: { lease_id: string; attempt: number }; runId: string }> {
  const offer = await nextFrame(r, 'lease.offer', after);
  const ref = { lease_id: String(offer.payload.lease_id), attempt: Number(offer.payload.attempt) };
  const runId = String(offer.payload.run_id);
  r.sock.send(frame('lease.accept', `a-${runId}`, ref));
  await waitFor('the Run running', async () => ((await api.get<{ status: string }>(`/v1/runs/${runId}`)).status === 'running' ? true : undefined), 15_000);
  return { ref, runId };
}

/** One `tool.check` of a builtin tool use; resolves with its `tool.decision`. */
async function checkTool(r: RawRunner<Frame>, ref: { lease_id: string; attempt: number }, frameId: string, toolUseId: string, name: string, input: Record<string, unknown>): Promise<Decision> {
  const at = r.frames.length;
  r.sock.send(frame('tool.check', frameId, { ...ref, tool_use_id: toolUseId, tool: { kind: 'builtin', name }, input }));
  return (await nextFrame(r, 'tool.decision', at, (f) => f.re === frameId)).payload as unknown as Decision;
}
const check = (r: RawRunner<Frame>, ref: { lease_id: string; attempt: number }, frameId: string, toolUseId: string, command: string): Promise<Decision> =>
  checkTool(r, ref, frameId, toolUseId, 'bash', { command });

describe('an approved ActionApproval at the tool-call boundary', () => {
  it('covers its very call for the continuing Run; not other input under the same tool use, nor a later Run', async () => {
    const r = await connectRawRunner<Frame>(p, await pairedRunnerSecret(p, principal, 'tool-check-runner'), dockerHello([MODEL_GATEWAY_PROTOCOL], { slots: 4 }));
    sockets.push(r.sock);
    const rule = (await p.root.post<{ id: string }>('/v1/action-policies', {
      effect: 'require_approval', tool: { kind: 'builtin', name: 'bash' }, arguments: { command_prefix: 'git push' },
    })).id;
    const sessionId = (await api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'pusher', model: 'default', tools: [{ type: 'builtin', name: 'bash' }] }, environment_id: envId,
    })).id;
    const say = (content: string) => api.post(`/v1/sessions/${sessionId}/events`, { type: 'user.message', payload: { content, authored_by: principal, caused_by: { kind: 'api' } } });
    const use = 'toolu_push000001';
    const approvedCommand = 'git push origin main';

    await say('push it');
    const first = await takeOffer(r, 0);
    expect(await check(r, first.ref, 'c1', use, approvedCommand)).toMatchObject({ decision: 'require_approval', rule_id: rule });
    let at = r.frames.length;
    r.sock.send(frame('events.batch', 'b1', {
      ...first.ref, session_id: sessionId,
      events: [{ producer_key: `${first.ref.lease_id}:0`, type: 'agent.tool_use', payload: { id: use, name: 'bash', input: { command: approvedCommand }, blocking: true, awaiting: 'tool_confirmation' } }],
    }));
    await nextFrame(r, 'events.ack', at);
    r.sock.send(frame('lease.complete', 'l1', { ...first.ref, result: { stop_reason: { type: 'requires_action', tool_use_ids: [use] }, waits: [{ tool_use_id: use, kind: 'confirmation' }] } }));
    await untilEvents(api, sessionId, (e) => idleCount(e) >= 1, 15_000);
    const approval = (await p.root.get<{ data: { id: string; tool_use_id: string }[] }>(`/v1/sessions/${sessionId}/action-approvals`)).data[0];
    expect(approval?.tool_use_id).toBe(use);
    at = r.frames.length;
    await p.root.post(`/v1/action-approvals/${approval?.id ?? ''}/approve`, {});

    // The Run that continues after the approval's wait: the approved call is allowed ...
    const second = await takeOffer(r, at);
    expect(await check(r, second.ref, 'c2', use, approvedCommand)).toMatchObject({ decision: 'allow' });
    // ... another command under the same tool use id is not.
    const other = await check(r, second.ref, 'c3', use, 'git push --force origin main');
    expect(other).toMatchObject({ decision: 'deny', rule_id: rule });
    expect(other.message).toContain(`ActionApproval ${approval?.id ?? ''}`);
    r.sock.send(frame('lease.complete', 'l2', { ...second.ref, result: { stop_reason: { type: 'end_turn' } } }));
    await untilEvents(api, sessionId, (e) => idleCount(e) >= 2, 15_000);

    // A later Run of the Session (a message started it) cannot replay the approved use.
    at = r.frames.length;
    await say('and again');
    const third = await takeOffer(r, at);
    expect(await check(r, third.ref, 'c4', use, approvedCommand)).toMatchObject({ decision: 'deny', rule_id: rule });
    // A call the policies allow by themselves is still allowed.
    expect(await check(r, third.ref, 'c5', use, 'git status')).toMatchObject({ decision: 'allow' });
    r.sock.send(frame('lease.complete', 'l3', { ...third.ref, result: { stop_reason: { type: 'end_turn' } } }));
    await untilEvents(api, sessionId, (e) => idleCount(e) >= 3, 15_000);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  }, 120_000);

  it('a deny path_glob refuses the file however the path is spelled', async () => {
    for (const s of sockets.splice(0)) s.terminate();
    const r = await connectRawRunner<Frame>(p, await pairedRunnerSecret(p, principal, 'path-runner'), dockerHello([MODEL_GATEWAY_PROTOCOL], { slots: 4 }));
    sockets.push(r.sock);
    const rule = (await p.root.post<{ id: string }>('/v1/action-policies', {
      effect: 'deny', tool: { kind: 'builtin', name: 'read' }, arguments: { path_glob: '/workspace/secrets/**' },
    })).id;
    const sessionId = (await api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'reader', model: 'default', tools: [{ type: 'builtin', name: 'read' }] }, environment_id: envId,
    })).id;
    await api.post(`/v1/sessions/${sessionId}/events`, { type: 'user.message', payload: { content: 'read it', authored_by: principal, caused_by: { kind: 'api' } } });
    const lease = await takeOffer(r, 0);
    const paths = ['/workspace/secrets/key', '/workspace/./secrets/key', '/workspace//secrets/key', '/workspace/notes/../secrets/key'];
    for (const [i, path] of paths.entries()) {
      expect(await checkTool(r, lease.ref, `p${i}`, `toolu_read00000${i}`, 'read', { path }), path).toMatchObject({ decision: 'deny', rule_id: rule });
    }
    expect(await checkTool(r, lease.ref, 'p9', 'toolu_read000009', 'read', { path: '/workspace/notes/key' })).toMatchObject({ decision: 'allow' });
    r.sock.send(frame('lease.complete', 'l4', { ...lease.ref, result: { stop_reason: { type: 'end_turn' } } }));
    await untilEvents(api, sessionId, (e) => idleCount(e) >= 1, 15_000);
    await p.root.request('DELETE', `/v1/action-policies/${rule}`);
  }, 120_000);
});
