import { once } from 'node:events';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import Koa from 'koa';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { createLogger } from '@agentplane/core';
import type { ApiDeps } from '../deps.js';
import { requestBoundary } from './router.js';

/**
 * The request boundary with tracing off (no async-local request scope): a failure after an
 * await still answers 500 `runtime.internal` naming its incident and the request's id, and the
 * log line names both, because the id travels explicitly.
 */
describe('the request boundary', () => {
  const lines: Record<string, unknown>[] = [];
  let server: Server;
  let base: string;

  beforeAll(async () => {
    const log = createLogger({ name: 'api', level: 'debug', destination: { write: (s: string) => void lines.push(JSON.parse(s) as Record<string, unknown>) } });
    const deps = { config: { docsUrl: 'https://docs.example/errors' }, log } as unknown as ApiDeps;
    const app = new Koa();
    app.silent = true;
    app.use(requestBoundary(deps));
    app.use(async () => {
      await new Promise((r) => setImmediate(r));
      throw new Error('boom');
    });
    server = createServer(app.callback());
    server.listen(0, '127.0.0.1');
    await once(server, 'listening');
    base = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  });
  afterAll(() => new Promise<void>((r) => server.close(() => r())));

  it.each([
    ['a new id', {}],
    ['the caller\'s X-Request-Id', { 'x-request-id': 'caller-id-1' }],
  ])('names the request in a 500 and its log lines (%s)', async (_what, headers: Record<string, string>) => {
    const res = await fetch(`${base}/v1/anything`, { headers });
    const id = res.headers.get('request-id') ?? '';
    if (headers['x-request-id']) expect(id).toBe(headers['x-request-id']);
    else expect(id).toMatch(/^req_[0-9a-f]{24}$/);
    expect(res.status).toBe(500);
    const body = (await res.json()) as { error: { type: string; message: string } };
    expect(body.error.type).toBe('runtime.internal');
    const incident = /incident reference (inc_[0-9a-f]{16}), request id (\S+)$/.exec(body.error.message);
    expect(incident?.[2]).toBe(id);
    const failure = lines.find((l) => l.msg === 'unhandled error' && l.incident === incident?.[1]);
    expect(failure).toMatchObject({ request_id: id });
    expect(lines.find((l) => l.msg === 'request' && l.request_id === id)).toMatchObject({ status: 500 });
  });
});
