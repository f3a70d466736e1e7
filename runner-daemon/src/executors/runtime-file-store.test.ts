import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { afterEach, describe, expect, it } from 'vitest';
import { runtimeFileStore } from './turn.js';

/**
 * A browser tool's screenshot is stored through the control plane's runtime file route under an
 * Idempotency-Key of its own, and sent again under the same key when the control plane did not
 * answer or answered 5xx (an api restarting), so it is stored once; a 4xx is not sent again.
 */
let close: (() => Promise<void>) | undefined;
afterEach(async () => {
  await close?.();
  close = undefined;
});

async function serve(answers: Array<(req: IncomingMessage, res: ServerResponse) => void>): Promise<{ url: string; seen: Array<{ key: string | undefined; bytes: number }> }> {
  const seen: Array<{ key: string | undefined; bytes: number }> = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      seen.push({ key: req.headers['idempotency-key'] as string | undefined, bytes: Buffer.concat(chunks).length });
      (answers[seen.length - 1] ?? answers[answers.length - 1]!)(req, res);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  close = () => new Promise<void>((r) => server.close(() => r()));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, seen };
}

const shot = { filename: 'shot.png', content_type: 'image/png' as const, data: Buffer.from([0x89, 0x50, 0x4e, 0x47]), tool_use_id: 'toolu_1' };

describe('the runtime file store', () => {
  it('sends a store the control plane did not answer, or answered 5xx, again under the same key', async () => {
    const { url, seen } = await serve([
      (req) => req.socket.destroy(),
      (_req, res) => res.writeHead(503, { 'content-type': 'application/json' }).end('{"error":{"type":"runtime.unavailable"}}'),
      (_req, res) => res.writeHead(201, { 'content-type': 'application/json' }).end('{"id":"file_1"}'),
    ]);
    const stored = await runtimeFileStore(url, 'ap_rt_x', undefined, [1, 1, 1])(shot);
    expect(stored).toEqual({ file_id: 'file_1' });
    expect(seen).toHaveLength(3);
    expect(seen[0]!.key).toMatch(/^runtime-output-/);
    expect(new Set(seen.map((s) => s.key)).size).toBe(1);
    expect(seen.every((s) => s.bytes === shot.data.length)).toBe(true);
  });

  it('does not send a refused store again, and gives up once its retries are spent', async () => {
    const refused = await serve([(_req, res) => res.writeHead(409, { 'content-type': 'application/json' }).end('{"error":{"type":"idempotency.conflict"}}')]);
    await expect(runtimeFileStore(refused.url, 'ap_rt_x', undefined, [1, 1])(shot)).rejects.toThrow(/HTTP 409/);
    expect(refused.seen).toHaveLength(1);
    await close?.();
    const down = await serve([(_req, res) => res.writeHead(503).end()]);
    await expect(runtimeFileStore(down.url, 'ap_rt_x', undefined, [1, 1])(shot)).rejects.toThrow(/HTTP 503/);
    expect(down.seen).toHaveLength(3);
  });
});
