import { mkdirSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { WebSocketServer, type WebSocket } from 'ws';
import type Docker from 'dockerode';
import { createLogger } from '@agentplane/core';
import { CLOSE, frame, parseFrame, type LeaseRef, type RunnerMessage } from '@agentplane/protocol';
import { RunnerAgent, type LeaseExecutor } from './agent.js';
import { loadDaemonConfig, statePath, type RunnerCredentialFile } from './config.js';
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
