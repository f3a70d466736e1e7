import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { HttpClient } from './http.js';

describe('HttpClient under a base path', () => {
  let server: Server;
  let origin: string;
  const seen: string[] = [];
  beforeAll(async () => {
    server = createServer((req, res) => {
      seen.push(req.url ?? '');
      res.writeHead(200, { 'content-type': 'application/json' }).end('{"ok":true}');
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    origin = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  it('keeps the path of the base URL in every request', async () => {
    const client = new HttpClient({ baseUrl: `${origin}/agentplane` });
    await client.get('/v1/sessions', { limit: 2 });
    expect(seen.pop()).toBe('/agentplane/v1/sessions?limit=2');
    expect(client.url('/v1/files/file_1/content')).toBe(`${origin}/agentplane/v1/files/file_1/content`);
    expect(new HttpClient({ baseUrl: `${origin}/` }).url('/healthz')).toBe(`${origin}/healthz`);
  });
});
