import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Docker from 'dockerode';
import { afterAll, describe, expect, it } from 'vitest';
import { HttpClient } from '@agentplane/client';
import { freePort } from '@agentplane/store';
import { ROOT_DIR, waitFor } from './harness/platform.js';
import { alive, Leftovers } from './harness/processes.js';

/**
 * How the platform ends: killed outright (every process it started ends too, within bounds), a
 * terminal's Ctrl-C with a turn in flight (the runner first, while the API it reports to still
 * runs; no sandbox left running; Redis last), and command lines it does not know (exit 2).
 *
 * Each platform is started as a process-group leader (detached) so that `kill(-pid)` signals it
 * the way a terminal's Ctrl-C does.
 */

interface LogLine { level: number; name?: string; service?: string; msg?: string; child?: string; [k: string]: unknown }

interface Started {
  proc: ChildProcess;
  dataDir: string;
  port: number;
  scope: string;
  lines: () => LogLine[];
  stderr: () => string;
  exited: Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>;
  pids: () => Record<string, number | undefined>;
}

const docker = new Docker({ socketPath: process.env.DOCKER_SOCKET ?? '/var/run/docker.sock' });
const left = new Leftovers();
afterAll(() => left.cleanUp());

const parse = (line: string): LogLine => {
  try {
    return JSON.parse(line) as LogLine;
  } catch {
    return { level: 0, msg: line };
  }
};

async function start(env: Record<string, string>, again?: Started): Promise<Started> {
  const dataDir = again?.dataDir ?? mkdtempSync(join(tmpdir(), 'agentplane-stop-'));
  if (!again) left.dirs.push(dataDir);
  const port = again?.port ?? (await freePort());
  // A sandbox scope of its own (a sub-scope of the run's, removed at its end).
  const scope = `${process.env.AGENTPLANE_SANDBOX_SCOPE ?? 'test'}-stop-${port}`;
  const proc = spawn(process.execPath, [join(ROOT_DIR, 'platform/dist/main.js')], {
    env: {
      PATH: process.env.PATH ?? '/usr/bin:/bin', HOME: process.env.HOME ?? '/tmp', DATA_DIR: dataDir, PORT: String(port), LOG_LEVEL: 'info',
      AGENTPLANE_SANDBOX_SCOPE: scope, START_SCHEDULER: 'true', START_RUNNER: 'true', ...env,
    },
    stdio: ['ignore', 'pipe', 'pipe'],
    detached: true,
  });
  let out = '';
  let err = '';
  proc.stdout?.on('data', (d: Buffer) => (out += d.toString('utf8')));
  proc.stderr?.on('data', (d: Buffer) => (err += d.toString('utf8')));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null; at: number }>((r) =>
    proc.once('exit', (code, signal) => r({ code, signal, at: Date.now() })));
  const pids = () => JSON.parse(readFileSync(join(dataDir, 'processes.json'), 'utf8')) as Record<string, number | undefined>;
  const lines = () => out.split('\n').filter((l) => l.length > 0).map(parse);
  await waitFor('the platform to serve', async () => {
    if (proc.exitCode !== null) throw new Error(`platform exited with ${proc.exitCode}: ${out.slice(-2000)} ${err.slice(-2000)}`);
    if (!existsSync(join(dataDir, 'bootstrap.json')) || !existsSync(join(dataDir, 'processes.json'))) return undefined;
    try {
      return (await fetch(`http://127.0.0.1:${port}/healthz`)).status === 200 ? true : undefined;
    } catch {
      return undefined;
    }
  }, 90_000);
  if (env.START_RUNNER !== 'false') await waitFor('the runner to connect', () => (lines().some((l) => l.msg === 'connected to the control plane') ? true : undefined), 120_000);
  for (const pid of Object.values(pids())) if (pid) left.pids.push(pid);
  return { proc, dataDir, port, scope, lines, stderr: () => err, exited, pids };
}

const SCRIPT = (rules: unknown[]) => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;

/** A turn whose bash tool call runs for minutes: a sandbox container is running when this returns. */
async function turnInFlight(p: Started): Promise<string> {
  const boot = JSON.parse(readFileSync(join(p.dataDir, 'bootstrap.json'), 'utf8')) as { root_key: string; workspace_id: string };
  const api = new HttpClient({ baseUrl: `http://127.0.0.1:${p.port}`, token: boot.root_key });
  const owner = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${boot.workspace_id}/principals`, {
    external_subject_id: 'owner', principal_type: 'person', display_name: 'Owner',
  })).id;
  const envId = (await api.post<{ id: string }>('/v1/environments', { name: 'sb', image: 'agentplane/sandbox:latest' })).id;
  const s = await api.post<{ id: string }>('/v1/sessions', {
    agent: {
      name: 'a', model: 'default', tools: [{ type: 'builtin', name: 'bash' }],
      system: SCRIPT([
        { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: 'sleep 600; echo finished' } }] },
        { when: { on: 'tool_result' }, then: [{ reply: 'ok: {{tool_result}}' }] },
      ]),
    },
    environment_id: envId,
  });
  await api.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'go', authored_by: owner, caused_by: { kind: 'api' } } });
  await waitFor('the bash tool call to run in a sandbox', async () => {
    const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${s.id}/threads`)).data[0]?.id;
    if (!thread) return undefined;
    const events = (await api.get<{ data: { type: string }[] }>(`/v1/sessions/${s.id}/threads/${thread}/events`, { limit: 1000 })).data;
    if (!events.some((e) => e.type === 'agent.tool_use')) return undefined;
    return (await running(p.scope)).length > 0 ? true : undefined;
  }, 120_000);
  return s.id;
}

function client(p: Started): HttpClient {
  const boot = JSON.parse(readFileSync(join(p.dataDir, 'bootstrap.json'), 'utf8')) as { root_key: string };
  return new HttpClient({ baseUrl: `http://127.0.0.1:${p.port}`, token: boot.root_key });
}

/** Sandbox containers of this platform's scope that are running. */
async function running(scope: string): Promise<Docker.ContainerInfo[]> {
  return docker.listContainers({ filters: JSON.stringify({ label: ['agentplane.managed=true', `agentplane.scope=${scope}`], status: ['running', 'paused', 'restarting'] }) });
}

describe('stopping the platform', () => {
  it('kill -9 of the platform process alone, a turn in flight: the api, scheduler, runner and redis-server all end, and no sandbox keeps running', async () => {
    const p = await start({});
    await turnInFlight(p);
    const pids = p.pids();
    const children = ['redis', 'api', 'scheduler', 'runner'].map((name) => ({ name, pid: pids[name] as number }));
    for (const c of children) expect(c.pid, c.name).toBeGreaterThan(0);
    p.proc.kill('SIGKILL');
    await p.exited;
    const killed = Date.now();
    // Each stops in its own bounded time: the api's graceful stop (which may hang on a Redis that
    // is gone) ends 10 s after its 10 s grace at most, the watch behind it 5 s later.
    await waitFor('every child of the killed platform to end', () => (children.every((c) => !alive(c.pid)) ? true : undefined), 45_000);
    expect(Date.now() - killed).toBeLessThan(45_000);
    // The runner cancelled its held work and stopped its sandbox on its way out.
    await waitFor('no sandbox of the killed platform running', async () => ((await running(p.scope)).length === 0 ? true : undefined), 10_000);
  }, 300_000);

  it('Ctrl-C with a turn in flight: the runner drains, cancels and stops its sandbox while the API runs; then the API and the scheduler; Redis last', async () => {
    const p = await start({ RUNNER_DRAIN_DEADLINE_MS: '3000' });
    const session = await turnInFlight(p);
    const { redis } = p.pids();
    const sent = Date.now();
    process.kill(-(p.proc.pid as number), 'SIGINT');
    const { code, at } = await p.exited;
    expect(code).toBe(0);
    // The drain deadline (3 s), the cancel, then the other processes: no grace period runs out.
    expect(at - sent).toBeLessThan(20_000);
    expect(alive(redis as number)).toBe(false);
    expect(await running(p.scope)).toEqual([]);

    const lines = p.lines();
    const index = (what: string, pred: (l: LogLine) => boolean): number => {
      const i = lines.findIndex(pred);
      expect(i, `${what} in the log; its end:\n${lines.slice(-60).map((l) => JSON.stringify(l)).join('\n')}`).toBeGreaterThanOrEqual(0);
      return i;
    };
    const stopping = index('the platform stopping', (l) => l.name === 'platform' && l.msg === 'stopping the platform');
    const cancelled = index('the runner draining its held turn', (l) => l.name === 'runner' && l.msg === 'draining' && l.held === 1);
    const sandboxes = index('the runner stopping its sandboxes', (l) => l.name === 'runner' && l.msg === "stopped this runner's sandboxes");
    const runnerGone = index('the runner exited', (l) => l.name === 'platform' && l.msg === 'platform process stopped' && l.child === 'runner');
    const apiStopping = index('the api stopping', (l) => l.name === 'api' && l.msg === 'api shutting down');
    const schedulerStopping = index('the scheduler stopping', (l) => l.name === 'scheduler' && l.msg === 'scheduler shutting down');
    const apiStopped = index('the api stopped', (l) => l.name === 'api' && l.msg === 'api stopped');
    const schedulerStopped = index('the scheduler stopped', (l) => l.name === 'scheduler' && l.msg === 'scheduler stopped');
    const redisStopping = index('the redis-server stopping', (l) => l.name === 'platform' && l.msg === 'stopping the embedded redis-server');
    const stopped = index('the platform stopped', (l) => l.name === 'platform' && l.msg === 'platform stopped');
    expect(stopping).toBeLessThan(cancelled);
    expect(cancelled).toBeLessThan(sandboxes);
    expect(sandboxes).toBeLessThan(runnerGone);
    expect(runnerGone).toBeLessThan(Math.min(apiStopping, schedulerStopping));
    expect(Math.max(apiStopped, schedulerStopped)).toBeLessThan(redisStopping);
    expect(redisStopping).toBeLessThan(stopped);
    expect(stopped).toBe(lines.length - 1);
    const after = lines.slice(stopping);
    // The API stayed up while the runner drained: no reconnect, no kill, nothing left for the platform to clean.
    expect(after.filter((l) => l.name === 'runner' && l.msg === 'reconnecting')).toEqual([]);
    expect(after.filter((l) => l.name === 'platform' && l.level >= 40)).toEqual([]);

    // The runner's report reached the API before it stopped: on the same data, no runner, the
    // Run's attempt is over, as an infrastructure failure: the turn is not ended (nobody
    // interrupted it), it waits to be retried.
    const again = await start({ START_RUNNER: 'false', START_SCHEDULER: 'false' }, p);
    const runs = (await client(again).get<{ data: { status: string; stop_reason: { type: string } | null; attempts: { ended_at: string | null; outcome: string | null }[] }[] }>(`/v1/sessions/${session}/runs`)).data;
    expect(runs).toHaveLength(1);
    expect(runs[0]?.stop_reason).toBeNull();
    expect(['succeeded', 'failed', 'canceled']).not.toContain(runs[0]?.status);
    expect(runs[0]?.attempts).toHaveLength(1);
    expect(runs[0]?.attempts[0]).toMatchObject({ ended_at: expect.any(String), outcome: 'infrastructure_failure' });
    process.kill(-(again.proc.pid as number), 'SIGINT');
    expect((await again.exited).code).toBe(0);
  }, 300_000);

  it('refuses a flag it does not know: one line on stderr and the usage, exit 2; --help exits 0', async () => {
    const run = (script: string, args: string[], env: Record<string, string> = {}) => new Promise<{ code: number | null; out: string; err: string }>((resolve) => {
      const child = spawn(process.execPath, [join(ROOT_DIR, script), ...args], { env: { PATH: process.env.PATH ?? '/usr/bin:/bin', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      child.stdout.on('data', (d: Buffer) => (out += d.toString('utf8')));
      child.stderr.on('data', (d: Buffer) => (err += d.toString('utf8')));
      child.once('exit', (code) => resolve({ code, out, err }));
    });
    const entries = [['agentplane', 'platform/dist/main.js'], ['api', 'api/dist/main.js'], ['scheduler', 'scheduler/dist/main.js'], ['gateway', 'gateway/dist/main.js']] as const;
    // Each entry point at once: starting node and loading the modules is most of the time.
    await Promise.all(entries.map(async ([name, script]) => {
      const [bogus, extra, help] = await Promise.all([run(script, ['--bogus']), run(script, ['start']), run(script, ['--help'])]);
      expect(bogus.code, script).toBe(2);
      expect(bogus.out, script).toBe('');
      const [first, blank, usage] = bogus.err.split('\n');
      expect(first, script).toBe(`${name}: unknown option '--bogus'`);
      expect(blank, script).toBe('');
      expect(usage, script).toMatch(/^agentplane\b/);
      expect(bogus.err, script).toContain('Usage: ');

      expect(extra.code, script).toBe(2);
      expect(extra.err.split('\n')[0], script).toBe(`${name}: unexpected argument 'start'`);

      expect(help.code, script).toBe(0);
      expect(help.out, script).toContain('Usage: ');
      expect(help.err, script).toBe('');
      // A missing setting is one clean line and exit code 2, as a bad one is (the platform starts
      // without any: not asked here).
      if (name === 'agentplane') return;
      const missing = await run(script, []);
      expect(missing.code, script).toBe(2);
      expect(missing.err, script).toBe(`${name} failed to start: REDIS_URL is required\n`);
    }));
    // The scheduler's help names every setting its config reads.
    const help = (await run('scheduler/dist/main.js', ['-h'])).out;
    for (const setting of ['SCHEDULER_HOST', 'CAPACITY_RETRY_MS', 'INTERRUPT_GRACE_MS', 'MASTER_KEY', 'SHUTDOWN_GRACE_MS', 'LEASE_HEARTBEAT_MS', 'FENCE_MARGIN_MS', 'EVENT_APPEND_WAIT_REPLICAS']) expect(help).toContain(setting);
  }, 120_000);
});
