import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from 'vitest';
import Docker from 'dockerode';
import type { HttpClient } from '@agentplane/client';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';
import { pairDaemon, RUNNER_CLI, startDaemon } from './harness/daemon.js';
import { spawnOwned } from './harness/spawn.js';

/**
 * Sandboxes that outlive their runner or their whole platform, with real Docker: the cycle a new
 * user goes through (start, Sessions, Ctrl-C, delete the data directory, start again), a runner
 * killed with SIGKILL whose credential is then revoked (`prune`), and Sessions that end while
 * their runner is offline. Everything here runs in its own reaping scope (a sub-scope of the test
 * run's), so no other test's containers are ever looked at; a plain container must survive it all.
 */
const SCOPE = `${process.env.AGENTPLANE_SANDBOX_SCOPE ?? 'test'}-reaper-${randomBytes(3).toString('hex')}`;
process.env.AGENTPLANE_SANDBOX_SCOPE = SCOPE; // daemons started here inherit it
const docker = new Docker();
const SCRIPT = (rules: unknown[]) => `\`\`\`scripted\n${JSON.stringify({ rules })}\n\`\`\``;
const ENV = { AGENTPLANE_SANDBOX_SCOPE: SCOPE, SANDBOX_REAP_GRACE_SECONDS: '2', SANDBOX_REAP_INTERVAL_SECONDS: '1' };

const platforms: Platform[] = [];
const daemons: ChildProcess[] = [];
const dirs: string[] = [];
let plain: Docker.Container;

beforeAll(async () => {
  // An unmanaged container, as a user's own: never touched by a runner or by prune.
  plain = await docker.createContainer({ Image: 'agentplane/sandbox:latest', Cmd: ['/usr/bin/sleep', 'infinity'], Labels: { 'test.scope': SCOPE }, HostConfig: { NetworkMode: 'none' } });
  await plain.start();
}, 60_000);

afterAll(async () => {
  for (const d of daemons) d.kill('SIGKILL');
  for (const p of platforms) await p.stop().catch(() => undefined);
  await plain?.remove({ force: true }).catch(() => undefined);
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

async function plainAlive(): Promise<boolean> {
  return (await plain.inspect()).State.Running;
}

/** The managed containers and volumes of this scope, optionally of one runner. */
async function managed(runnerId?: string): Promise<{ containers: Docker.ContainerInfo[]; volumes: Docker.VolumeInspectInfo[] }> {
  const label = ['agentplane.managed=true', `agentplane.scope=${SCOPE}`, ...(runnerId ? [`agentplane.runner=${runnerId}`] : [])];
  const filters = JSON.stringify({ label });
  const [containers, { Volumes }] = await Promise.all([docker.listContainers({ all: true, filters }), docker.listVolumes({ filters })]);
  return { containers, volumes: Volumes ?? [] };
}

async function setup(p: Platform): Promise<{ api: HttpClient; owner: string; envId: string }> {
  const api = p.root;
  const owner = (await api.post<{ id: string }>(`/v1/organizations/workspaces/${p.bootstrap.workspace_id}/principals`, {
    external_subject_id: `owner-${randomBytes(3).toString('hex')}`, principal_type: 'person', display_name: 'Owner',
  })).id;
  const envId = (await api.post<{ id: string }>('/v1/environments', { name: 'sb', image: 'agentplane/sandbox:latest' })).id;
  return { api, owner, envId };
}

/** A Session whose one turn runs a command in its sandbox; resolves once the turn is over. */
async function sessionWithSandbox(ctx: { api: HttpClient; owner: string; envId: string }): Promise<string> {
  const { api, owner, envId } = ctx;
  const rules = [
    { when: { user_contains: 'go' }, then: [{ tool: 'bash', input: { command: 'echo hi > note.txt; echo done' } }] },
    { when: { on: 'tool_result' }, then: [{ reply: 'ok' }] },
  ];
  const s = await api.post<{ id: string }>('/v1/sessions', { agent: { name: 'a', model: 'default', system: SCRIPT(rules), tools: [{ type: 'builtin', name: 'bash' }] }, environment_id: envId });
  await api.post(`/v1/sessions/${s.id}/events`, { type: 'user.message', payload: { content: 'go', authored_by: owner, caused_by: { kind: 'api' } } });
  await waitFor(`session ${s.id} idle`, async () => {
    const thread = (await api.get<{ data: { id: string }[] }>(`/v1/sessions/${s.id}/threads`)).data[0]?.id;
    if (!thread) return undefined;
    const evs = (await api.get<{ data: { type: string }[] }>(`/v1/sessions/${s.id}/threads/${thread}/events`, { limit: 1000 })).data;
    return evs.some((e) => e.type === 'session.status_idle') && evs.some((e) => e.type === 'agent.tool_result') ? true : undefined;
  }, 120_000);
  return s.id;
}

function cli(args: string[]): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((done) => {
    const child = spawnOwned(process.execPath, [RUNNER_CLI, ...args], { env: { ...process.env, AGENTPLANE_SANDBOX_SCOPE: SCOPE }, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout?.setEncoding('utf8').on('data', (d: string) => (stdout += d));
    child.stderr?.setEncoding('utf8').on('data', (d: string) => (stderr += d));
    child.on('close', (code) => done({ code, stdout, stderr }));
  });
}

const logLines = (p: Platform): Array<Record<string, unknown>> =>
  readFileSync(p.logFile, 'utf8').split('\n').flatMap((l) => {
    try {
      return [JSON.parse(l) as Record<string, unknown>];
    } catch {
      return [];
    }
  });

describe('sandboxes that outlive their platform', () => {
  it('start, two Sessions, SIGTERM, delete the data directory, start again: the new runner reaps both sandboxes and volumes', async () => {
    const dataDir = mkdtempSync(join(tmpdir(), 'agentplane-reaper-'));
    dirs.push(dataDir);
    const p1 = await startPlatform({ runner: true, scheduler: true, dataDir, env: ENV, startTimeoutMs: 180_000 });
    platforms.push(p1);
    const ctx = await setup(p1);
    const oldRunner = (JSON.parse(readFileSync(join(dataDir, 'runner', 'runner.json'), 'utf8')) as { runner_id: string }).runner_id;
    const sessions = [await sessionWithSandbox(ctx), await sessionWithSandbox(ctx)];
    const before = await managed(oldRunner);
    expect(before.containers.map((c) => c.Labels['agentplane.session']).sort()).toEqual([...sessions].sort());
    expect(before.volumes).toHaveLength(2);
    // Attribution: the runner's home and the issuing Workspace are on every item.
    for (const item of [...before.containers.map((c) => c.Labels), ...before.volumes.map((v) => v.Labels)]) {
      expect(item).toMatchObject({ 'agentplane.home': join(dataDir, 'runner'), 'agentplane.workspace': p1.bootstrap.workspace_id, 'agentplane.scope': SCOPE });
    }

    await p1.stop(); // SIGTERM, as Ctrl-C: the durable workspaces stay
    const kept = await managed(oldRunner);
    expect(kept.containers).toHaveLength(2);
    expect(kept.volumes).toHaveLength(2);
    rmSync(dataDir, { recursive: true, force: true });
    mkdirSync(dataDir); // empty, as after `rm -rf .data/*` (the harness logs into it)

    const p2 = await startPlatform({ runner: true, scheduler: true, dataDir, env: ENV, startTimeoutMs: 180_000 });
    platforms.push(p2);
    // Stopped when this test ends, passed or not: its runner reaps every sandbox of this scope
    // whose runner it does not know, and the next tests' runners are such runners.
    onTestFinished(() => p2.stop());
    // Said once at start, with the command that prunes them.
    const notice = await waitFor('the earlier-platform notice', () => {
      const found = logLines(p2).filter((l) => typeof l.msg === 'string' && l.msg.includes('of an earlier platform'));
      return found.length > 0 ? found : undefined;
    }, 90_000);
    expect(notice).toHaveLength(1);
    expect(notice[0]).toMatchObject({ containers: 2, volumes: 2 });
    expect(String(notice[0]?.command)).toContain('prune');

    await waitFor('the old runner\'s sandboxes and volumes to be reaped', async () => {
      const left = await managed(oldRunner);
      return left.containers.length === 0 && left.volumes.length === 0 ? true : undefined;
    }, 90_000);
    // Each removal is logged after Docker reports it: the lines may trail the removals a little.
    const reaped = await waitFor('a log line per reaped container and volume', () => {
      const lines = logLines(p2).filter((l) => typeof l.msg === 'string' && l.msg.startsWith('reaped the') && l.gone_runner === oldRunner);
      return lines.length >= 2 * sessions.length ? lines : undefined;
    }, 30_000);
    expect(reaped.map((l) => `${String(l.kind)}:${String(l.session)}`).sort()).toEqual(
      [...sessions.map((s) => `container:${s}`), ...sessions.map((s) => `volume:${s}`)].sort(),
    );
    expect(reaped.every((l) => l.reason === 'credential_gone')).toBe(true);
    expect(await plainAlive()).toBe(true);
  }, 480_000);
});

describe('runners of one platform', () => {
  let p: Platform;
  let ctx: { api: HttpClient; owner: string; envId: string };
  beforeAll(async () => {
    p = await startPlatform({ runner: false, scheduler: true, env: { ...ENV, RUNNER_HEARTBEAT_INTERVAL_MS: '1000', RUNNER_PRESENCE_TTL_MS: '3000' }, startTimeoutMs: 180_000 });
    platforms.push(p);
    ctx = await setup(p);
  }, 240_000);

  async function daemon(label: string, existing?: { dir: string; runnerId: string }): Promise<{ proc: ChildProcess; dir: string; runnerId: string }> {
    const { dir, runnerId } = existing ?? (await pairDaemon(p, ctx.owner, label));
    dirs.push(dir);
    const proc = startDaemon(dir, ['--sandbox-report-seconds', '1']);
    daemons.push(proc);
    await waitFor(`${label} ready`, async () => ((await ctx.api.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences')).data.some((x) => x.runner === runnerId && x.status === 'ready') ? true : undefined), 180_000);
    return { proc, dir, runnerId };
  }
  const exited = (proc: ChildProcess): Promise<void> => (proc.exitCode !== null || proc.signalCode !== null ? Promise.resolve() : new Promise((r) => proc.once('exit', () => r())));

  it('Sessions archived or deleted while their runner was offline are released when it reconnects', async () => {
    const j = await daemon('box-j');
    const [archived, deleted] = [await sessionWithSandbox(ctx), await sessionWithSandbox(ctx)];
    expect((await managed(j.runnerId)).volumes).toHaveLength(2);
    j.proc.kill('SIGTERM');
    await exited(j.proc);
    await ctx.api.post(`/v1/sessions/${archived}/archive`);
    await ctx.api.delete(`/v1/sessions/${deleted}`);
    const offline = await managed(j.runnerId);
    expect(offline.volumes).toHaveLength(2); // nobody removed them while the runner was away
    const again = await daemon('box-j', j);
    await waitFor('both sandboxes released on reconnect', async () => {
      const left = await managed(j.runnerId);
      return left.containers.length === 0 && left.volumes.length === 0 ? true : undefined;
    }, 90_000);
    again.proc.kill('SIGTERM');
    await exited(again.proc);
  }, 360_000);

  it('a runner killed with SIGKILL: its sandboxes are kept while its credential lives, and pruned once it is revoked', async () => {
    const k = await daemon('box-k');
    const session = await sessionWithSandbox(ctx);
    k.proc.kill('SIGKILL');
    await exited(k.proc);
    const left = await managed(k.runnerId);
    expect(left.containers.map((c) => c.Labels['agentplane.session'])).toEqual([session]);
    expect(left.volumes).toHaveLength(1);
    const configDir = mkdtempSync(join(tmpdir(), 'runner-prune-'));
    dirs.push(configDir);

    // The credential is still accepted: nothing to prune.
    const live = await cli(['prune', '--dry-run', '--json', '--config-dir', configDir]);
    expect(live.code, live.stderr).toBe(0);
    const livePlan = JSON.parse(live.stdout) as { would_remove: unknown[]; runners: Array<{ runner: string; verdict: string }> };
    expect(livePlan.would_remove).toEqual([]);
    expect(livePlan.runners.find((r) => r.runner === k.runnerId)?.verdict).toBe('live');

    const cred = JSON.parse(readFileSync(join(k.dir, 'runner.json'), 'utf8')) as { runner_credential_id: string };
    await ctx.api.post(`/v1/runner-credentials/${cred.runner_credential_id}/revoke`, {});

    const doctor = await cli(['doctor', '--json', '--config-dir', configDir]);
    const listed = (JSON.parse(doctor.stdout) as { prune: { reapable: Array<{ kind: string; runner: string; reason: string }> } }).prune.reapable;
    expect(listed.map((i) => `${i.kind}:${i.runner}:${i.reason}`).sort(), doctor.stdout).toEqual([`container:${k.runnerId}:credential_revoked`, `volume:${k.runnerId}:credential_revoked`]);

    const dry = await cli(['prune', '--dry-run', '--json', '--config-dir', configDir]);
    expect((JSON.parse(dry.stdout) as { would_remove: unknown[] }).would_remove).toHaveLength(2);
    expect((await managed(k.runnerId)).volumes).toHaveLength(1); // a dry run removes nothing

    const pruned = await cli(['prune', '--json', '--config-dir', configDir]);
    expect(pruned.code, pruned.stdout + pruned.stderr).toBe(0);
    const removed = (JSON.parse(pruned.stdout) as { removed: Array<{ kind: string; session: string }> }).removed;
    expect(removed.map((i) => `${i.kind}:${i.session}`).sort()).toEqual([`container:${session}`, `volume:${session}`]);
    const after = await managed(k.runnerId);
    expect(after.containers).toHaveLength(0);
    expect(after.volumes).toHaveLength(0);
    expect(await plainAlive()).toBe(true);

    const human = await cli(['prune', '--config-dir', configDir]);
    expect(human.code).toBe(0);
    expect(human.stdout).toContain('nothing pruned');
  }, 360_000);
});
