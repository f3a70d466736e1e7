import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { waitFor, type Platform } from './harness/platform.js';
import { idleCount, SCRIPT, startTurnPlatform, untilEvents, type Json, type TurnEvent, type TurnPlatform } from './harness/turns.js';
import { startGitServer, type GitServer } from './harness/git-server.js';

/**
 * Session resources end to end: a File uploaded through the API and repositories served by a
 * local git server are materialised into the Session's sandbox workspace before the first Run
 * (by the local runner, started like `npm start`), once; ended Sessions lose their sandbox.
 */
let p: Platform;
let git: GitServer;
let api: HttpClient;
let envId: string;
let msg: TurnPlatform['msg'];
const docker = new Docker();

type Ev = TurnEvent;
const until = (sessionId: string, stop: (events: Ev[]) => boolean): Promise<Ev[]> => untilEvents(api, sessionId, stop, 90_000);

/** The agent runs `command` on any message and replies with its output. */
const shellAgent = (command: string) => ({
  name: 'reader', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
  system: SCRIPT([
    { when: { on: 'tool_result' }, then: [{ reply: 'OUT {{tool_result}}' }] },
    { then: [{ tool: 'bash', input: { command } }] },
  ]),
});

async function turn(sessionId: string, turns: number): Promise<{ reply: string; idle: Json }> {
  await api.post(`/v1/sessions/${sessionId}/events`, msg('go'));
  const evs = await until(sessionId, (e) => idleCount(e) >= turns);
  const idle = evs.filter((e) => e.type === 'session.status_idle').pop()?.payload ?? {};
  const replies = evs.filter((e) => e.type === 'agent.message').map((e) => JSON.stringify(e.payload));
  return { reply: replies.pop() ?? '', idle };
}

async function sandboxOf(sessionId: string): Promise<{ containers: number; volumes: number }> {
  const filters = JSON.stringify({ label: [`agentplane.session=${sessionId}`] });
  const [containers, volumes] = await Promise.all([docker.listContainers({ all: true, filters }), docker.listVolumes({ filters })]);
  return { containers: containers.length, volumes: (volumes.Volumes ?? []).length };
}

beforeAll(async () => {
  git = await startGitServer();
  const first = await git.createRepo('demo', { 'README.md': '# demo\n', 'src/app.txt': 'v1\n' }, { tags: ['v1'] });
  expect(first.commit).toMatch(/^[0-9a-f]{40}$/);
  await git.commit('demo', { 'src/app.txt': 'v2\n' });
  ({ p, api, envId, msg } = await startTurnPlatform({ name: 'resources', env: { GIT_SSL_CAINFO: git.caFile, SANDBOX_REPORT_SECONDS: '1' } }));
}, 180_000);
afterAll(async () => {
  await p?.stop();
  await git?.close();
});

describe('session resources', () => {
  it('a File and repositories (by tag and by default branch) are in the workspace before the first Run, owned by the sandbox user', async () => {
    const file = (await api.uploadFile<{ id: string }>('data.csv', new TextEncoder().encode('a,b\n1,2\n'), { contentType: 'text/csv' })).body;
    const s = await api.post<{ id: string }>('/v1/sessions', {
      agent: shellAgent('cat inputs/data.csv demo/src/app.txt latest/src/app.txt; stat -c %U inputs/data.csv demo/README.md; cat extra.txt 2>/dev/null; true'),
      environment_id: envId,
      resources: [
        { type: 'file', file_id: file.id, mount_path: '/inputs/data.csv' },
        { type: 'repository', url: git.url('demo'), ref: 'v1' },
        { type: 'repository', url: git.url('demo'), mount_path: '/workspace/latest' },
      ],
    });
    const first = await turn(s.id, 1);
    expect(first.idle.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(first.reply).toContain('a,b\\n1,2');
    expect(first.reply).toContain('v1\\nv2');
    expect(first.reply).toContain('agent\\nagent');

    // Materialised once: the File may even be deleted now, the next Run finds it in place.
    await api.delete(`/v1/files/${file.id}`);
    const fetchesBefore = git.requests.length;
    const again = await turn(s.id, 2);
    expect(again.idle.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(again.reply).toContain('a,b\\n1,2');
    expect(again.reply).not.toContain('late arrival');
    expect(git.requests.length).toBe(fetchesBefore);

    // A resource added to the live Session is placed before the next Run.
    const extra = (await api.uploadFile<{ id: string }>('extra.txt', new TextEncoder().encode('late arrival'))).body;
    await api.post(`/v1/sessions/${s.id}/resources`, { type: 'file', file_id: extra.id });
    const third = await turn(s.id, 3);
    expect(third.idle.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(third.reply).toContain('late arrival');
  }, 240_000);

  it('a File whose name is more than a file system takes in UTF-8 bytes is mounted under its name cut to fit', async () => {
    // 200 CJK characters: a filename the API takes (255 characters at most), 600 bytes of UTF-8.
    const long = `${'報'.repeat(200)}.txt`;
    const file = (await api.uploadFile<{ id: string; filename: string }>(long, new TextEncoder().encode('long name'))).body;
    expect(file.filename).toBe(long);
    const s = await api.post<{ id: string }>('/v1/sessions', {
      agent: shellAgent(`cat ${'報'.repeat(83)}.txt`), environment_id: envId, resources: [{ type: 'file', file_id: file.id }],
    });
    const first = await turn(s.id, 1);
    expect(first.idle.stop_reason).toMatchObject({ type: 'end_turn' });
    expect(first.reply).toContain('long name');
  }, 240_000);

  it('a repository that cannot be fetched ends the turn with an error that says why', async () => {
    const s = await api.post<{ id: string }>('/v1/sessions', {
      agent: shellAgent('true'), environment_id: envId, resources: [{ type: 'repository', url: git.url('no-such-repo') }],
    });
    const { idle } = await turn(s.id, 1);
    expect(idle.stop_reason).toMatchObject({ type: 'error' });
    expect(JSON.stringify(idle.stop_reason)).toMatch(/no-such-repo|not found/i);
    const runs = await api.get<{ data: Array<{ status: string }> }>(`/v1/sessions/${s.id}/runs`);
    expect(runs.data[0]?.status).toBe('failed');

    const badRef = await api.post<{ id: string }>('/v1/sessions', {
      agent: shellAgent('true'), environment_id: envId, resources: [{ type: 'repository', url: git.url('demo'), ref: 'no-such-branch' }],
    });
    const bad = await turn(badRef.id, 1);
    expect(bad.idle.stop_reason).toMatchObject({ type: 'error' });
  }, 120_000);

  it('a File deleted before the first Run ends the turn with an error', async () => {
    const file = (await api.uploadFile<{ id: string }>('gone.txt', new TextEncoder().encode('x'))).body;
    const s = await api.post<{ id: string }>('/v1/sessions', {
      agent: shellAgent('true'), environment_id: envId, resources: [{ type: 'file', file_id: file.id }],
    });
    await api.delete(`/v1/files/${file.id}`);
    const { idle } = await turn(s.id, 1);
    expect(idle.stop_reason).toMatchObject({ type: 'error' });
    expect(JSON.stringify(idle.stop_reason)).toContain('no longer exists');
  }, 120_000);

  it('archiving or deleting a Session removes its sandbox and workspace from the runner', async () => {
    const a = await api.post<{ id: string }>('/v1/sessions', { agent: shellAgent('echo kept > note.txt'), environment_id: envId });
    const d = await api.post<{ id: string }>('/v1/sessions', { agent: shellAgent('echo kept > note.txt'), environment_id: envId });
    await turn(a.id, 1);
    await turn(d.id, 1);
    expect(await sandboxOf(a.id)).toEqual({ containers: 1, volumes: 1 });
    expect(await sandboxOf(d.id)).toEqual({ containers: 1, volumes: 1 });
    await api.post(`/v1/sessions/${a.id}/archive`);
    await api.delete(`/v1/sessions/${d.id}`);
    await waitFor('the archived Session\'s sandbox to go', async () => {
      const s = await sandboxOf(a.id);
      return s.containers === 0 && s.volumes === 0 ? true : undefined;
    }, 20_000);
    await waitFor('the deleted Session\'s sandbox to go', async () => {
      const s = await sandboxOf(d.id);
      return s.containers === 0 && s.volumes === 0 ? true : undefined;
    }, 20_000);
  }, 120_000);
});
