import { randomBytes } from 'node:crypto';
import { createServer, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import { WebSocket, WebSocketServer } from 'ws';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger, createMetrics, secretDigest } from '@agentplane/core';
import { keys } from '@agentplane/store';
import { useEmbeddedRedis } from '@agentplane/store/testing';
import { attachGateway, type Gateway } from './gateway.js';
import { advertiseLink, GATEWAY_LINK_PATH, LINK_SEND_BACKLOG_BYTES, NodeLinks } from './link.js';

/**
 * The send bound of a node link (`LINK_SEND_BACKLOG_BYTES`), on both of its ends: a peer that
 * stops reading its link gets it closed, and what would have gone over it is published instead,
 * rather than held in the sender's memory without bound.
 */
const redis = useEmbeddedRedis('agentplane-link-backlog');
const log = createLogger({ name: 'link-backlog-test', level: 'silent' });
const MiB = 1024 * 1024;
const big = (n: number) => `${n}:${'x'.repeat(MiB)}`;

/** Until `check` holds, looking again after each short wait (at most `ms`). */
async function until(check: () => boolean | Promise<boolean>, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!(await check())) {
    if (Date.now() > end) throw new Error('condition not met in time');
    await new Promise((r) => setTimeout(r, 10));
  }
}

let http: Server;
beforeAll(async () => {
  http = createServer();
  await new Promise<void>((r) => http.listen(0, '127.0.0.1', r));
});
afterAll(async () => {
  await new Promise((r) => http?.close(r));
});

describe('a node link whose gateway node stops reading', () => {
  it('is closed once more than the bound waits to be sent, and the frames go by pub/sub', async () => {
    // A "node" that accepts the link, then reads nothing more.
    const wss = new WebSocketServer({ noServer: true });
    const peers: Socket[] = [];
    const onUpgrade = (req: Parameters<WebSocketServer['handleUpgrade']>[0], socket: Socket, head: Buffer) => {
      if (!req.url?.startsWith(GATEWAY_LINK_PATH)) return;
      wss.handleUpgrade(req, socket, head, () => {
        peers.push(socket);
        // Paused after the hello: the link opens, then nothing it is sent is read.
        socket.once('data', () => socket.pause());
      });
    };
    http.on('upgrade', onUpgrade);
    const nodeId = `gw_stalled_${randomBytes(4).toString('hex')}`;
    const advertised = advertiseLink(redis(), nodeId, `ws://127.0.0.1:${(http.address() as AddressInfo).port}`, log);
    const links = new NodeLinks({ redis: redis(), log, replyChannels: ['reply:stalled'], onReply: () => undefined });
    try {
      const delivery = (n: number) => ({ runner_id: 'runner_stalled', frame: big(n) });
      // The first send starts the link (and goes by pub/sub); a later one finds it open.
      await until(() => links.send(nodeId, { runner_id: 'runner_stalled', frame: 'open?' }));
      let sent = 0;
      let refused = false;
      for (let n = 0; n < 200 && !refused; n++) {
        if (links.send(nodeId, delivery(n))) sent++;
        else refused = true;
        // Let the socket hand what it can to the kernel, as a process's later turns would.
        await new Promise((r) => setImmediate(r));
      }
      expect(refused).toBe(true);
      // Not cut before the bound was passed.
      expect(sent * MiB).toBeGreaterThan(LINK_SEND_BACKLOG_BYTES);
      // Closed: later frames are published too (the link is tried again only after a pause).
      expect(links.send(nodeId, delivery(999))).toBe(false);
    } finally {
      links.close();
      await advertised.stop();
      http.off('upgrade', onUpgrade);
      for (const s of peers) s.destroy();
      wss.close();
    }
  }, 30_000);
});

describe('a node link whose sender stops reading', () => {
  let gw: Gateway;
  beforeAll(() => {
    gw = attachGateway(http, { redis: redis(), log, metrics: createMetrics({ runtime: false }), options: { nodeId: 'gw_link_backlog' } });
  });
  afterAll(async () => {
    await gw?.close();
  });

  it('is closed by the node once more than the bound waits to be sent, and its replies are published', async () => {
    const ticket = randomBytes(24).toString('base64url');
    await redis().set(keys.global(`gw_link_ticket:${secretDigest(ticket)}`), 'gw_link_backlog', 'PX', 10_000);
    const sender = new WebSocket(`ws://127.0.0.1:${(http.address() as AddressInfo).port}${GATEWAY_LINK_PATH}`, { headers: { authorization: `Bearer ${ticket}` } });
    const sub = redis.connect('link-backlog-sub');
    try {
      await new Promise((resolve, reject) => sender.once('open', resolve).once('error', reject));
      const channel = `reply:${randomBytes(4).toString('hex')}`;
      sender.send(JSON.stringify({ k: 'hello', reply_channels: [channel] }));
      // The node took the hello: a reply comes over the link.
      const overLink: string[] = [];
      sender.on('message', (d) => overLink.push(String(d)));
      await until(async () => {
        await gw.sendToChannel(channel, 'ping');
        return overLink.length > 0;
      });
      // From now on the sender reads nothing.
      (sender as unknown as { _socket: Socket })._socket.pause();
      const published: string[] = [];
      sub.on('message', (ch: string, m: string) => ch === channel && published.push(m));
      await sub.subscribe(channel);
      for (let n = 0; n < 200 && published.length === 0; n++) {
        await gw.sendToChannel(channel, big(n));
        await new Promise((r) => setImmediate(r));
      }
      await until(() => published.length > 0);
      // Not cut before the bound was passed: the first message published came after it.
      expect(Number(published[0]?.split(':')[0]) * MiB).toBeGreaterThanOrEqual(LINK_SEND_BACKLOG_BYTES);
    } finally {
      sender.terminate();
      sub.disconnect();
    }
  }, 30_000);
});
