import { mkdtempSync, rmSync } from 'node:fs';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { WebSocketServer, type WebSocket } from 'ws';
import type Docker from 'dockerode';
import { createLogger } from '@agentplane/core';
import { CLOSE, frame, parseFrame, type LeaseRef, type RunnerMessage } from '@agentplane/protocol';
import { RunnerAgent, type LeaseExecutor } from './agent.js';
import { loadDaemonConfig, type RunnerCredentialFile } from './config.js';

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
