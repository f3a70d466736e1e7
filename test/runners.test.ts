import { spawnSync, type ChildProcess } from 'node:child_process';
import { mkdtempSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { WebSocket } from 'ws';
import { connectRedis, freePort, keys, tags, type Redis } from '@agentplane/store';
import { frame, type RunnerPresence } from '@agentplane/protocol';
import { deliverToRunner, GATEWAY_CONTROL_CHANNEL, PresenceStore } from '@agentplane/gateway';
import { ROOT_DIR, startPlatform, waitFor, type Platform } from './harness/platform.js';
import { DAEMON_READY_MS, RUNNER_CLI as CLI, startDaemon as startHarnessDaemon, WITH_DAEMON_MS } from './harness/daemon.js';
import { spawnOwned } from './harness/spawn.js';
import { connectRawRunner, runnerConnectUrl, welcomeOf, type RawRunner } from './harness/raw-runner.js';

const HEARTBEAT_MS = 400;
const TTL_MS = 2000;

let p: Platform;
let redis: Redis;
let ws: string;
const children: ChildProcess[] = [];
const sockets: WebSocket[] = [];

const errType = (r: { body: unknown }) => (r.body as { error?: { type?: string } }).error?.type;

beforeAll(async () => {
  p = await startPlatform({
    env: { RUNNER_HEARTBEAT_INTERVAL_MS: String(HEARTBEAT_MS), RUNNER_PRESENCE_TTL_MS: String(TTL_MS), RUNNER_MAX_FRAME_BYTES: '65536' },
  });
  redis = connectRedis(p.redisUrl(), { name: 'test' });
  ws = p.bootstrap.workspace_id;
});
afterAll(async () => {
  for (const s of sockets) s.terminate();
  for (const c of children) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
  await redis?.quit();
  await p?.stop();
});

let principalSeq = 0;
async function newPrincipal(): Promise<string> {
  const r = await p.root.request('POST', `/v1/organizations/workspaces/${ws}/principals`, {
    body: { external_subject_id: `runner-owner-${Date.now()}-${++principalSeq}`, principal_type: 'person', display_name: 'Owner' },
  });
  expect(r.status).toBe(201);
  return (r.body as { id: string }).id;
}

async function createPairing(principal: string, label: string, key = `k-${Math.random()}`, expires = 300) {
  return p.root.request('POST', '/v1/runner-pairings', { idempotencyKey: key, body: { principal_id: principal, machine_label: label, expires_in_seconds: expires } });
}

interface Issued {
  secret: string;
  runner_credential: { id: string; runner_id: string; runner_pool_id: string; owner: { principal: string; machine_label: string } | null };
}

async function redeem(code: string, extra: Record<string, unknown> = {}) {
  return p.anon.request('POST', '/v1/runner-pairings/redeem', { body: { code, ...extra } });
}

async function presences(query: Record<string, string> = {}): Promise<RunnerPresence[]> {
  const r = await p.root.request('GET', '/v1/runner-pools/presences', { query: { limit: 1000, ...query } });
  expect(r.status).toBe(200);
  return (r.body as { data: RunnerPresence[] }).data;
}

const presenceOf = async (runner: string) => (await presences()).find((x) => x.runner === runner);

function startDaemon(configDir: string): ChildProcess {
  const c = startHarnessDaemon(configDir);
  children.push(c);
  return c;
}

async function pairedDaemonDir(principal: string, label: string): Promise<{ dir: string; runnerId: string }> {
  const r = await createPairing(principal, label);
  expect(r.status).toBe(201);
  const dir = mkdtempSync(join(tmpdir(), 'runner-test-'));
  const out = spawnSync(process.execPath, [CLI, 'pair', '--code', (r.body as { code: string }).code, '--url', p.baseUrl, '--config-dir', dir, '--label', label, '--json'], { encoding: 'utf8' });
  expect(out.status, out.stdout + out.stderr).toBe(0);
  const res = JSON.parse(out.stdout) as { runner_id: string };
  return { dir, runnerId: res.runner_id };
}

/** A raw protocol client: hello, then heartbeats on demand; terminated after the file's tests. */
async function rawRunner(secret: string): Promise<RawRunner> {
  const r = await connectRawRunner(p, secret);
  sockets.push(r.sock);
  return r;
}

async function managedCredential(): Promise<Issued> {
  const pool = await p.root.request('POST', '/v1/runner-pools', { body: { name: `managed-${Date.now()}`, placement: 'managed' } });
  expect(pool.status).toBe(201);
  const key = await p.root.request('POST', `/v1/organizations/${p.bootstrap.organization_id}/api-keys`, {
    idempotencyKey: `rk-${Math.random()}`, body: { display_name: 'ops runner key', role: 'runner', scope: { type: 'workspace', workspace_id: ws } },
  });
  expect(key.status).toBe(201);
  const runnerKey = p.anon.with({ token: (key.body as { secret: string }).secret });
  const r = await runnerKey.request('POST', `/v1/runner-pools/${(pool.body as { id: string }).id}/enrollments`, { idempotencyKey: `e-${Math.random()}`, body: { machine_label: 'ci-1' } });
  expect(r.status).toBe(201);
  const issued = r.body as Issued;
  expect(issued.runner_credential.owner).toBeNull();
  return issued;
}

describe('runner pairing', () => {
  it('validates the request exactly', async () => {
    const principal = await newPrincipal();
    const noKey = await p.root.request('POST', '/v1/runner-pairings', { body: { principal_id: principal, machine_label: 'm', expires_in_seconds: 300 } });
    expect(noKey.status).toBe(400);
    expect(errType(noKey)).toBe('validation.malformed');
    for (const bad of [119, 601]) {
      const r = await createPairing(principal, 'm', `bad-${bad}`, bad);
      expect(r.status).toBe(400);
      expect(errType(r)).toBe('validation.malformed');
    }
    const unknown = await createPairing(`prin_${'0'.repeat(32)}`, 'm');
    expect(unknown.status).toBe(404);
    const extra = await p.root.request('POST', '/v1/runner-pairings', { idempotencyKey: 'x1', body: { principal_id: principal, machine_label: 'm', surprise: 1 } });
    expect(extra.status).toBe(400);
    // No control character in a label: C0, DEL and C1 alike.
    for (const [i, label] of ['m\u0007x', 'm\u007fx', 'm\u0085x'].entries()) {
      const r = await createPairing(principal, label, `ctl-${i}`);
      expect([r.status, errType(r)]).toEqual([400, 'validation.malformed']);
    }
  });

  it('a runner pool\'s name is a logical key: up to 94 characters', async () => {
    const name = (n: number) => `p${'a'.repeat(n - 1)}`;
    const long = await p.root.request('POST', '/v1/runner-pools', { body: { name: name(95), placement: 'managed' } });
    expect([long.status, errType(long)]).toEqual([400, 'validation.malformed']);
    const upper = await p.root.request('POST', '/v1/runner-pools', { body: { name: 'Pool', placement: 'managed' } });
    expect([upper.status, errType(upper)]).toEqual([400, 'validation.malformed']);
    expect((await p.root.request('POST', '/v1/runner-pools', { body: { name: name(94), placement: 'managed' } })).status).toBe(201);
  });

  it('creates a single-use code, replays it for the same key, and conflicts on a second pending pairing', async () => {
    const principal = await newPrincipal();
    const before = Date.now();
    const r1 = await createPairing(principal, 'laptop', 'same-key', 180);
    expect(r1.status).toBe(201);
    const body = r1.body as { id: string; code: string; expires_at: string };
    expect(body.id).toMatch(/^rpair_[0-9a-f]{32}$/);
    expect(body.code).toMatch(/^[0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{4}-[0-9A-Z]{4}$/);
    const exp = Date.parse(body.expires_at);
    expect(exp).toBeGreaterThanOrEqual(before + 180_000 - 1000);
    expect(exp).toBeLessThanOrEqual(Date.now() + 180_000 + 1000);
    const replay = await createPairing(principal, 'laptop', 'same-key', 180);
    expect(replay.status).toBe(201);
    expect(replay.body).toEqual(body);
    const conflict = await createPairing(principal, 'laptop', 'other-key', 180);
    expect(conflict.status).toBe(409);
    expect(errType(conflict)).toBe('validation.conflict');
    // Only the digest is stored.
    const stored = await redis.get(keys.doc(tags.workspace(ws), body.id));
    expect(stored).not.toContain(body.code);

    // runner_enrollment must be BYOC and must not carry an owner; refused before the code is consumed.
    const withOwner = await redeem(body.code, { runner_enrollment: { placement: 'byoc', owner: { principal } } });
    expect(withOwner.status).toBe(400);
    const managed = await redeem(body.code, { runner_enrollment: { placement: 'managed' } });
    expect(managed.status).toBe(400);

    const ok = await redeem(body.code.toLowerCase(), { runner_enrollment: { placement: 'byoc' } });
    expect(ok.status).toBe(201);
    const issued = ok.body as Issued;
    expect(issued.secret).toMatch(/^ap_runner_/);
    expect(issued.runner_credential.owner).toEqual({ principal, machine_label: 'laptop' });
    const again = await redeem(body.code);
    expect(again.status).toBe(401);
    expect(errType(again)).toBe('auth.invalid_key');
    // After redemption the keyed retry no longer replays the code.
    const late = await createPairing(principal, 'laptop', 'same-key', 180);
    expect(late.status).toBe(409);
    // The machine is paired: a new pairing for the same label conflicts until the credential is revoked.
    const dup = await createPairing(principal, 'laptop', 'k-dup', 180);
    expect(dup.status).toBe(409);
    expect(errType(dup)).toBe('validation.conflict');
    // The runner credential cannot call ordinary REST operations.
    const asRunner = await p.anon.with({ token: issued.secret }).request('GET', '/v1/runner-pools');
    expect(asRunner.status).toBe(403);
  });

  it('refuses an expired code (server checks expires_at, not only the key TTL)', async () => {
    const principal = await newPrincipal();
    const r = await createPairing(principal, 'old-box', `k-exp`, 120);
    const { id, code } = r.body as { id: string; code: string };
    const docKey = keys.doc(tags.workspace(ws), id);
    const doc = JSON.parse((await redis.get(docKey))!) as { expires_at: string };
    doc.expires_at = new Date(Date.now() - 1000).toISOString();
    await redis.set(docKey, JSON.stringify(doc));
    const res = await redeem(code);
    expect(res.status).toBe(401);
    expect(errType(res)).toBe('auth.invalid_key');
    const garbage = await redeem('not-a-code');
    expect(garbage.status).toBe(401);
  });
});

describe('runner daemon, gateway and presence', () => {
  it('pair → start → presence with real capabilities; owner filter; kill -9 → presence expires after the TTL', async () => {
    const principal = await newPrincipal();
    const { dir, runnerId } = await pairedDaemonDir(principal, 'workstation');
    expect(statSync(join(dir, 'runner.json')).mode & 0o777).toBe(0o600);
    const daemon = startDaemon(dir);
    const pres = await waitFor('presence', async () => {
      const x = await presenceOf(runnerId);
      return x?.status === 'ready' ? x : undefined;
    }, DAEMON_READY_MS);
    expect(pres.generation).toBeGreaterThanOrEqual(1);
    expect(pres.owner).toEqual({ principal, machine_label: 'workstation' });
    expect(pres.capabilities.protocol_versions).toEqual([1]);
    expect(pres.capabilities.plane_protocols).toEqual(['model-gateway-v1', 'lease-spec-v1']);
    // dockerd answers on this machine: the runner runs every sandbox under Docker and claims no
    // unisolated process provider beside it.
    expect(pres.capabilities.drivers).toEqual(['docker']);
    expect(pres.capabilities.providers.map((x) => x.id)).toEqual(['docker']);
    const docker = pres.capabilities.providers.find((x) => x.id === 'docker')!;
    // Tiers a canary proved: runc always here; gvisor too where runsc is configured.
    expect(docker.tiers).toContain('container');
    expect(docker.network_modes).toContain('none');
    // Nothing claimed that does not exist yet: no ACP transport, no browser.
    expect(docker.acp_transport).toBeUndefined();
    expect(docker.mount_kinds).toEqual(['uploaded_project']);
    for (const prov of pres.capabilities.providers) expect(prov.browser_observation, prov.id).toBeUndefined();
    expect(pres.capabilities.available_slots).toBeGreaterThan(0);
    expect(Date.parse(pres.expires_at) - Date.parse(pres.last_seen_at)).toBe(TTL_MS);

    // The owner filter: only presences owner-scoped to exactly that Principal.
    const managed = await managedCredential();
    const raw = await rawRunner(managed.secret);
    await waitFor('managed presence', async () => ((await presenceOf(managed.runner_credential.runner_id)) ? true : undefined));
    const mine = await presences({ owner: principal });
    expect(mine.map((x) => x.runner)).toEqual([runnerId]);
    expect(await presences({ owner: await newPrincipal() })).toEqual([]);
    const all = (await presences()).map((x) => x.runner);
    expect(all).toContain(runnerId);
    expect(all).toContain(managed.runner_credential.runner_id);
    // Paging: limit 1 walks every presence once.
    const seen: string[] = [];
    let page: string | null = null;
    do {
      const r = await p.root.request('GET', '/v1/runner-pools/presences', { query: { limit: 1, ...(page ? { page } : {}) } });
      const b = r.body as { data: RunnerPresence[]; next_page: string | null };
      seen.push(...b.data.map((x) => x.runner));
      page = b.next_page;
    } while (page);
    expect(seen.sort()).toEqual([...all].sort());
    // The per-pool index (what the scheduler reads) holds exactly the pool's runners.
    const store = new PresenceStore(redis);
    const managedPool = await store.listPool(ws, managed.runner_credential.runner_pool_id, { limit: 10 });
    expect(managedPool.data.map((x) => x.runner)).toEqual([managed.runner_credential.runner_id]);
    expect((await store.listPool(ws, pres.runner_pool, { limit: 100 })).data.map((x) => x.runner)).toContain(runnerId);
    raw.sock.close(1000);

    // Status command reads the daemon's state.
    const st = spawnSync(process.execPath, [CLI, 'status', '--config-dir', dir, '--json'], { encoding: 'utf8' });
    expect(JSON.parse(st.stdout)).toMatchObject({ connected: true, status: 'ready', runner_id: runnerId });

    daemon.kill('SIGKILL');
    const killedAt = Date.now();
    // Still listed right after (it may be reconnecting), gone once the TTL passes.
    expect(await presenceOf(runnerId)).toBeDefined();
    await waitFor('presence to expire', async () => ((await presenceOf(runnerId)) ? undefined : true), 10_000);
    expect(Date.now() - killedAt).toBeGreaterThanOrEqual(TTL_MS - HEARTBEAT_MS - 200);
  }, WITH_DAEMON_MS);

  it('survives an API restart: the daemon reconnects with a new generation', async () => {
    const { dir, runnerId } = await pairedDaemonDir(await newPrincipal(), 'restart-box');
    startDaemon(dir);
    const first = await waitFor('presence', async () => ((await presenceOf(runnerId))?.status === 'ready' ? (await presenceOf(runnerId))! : undefined), DAEMON_READY_MS);
    const apiPid = p.pids().api!;
    process.kill(apiPid, 'SIGKILL');
    const next = await waitFor('reconnect', async () => {
      const pids = p.pids();
      if (!pids.api || pids.api === apiPid) return undefined;
      try {
        const x = await presenceOf(runnerId);
        return x && x.generation > first.generation ? x : undefined;
      } catch {
        return undefined;
      }
    }, 30_000);
    expect(next.generation).toBe(first.generation + 1);
    expect(next.status).toBe('ready');
  }, WITH_DAEMON_MS);

  it('closes the socket within seconds when the credential is revoked or the owner Principal suspended', async () => {
    const principal = await newPrincipal();
    const r1 = await createPairing(principal, 'revoke-me');
    const issued = (await redeem((r1.body as { code: string }).code)).body as Issued;
    const a = await rawRunner(issued.secret);
    const t0 = Date.now();
    const rev = await p.root.request('POST', `/v1/runner-credentials/${issued.runner_credential.id}/revoke`);
    expect(rev.status).toBe(200);
    expect(await a.closed).toBe(4401);
    expect(Date.now() - t0).toBeLessThan(3000);
    // Reconnecting with the revoked secret is refused at the upgrade.
    const refused = await new Promise<number>((resolve) => {
      const s = new WebSocket(runnerConnectUrl(p.baseUrl), { headers: { authorization: `Bearer ${issued.secret}` } });
      s.on('unexpected-response', (_q, res) => resolve(res.statusCode ?? 0));
      s.on('open', () => resolve(101));
    });
    expect(refused).toBe(401);
    // A revoked runner takes no work: a drain of it is refused, and changes nothing.
    const drained = await p.root.request<{ error: { type: string } }>('POST', `/v1/runners/${issued.runner_credential.runner_id}/drain`, { body: {} });
    expect([drained.status, drained.body.error.type]).toEqual([409, 'runtime.invalid_transition']);

    const r2 = await createPairing(principal, 'owner-suspended');
    const issued2 = (await redeem((r2.body as { code: string }).code)).body as Issued;
    const b = await rawRunner(issued2.secret);
    const sus = await p.root.request('POST', `/v1/principals/${principal}/suspend`, { body: {} });
    expect(sus.status).toBe(200);
    expect(await b.closed).toBe(4403);
  });

  it('closes malformed and oversized frames with clear codes while other runners stay connected', async () => {
    const steady = await rawRunner((await managedCredential()).secret);
    const bad = await rawRunner((await managedCredential()).secret);
    bad.sock.send('this is not json');
    expect(await bad.closed).toBe(4400);
    const wrongType = await rawRunner((await managedCredential()).secret);
    wrongType.sock.send(JSON.stringify({ v: 1, type: 'lease.offer', id: 'x', payload: {} }));
    expect(await wrongType.closed).toBe(4400);
    const badPayload = await rawRunner((await managedCredential()).secret);
    badPayload.sock.send(JSON.stringify({ v: 1, type: 'heartbeat', id: 'x', payload: { status: 'ready', available_slots: -1, held_leases: [] } }));
    expect(await badPayload.closed).toBe(4400);
    // Work before hello is a protocol violation.
    const early = new WebSocket(runnerConnectUrl(p.baseUrl), { headers: { authorization: `Bearer ${(await managedCredential()).secret}` } });
    sockets.push(early);
    const earlyClosed = new Promise<number>((r) => early.on('close', (code) => r(code)));
    early.on('open', () => early.send(frame('heartbeat', 'x', { status: 'ready', available_slots: 1, held_leases: [] })));
    expect(await earlyClosed).toBe(4422);
    const big = await rawRunner((await managedCredential()).secret);
    big.sock.send('x'.repeat(70_000));
    expect(await big.closed).toBe(1009);
    // The steady runner still gets heartbeat acknowledgements.
    steady.sock.send(frame('heartbeat', 'hb1', { status: 'ready', available_slots: 1, held_leases: [] }));
    await waitFor('heartbeat.ack', () => (steady.frames.some((f) => f.type === 'heartbeat.ack') ? true : undefined), 5000);
    expect(steady.sock.readyState).toBe(WebSocket.OPEN);
    const metrics = await (await fetch(`${p.baseUrl}/metrics`)).text();
    expect(metrics).toMatch(/agentplane_gateway_closes_total\{code="4400"\} [1-9]/);
    expect(metrics).toMatch(/agentplane_gateway_connected_runners [1-9]/);
  });

  it('a second connection of the same runner supersedes the first (4409); presence follows the newer generation', async () => {
    const cred = await managedCredential();
    const a = await rawRunner(cred.secret);
    const genA = welcomeOf(a).generation;
    const b = await rawRunner(cred.secret);
    const genB = welcomeOf(b).generation;
    expect(genB).toBe(genA + 1);
    expect(await a.closed).toBe(4409);
    // The stale socket's late heartbeat cannot win back the presence.
    const pres = await presenceOf(cred.runner_credential.runner_id);
    expect(pres?.generation).toBe(genB);
    b.sock.close(1000);
    await waitFor('presence removed on a clean close', async () => ((await presenceOf(cred.runner_credential.runner_id)) ? undefined : true), 5000);
  });
});

async function frameCount(direction: 'in' | 'out', type: string, base = gatewayUrl): Promise<number> {
  const text = await (await fetch(`${base}/metrics`)).text();
  const m = new RegExp(`agentplane_gateway_frames_total\\{direction="${direction}",type="${type.replace('.', '\\.')}"\\} (\\d+)`).exec(text);
  return m ? Number(m[1]) : 0;
}

const offer = (leaseId: string, durationMs: number) =>
  frame('lease.offer', `o-${leaseId}`, {
    lease_id: leaseId, attempt: 1, run_id: `run_${'1'.repeat(32)}`, session_id: `sess_${'2'.repeat(32)}`,
    accept_within_ms: 5000, lease_ttl_ms: 3000, spec: { driver: 'noop', duration_ms: durationMs },
  });

/**
 * These run against a standalone gateway process on the platform's Redis (no lease handlers
 * installed), so made-up offers are not revoked by the control plane's lease records; the
 * presence it writes is still listed by the API, and deliverToRunner reaches it across processes.
 */
let gatewayUrl = '';
let gatewayProc: ChildProcess | undefined;

async function pairedToGateway(label: string): Promise<{ dir: string; runnerId: string }> {
  const paired = await pairedDaemonDir(await newPrincipal(), label);
  const file = join(paired.dir, 'runner.json');
  writeFileSync(file, JSON.stringify({ ...(JSON.parse(readFileSync(file, 'utf8')) as object), base_url: gatewayUrl }));
  return paired;
}

describe('leases through the gateway (delivery interface) and SIGTERM drain', () => {
  beforeAll(async () => {
    const port = await freePort();
    gatewayProc = spawnOwned(process.execPath, [join(ROOT_DIR, 'gateway/dist/main.js')], {
      env: { PATH: process.env.PATH ?? '', REDIS_URL: p.redisUrl(), PORT: String(port), LOG_LEVEL: 'warn', RUNNER_HEARTBEAT_INTERVAL_MS: String(HEARTBEAT_MS), RUNNER_PRESENCE_TTL_MS: String(TTL_MS) },
      stdio: ['ignore', 'ignore', 'inherit'],
    });
    children.push(gatewayProc);
    gatewayUrl = `http://127.0.0.1:${port}`;
    await waitFor('standalone gateway', async () => {
      try {
        return (await fetch(`${gatewayUrl}/healthz`)).ok ? true : undefined;
      } catch {
        return undefined;
      }
    }, 15_000);
  });

  it('delivers an offer from another process via the node channel; SIGTERM finishes held work, then exits', async () => {
    const { dir, runnerId } = await pairedToGateway('lease-box');
    const daemon = startDaemon(dir);
    await waitFor('presence', async () => ((await presenceOf(runnerId))?.status === 'ready' ? true : undefined), DAEMON_READY_MS);
    const accepts = await frameCount('in', 'lease.accept');
    const completes = await frameCount('in', 'lease.complete');
    const renewals = await frameCount('in', 'lease.heartbeat');
    expect(await deliverToRunner(redis, ws, runnerId, offer('lease-a', 2500))).toBe(true);
    await waitFor('lease.accept', async () => ((await frameCount('in', 'lease.accept')) > accepts ? true : undefined), 5000);
    const exited = new Promise<number | null>((r) => daemon.once('exit', (code) => r(code)));
    daemon.kill('SIGTERM');
    await waitFor('draining presence', async () => ((await presenceOf(runnerId))?.status === 'draining' ? true : undefined), 5000);
    expect(daemon.exitCode).toBeNull(); // still finishing the held lease
    expect(await exited).toBe(0);
    expect(await frameCount('in', 'lease.complete')).toBe(completes + 1);
    expect(await frameCount('in', 'lease.heartbeat')).toBeGreaterThan(renewals); // renewed at a third of the TTL
    // An offer for a runner nobody holds is not delivered.
    expect(await deliverToRunner(redis, ws, `runner_${'9'.repeat(32)}`, offer('lease-x', 0))).toBe(false);
  }, WITH_DAEMON_MS);

  it('an offer without its spec (lease-spec-v1): accepted at once, run once the spec follows; a spec ahead of its offer waits for it; an error fails the lease', async () => {
    const { dir, runnerId } = await pairedToGateway('spec-box');
    const daemon = startDaemon(dir);
    await waitFor('presence', async () => ((await presenceOf(runnerId))?.status === 'ready' ? true : undefined), DAEMON_READY_MS);
    expect((await presenceOf(runnerId))?.capabilities.plane_protocols).toContain('lease-spec-v1');
    const ahead = (leaseId: string) => frame('lease.offer', `o-${leaseId}`, {
      lease_id: leaseId, attempt: 1, run_id: `run_${'1'.repeat(32)}`, session_id: `sess_${'2'.repeat(32)}`, accept_within_ms: 5000, lease_ttl_ms: 3000,
    });
    const specOf = (leaseId: string, body: { spec?: Record<string, unknown>; error?: string }) => frame('lease.spec', `s-${leaseId}`, { lease_id: leaseId, attempt: 1, ...body });
    const count = () => Promise.all([frameCount('in', 'lease.accept'), frameCount('in', 'lease.complete'), frameCount('in', 'lease.fail')]);
    const [accepts, completes, fails] = await count();
    // The spec follows the offer: accepted before the spec is in, completed after it.
    expect(await deliverToRunner(redis, ws, runnerId, ahead('lease-s1'))).toBe(true);
    await waitFor('lease.accept', async () => ((await frameCount('in', 'lease.accept')) > accepts ? true : undefined), 5000);
    expect(await frameCount('in', 'lease.complete')).toBe(completes);
    expect(await deliverToRunner(redis, ws, runnerId, specOf('lease-s1', { spec: { driver: 'noop', duration_ms: 0 } }))).toBe(true);
    await waitFor('lease.complete', async () => ((await frameCount('in', 'lease.complete')) > completes ? true : undefined), 5000);
    // A spec that overtook its offer is kept until the offer comes.
    expect(await deliverToRunner(redis, ws, runnerId, specOf('lease-s2', { spec: { driver: 'noop', duration_ms: 0 } }))).toBe(true);
    expect(await deliverToRunner(redis, ws, runnerId, ahead('lease-s2'))).toBe(true);
    await waitFor('second lease.complete', async () => ((await frameCount('in', 'lease.complete')) > completes + 1 ? true : undefined), 5000);
    // A spec the control plane could not build, and one this runner cannot run, fail the lease.
    expect(await deliverToRunner(redis, ws, runnerId, ahead('lease-s3'))).toBe(true);
    expect(await deliverToRunner(redis, ws, runnerId, specOf('lease-s3', { error: 'the control plane could not prepare the turn spec' }))).toBe(true);
    expect(await deliverToRunner(redis, ws, runnerId, ahead('lease-s4'))).toBe(true);
    expect(await deliverToRunner(redis, ws, runnerId, specOf('lease-s4', { spec: { driver: 'nonsense' } }))).toBe(true);
    await waitFor('two lease.fail', async () => ((await frameCount('in', 'lease.fail')) >= fails + 2 ? true : undefined), 5000);
    expect((await count())[1]).toBe(completes + 2);
    daemon.kill('SIGTERM');
  }, WITH_DAEMON_MS);

  it('an offer sent to a stale node hint is forwarded once to the node holding the socket; a dead hint falls back to the presence', async () => {
    const { dir, runnerId } = await pairedToGateway('hint-box');
    const daemon = startDaemon(dir);
    await waitFor('presence', async () => ((await presenceOf(runnerId))?.status === 'ready' ? true : undefined), DAEMON_READY_MS);
    const route = (await new PresenceStore(redis).get(ws, runnerId))?.route.node_id;
    // The API's own gateway node is live but does not hold this runner's socket.
    const nodes = ((await redis.pubsub('CHANNELS', 'ap:gateway:node:*')) as string[]).map((c) => c.slice('ap:gateway:node:'.length));
    const stale = nodes.find((n) => n !== route);
    expect(route).toBeDefined();
    expect(stale).toBeDefined();
    const accepts = await frameCount('in', 'lease.accept');
    const completes = await frameCount('in', 'lease.complete');
    expect(await deliverToRunner(redis, ws, runnerId, offer('lease-h1', 200), { nodeId: stale as string })).toBe(true);
    await waitFor('forwarded offer accepted', async () => ((await frameCount('in', 'lease.accept')) === accepts + 1 ? true : undefined), 5000);
    expect(await deliverToRunner(redis, ws, runnerId, offer('lease-h2', 200), { nodeId: 'gw_nobody_listens' })).toBe(true);
    await waitFor('looked-up offer accepted', async () => ((await frameCount('in', 'lease.accept')) === accepts + 2 ? true : undefined), 5000);
    // A hinted frame for a runner connected nowhere is dropped, not bounced between nodes, and the
    // node says so at once on the channel the sender named.
    const sub = redis.duplicate();
    try {
      const told = new Promise<string>((resolve) => sub.on('message', (_ch: string, m: string) => resolve(m)));
      await sub.subscribe('test:undelivered');
      const undelivered = { channel: 'test:undelivered', message: 'lease-h3 not delivered' };
      expect(await deliverToRunner(redis, ws, `runner_${'8'.repeat(32)}`, offer('lease-h3', 0), { nodeId: stale as string, undelivered })).toBe(true);
      expect(await told).toBe('lease-h3 not delivered');
    } finally {
      sub.disconnect();
    }
    // The same offer delivered twice (a frame may reach a runner twice) runs once. (After the
    // first two ended: this runner has two slots.)
    await waitFor('two leases completed', async () => ((await frameCount('in', 'lease.complete')) >= completes + 2 ? true : undefined), 10_000);
    expect(await deliverToRunner(redis, ws, runnerId, offer('lease-h4', 1000))).toBe(true);
    expect(await deliverToRunner(redis, ws, runnerId, offer('lease-h4', 1000))).toBe(true);
    await waitFor('three leases completed', async () => ((await frameCount('in', 'lease.complete')) >= completes + 3 ? true : undefined), 10_000);
    // SIGTERM waits for held work: a second run of lease-h4 would be accepted and completed too.
    const exited = new Promise<number | null>((r) => daemon.once('exit', (code) => r(code)));
    daemon.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(await frameCount('in', 'lease.accept')).toBe(accepts + 3);
    expect(await frameCount('in', 'lease.complete')).toBe(completes + 3);
  }, WITH_DAEMON_MS);

  it('a second SIGTERM cancels held work (lease.fail) and the daemon exits', async () => {
    const { dir, runnerId } = await pairedToGateway('cancel-box');
    const daemon = startDaemon(dir);
    await waitFor('presence', async () => ((await presenceOf(runnerId))?.status === 'ready' ? true : undefined), DAEMON_READY_MS);
    const accepts = await frameCount('in', 'lease.accept');
    const fails = await frameCount('in', 'lease.fail');
    expect(await deliverToRunner(redis, ws, runnerId, offer('lease-b', 600_000))).toBe(true);
    await waitFor('lease.accept', async () => ((await frameCount('in', 'lease.accept')) > accepts ? true : undefined), 5000);
    const exited = new Promise<number | null>((r) => daemon.once('exit', (code) => r(code)));
    daemon.kill('SIGTERM');
    await waitFor('draining presence', async () => ((await presenceOf(runnerId))?.status === 'draining' ? true : undefined), 5000);
    const t0 = Date.now();
    daemon.kill('SIGTERM');
    expect(await exited).toBe(0);
    expect(Date.now() - t0).toBeLessThan(5000);
    expect(await frameCount('in', 'lease.fail')).toBe(fails + 1);
  }, WITH_DAEMON_MS);
});

describe('drain and resume races', () => {
  type Control = { kind: string; runner_pool_id?: string; runner_id?: string; except_runner_ids?: string[]; mark?: string };

  /**
   * Every control message published from now on, and `settled()`: resolves once every message
   * published before it was called has been seen (a marker of the test's own goes through the
   * same channel after them).
   */
  async function watchControl(): Promise<{ seen: Control[]; settled(): Promise<void>; stop(): Promise<void> }> {
    const sub = connectRedis(p.redisUrl(), { name: 'test-control' });
    const seen: Control[] = [];
    const marks = new Map<string, () => void>();
    sub.on('message', (_channel: string, raw: string) => {
      const m = JSON.parse(raw) as Control;
      if (m.mark) marks.get(m.mark)?.();
      else seen.push(m);
    });
    await sub.subscribe(GATEWAY_CONTROL_CHANNEL);
    return {
      seen,
      async settled() {
        const mark = `mark-${Math.random()}`;
        const arrived = new Promise<void>((resolve) => marks.set(mark, resolve));
        // `lease_ended` is the one kind the gateways leave to others; a marker of it closes no socket.
        await redis.publish(GATEWAY_CONTROL_CHANNEL, JSON.stringify({ kind: 'lease_ended', mark }));
        await arrived;
      },
      async stop() {
        await sub.quit();
      },
    };
  }

  it('the last drain or resume the gateways receive for a pool, or a runner, states what is stored', async () => {
    const issued = await managedCredential();
    const pool = issued.runner_credential.runner_pool_id;
    const runner = issued.runner_credential.runner_id;
    const control = await watchControl();
    try {
      const drained = (m: Control) => m.kind === 'drain';
      const race = async (round: number, writes: Array<() => Promise<{ status: number }>>) => {
        for (const w of await Promise.all(writes.map((f) => f()))) expect(w.status).toBe(200);
        await control.settled();
        const stored = await p.root.get<{ status: string }>(`/v1/runner-pools/${pool}`);
        const own = await p.root.get<{ drain: unknown }>(`/v1/runner-credentials/${issued.runner_credential.id}`);
        // What a gateway did last for this runner: the last message naming its pool (and not
        // leaving it out) or the runner itself.
        const last = control.seen.filter((m) => (m.runner_pool_id === pool && !m.except_runner_ids?.includes(runner)) || m.runner_id === runner).at(-1);
        expect(last !== undefined && drained(last), `round ${round}: pool ${stored.status}, own drain ${JSON.stringify(own.drain)}`)
          .toBe(stored.status === 'draining' || own.drain !== null);
        control.seen.length = 0;
      };
      for (let round = 0; round < 20; round++) {
        await race(round, [
          () => p.root.request('POST', `/v1/runner-pools/${pool}/drain`, { body: { reason: `round ${round}` } }),
          () => p.root.request('POST', `/v1/runner-pools/${pool}/resume`),
        ]);
        await race(round, [
          () => p.root.request('POST', `/v1/runners/${runner}/drain`, { body: {} }),
          () => p.root.request('POST', `/v1/runners/${runner}/resume`),
          () => p.root.request('POST', `/v1/runner-pools/${pool}/resume`),
        ]);
      }
    } finally {
      await control.stop();
    }
  });
});

describe('npm start', () => {
  it('runs one local runner paired to the bootstrap workspace default pool', async () => {
    const q = await startPlatform({ runner: true });
    try {
      const pres = await waitFor('local runner presence', async () => {
        const r = await q.root.request('GET', '/v1/runner-pools/presences');
        const d = (r.body as { data: RunnerPresence[] }).data;
        return d[0]?.status === 'ready' ? d : undefined;
      }, 20_000);
      expect(pres).toHaveLength(1);
      const pools = await q.root.request('GET', '/v1/runner-pools');
      const def = (pools.body as { data: { id: string; is_default: boolean }[] }).data.find((x) => x.is_default)!;
      expect(pres[0]!.runner_pool).toBe(def.id);
      expect(pres[0]!.owner).toBeUndefined();
      expect(statSync(join(q.dataDir, 'runner', 'runner.json')).mode & 0o777).toBe(0o600);
      expect(readFileSync(join(q.dataDir, 'runner', 'runner.json'), 'utf8')).toContain('ap_runner_');
    } finally {
      await q.stop();
    }
  });
});
