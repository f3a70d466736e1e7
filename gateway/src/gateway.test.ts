import { mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Redis } from 'ioredis';
import { WebSocket } from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, createMetrics, secretDigest } from '@agentplane/core';
import { CLOSE, frame, RUNNER_CONNECT_PATH, type Payload } from '@agentplane/protocol';
import { keys, startEmbeddedRedis, tags, type EmbeddedRedis } from '@agentplane/store';
import { attachGateway, type Gateway } from './gateway.js';
import { GATEWAY_CONTROL_CHANNEL } from './presence.js';

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
