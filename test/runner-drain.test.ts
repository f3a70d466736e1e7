import { spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Redis } from 'ioredis';
import { keys, tags } from '@agentplane/store';
import { DAEMON_READY_MS, RUNNER_CLI, startDaemon, WITH_DAEMON_MS } from './harness/daemon.js';
import { startPlatform, waitFor, type Platform } from './harness/platform.js';

/**
 * Drain and resume through the API, as an operator does from the console: a drained runner stays
 * connected and idle until it is resumed (one runner, or its pool), unless it was started with
 * --exit-when-drained; a local drain (SIGTERM) is not undone by a resume.
 */
let p: Platform;
let ws: string;
let owner: string;
const children: ChildProcess[] = [];
const errType = (r: { body: unknown }) => (r.body as { error?: { type?: string } }).error?.type;

beforeAll(async () => {
  p = await startPlatform({ env: { RUNNER_HEARTBEAT_INTERVAL_MS: '400', RUNNER_PRESENCE_TTL_MS: '2000' } });
  ws = p.bootstrap.workspace_id;
  owner = (await p.root.post<{ id: string }>(`/v1/organizations/workspaces/${ws}/principals`, {
    external_subject_id: 'drain-owner', principal_type: 'person', display_name: 'Owner',
  })).id;
}, 90_000);
afterAll(async () => {
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await p?.stop();
});

async function paired(label: string, pool?: string): Promise<{ dir: string; runnerId: string }> {
  const r = await p.root.request<{ code: string }>('POST', '/v1/runner-pairings', {
    idempotencyKey: `pair-${label}`, body: { principal_id: owner, machine_label: label, expires_in_seconds: 300 },
  });
  expect(r.status).toBe(201);
  const dir = mkdtempSync(join(tmpdir(), 'runner-drain-'));
  const out = spawnSync(process.execPath, [RUNNER_CLI, 'pair', '--code', r.body.code, '--url', p.baseUrl, '--config-dir', dir, '--label', label, '--json', ...(pool ? ['--pool', pool] : [])], { encoding: 'utf8' });
  expect(out.status, out.stdout + out.stderr).toBe(0);
  return { dir, runnerId: (JSON.parse(out.stdout) as { runner_id: string }).runner_id };
}

function start(dir: string, extra: string[] = []): ChildProcess {
  const c = startDaemon(dir, extra);
  children.push(c);
  return c;
}

async function statusOf(runnerId: string): Promise<string | undefined> {
  const r = await p.root.get<{ data: { runner: string; status: string }[] }>('/v1/runner-pools/presences');
  return r.data.find((x) => x.runner === runnerId)?.status;
}
const waitStatus = (runnerId: string, want: string | undefined) =>
  waitFor(`runner ${want ?? 'gone'}`, async () => ((await statusOf(runnerId)) === want ? true : undefined), DAEMON_READY_MS);

describe('drain and resume through the API', () => {
  it('a drained runner stays connected and idle; resume makes it ready again', async () => {
    const { dir, runnerId } = await paired('stay-box');
    const d = start(dir);
    await waitStatus(runnerId, 'ready');
    const drained = await p.root.request<{ drain: unknown }>('POST', `/v1/runners/${runnerId}/drain`, { body: { deadline_seconds: 60, reason: 'maintenance' } });
    expect(drained.status).toBe(200);
    expect(drained.body.drain).toMatchObject({ reason: 'maintenance' });
    await waitStatus(runnerId, 'draining');
    const resumed = await p.root.request<{ drain: unknown }>('POST', `/v1/runners/${runnerId}/resume`);
    expect(resumed.status).toBe(200);
    expect(resumed.body.drain).toBeNull();
    await waitStatus(runnerId, 'ready');
    expect(d.exitCode).toBeNull();
    // Resuming a runner that is not drained is a no-op, not an error.
    expect((await p.root.request('POST', `/v1/runners/${runnerId}/resume`)).status).toBe(200);
  }, WITH_DAEMON_MS);

  it('with --exit-when-drained the idle daemon leaves; a resume clears the drain for its next start', async () => {
    const { dir, runnerId } = await paired('exit-box');
    const d = start(dir, ['--exit-when-drained']);
    await waitStatus(runnerId, 'ready');
    const exited = new Promise<number | null>((r) => d.once('exit', (code) => r(code)));
    expect((await p.root.request('POST', `/v1/runners/${runnerId}/drain`, { body: { deadline_seconds: 60 } })).status).toBe(200);
    expect(await exited).toBe(0);
    await waitStatus(runnerId, undefined);
    // Started again while still drained, it is told to drain at once and leaves again.
    const again = start(dir, ['--exit-when-drained']);
    expect(await new Promise<number | null>((r) => again.once('exit', (code) => r(code)))).toBe(0);
    expect((await p.root.request('POST', `/v1/runners/${runnerId}/resume`)).status).toBe(200);
    start(dir, ['--exit-when-drained']);
    await waitStatus(runnerId, 'ready');
  }, WITH_DAEMON_MS + DAEMON_READY_MS);

  it('a pool resume brings its connected runners back, except one drained on its own', async () => {
    const pool = await p.root.post<{ id: string }>('/v1/runner-pools', { name: 'resume-pool', placement: 'byoc' });
    const a = await paired('pool-a', pool.id);
    const b = await paired('pool-b', pool.id);
    start(a.dir);
    start(b.dir);
    await waitStatus(a.runnerId, 'ready');
    await waitStatus(b.runnerId, 'ready');
    expect((await p.root.request('POST', `/v1/runner-pools/${pool.id}/drain`, { body: { deadline_seconds: 60 } })).status).toBe(200);
    await waitStatus(a.runnerId, 'draining');
    await waitStatus(b.runnerId, 'draining');
    expect((await p.root.request('POST', `/v1/runners/${b.runnerId}/drain`, { body: { deadline_seconds: 60 } })).status).toBe(200);
    // While the pool drains, a runner's own resume does not bring it back.
    expect((await p.root.request('POST', `/v1/runners/${a.runnerId}/resume`)).status).toBe(200);
    expect((await p.root.request('POST', `/v1/runner-pools/${pool.id}/resume`)).status).toBe(200);
    await waitStatus(a.runnerId, 'ready');
    expect(await statusOf(b.runnerId)).toBe('draining');
    expect((await p.root.request('POST', `/v1/runners/${b.runnerId}/resume`)).status).toBe(200);
    await waitStatus(b.runnerId, 'ready');
  }, WITH_DAEMON_MS);

  it('a SIGTERM drain is the operator leaving: a resume does not undo it', async () => {
    const { dir, runnerId } = await paired('term-box');
    const d = start(dir);
    await waitStatus(runnerId, 'ready');
    const exited = new Promise<number | null>((r) => d.once('exit', (code) => r(code)));
    d.kill('SIGTERM');
    await p.root.request('POST', `/v1/runners/${runnerId}/resume`);
    expect(await exited).toBe(0);
  }, WITH_DAEMON_MS);

  it('a drain, a resume or a revocation recorded while the gateway\'s subscriber was away reaches the runner once it is back', async () => {
    const { dir, runnerId } = await paired('missed-box');
    const credentialId = (JSON.parse(readFileSync(join(dir, 'runner.json'), 'utf8')) as { runner_credential_id: string }).runner_credential_id;
    start(dir);
    await waitStatus(runnerId, 'ready');
    const redis = new Redis(p.redisUrl());
    try {
      const key = keys.doc(tags.workspace(ws), credentialId);
      // What the drain, resume and revoke operations store, written without their broadcast: as
      // if it had been published while the gateway's subscriber was reconnecting.
      const patch = async (fields: Record<string, unknown>) => {
        const doc = JSON.parse((await redis.get(key)) as string) as Record<string, unknown>;
        await redis.set(key, JSON.stringify({ ...doc, ...fields }));
      };
      const dropSubscriber = async () => {
        const killed = await redis.call('CLIENT', 'KILL', 'TYPE', 'pubsub', 'SKIPME', 'yes', 'USER', 'default');
        expect(Number(killed)).toBeGreaterThan(0);
      };
      await patch({ drain: { deadline: new Date(Date.now() + 60_000).toISOString(), reason: 'missed broadcast', requested_at: new Date().toISOString() } });
      // Nothing tells the runner yet.
      expect(await statusOf(runnerId)).toBe('ready');
      await dropSubscriber();
      await waitStatus(runnerId, 'draining');
      await patch({ drain: null });
      await dropSubscriber();
      await waitStatus(runnerId, 'ready');
      // A revocation stored without its broadcast: the socket is closed once the subscriber is back.
      await patch({ status: 'revoked' });
      await dropSubscriber();
      // Well inside the periodic revalidation (30 s), the backstop that would find it otherwise.
      await waitFor('the revoked runner gone', async () => ((await statusOf(runnerId)) === undefined ? true : undefined), 10_000);
    } finally {
      redis.disconnect();
    }
  }, WITH_DAEMON_MS);

  it('errors: an unknown runner is 404, a wrong id prefix 400', async () => {
    const unknown = await p.root.request('POST', `/v1/runners/runner_${'0'.repeat(32)}/resume`);
    expect(unknown.status).toBe(404);
    expect(errType(unknown)).toBe('validation.not_found');
    const wrong = await p.root.request('POST', `/v1/runners/sess_${'0'.repeat(32)}/resume`);
    expect(wrong.status).toBe(400);
    expect(errType(wrong)).toBe('validation.malformed');
  });
});
