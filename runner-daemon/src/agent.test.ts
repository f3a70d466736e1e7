import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it, vi } from 'vitest';
import { WebSocketServer, type WebSocket } from 'ws';
import type Docker from 'dockerode';
import { createLogger } from '@agentplane/core';
import { CLOSE, frame, parseFrame, type LeaseRef, type RunnerMessage } from '@agentplane/protocol';
import { RunnerAgent, type LeaseExecutor } from './agent.js';
import { loadState, statePath, type RunnerCredentialFile } from '@agentplane/protocol';
import { loadDaemonConfig } from './config.js';
import { RunnerMetrics } from './metrics.js';

const dirs: string[] = [];
afterAll(() => {
  for (const d of dirs) rmSync(d, { recursive: true, force: true });
});

/** No Docker here: the daemon offers what it knows of the host, which is enough to take a lease. */
const noDocker = { ping: () => Promise.reject(new Error('no docker in this test')) } as unknown as Docker;

const LEASE: LeaseRef = { lease_id: 'lease-end-1', attempt: 1 };

function deferred<T>(): { promise: Promise<T>; resolve: (value: T) => void } {
  let resolve!: (value: T) => void;
  const promise = new Promise<T>((r) => (resolve = r));
  return { promise, resolve };
}

/**
 * A stand-in gateway: welcomes each connection, answers heartbeats, and hands every runner frame
 * to `onFrame` with its socket.
 */
function fakeGateway(onFrame: (ws: WebSocket, msg: RunnerMessage, connection: number) => void): Promise<{ url: string; close: () => Promise<void> }> {
  const wss = new WebSocketServer({ port: 0, host: '127.0.0.1' });
  let connections = 0;
  let seq = 0;
  wss.on('connection', (ws) => {
    const n = ++connections;
    ws.on('message', (data) => {
      const msg = parseFrame(data.toString(), 'runner');
      const id = `g${++seq}`;
      const now = new Date().toISOString();
      if (msg.type === 'hello') {
        ws.send(frame('welcome', id, {
          protocol_version: 1, runner_id: 'runner_t', runner_pool_id: 'rpool_t', workspace_id: 'wrkspc_t', generation: n, heartbeat_interval_ms: 100,
          presence_ttl_ms: 1000, max_frame_bytes: 1 << 20, server_time: now, resumed_leases: msg.payload.held_leases,
        }, msg.id));
      } else if (msg.type === 'heartbeat') {
        ws.send(frame('heartbeat.ack', id, { server_time: now, presence_expires_at: now, cancellations: [] }, msg.id));
      } else if (msg.type === 'drained') {
        ws.close(CLOSE.DRAINED, 'drained');
      }
      onFrame(ws, msg, n);
    });
  });
  return new Promise((resolve) => wss.on('listening', () => resolve({
    url: `http://127.0.0.1:${(wss.address() as AddressInfo).port}`,
    close: () => new Promise<void>((r) => wss.close(() => r())),
  })));
}

describe('a lease\'s end', () => {
  it('keeps the lease held until lease.complete is acknowledged: listed in hello after a reconnect, the end sent again, then released', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'runner-agent-'));
    dirs.push(dir);
    let offered = false;
    const firstEnd = deferred<string>();
    const reconnected = deferred<LeaseRef[]>();
    const resentEnd = deferred<string>();
    const released = deferred<void>();
    let acked = false;
    const gw = await fakeGateway((ws, msg, connection) => {
      if (msg.type === 'heartbeat' && !offered) {
        offered = true;
        ws.send(frame('lease.offer', 'o1', { ...LEASE, run_id: 'run_t', session_id: 'sess_t', accept_within_ms: 5000, lease_ttl_ms: 30_000, spec: { driver: 'test' } }));
      } else if (msg.type === 'lease.complete' && connection === 1) {
        // The gateway's process dies with the end unanswered (read, or lost on the way).
        firstEnd.resolve(msg.id);
        ws.terminate();
      } else if (msg.type === 'hello' && connection === 2) {
        reconnected.resolve(msg.payload.held_leases);
      } else if (msg.type === 'lease.complete' && connection === 2) {
        resentEnd.resolve(msg.id);
        acked = true;
        ws.send(frame('ack', 'a1', {}, msg.id));
      } else if (msg.type === 'heartbeat' && acked && msg.payload.held_leases.length === 0) {
        released.resolve();
      }
    });
    const config = loadDaemonConfig({}, { 'config-dir': dir, 'heartbeat-ms': '100', slots: '2', 'reconnect-base-ms': '10', 'reconnect-cap-ms': '20' });
    const cred: RunnerCredentialFile = {
      base_url: gw.url, secret: 'ap_runner_test', runner_id: 'runner_t', runner_credential_id: 'rcred_t', runner_pool_id: 'rpool_t',
      workspace_id: 'wrkspc_t', machine_label: 'test', paired_at: new Date().toISOString(),
    };
    const agent = new RunnerAgent(cred, config, createLogger({ name: 'test', level: 'silent' }), noDocker);
    const executor: LeaseExecutor = { refuse: () => null, run: async () => ({ stop_reason: { type: 'end_turn' } }) };
    agent.executor = executor;
    const done = agent.run();
    try {
      await firstEnd.promise;
      // The lease is still this runner's: the reconnect resumes it instead of giving it up.
      expect(await reconnected.promise).toEqual([LEASE]);
      await resentEnd.promise;
      await released.promise;
      expect(agent.heldCount).toBe(0);
    } finally {
      agent.beginDrain(Date.now(), 'test over');
      await done;
      await gw.close();
    }
  });
});

describe('work held across a reconnect', () => {
  it('sends nothing but its hello before the welcome: events resent after a reconnect wait for it', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'runner-agent-'));
    dirs.push(dir);
    const beforeWelcome: string[] = [];
    const delivered = deferred<number>();
    let offered = false;
    const wss = new WebSocketServer({ port: 0, host: '127.0.0.1' });
    let connections = 0;
    // After the first connection is cut, connections are refused until the runner's resend of
    // the unanswered batch is due (3 s after it was sent), and the next hello is answered late:
    // the resend falls between that hello and its welcome.
    let refuseUntil = 0;
    wss.on('connection', (ws) => {
      if (Date.now() < refuseUntil) return void ws.terminate();
      const n = ++connections;
      let welcomed = false;
      ws.on('message', (data) => {
        const msg = parseFrame(data.toString(), 'runner');
        const now = new Date().toISOString();
        if (!welcomed && msg.type !== 'hello') beforeWelcome.push(`${n}:${msg.type}`);
        if (msg.type === 'hello') {
          // The second connection's hello is answered late: the runner's resends run meanwhile.
          setTimeout(() => {
            welcomed = true;
            ws.send(frame('welcome', `w${n}`, {
              protocol_version: 1, runner_id: 'runner_t', runner_pool_id: 'rpool_t', workspace_id: 'wrkspc_t', generation: n, heartbeat_interval_ms: 100,
              presence_ttl_ms: 1000, max_frame_bytes: 1 << 20, server_time: now, resumed_leases: msg.payload.held_leases,
            }, msg.id));
          }, n === 1 ? 0 : 1500);
        } else if (msg.type === 'heartbeat') {
          ws.send(frame('heartbeat.ack', `h${n}`, { server_time: now, presence_expires_at: now, cancellations: [] }, msg.id));
          if (!offered) {
            offered = true;
            ws.send(frame('lease.offer', 'o1', { ...LEASE, run_id: 'run_t', session_id: 'sess_t', accept_within_ms: 5000, lease_ttl_ms: 30_000, spec: { driver: 'test' } }));
          }
        } else if (msg.type === 'events.batch' && n === 1) {
          refuseUntil = Date.now() + 2500;
          ws.terminate(); // the control plane goes away with the batch unanswered
        } else if (msg.type === 'events.batch') {
          ws.send(frame('events.ack', 'e1', { ...LEASE, seqs: [7] }, msg.id));
          delivered.resolve(n);
        } else if (msg.type === 'lease.complete') {
          ws.send(frame('ack', 'a1', {}, msg.id));
        }
      });
    });
    await new Promise<void>((r) => wss.on('listening', () => r()));
    const url = `http://127.0.0.1:${(wss.address() as AddressInfo).port}`;
    const config = loadDaemonConfig({}, { 'config-dir': dir, 'heartbeat-ms': '100', slots: '2', 'reconnect-base-ms': '10', 'reconnect-cap-ms': '20' });
    const agent = new RunnerAgent(credFor(url), config, createLogger({ name: 'test', level: 'silent' }), noDocker);
    agent.executor = {
      refuse: () => null,
      run: async (h) => {
        await h.deliverEvents('sess_t', [{ producer_key: 'k1', type: 'agent.message', payload: { content: [{ type: 'text', text: 'hi' }] } }], 20_000);
        return { stop_reason: { type: 'end_turn' } };
      },
    };
    const done = agent.run();
    try {
      expect(await delivered.promise).toBe(2);
      expect(beforeWelcome).toEqual([]);
    } finally {
      agent.beginDrain(Date.now(), 'test over');
      await done;
      await new Promise<void>((r) => wss.close(() => r()));
    }
  });
});

/** A logger whose lines (parsed) the test reads. */
function recordingLogger(): { log: ReturnType<typeof createLogger>; lines: Array<Record<string, unknown> & { msg: string; level: number }> } {
  const lines: Array<Record<string, unknown> & { msg: string; level: number }> = [];
  const log = createLogger({ name: 'test', level: 'debug', destination: { write: (l: string) => void lines.push(JSON.parse(l) as (typeof lines)[number]) } });
  return { log, lines };
}

const credFor = (url: string): RunnerCredentialFile => ({
  base_url: url, secret: 'ap_runner_test', runner_id: 'runner_t', runner_credential_id: 'rcred_t', runner_pool_id: 'rpool_t',
  workspace_id: 'wrkspc_t', machine_label: 'test', paired_at: new Date().toISOString(),
});

describe('a state file that cannot be written', () => {
  it('does not keep the daemon from running or stopping: said once at warn level, no temp file left', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'runner-agent-'));
    dirs.push(dir);
    // Every state write fails (its rename meets a directory), as on a disk that is full.
    mkdirSync(statePath(dir));
    writeFileSync(join(statePath(dir), 'in-the-way'), 'x');
    const acks = deferred<void>();
    let beats = 0;
    const gw = await fakeGateway((_ws, msg) => {
      if (msg.type === 'heartbeat' && ++beats === 3) acks.resolve();
    });
    const { log, lines } = recordingLogger();
    const config = loadDaemonConfig({}, { 'config-dir': dir, 'heartbeat-ms': '100', 'reconnect-base-ms': '10', 'reconnect-cap-ms': '20' });
    const agent = new RunnerAgent(credFor(gw.url), config, log, noDocker);
    agent.executor = { refuse: () => null, run: async () => undefined };
    const done = agent.run();
    try {
      await acks.promise; // several state writes (welcome, heartbeat acks) failed by now
      agent.beginDrain(Date.now(), 'test over');
      await done; // the stop writes the state too: it must not throw
    } finally {
      await gw.close();
    }
    const warned = lines.filter((l) => l.msg.startsWith('state file could not be written'));
    expect(warned).toHaveLength(1);
    expect(warned[0]).toMatchObject({ level: 40, path: statePath(dir) });
    expect(readdirSync(dir).sort()).toEqual(['state.json']);
    expect(readdirSync(statePath(dir))).toEqual(['in-the-way']);
  });
});

describe('isolation tiers that come and go', () => {
  it('are said at warn level when lost and when back, reported to the control plane and in the metrics', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'runner-agent-'));
    dirs.push(dir);
    const docker = {
      ping: () => Promise.resolve('OK'),
      info: () => Promise.resolve({ ServerVersion: 'test', OSType: 'linux', Architecture: 'x86_64', NCPU: 2, MemTotal: 2 ** 31, Plugins: { Network: ['bridge', 'null'] }, DockerRootDir: '/' }),
    } as unknown as Docker;
    const reported: string[][] = [];
    const waiters: Array<{ want: string; done: () => void }> = [];
    const gw = await fakeGateway((_ws, msg) => {
      const caps = msg.type === 'hello' ? msg.payload.capabilities : msg.type === 'heartbeat' ? msg.payload.capabilities : undefined;
      if (!caps) return;
      const drivers = [...caps.drivers].sort();
      reported.push(drivers);
      for (const w of waiters.splice(0)) if (drivers.join(',') === w.want) w.done(); else waiters.push(w);
    });
    const reportedAs = (want: string): Promise<void> => new Promise((done) => {
      if (reported.at(-1)?.join(',') === want) done();
      else waiters.push({ want, done });
    });
    const { log, lines } = recordingLogger();
    const config = loadDaemonConfig({}, { 'config-dir': dir, 'heartbeat-ms': '100', 'reconnect-base-ms': '10', 'reconnect-cap-ms': '20' });
    const agent = new RunnerAgent(credFor(gw.url), config, log, docker);
    const metrics = new RunnerMetrics(() => 0, { served: false });
    agent.metrics = metrics;
    let tiers = ['container'];
    agent.tierSource = () => Promise.resolve(tiers);
    agent.executor = { refuse: () => null, run: async () => undefined };
    const done = agent.run();
    try {
      await reportedAs('docker,process');
      expect(lines.filter((l) => l.msg.startsWith('isolation tiers'))).toEqual([]);

      tiers = []; // Docker went away: no canary runs
      agent.capabilitiesChanged();
      await reportedAs('process');
      const lost = lines.find((l) => l.msg.startsWith('isolation tiers lost'));
      expect(lost).toMatchObject({ level: 40, lost: ['container'], tiers: [] });
      expect(agent.verifiedTiers).toEqual([]);
      expect(await metrics.registry.metrics()).toContain('agentplane_runner_isolation_tier_verified{tier="container"} 0');

      tiers = ['container'];
      agent.capabilitiesChanged();
      await reportedAs('docker,process');
      expect(lines.find((l) => l.msg.startsWith('isolation tiers offered again'))).toMatchObject({ level: 40, regained: ['container'] });
      expect(await metrics.registry.metrics()).toContain('agentplane_runner_isolation_tier_verified{tier="container"} 1');
      expect(await metrics.registry.metrics()).toContain('agentplane_runner_docker_up 1');
    } finally {
      agent.beginDrain(Date.now(), 'test over');
      await done;
      await gw.close();
    }
  });
});

/**
 * A stand-in gateway on a real HTTP server: each runner upgrade is answered with the next status
 * of `plan` (the last one repeated): 101 takes the socket, welcomes the runner (resuming what it
 * holds) and hands its frames to `onFrame`; any other status is a plain HTTP answer with an error
 * body, as the gateway refuses upgrades.
 */
async function scriptedGateway(plan: number[], onFrame: (ws: WebSocket, msg: RunnerMessage, connection: number) => void = () => undefined): Promise<{
  url: string; upgrades: number[]; close: () => Promise<void>;
}> {
  const server = createServer((_req, res) => res.writeHead(404).end());
  const wss = new WebSocketServer({ noServer: true });
  const upgrades: number[] = [];
  let connections = 0;
  let seq = 0;
  server.on('upgrade', (req, socket, head) => {
    const status = plan[Math.min(upgrades.length, plan.length - 1)] ?? 101;
    upgrades.push(status);
    if (status !== 101) {
      const body = JSON.stringify({ error: { type: status === 401 ? 'auth.invalid_key' : 'runtime.unavailable', message: `refused with ${status}` } });
      socket.end(`HTTP/1.1 ${status} No\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`);
      return;
    }
    wss.handleUpgrade(req, socket, head, (ws) => {
      const n = ++connections;
      ws.on('message', (data) => {
        const msg = parseFrame(data.toString(), 'runner');
        const now = new Date().toISOString();
        if (msg.type === 'hello') {
          ws.send(frame('welcome', `g${++seq}`, {
            protocol_version: 1, runner_id: 'runner_t', runner_pool_id: 'rpool_t', workspace_id: 'wrkspc_t', generation: n, heartbeat_interval_ms: 100,
            presence_ttl_ms: 1000, max_frame_bytes: 1 << 20, server_time: now, resumed_leases: msg.payload.held_leases,
          }, msg.id));
        } else if (msg.type === 'heartbeat') {
          ws.send(frame('heartbeat.ack', `g${++seq}`, { server_time: now, presence_expires_at: now, cancellations: [] }, msg.id));
        } else if (msg.type === 'drained') {
          ws.close(CLOSE.DRAINED, 'drained');
        }
        onFrame(ws, msg, n);
      });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    upgrades,
    close: async () => {
      for (const c of wss.clients) c.terminate();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    },
  };
}

const OFFER = { ...LEASE, run_id: 'run_t', session_id: 'sess_t', accept_within_ms: 5000, lease_ttl_ms: 30_000, spec: { driver: 'test' } };

describe('a control plane that refuses the credential', () => {
  it('once, while a lease is held: the daemon reconnects, the lease resumed and its work untouched', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'runner-agent-'));
    dirs.push(dir);
    const accepted = deferred<void>();
    const resumed = deferred<LeaseRef[]>();
    const completed = deferred<void>();
    let offered = false;
    // Welcomed, then (the socket cut) a 401, a 503, a 401 again and a welcome: no two refusals in a row.
    const gw = await scriptedGateway([101, 401, 503, 401, 101], (ws, msg, connection) => {
      if (msg.type === 'heartbeat' && !offered) {
        offered = true;
        ws.send(frame('lease.offer', 'o1', OFFER));
      } else if (msg.type === 'lease.accept') {
        accepted.resolve();
        ws.close(CLOSE.UNAUTHORIZED, 'unauthorized');
      } else if (msg.type === 'hello' && connection === 2) {
        resumed.resolve(msg.payload.held_leases);
      } else if (msg.type === 'lease.complete') {
        ws.send(frame('ack', 'a1', {}, msg.id));
        completed.resolve();
      }
    });
    const { log, lines } = recordingLogger();
    const config = loadDaemonConfig({}, { 'config-dir': dir, 'heartbeat-ms': '100', 'reconnect-base-ms': '10', 'reconnect-cap-ms': '20' });
    const agent = new RunnerAgent(credFor(gw.url), config, log, noDocker);
    const finishWork = deferred<void>();
    let signal: AbortSignal | undefined;
    agent.executor = {
      refuse: () => null,
      run: async (h) => {
        signal = h.signal;
        // Done when the test says so, or stopped (so a failing test ends rather than hangs).
        await Promise.race([finishWork.promise, new Promise((r) => h.signal.addEventListener('abort', r, { once: true }))]);
        return { stop_reason: { type: 'end_turn' } };
      },
    };
    const done = agent.run();
    try {
      await accepted.promise;
      expect(await resumed.promise).toEqual([LEASE]);
      expect(gw.upgrades).toEqual([101, 401, 503, 401, 101]);
      expect(agent.credentialRefusal).toBeNull();
      expect(signal?.aborted).toBe(false);
      finishWork.resolve();
      await completed.promise;
      expect(lines.filter((l) => l.msg.startsWith('runner upgrade refused: the control plane refused'))).toHaveLength(2);
      expect(lines.filter((l) => l.msg.startsWith('the control plane refused this runner\'s credential'))).toEqual([]);
    } finally {
      agent.beginDrain(Date.now(), 'test over');
      await done;
      await gw.close();
    }
    expect(agent.credentialRefusal).toBeNull();
  });

  it('twice in a row, while a lease is held: the held work is canceled (infrastructure failure) and the daemon stops, saying why', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'runner-agent-'));
    dirs.push(dir);
    let offered = false;
    const gw = await scriptedGateway([101, 401], (ws, msg) => {
      if (msg.type === 'heartbeat' && !offered) {
        offered = true;
        ws.send(frame('lease.offer', 'o1', OFFER));
      } else if (msg.type === 'lease.accept') {
        // Revoked: the live socket is closed, and every upgrade from now on refused.
        ws.close(CLOSE.UNAUTHORIZED, 'unauthorized');
      }
    });
    const { log, lines } = recordingLogger();
    const config = loadDaemonConfig({}, { 'config-dir': dir, 'heartbeat-ms': '100', 'reconnect-base-ms': '10', 'reconnect-cap-ms': '20' });
    const agent = new RunnerAgent(credFor(gw.url), config, log, noDocker);
    const metrics = new RunnerMetrics(() => agent.heldCount, { served: false });
    agent.metrics = metrics;
    let reason: unknown;
    agent.executor = {
      refuse: () => null,
      // Runs until it is told to stop.
      run: (h) => new Promise((resolve) => h.signal.addEventListener('abort', () => {
        reason = h.signal.reason;
        resolve(undefined);
      }, { once: true })),
    };
    try {
      await agent.run();
    } finally {
      await gw.close();
    }
    expect(gw.upgrades).toEqual([101, 401, 401]);
    expect(agent.credentialRefusal).toMatchObject({ http_status: 401, error_type: 'auth.invalid_key', error_message: 'refused with 401' });
    expect(agent.heldCount).toBe(0);
    expect((reason as Error).message).toContain('the runner stopped: the control plane refused this runner\'s credential (HTTP 401)');
    expect(await metrics.registry.metrics()).toContain('agentplane_runner_leases_total{outcome="failed_infrastructure"} 1');
    const said = lines.filter((l) => l.msg.startsWith('the control plane refused this runner\'s credential'));
    expect(said).toHaveLength(1);
    expect(said[0]).toMatchObject({ level: 50, http_status: 401, refusals: 2, held: 1 });
    expect(loadState(dir)).toMatchObject({ status: 'stopped', connected: false, drain: 'local', credential_refused: { http_status: 401, error_message: 'refused with 401' } });
  });
});

const within = <T>(p: Promise<T>, ms: number): Promise<T | 'still waiting'> =>
  Promise.race([p, new Promise<'still waiting'>((r) => setTimeout(() => r('still waiting'), ms).unref())]);

describe('a local drain asked while the daemon connects', () => {
  it('stops the daemon once the upgrade completes, instead of at the drain deadline', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'runner-agent-'));
    dirs.push(dir);
    // The control plane takes the upgrade only when told: the signal comes while it is under way.
    const upgrading = deferred<void>();
    const answer = deferred<void>();
    const drained = deferred<void>();
    const server = createServer((_req, res) => res.writeHead(404).end());
    const wss = new WebSocketServer({ noServer: true });
    server.on('upgrade', (req, socket, head) => {
      upgrading.resolve();
      void answer.promise.then(() => wss.handleUpgrade(req, socket, head, (ws) => {
        ws.on('message', (data) => {
          const msg = parseFrame(data.toString(), 'runner');
          const now = new Date().toISOString();
          if (msg.type === 'hello') {
            ws.send(frame('welcome', 'g1', {
              protocol_version: 1, runner_id: 'runner_t', runner_pool_id: 'rpool_t', workspace_id: 'wrkspc_t', generation: 1, heartbeat_interval_ms: 100,
              presence_ttl_ms: 1000, max_frame_bytes: 1 << 20, server_time: now, resumed_leases: [],
            }, msg.id));
          } else if (msg.type === 'heartbeat') {
            ws.send(frame('heartbeat.ack', `g${Math.random()}`, { server_time: now, presence_expires_at: now, cancellations: [] }, msg.id));
          } else if (msg.type === 'drained') {
            drained.resolve();
            ws.close(CLOSE.DRAINED, 'drained');
          }
        });
      }));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
    const config = loadDaemonConfig({}, { 'config-dir': dir, 'heartbeat-ms': '100', 'reconnect-base-ms': '10', 'reconnect-cap-ms': '20' });
    const agent = new RunnerAgent(credFor(url), config, createLogger({ name: 'test', level: 'silent' }), noDocker);
    agent.executor = { refuse: () => null, run: async () => undefined };
    const done = agent.run();
    try {
      await upgrading.promise;
      agent.beginDrain(Date.now() + 3_600_000, 'SIGTERM received'); // the default deadline: an hour
      answer.resolve();
      expect(await within(done, 10_000)).toBeUndefined();
      await drained.promise; // said goodbye on the socket it got, so its presence goes at once
      expect(loadState(dir)).toMatchObject({ status: 'stopped', drain: 'local' });
    } finally {
      agent.cancelAll('test over');
      await done;
      for (const c of wss.clients) c.terminate();
      server.closeAllConnections();
      await new Promise<void>((r) => server.close(() => r()));
    }
  });
});

describe('work canceled because the runner stops, with the control plane away', () => {
  it('does not wait for the control plane to come back: the daemon stops at once', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'runner-agent-'));
    dirs.push(dir);
    const accepted = deferred<WebSocket>();
    let offered = false;
    const gw = await fakeGateway((ws, msg) => {
      if (msg.type === 'heartbeat' && !offered) {
        offered = true;
        ws.send(frame('lease.offer', 'o1', OFFER));
      } else if (msg.type === 'lease.accept') {
        accepted.resolve(ws);
      }
    });
    const config = loadDaemonConfig({}, { 'config-dir': dir, 'heartbeat-ms': '100', 'reconnect-base-ms': '10', 'reconnect-cap-ms': '20' });
    const agent = new RunnerAgent(credFor(gw.url), config, createLogger({ name: 'test', level: 'silent' }), noDocker);
    let delivery: unknown;
    agent.executor = {
      refuse: () => null,
      // Runs until stopped, then reports its last moments as the harness does (an interrupted
      // tool's result), each event acknowledged before the work ends.
      run: async (h) => {
        await new Promise((r) => h.signal.addEventListener('abort', r, { once: true }));
        delivery = await h.deliverEvents('sess_t', [{ producer_key: `${h.lease.lease_id}:0`, type: 'agent.tool_result', payload: { tool_use_id: 'toolu_1', content: 'interrupted', is_error: true } }])
          .catch((err: unknown) => err);
        throw new Error('interrupted');
      },
    };
    const done = agent.run();
    try {
      const ws = await accepted.promise;
      // The control plane goes away (stopped, or its host unreachable): reconnects are refused.
      ws.terminate();
      await gw.close();
      await vi.waitFor(() => expect(agent.connected).toBe(false));
      agent.beginDrain(Date.now() + 3_600_000, 'SIGTERM received');
      agent.cancelAll('SIGTERM received twice');
      expect(await within(done, 10_000)).toBeUndefined();
      expect((delivery as Error).message).toBe('the runner stopped before these events were acknowledged');
      expect(agent.heldCount).toBe(0);
    } finally {
      agent.cancelAll('test over');
      await within(done, 1_000);
    }
  });
});

describe('a model step under way when the connection to the control plane drops', () => {
  it('ends at once with a retryable error, and the Run fails as infrastructure (retried), not as the agent\'s work', async () => {
    const dir = mkdtempSync(join(tmpdir(), 'runner-agent-'));
    dirs.push(dir);
    let offered = false;
    const reconnected = deferred<LeaseRef[]>();
    const failed = deferred<{ failure_class: string; reason: string }>();
    const gw = await fakeGateway((ws, msg, connection) => {
      if (msg.type === 'heartbeat' && !offered) {
        offered = true;
        ws.send(frame('lease.offer', 'o1', OFFER));
      } else if (msg.type === 'model.request' && connection === 1) {
        // The control plane restarts while it streams the step: it never answers on this socket.
        ws.terminate();
      } else if (msg.type === 'hello' && connection === 2) {
        reconnected.resolve(msg.payload.held_leases);
      } else if (msg.type === 'lease.fail') {
        failed.resolve(msg.payload);
      }
    });
    const config = loadDaemonConfig({}, { 'config-dir': dir, 'heartbeat-ms': '100', 'reconnect-base-ms': '10', 'reconnect-cap-ms': '20' });
    const agent = new RunnerAgent(credFor(gw.url), config, createLogger({ name: 'test', level: 'silent' }), noDocker);
    const seen: unknown[] = [];
    agent.executor = {
      refuse: () => null,
      run: async (h) => {
        for await (const ev of h.model.stream({ routing_key: 'default', messages: [{ role: 'user', content: [{ type: 'text', text: 'hi' }] }], tools: [] }, h.signal)) seen.push(ev);
        // The resumed lease is still this runner's to fail: the failure is said on the new socket.
        await reconnected.promise;
        throw new Error('model step failed: the connection to the control plane was lost');
      },
    };
    const done = agent.run();
    try {
      const fail = await within(failed.promise, 10_000);
      expect(seen).toEqual([{ type: 'error', error: { type: 'runtime.internal', message: 'the connection to the control plane was lost during the model step', retryable: true } }]);
      expect(await reconnected.promise).toEqual([LEASE]);
      expect(fail).toMatchObject({ failure_class: 'infrastructure' });
    } finally {
      agent.beginDrain(Date.now(), 'test over');
      agent.cancelAll('test over');
      await done;
      await gw.close();
    }
  });
});
