import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import Docker from 'dockerode';
import type { HttpClient } from '@agentplane/client';
import { idleCount, SCRIPT, untilEvents } from './harness/turns.js';
import { FIXTURE_PACKAGE, startAcpPlatform, type AcpPlatform } from './harness/acp-fixture.js';

/**
 * An ACP Run whose runner is killed mid-turn is rescheduled like any Run (docs/ACP.md): two
 * runners with the fixture harness; the one holding the lease is killed while the agent's
 * command runs; the lease expires and the other runner runs the turn to its end.
 */
let acp: AcpPlatform;
let api: HttpClient;
let principal: string;
let envId: string;
let daemons: AcpPlatform['daemons'];
const docker = new Docker();

beforeAll(async () => {
  acp = await startAcpPlatform();
  ({ api, principal, envId, daemons } = acp);
  await acp.ready([await acp.daemon('acp-a'), await acp.daemon('acp-b')]);
}, 240_000);
afterAll(async () => {
  await acp?.stop();
});

describe('ACP agent harness and lost leases', () => {
  it('a runner killed mid-turn: the Run is rescheduled and completes on the other runner', async () => {
    const id = (await api.post<{ id: string }>('/v1/sessions', {
      agent: { name: 'acp', model: 'default', tools: [], system: SCRIPT([
        { when: { user_contains: 'slow' }, then: [{ tool: 'run', input: { command: 'sleep 3; echo slept' } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'After: {{tool_result}}' }] },
      ]) },
      environment_id: envId,
    })).id;
    await api.post(`/v1/sessions/${id}/events`, { type: 'user.message', payload: { content: 'slow one', authored_by: principal, caused_by: { kind: 'api' } } });
    await untilEvents(api, id, (e) => e.some((x) => x.type === 'agent.tool_use'));
    const runsOf = async () => (await api.get<{ data: Array<{ status: string; attempts: Array<{ runner_id: string }> }> }>(`/v1/sessions/${id}/runs`)).data;
    const holder = (await runsOf())[0]?.attempts[0]?.runner_id ?? '';
    const victim = daemons.get(holder);
    expect(victim, `runner ${holder} holds the lease`).toBeDefined();
    victim?.kill('SIGKILL');
    daemons.delete(holder);
    const evs = await untilEvents(api, id, (e) => idleCount(e) >= 1, 90_000);
    expect(evs.some((e) => e.type === 'session.thread_status_rescheduled')).toBe(true);
    expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message').at(-1)?.payload)).toContain('After: slept');
    const run = (await runsOf())[0];
    expect(run?.status).toBe('succeeded');
    expect(run?.attempts.map((a) => a.runner_id)).toEqual([holder, [...daemons.keys()][0]]);
    // The harness image layer the sandboxes ran from carries the harness's digest.
    const images = await docker.listImages({ filters: JSON.stringify({ label: [`agentplane.acp.package=${FIXTURE_PACKAGE}`] }) });
    expect(images.length).toBeGreaterThan(0);
  });
});
