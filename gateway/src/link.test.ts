import { createServer, type Server } from 'node:http';
import type { AddressInfo, Socket } from 'node:net';
import type { Duplex } from 'node:stream';
import { WebSocket, WebSocketServer } from 'ws';
import { ConfigError } from '@agentplane/core';
import { corkForTurn } from '@agentplane/store';
import { describe, expect, it } from 'vitest';
import { gatewayLinkUrlFrom, linkUrlFor } from './link.js';

describe('GATEWAY_LINK_URL', () => {
  it('is a ws:// or wss:// origin, off, or unset', () => {
    expect(gatewayLinkUrlFrom({})).toBeUndefined();
    expect(gatewayLinkUrlFrom({ GATEWAY_LINK_URL: 'off' })).toBeNull();
    expect(gatewayLinkUrlFrom({ GATEWAY_LINK_URL: 'ws://10.0.0.7:8080' })).toBe('ws://10.0.0.7:8080');
    expect(gatewayLinkUrlFrom({ GATEWAY_LINK_URL: 'wss://api-1.internal:443/' })).toBe('wss://api-1.internal:443/');
    for (const bad of ['http://10.0.0.7:8080', 'ws://host:1/path', 'ws://', 'true']) {
      expect(() => gatewayLinkUrlFrom({ GATEWAY_LINK_URL: bad }), bad).toThrow(ConfigError);
    }
  });

  it('defaults to the listen address, a loopback one for every interface', () => {
    expect(linkUrlFor('127.0.0.1', 8080)).toBe('ws://127.0.0.1:8080');
    expect(linkUrlFor('0.0.0.0', 8080)).toBe('ws://127.0.0.1:8080');
    expect(linkUrlFor('::', 8080)).toBe('ws://[::1]:8080');
    expect(linkUrlFor('fd00::7', 8080)).toBe('ws://[fd00::7]:8080');
    expect(linkUrlFor('0.0.0.0', 8080, 'wss://api-1.internal:443/')).toBe('wss://api-1.internal:443');
  });
});

describe('a gateway socket corked for the turn (corkForTurn)', () => {
  it('sends the frames of one turn in one socket write, in order, and later turns in writes of their own', async () => {
    const wss = new WebSocketServer({ noServer: true });
    const server: Server = createServer();
    const accepted = new Promise<{ ws: WebSocket; socket: Duplex }>((resolve) => {
      server.on('upgrade', (req, socket, head) => wss.handleUpgrade(req, socket, head, (ws) => resolve({ ws, socket })));
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    const client = new WebSocket(`ws://127.0.0.1:${(server.address() as AddressInfo).port}`);
    const received: string[] = [];
    let wanted: { n: number; resolve: () => void } | undefined;
    client.on('message', (d) => {
      received.push(String(d));
      if (wanted && received.length >= wanted.n) wanted.resolve();
    });
    const all = (n: number) => new Promise<void>((resolve) => {
      wanted = { n, resolve };
    });
    try {
      await new Promise((r, j) => client.once('open', r).once('error', j));
      const { ws, socket } = await accepted;
      // Every write the socket hands to the kernel, counted where the stream calls it.
      const net = socket as Socket & { _write: (...a: unknown[]) => void; _writev: (...a: unknown[]) => void };
      let writes = 0;
      for (const name of ['_write', '_writev'] as const) {
        const orig = net[name].bind(net);
        net[name] = (...a: unknown[]) => {
          writes++;
          orig(...a);
        };
      }
      const first = all(3);
      for (const text of ['a', 'b', 'c']) {
        corkForTurn(socket);
        ws.send(text);
      }
      // Still held: nothing of the turn has been written yet.
      expect(writes).toBe(0);
      expect(net.writableLength).toBeGreaterThan(0);
      await first;
      expect(received).toEqual(['a', 'b', 'c']);
      expect(writes).toBe(1);
      // The next turn corks again.
      const second = all(5);
      corkForTurn(socket);
      ws.send('d');
      corkForTurn(socket);
      ws.send('e');
      expect(writes).toBe(1);
      await second;
      expect(received).toEqual(['a', 'b', 'c', 'd', 'e']);
      expect(writes).toBe(2);
    } finally {
      client.terminate();
      wss.close();
      await new Promise((r) => server.close(r));
    }
  });
});
