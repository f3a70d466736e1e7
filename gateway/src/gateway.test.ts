import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { WebSocket } from 'ws';
import { afterAll, beforeAll, describe, expect, it, vi } from 'vitest';
import { createLogger, createMetrics, secretDigest } from '@agentplane/core';
import { CLOSE, frame, RUNNER_CONNECT_PATH, type Payload } from '@agentplane/protocol';
import { keys, startEmbeddedRedis, tags, type EmbeddedRedis } from '@agentplane/store';
import { attachGateway, type Gateway, type GatewayControlMessage, type NodeDelivery } from './gateway.js';
import { GATEWAY_CONTROL_CHANNEL, gatewayNodeChannel } from './presence.js';

/**
 * A runner credential revoked while its runner connects: after the upgrade's check read it still
 * active, before the connection was registered to hear the revocation's announcement. The gateway
 * here is a real one on a real Redis; its Redis client is the test's, which lands the revocation
 * (written, then announced and heard by the gateway) right after the upgrade's check has read the
 * credential, so the window is hit every time rather than by timing.
 */
const WS = 'ws_connecting';
const ORG = 'org_connecting';
const TOKEN = 'ap_runner_connecting_secret_0011223344';
const HELLO: Payload<'hello'> = {
  protocol_versions: [1], daemon_version: 'test', status: 'ready', held_leases: [],
  capabilities: { protocol_versions: [1], available_slots: 1, drivers: ['process'], plane_protocols: [], providers: [] },
};

const dir = mkdtempSync(join(tmpdir(), 'agentplane-gateway-connect-'));
let server: EmbeddedRedis;
let redis: Redis;
let http: Server;
let gw: Gateway;
/** The gateway's control subscriber (its Redis client's duplicate). */
let subscriber: Redis | undefined;
/** Runs once, right after the gateway's next read of this credential document. */
let afterCredentialRead: { key: string; run: () => Promise<void> } | null = null;

const credentialKey = (id: string) => keys.doc(tags.workspace(WS), id);
const credential = (id: string, status: string) =>
  JSON.stringify({ id, status, workspace_id: WS, runner_id: `runner_${id}`, runner_pool_id: 'rpool_connecting', placement: 'managed', owner: null, drain: null });

/** A runner credential as the API stores it: its auth record under the bearer's digest, its document. */
async function storeCredential(id: string, token: string): Promise<void> {
  await redis.set(keys.auth(secretDigest(token)), JSON.stringify({ kind: 'runner_credential', credential_id: id, organization_id: ORG, workspace_id: WS, principal_id: null }));
  await redis.set(credentialKey(id), credential(id, 'active'));
}

/** What the API's revocation does: the document revoked, the auth record gone, then the announcement. */
async function revoke(id: string, token: string): Promise<void> {
  await redis.set(credentialKey(id), credential(id, 'revoked'));
  await redis.del(keys.auth(secretDigest(token)));
  await redis.publish(GATEWAY_CONTROL_CHANNEL, JSON.stringify({ kind: 'credential_revoked', workspace_id: WS, credential_id: id }));
}

/** The gateway's Redis client: the test's own, with a hook after a read of one document, and its duplicate kept. */
function gatewayRedis(target: Redis): Redis {
  return new Proxy(target, {
    get(t, prop) {
      if (prop === 'duplicate') return (...a: Parameters<Redis['duplicate']>) => (subscriber = t.duplicate(...a));
      if (prop === 'get') {
        return async (key: string) => {
          const value = await t.get(key);
          const hook = afterCredentialRead;
          if (hook && key === hook.key) {
            afterCredentialRead = null;
            await hook.run();
          }
          return value;
        };
      }
      const v = Reflect.get(t, prop, t) as unknown;
      return typeof v === 'function' ? (v as (...a: unknown[]) => unknown).bind(t) : v;
    },
  });
}

beforeAll(async () => {
  server = await startEmbeddedRedis({ dir });
  redis = new Redis(server.url);
  await redis.set(keys.doc(tags.workspace(WS), WS), JSON.stringify({ id: WS, status: 'active' }));
  await redis.set(keys.doc(tags.org(ORG), ORG), JSON.stringify({ id: ORG, status: 'active' }));
  http = createServer();
  gw = attachGateway(http, { redis: gatewayRedis(redis), log: createLogger({ name: 'gateway-test', level: 'silent' }), metrics: createMetrics({ runtime: false }) });
  await new Promise<void>((r) => http.listen(0, '127.0.0.1', r));
  // Its control subscription is in place (a revocation announced from now on reaches it).
  for (;;) {
    const [, count] = (await redis.pubsub('NUMSUB', GATEWAY_CONTROL_CHANNEL)) as [string, number];
    if (Number(count) > 0) break;
    await new Promise((r) => setImmediate(r));
  }
}, 60_000);

afterAll(async () => {
  await gw?.close();
  await new Promise((r) => http?.close(r));
  redis?.disconnect();
  await server?.stop();
  rmSync(dir, { recursive: true, force: true });
});

interface Client {
  sock: WebSocket;
  types: string[];
  /** The first of: a frame from the gateway (its type), or the socket's close (its code). */
  next(): Promise<{ frame: string } | { closed: number }>;
}

async function open(token: string): Promise<Client> {
  const sock = new WebSocket(`ws://127.0.0.1:${(http.address() as AddressInfo).port}${RUNNER_CONNECT_PATH}`, { headers: { authorization: `Bearer ${token}` } });
  const types: string[] = [];
  const waiting: ((v: { frame: string } | { closed: number }) => void)[] = [];
  sock.on('message', (d) => {
    const type = (JSON.parse(String(d)) as { type: string }).type;
    types.push(type);
    waiting.shift()?.({ frame: type });
  });
  let closed: number | null = null;
  sock.on('close', (code) => {
    closed = code;
    for (const w of waiting.splice(0)) w({ closed: code });
  });
  await new Promise<void>((resolve, reject) => sock.once('open', () => resolve()).once('error', reject));
  return { sock, types, next: () => new Promise((r) => (closed !== null ? r({ closed }) : waiting.push(r))) };
}

describe('a runner credential revoked while its runner connects', () => {
  it('an active credential connects and is welcomed', async () => {
    await storeCredential('rcred_active', `${TOKEN}_a`);
    const c = await open(`${TOKEN}_a`);
    c.sock.send(frame('hello', 'h1', HELLO));
    expect(await c.next()).toEqual({ frame: 'welcome' });
    c.sock.close();
  });

  it('revoked after the upgrade\'s check, announced before the connection could hear it: its hello is refused 4401, nothing sent', async () => {
    await storeCredential('rcred_revoked', TOKEN);
    let landed = false;
    afterCredentialRead = {
      key: credentialKey('rcred_revoked'),
      run: async () => {
        const heard = new Promise<void>((r) => subscriber!.once('message', () => r()));
        await revoke('rcred_revoked', TOKEN);
        // The gateway's own listener came first: it has handled the announcement (no socket to close yet).
        await heard;
        landed = true;
      },
    };
    const c = await open(TOKEN);
    // The upgrade went through on the read from before the revocation.
    expect(landed).toBe(true);
    c.sock.send(frame('hello', 'h1', HELLO));
    expect(await c.next()).toEqual({ closed: CLOSE.UNAUTHORIZED });
    expect(c.types).toEqual([]);
  });
});

/**
 * What reaches a runner while its connection is being registered (its hello read, its presence
 * written, its welcome not yet sent), and a presence write that comes after the connection
 * closed. A second gateway on the same Redis, whose client lets a test act right after one of its
 * reads or before one of its writes, so each window is hit every time rather than by timing.
 */
describe('a runner connection between its hello and its welcome, and after its close', () => {
  let http2: Server;
  let gw2: Gateway;
  let subscriber2: Redis | undefined;
  /** Runs once, right after the gateway's next standing read (`currentStanding`'s MGET) of this credential. */
  let afterStandingRead: { key: string; run: () => Promise<void> } | null = null;
  /** Runs once, right before the gateway's next presence write of this runner. */
  let beforePresenceWrite: { key: string; run: () => Promise<void> } | null = null;

  const presenceKey = (runner: string) => keys.scoped(tags.workspace(WS), `presence:${runner}`);

  beforeAll(async () => {
    const proxied = new Proxy(redis, {
      get(t, prop) {
        if (prop === 'duplicate') return (...a: Parameters<Redis['duplicate']>) => (subscriber2 = t.duplicate(...a));
        if (prop === 'mget') {
          return async (...a: string[]) => {
            const value = await t.mget(...a);
            const hook = afterStandingRead;
            if (hook && a.includes(hook.key)) {
              afterStandingRead = null;
              await hook.run();
            }
            return value;
          };
        }
        if (prop === 'evalsha') {
          return async (...a: (string | number)[]) => {
            const hook = beforePresenceWrite;
            if (hook && a.includes(hook.key)) {
              beforePresenceWrite = null;
              await hook.run();
            }
            return (t.evalsha as (...x: (string | number)[]) => Promise<unknown>)(...a);
          };
        }
        const v = Reflect.get(t, prop, t) as unknown;
        return typeof v === 'function' ? (v as (...x: unknown[]) => unknown).bind(t) : v;
      },
    });
    http2 = createServer();
    // Every heartbeat re-checks the standing (a read before the presence write).
    gw2 = attachGateway(http2, { redis: proxied, log: createLogger({ name: 'gateway-test', level: 'silent' }), metrics: createMetrics({ runtime: false }), options: { revalidateMs: 0 } });
    await new Promise<void>((r) => http2.listen(0, '127.0.0.1', r));
  });

  afterAll(async () => {
    await gw2?.close();
    await new Promise((r) => http2?.close(r));
  });

  interface Frames extends Client {
    frames: { type: string; payload: Record<string, unknown> }[];
  }

  async function open2(token: string): Promise<Frames> {
    const sock = new WebSocket(`ws://127.0.0.1:${(http2.address() as AddressInfo).port}${RUNNER_CONNECT_PATH}`, { headers: { authorization: `Bearer ${token}` } });
    const types: string[] = [];
    const frames: Frames['frames'] = [];
    const waiting: ((v: { frame: string } | { closed: number }) => void)[] = [];
    sock.on('message', (d) => {
      const f = JSON.parse(String(d)) as { type: string; payload: Record<string, unknown> };
      types.push(f.type);
      frames.push(f);
      waiting.shift()?.({ frame: f.type });
    });
    let closed: number | null = null;
    sock.on('close', (code) => {
      closed = code;
      for (const w of waiting.splice(0)) w({ closed: code });
    });
    await new Promise<void>((resolve, reject) => sock.once('open', () => resolve()).once('error', reject));
    return { sock, types, frames, next: () => new Promise((r) => (closed !== null ? r({ closed }) : waiting.push(r))) };
  }

  /** Publish on the gateway's control or node channel, and wait until its subscriber has it. */
  async function announce(channel: string, message: unknown): Promise<void> {
    const heard = new Promise<void>((r) => {
      const on = (ch: string) => {
        if (ch !== channel) return;
        subscriber2!.removeListener('message', on);
        r();
      };
      subscriber2!.on('message', on);
    });
    await redis.publish(channel, JSON.stringify(message));
    await heard;
  }

  it('a runner that drains and leaves while its heartbeat is re-checked keeps no presence', async () => {
    const cred = 'rcred_late_write';
    const secret = `${TOKEN}_late_write`;
    await storeCredential(cred, secret);
    const c = await open2(secret);
    c.sock.send(frame('hello', 'h1', HELLO));
    expect(await c.next()).toEqual({ frame: 'welcome' });
    expect(await redis.exists(presenceKey(`runner_${cred}`))).toBe(1);
    let left = false;
    afterStandingRead = {
      key: credentialKey(cred),
      run: async () => {
        // The heartbeat's re-check has read the standing; the runner says drained and goes.
        c.sock.send(frame('drained', 'd1', { held_leases: [] }));
        expect(await c.next()).toEqual({ frame: 'ack' });
        expect(await c.next()).toEqual({ closed: CLOSE.DRAINED });
        left = true;
      },
    };
    const heartbeat: Payload<'heartbeat'> = { status: 'ready', available_slots: 1, held_leases: [] };
    c.sock.send(frame('heartbeat', 'b1', heartbeat));
    await vi.waitFor(() => expect(left).toBe(true), { timeout: 10_000 });
    // The heartbeat's handler goes on in the same turn as the read it waited for (no I/O in
    // between): once this turn is over, any presence write it makes is on the connection ahead of
    // this read.
    await new Promise((r) => setImmediate(r));
    expect(await redis.exists(presenceKey(`runner_${cred}`))).toBe(0);
  });

  it('a frame routed to the runner before its welcome is not sent ahead of it: the sender hears at once that it was not delivered', async () => {
    const cred = 'rcred_early_frame';
    const secret = `${TOKEN}_early_frame`;
    const runner = `runner_${cred}`;
    await storeCredential(cred, secret);
    // The scheduler's undelivered-answer channel, as an offer names it.
    const replies = redis.duplicate();
    await replies.subscribe('test:offer-replies');
    const undelivered = new Promise<string>((r) => replies.once('message', (_ch: string, m: string) => r(m)));
    const c = await open2(secret);
    beforePresenceWrite = {
      key: presenceKey(runner),
      run: async () => {
        // The connection is registered (the runner's presence is being written): an offer comes.
        const offer = frame('lease.offer', 'o1', { lease_id: 'lease_early', attempt: 1, run_id: 'run_early', session_id: 'sess_early', accept_within_ms: 5000, lease_ttl_ms: 30_000, spec: {} });
        await announce(gatewayNodeChannel(gw2.options.nodeId), { runner_id: runner, frame: offer, undelivered: { channel: 'test:offer-replies', message: 'not delivered' } } satisfies NodeDelivery);
      },
    };
    c.sock.send(frame('hello', 'h1', HELLO));
    expect(await c.next()).toEqual({ frame: 'welcome' });
    expect(await undelivered).toBe('not delivered');
    // Nothing came before the welcome; a heartbeat's answer comes right after it.
    c.sock.send(frame('heartbeat', 'b1', { status: 'ready', available_slots: 1, held_leases: [] } satisfies Payload<'heartbeat'>));
    expect(await c.next()).toEqual({ frame: 'heartbeat.ack' });
    expect(c.types).toEqual(['welcome', 'heartbeat.ack']);
    replies.disconnect();
    c.sock.close();
  });

  it('the leases a connecting runner no longer names are settled before anything can reach it: an offer meanwhile is not delivered', async () => {
    const cred = 'rcred_orphan_check';
    const secret = `${TOKEN}_orphan_check`;
    const runner = `runner_${cred}`;
    await storeCredential(cred, secret);
    const replies = redis.duplicate();
    await replies.subscribe('test:orphan-replies');
    const undelivered = new Promise<string>((r) => replies.once('message', (_ch: string, m: string) => r(m)));
    let checked = false;
    // The lease owner's check of the leases the hello does not name (it abandons those): an offer
    // for the runner comes while it runs, and would be accepted (and then abandoned) if delivered.
    gw2.onConnected(async (conn) => {
      if (conn.identity.runnerId !== runner) return;
      const offer = frame('lease.offer', 'o1', { lease_id: 'lease_orphan', attempt: 1, run_id: 'run_orphan', session_id: 'sess_orphan', accept_within_ms: 5000, lease_ttl_ms: 30_000, spec: {} });
      await announce(gatewayNodeChannel(gw2.options.nodeId), { runner_id: runner, frame: offer, undelivered: { channel: 'test:orphan-replies', message: 'not delivered' } } satisfies NodeDelivery);
      checked = true;
    });
    const c = await open2(secret);
    c.sock.send(frame('hello', 'h1', HELLO));
    expect(await c.next()).toEqual({ frame: 'welcome' });
    expect(checked).toBe(true);
    expect(await undelivered).toBe('not delivered');
    c.sock.send(frame('heartbeat', 'b1', { status: 'ready', available_slots: 1, held_leases: [] } satisfies Payload<'heartbeat'>));
    expect(await c.next()).toEqual({ frame: 'heartbeat.ack' });
    expect(c.types).toEqual(['welcome', 'heartbeat.ack']);
    replies.disconnect();
    c.sock.close();
  });

  it('a drain announced after the hello read the standing, before the welcome, still reaches the runner', async () => {
    const cred = 'rcred_drain_connecting';
    const secret = `${TOKEN}_drain_connecting`;
    const runner = `runner_${cred}`;
    await storeCredential(cred, secret);
    const c = await open2(secret);
    const drain = { deadline: new Date(Date.now() + 60_000).toISOString(), reason: 'maintenance' };
    afterStandingRead = {
      key: credentialKey(cred),
      run: async () => {
        // The hello's read found no drain; the drain is written and announced now.
        const doc = JSON.parse(await redis.get(credentialKey(cred)) as string) as Record<string, unknown>;
        await redis.set(credentialKey(cred), JSON.stringify({ ...doc, drain }));
        await announce(GATEWAY_CONTROL_CHANNEL, { kind: 'drain', workspace_id: WS, runner_id: runner, ...drain } satisfies GatewayControlMessage);
      },
    };
    c.sock.send(frame('hello', 'h1', HELLO));
    expect(await c.next()).toEqual({ frame: 'welcome' });
    expect(c.frames[0]?.payload.drain).toBeUndefined();
    expect(await c.next()).toEqual({ frame: 'drain' });
    expect(c.frames[1]?.payload).toEqual(drain);
    c.sock.close();
  });

  it('a resume announced after the hello read a drain, before the welcome, still reaches the runner', async () => {
    const cred = 'rcred_resume_connecting';
    const secret = `${TOKEN}_resume_connecting`;
    const runner = `runner_${cred}`;
    await storeCredential(cred, secret);
    const drain = { deadline: new Date(Date.now() + 60_000).toISOString(), reason: 'maintenance' };
    const doc = JSON.parse(await redis.get(credentialKey(cred)) as string) as Record<string, unknown>;
    await redis.set(credentialKey(cred), JSON.stringify({ ...doc, drain }));
    const c = await open2(secret);
    afterStandingRead = {
      key: credentialKey(cred),
      run: async () => {
        // The hello's read found the drain; it is lifted and the resume announced now.
        await redis.set(credentialKey(cred), JSON.stringify({ ...doc, drain: null }));
        await announce(GATEWAY_CONTROL_CHANNEL, { kind: 'resume', workspace_id: WS, runner_id: runner, reason: 'back' } satisfies GatewayControlMessage);
      },
    };
    c.sock.send(frame('hello', 'h1', HELLO));
    expect(await c.next()).toEqual({ frame: 'welcome' });
    expect(c.frames[0]?.payload.drain).toEqual(drain);
    expect(await c.next()).toEqual({ frame: 'resume' });
    c.sock.close();
  });
});
