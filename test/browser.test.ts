import type { ChildProcess } from 'node:child_process';
import { existsSync } from 'node:fs';
import Docker from 'dockerode';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import type { HttpClient } from '@agentplane/client';
import { ensureBrowserImage } from '../runner-daemon/src/sandbox/browser-image.js';
import { createPerson, startReadyDaemon } from './harness/daemon.js';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { idleCount, untilEvents, type TurnEvent } from './harness/turns.js';

/**
 * Browser observation end to end, with real Docker and the host's Chromium: a runner claims
 * `browser_observation` only after its browser canary ran, a browser Run waits for such a
 * runner, and the scripted agent writes a page, opens it, reads its accessibility tree, clicks
 * by reference and takes a screenshot that is stored as a File of the Session. A browser killed
 * mid-call ends that call with a clear error and the sandbox goes on; the browser's processes
 * are gone when the Run ends and the sandbox with the Session. Skipped without Chromium.
 */
const hasChromium = existsSync('/usr/lib/chromium/chromium');
const docker = new Docker();

let p: Platform;
let api: HttpClient;
let owner: string;
const daemons: ChildProcess[] = [];
type Json = Record<string, unknown>;
interface Provider { id: string; browser_observation?: { accessibility_tree: boolean; screenshot: boolean }; desktop_observation?: Json }
interface Presence { runner: string; status: string; capabilities: { providers: Provider[] } }
const SCRIPT = (rules: unknown[]) => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;

const PAGE = '<!doctype html><title>Counter</title><h1 id="out">waiting</h1><button onclick="document.getElementById(\'out\').textContent=\'pressed\'">Press me</button>';

beforeAll(async () => {
  if (!hasChromium) return;
  // Built once per machine (content-addressed and cached): later runs only stat the files.
  await ensureBrowserImage({ docker });
  p = await startPlatform({ runner: false, scheduler: true, env: { RUNNER_HEARTBEAT_INTERVAL_MS: '1000', RUNNER_PRESENCE_TTL_MS: '4000' } });
  api = p.root;
  owner = await createPerson(p, 'browser-owner', 'Owner');
}, 120_000);
afterAll(async () => {
  for (const d of daemons) d.kill('SIGKILL');
  await p?.stop();
});

const runner = (label: string, args: string[] = []) => startReadyDaemon<Presence>(p, owner, label, daemons, args, 60_000);

const msg = (content: string) => ({ type: 'user.message', payload: { content, authored_by: owner, caused_by: { kind: 'api' } } });

/** Host pids of the container's Chromium processes (`docker top`). */
async function chromiumPids(container: string): Promise<number[]> {
  const top = (await docker.getContainer(container).top({ ps_args: '-eo pid,args' })) as { Processes?: string[][] };
  return (top.Processes ?? []).filter((row) => row.some((c) => c.includes('/usr/lib/chromium/chromium'))).map((row) => Number(row[0]));
}

const alive = (pid: number): boolean => existsSync(`/proc/${pid}`);

const TOOLS = ['write', 'bash', 'browser_navigate', 'browser_snapshot', 'browser_click', 'browser_type', 'browser_press_key', 'browser_wait_for', 'browser_screenshot']
  .map((name) => ({ type: 'builtin', name }));

/** A Session whose scripted agent builds a page and looks at it, and (second turn) meets a browser crash. */
async function browserSession(environmentId: string): Promise<string> {
  return (await api.post<{ id: string }>('/v1/sessions', {
    agent: {
      name: 'looker', model: 'default', tools: TOOLS,
      system: SCRIPT([
        { when: { user_contains: 'build' }, then: [{ tool: 'write', input: { path: 'site/index.html', content: PAGE } }] },
        { when: { after_tool: 'write' }, then: [{ tool: 'browser_navigate', input: { url: 'file:///workspace/site/index.html' } }] },
        { when: { on: 'tool_result', after_tool: 'browser_navigate', user_contains: 'build' }, then: [{ tool: 'browser_snapshot' }] },
        { when: { after_tool: 'browser_snapshot' }, then: [{ tool: 'browser_click', input: { ref: 'e3', element: 'Press me button' } }] },
        { when: { after_tool: 'browser_click' }, then: [{ tool: 'browser_screenshot' }] },
        { when: { after_tool: 'browser_screenshot' }, then: [{ reply: 'done: {{tool_result}}' }] },
        // The crash turn: open the page, wait for text that never comes (the test kills the browser).
        { when: { user_contains: 'crash' }, then: [{ tool: 'browser_navigate', input: { url: 'file:///workspace/site/index.html' } }] },
        { when: { after_tool: 'browser_navigate', tool_result_contains: 'index.html?again' }, then: [{ tool: 'browser_wait_for', input: { time_ms: 3000 } }] },
        { when: { on: 'tool_result', after_tool: 'browser_navigate', user_contains: 'crash' }, then: [{ tool: 'browser_wait_for', input: { text: 'never shows up', timeout_ms: 45000 } }] },
        { when: { after_tool: 'browser_wait_for', tool_result_contains: 'crashed' }, then: [{ tool: 'bash', input: { command: 'echo sandbox-alive' } }] },
        { when: { after_tool: 'bash' }, then: [{ tool: 'browser_navigate', input: { url: 'file:///workspace/site/index.html?again' } }] },
        { when: { after_tool: 'browser_wait_for' }, then: [{ reply: 'after: {{tool_result}}' }] },
      ]),
    },
    environment_id: environmentId,
  })).id;
}

/** The first turn: write a page, open it, read it, click by reference, take a screenshot. */
async function lookAtPage(sessionId: string, container: string): Promise<void> {
  const events = await untilEvents(api, sessionId, (e) => idleCount(e) >= 1, 90_000);
  const results = new Map<string, TurnEvent>();
  const uses = events.filter((e) => e.type === 'agent.tool_use');
  for (const r of events.filter((e) => e.type === 'agent.tool_result')) {
    const use = uses.find((u) => u.payload.id === r.payload.tool_use_id);
    results.set(String(use?.payload.name), r);
  }
  expect(uses.map((u) => u.payload.name)).toEqual(['write', 'browser_navigate', 'browser_snapshot', 'browser_click', 'browser_screenshot']);
  for (const r of results.values()) expect(r.payload.is_error, String(r.payload.content)).toBe(false);
  const snapshot = String(results.get('browser_snapshot')?.payload.content);
  expect(snapshot).toContain('Page URL: file:///workspace/site/index.html');
  expect(snapshot).toContain('heading "waiting"');
  expect(snapshot).toContain('button "Press me" [ref=e3]');
  // The click went to the button: the page it returns shows the handler's work.
  expect(String(results.get('browser_click')?.payload.content)).toContain('heading "pressed"');

  // The screenshot is a File of the Session; the event names it and carries no image bytes.
  const shot = results.get('browser_screenshot') as TurnEvent;
  const fileId = String(shot.payload.file_id);
  expect(fileId).toMatch(/^file_/);
  expect(String(shot.payload.content)).toContain(fileId);
  expect(JSON.stringify(events)).not.toContain('iVBORw0KGgo');
  const file = await api.get<{ content_type: string; session_id: string; size_bytes: number }>(`/v1/files/${fileId}`);
  expect(file).toMatchObject({ content_type: 'image/png', session_id: sessionId });
  const res = await fetch(api.url(`/v1/files/${fileId}/content`), { headers: api.headers() });
  expect(res.status).toBe(200);
  const png = Buffer.from(await res.arrayBuffer());
  expect(png.subarray(0, 8)).toEqual(Buffer.from([0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a]));
  expect(png.toString('ascii', 12, 16)).toBe('IHDR');
  expect([png.readUInt32BE(16), png.readUInt32BE(20)]).toEqual([1280, 720]);
  expect(png.length).toBe(file.size_bytes);
  // The model saw the screenshot (an image block beside the text), the reply quotes its result.
  expect(JSON.stringify(events.filter((e) => e.type === 'agent.message'))).toContain(fileId);
  expect(events.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
  // The Run's browser ended with the Run.
  expect(await chromiumPids(container)).toEqual([]);
}

/**
 * The second turn: the test kills every Chromium process while `browser_wait_for` runs; the call
 * ends with a clear error, bash still works, the next navigate gets a new browser. The processes
 * of both browsers are gone after the Run, the sandbox after the Session.
 */
async function crashTurn(sessionId: string, container: string): Promise<void> {
  await api.post(`/v1/sessions/${sessionId}/events`, msg('crash it, then again'));
  let killed: number[] = [];
  let live: number[] = [];
  const events = await untilEvents(api, sessionId, (seen) => {
    const waits = seen.filter((e) => e.type === 'agent.tool_use' && e.payload.name === 'browser_wait_for');
    if (waits.length === 1 && killed.length === 0) {
      killed = [-1];
      void chromiumPids(container).then(async (pids) => {
        killed = pids;
        const exec = await docker.getContainer(container).exec({ Cmd: ['bash', '-c', 'kill -9 $(ps -eo pid,args | awk \'$2 == "/usr/lib/chromium/chromium" {print $1}\')'], AttachStdout: true, AttachStderr: true });
        const stream = await exec.start({ hijack: true, stdin: false });
        stream.resume();
      });
    }
    if (waits.length === 2 && live.length === 0) {
      live = [-1];
      void chromiumPids(container).then((pids) => (live = pids));
    }
    return idleCount(seen) >= 2;
  }, 120_000);
  const turn = events.slice(events.findLastIndex((e) => e.type === 'user.message'));
  const uses = turn.filter((e) => e.type === 'agent.tool_use').map((e) => e.payload.name);
  expect(uses).toEqual(['browser_navigate', 'browser_wait_for', 'bash', 'browser_navigate', 'browser_wait_for']);
  const results = turn.filter((e) => e.type === 'agent.tool_result');
  expect(results[1]?.payload.is_error).toBe(true);
  expect(String(results[1]?.payload.content)).toMatch(/^The browser crashed: the browser process exited; the sandbox is unaffected/);
  expect(results[2]?.payload).toMatchObject({ is_error: false, exit_code: 0 });
  expect(String(results[2]?.payload.content)).toContain('sandbox-alive');
  expect(results[3]?.payload.is_error).toBe(false);
  expect(results[4]?.payload.is_error).toBe(false);
  expect(turn.find((e) => e.type === 'session.status_idle')?.payload.stop_reason).toMatchObject({ type: 'end_turn' });
  expect(killed.filter((pid) => pid > 0).length).toBeGreaterThan(0);
  // A killed process lingers until its parent reaps it (the container's init, a moment later).
  await waitFor('the killed browser processes reaped', () => (killed.every((pid) => !alive(pid)) ? true : undefined), 15_000);

  expect(live.filter((pid) => pid > 0).length).toBeGreaterThan(0);
  await waitFor('the browser gone after the Run', async () => ((await chromiumPids(container)).length === 0 && live.every((pid) => !alive(pid)) ? true : undefined), 15_000);
  await api.delete(`/v1/sessions/${sessionId}`);
  await waitFor('the sandbox removed', async () => {
    const gone = await docker.getContainer(container).inspect().then(() => false, (err: { statusCode?: number }) => err.statusCode === 404);
    return gone ? true : undefined;
  }, 60_000);
}

describe.skipIf(!hasChromium)('browser observation', () => {
  let browserRunner = '';
  const sessions: Record<'split' | 'colocated', { id: string; container: string }> = { split: { id: '', container: '' }, colocated: { id: '', container: '' } };
  const containerOf = (sessionId: string): string => `agentplane-${browserRunner}-${sessionId}`.replace(/[^a-zA-Z0-9_.-]/g, '-');

  it('is claimed only where the canary ran; a browser Run waits for such a runner, then looks at its page (split topology)', async () => {
    // Without --browser, or with a browser image that is not there: no claim.
    const [plain, missing] = await Promise.all([
      runner('no-browser', ['--tiers', 'container']),
      runner('missing-image', ['--tiers', 'container', '--browser-image', 'agentplane/sandbox-browser:missing']),
    ]);
    for (const r of [plain, missing]) {
      const provider = r.presence.capabilities.providers.find((x) => x.id === 'docker');
      expect(provider?.browser_observation).toBeUndefined();
    }

    const env = await api.post<{ id: string; browser: boolean }>('/v1/environments', {
      name: 'web', image: 'agentplane/sandbox:latest', browser: true,
      resources: { cpu_millis: 1000, memory_mib: 1024, disk_mib: 512, max_duration_seconds: 120 },
    });
    expect(env.browser).toBe(true);
    // Verified under the container tier only.
    await expect(api.post('/v1/environments', { name: 'gv-web', image: 'agentplane/sandbox:latest', browser: true, tier: 'gvisor' })).rejects.toMatchObject({ status: 400 });
    await expect(api.post('/v1/environments', { name: 'acp-web', image: 'agentplane/sandbox:latest', browser: true, harness: { kind: 'acp', package: 'some-agent', command: 'some-agent' } })).rejects.toMatchObject({ status: 400, body: { error: { type: 'validation.malformed' } } });
    const id = await browserSession(env.id);
    await api.post(`/v1/sessions/${id}/events`, msg('build the page'));
    const waiting = await waitFor('the Run waiting with its reason', async () => {
      const r = (await api.get<{ data: { status: string; waiting_reason?: string | null }[] }>(`/v1/sessions/${id}/runs`)).data[0];
      return r?.status === 'waiting' && r.waiting_reason?.includes('browser') ? r : undefined;
    }, 30_000);
    expect(waiting.waiting_reason).toContain('browser observation not offered');

    const withBrowser = await runner('with-browser', ['--tiers', 'container', '--browser', '--sandbox-report-seconds', '1']);
    const claimed = withBrowser.presence.capabilities.providers.find((x) => x.id === 'docker');
    expect(claimed?.browser_observation).toEqual({ accessibility_tree: true, screenshot: true });
    expect(claimed?.desktop_observation).toEqual({ accessibility_tree: false, screenshot: false, window_inventory: false });
    browserRunner = withBrowser.runnerId;
    sessions.split = { id, container: containerOf(id) };
    await lookAtPage(id, sessions.split.container);
  }, 240_000);

  it('the same turn in the colocated topology: the harness drives Chromium inside the sandbox', async () => {
    expect(browserRunner).not.toBe('');
    const env = await api.post<{ id: string }>('/v1/environments', {
      name: 'web-colocated', image: 'agentplane/sandbox:latest', browser: true, harness_topology: 'colocated',
      resources: { cpu_millis: 1000, memory_mib: 1024, disk_mib: 512, max_duration_seconds: 120 },
    });
    const id = await browserSession(env.id);
    sessions.colocated = { id, container: containerOf(id) };
    await api.post(`/v1/sessions/${id}/events`, msg('build the page'));
    await lookAtPage(id, sessions.colocated.container);
  }, 180_000);

  it.each(['split', 'colocated'] as const)('%s: a browser killed mid-call ends that call with a clear error; the sandbox goes on; processes gone after the Run and the Session', async (topology) => {
    const s = sessions[topology];
    expect(s.id).not.toBe('');
    await crashTurn(s.id, s.container);
  }, 180_000);
});
