import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { LightClient } from '../bench/lib/light-client.js';

// The load benches' HTTP client parses answers itself: what it reads must be what was sent.
let server: Server;
let base = '';
const seen: { method?: string; url?: string; auth?: string; body: string }[] = [];

beforeAll(async () => {
  server = createServer((req, res) => {
    let body = '';
    req.setEncoding('utf8');
    req.on('data', (c: string) => (body += c));
    req.on('end', () => {
      seen.push({ method: req.method, url: req.url, auth: req.headers.authorization, body });
      if (req.url === '/v1/ok') {
        res.writeHead(201, { 'content-type': 'application/json' }).end(JSON.stringify({ ok: 'ü' }));
      } else if (req.url === '/v1/chunked') {
        res.writeHead(200, { 'content-type': 'application/json' });
        res.write('{"a":');
        setImmediate(() => res.end('1}'));
      } else if (req.url === '/v1/conflict') {
        res.writeHead(409, { 'content-type': 'application/json' }).end('{"error":{"type":"validation.conflict","message":"stale é"}}');
      } else if (req.url === '/v1/stream') {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.write(': keep-alive\n\n');
        res.write('id: 1\ndata: {"type":"user.message"}\n\n');
        res.write('data: {"type":"agent.message"}\n\n'); // no id: a preview, not the event
        const event = 'id: 2\ndata: {"type":"agent.message","text":"ça"}\n\n';
        res.write(event.slice(0, 9));
        setImmediate(() => res.write(event.slice(9)));
      } else {
        res.writeHead(404).end('{"error":{"type":"validation.not_found"}}');
      }
    });
  });
  server.keepAliveTimeout = 200;
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  base = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
});
afterAll(async () => {
  server.closeAllConnections();
  await new Promise((r) => server.close(r));
});

describe('bench LightClient', () => {
  it('posts a JSON body with the credential and reads answers framed by length or in chunks', async () => {
    const c = new LightClient({ baseUrl: base, token: 'k' });
    expect(await c.post('/ok', { text: 'ü' })).toBe(201);
    expect(seen.at(-1)).toMatchObject({ method: 'POST', url: '/v1/ok', auth: 'Bearer k', body: '{"text":"ü"}' });
    expect(await c.post('/chunked', {})).toBe(200);
    expect(await c.post('/ok', {})).toBe(201); // the same kept-alive socket, after a chunked answer
    await expect(c.post('/conflict', {})).rejects.toThrow('POST /conflict answered 409: {"error":{"type":"validation.conflict","message":"stale é"}}');
    c.close();
  });

  it('sends again on a new socket when the server closed the idle one', async () => {
    const c = new LightClient({ baseUrl: base });
    expect(await c.post('/ok', {})).toBe(201);
    const before = seen.length;
    await new Promise((r) => setTimeout(r, 400)); // past the server's keep-alive timeout
    expect(await c.post('/ok', {})).toBe(201);
    expect(seen.length).toBe(before + 1);
    c.close();
  });

  it('resolves a stream at the first event of the type with an id, split across reads; refuses an error answer', async () => {
    const c = new LightClient({ baseUrl: base });
    let opened = false;
    const at = await c.firstOf('/stream', 'agent.message', new AbortController().signal, () => (opened = true));
    expect(opened).toBe(true);
    expect(at).toBeGreaterThan(0);
    await expect(c.firstOf('/missing', 'agent.message', new AbortController().signal)).rejects.toThrow('stream /missing answered 404');
    const ac = new AbortController();
    const never = c.firstOf('/stream', 'session.status_idle', ac.signal);
    setTimeout(() => ac.abort(), 50);
    await expect(never).rejects.toThrow('aborted');
    c.close();
  });
});
