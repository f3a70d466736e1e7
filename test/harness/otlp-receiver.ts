import { createServer, type IncomingHttpHeaders } from 'node:http';
import { freePort } from '@agentplane/store';

/** One export request as a receiver got it. */
export interface Received { path: string; headers: IncomingHttpHeaders; body: Buffer }

export interface OtlpReceiver {
  /** `http://127.0.0.1:<port>`: the value for OTEL_EXPORTER_OTLP_ENDPOINT. */
  url: string;
  port: number;
  /** Every request so far, in arrival order (empty it between tests). */
  received: Received[];
  /** The status the next answers carry (default 200). */
  status: number;
  close(): Promise<void>;
}

/**
 * A local OTLP/HTTP receiver for tests: keeps every request whole and answers as a collector
 * does, in the request's encoding (an empty protobuf body, or `{}` for JSON).
 */
export async function startOtlpReceiver(): Promise<OtlpReceiver> {
  const port = await freePort();
  const receiver: OtlpReceiver = { url: `http://127.0.0.1:${port}`, port, received: [], status: 200, close: async () => undefined };
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      receiver.received.push({ path: req.url ?? '', headers: req.headers, body: Buffer.concat(chunks) });
      if (req.headers['content-type'] === 'application/x-protobuf') res.writeHead(receiver.status, { 'content-type': 'application/x-protobuf' }).end();
      else res.writeHead(receiver.status, { 'content-type': 'application/json' }).end('{}');
    });
  });
  await new Promise<void>((r) => server.listen(port, '127.0.0.1', () => r()));
  receiver.close = () => new Promise<void>((r) => server.close(() => r()));
  return receiver;
}
