import type { ChildProcess } from 'node:child_process';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { DAEMON_READY_MS, pairDaemon, startDaemon } from './harness/daemon.js';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';

/**
 * A Session's sandbox container removed by hand (`docker rm -f`) while its Run's command runs is
 * the machine's failure, not the agent's: the lease fails as `infrastructure`, the Run is retried
 * in a new container (the workspace volume kept its files) and completes; the turn does not end
 * with an error, and the model is never shown the command as killed.
 */
let p: Platform;
let api: HttpClient;
let owner: string;
let envId: string;
const daemons: ChildProcess[] = [];
const docker = new Docker();

type Json = Record<string, unknown>;
interface Ev { seq: number; type: string; payload: Json }
const SCRIPT = (rules: unknown[]) => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;

beforeAll(async () => {
  p = await startPlatform({ runner: false, scheduler: true, env: { RUN_BACKOFF_MS: '100', RUNNER_HEARTBEAT_INTERVAL_MS: '1000' } });
  api = p.root;
  owner = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: 'owner', principal_type: 'person', display_name: 'Owner',
  })).id;
  envId = (await api.post<{ id: string }>('/v1/environments', { name: 'sb', image: 'agentplane/sandbox:latest' })).id;
}, 90_000);
afterAll(async () => {
  for (const d of daemons) d.kill('SIGKILL');
  await p?.stop();
});

async function events(sessionId: string): Promise<Ev[]> {
  const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${sessionId}/threads`)).data[0]?.id ?? '';
  return (await api.get<{ data: Ev[] }>(`/v1/sessions/${sessionId}/threads/${thread}/events`, { limit: 1000 })).data;
}
const waitEvents = (id: string, pred: (e: Ev[]) => boolean, ms: number) => waitFor('events', async () => {
  const e = await events(id);
  return pred(e) ? e : undefined;
}, ms);

describe('a sandbox container removed by hand during a Run', () => {
  it('fails the lease as infrastructure; the Run is retried in a new container and completes', async () => {
    const { dir, runnerId } = await pairDaemon(p, owner, 'box');
    daemons.push(startDaemon(dir));
    await waitFor('runner ready', async () => ((await api.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined), DAEMON_READY_MS);
    const s = await api.post<{ id: string }>('/v1/sessions', {
      agent: {
        name: 'a', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
        system: SCRIPT([
          // The first attempt marks the workspace and waits; the retry finds the mark and finishes.
          { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: 'if [ -e .once ]; then echo finished; else touch .once; sleep 600; fi' } }] },
          { when: { on: 'tool_result' }, then: [{ reply: 'ok: {{tool_result}}' }] },
        ]),
      },
      environment_id: envId,
    });
    await api.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'go', authored_by: owner, caused_by: { kind: 'api' } } });
    await waitEvents(s.id, (e) => e.some((x) => x.type === 'agent.tool_use'), 60_000);
    const filters = JSON.stringify({ label: [`agentplane.session=${s.id}`] });
    const [container] = await docker.listContainers({ filters });
    expect(container).toBeDefined();
    // The command is under way (its mark is in the workspace) when the container goes.
    await waitFor('command started', async () => {
      const exec = await docker.getContainer(container?.Id ?? '').exec({ Cmd: ['test', '-e', '/workspace/.once'] });
      const stream = await exec.start({});
      stream.resume();
      await new Promise((r) => stream.on('end', r));
      return (await exec.inspect()).ExitCode === 0 ? true : undefined;
    }, 30_000);
    await docker.getContainer(container?.Id ?? '').remove({ force: true });

    const evs = await waitEvents(s.id, (e) => e.some((x) => x.type === 'session.status_idle'), 90_000);
    expect(evs.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(JSON.stringify(evs.filter((e) => e.type === 'agent.message'))).toContain('finished');
    // The model never saw the cut-off command as a result of its own (exit code 137).
    expect(evs.filter((e) => e.type === 'agent.tool_result').map((e) => e.payload.exit_code)).toEqual([0]);
    const runs = (await api.get<{ data: { status: string; attempts: { outcome: string }[] }[] }>(`/v1/sessions/${s.id}/runs`)).data;
    expect(runs).toHaveLength(1);
    expect(runs[0]?.status).toBe('succeeded');
    expect(runs[0]?.attempts.map((a) => a.outcome)).toEqual(['infrastructure_failure', 'succeeded']);
    // A new container of that Session runs, on the same workspace volume.
    const now = await docker.listContainers({ filters });
    expect(now.map((c) => c.Id)).not.toContain(container?.Id);
  }, 120_000 + DAEMON_READY_MS);
});
